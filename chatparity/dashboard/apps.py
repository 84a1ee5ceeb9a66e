from django.apps import AppConfig


class DashboardConfig(AppConfig):
    name = "chatparity.dashboard"
    label = "chatparity_dashboard"
    verbose_name = "chatparity dashboard"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from ..signals import request_logged
        from .tail import publish

        request_logged.connect(publish, dispatch_uid="chatparity.dashboard.tail")
