from typing import Any

from django.apps import AppConfig
from django.conf import settings
from django.core.checks import CheckMessage, Error, register

MIDDLEWARE = "chatparity.audit.middleware.AuditMiddleware"


def check_middleware(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    """The middleware that says who made a change is installed."""
    if MIDDLEWARE in settings.MIDDLEWARE:
        return []
    return [
        Error(
            f"chatparity.audit needs {MIDDLEWARE!r} in MIDDLEWARE.",
            hint="Without it, changes made in the admin, the management API and the portal"
            " are recorded without who made them.",
            id="chatparity_audit.E001",
        )
    ]


class AuditConfig(AppConfig):
    name = "chatparity.audit"
    label = "chatparity_audit"
    verbose_name = "chatparity audit trail"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from . import recording

        recording.connect()
        register(check_middleware)
