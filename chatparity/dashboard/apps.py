from django.apps import AppConfig
from django.core.checks import register


class DashboardConfig(AppConfig):
    name = "chatparity.dashboard"
    label = "chatparity_dashboard"
    verbose_name = "chatparity dashboard"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from ..signals import request_logged
        from .checks import check_channels
        from .tail import publish

        request_logged.connect(publish, dispatch_uid="chatparity.dashboard.tail")
        register(check_channels)
