from django.apps import AppConfig


class ChatparityConfig(AppConfig):
    name = "chatparity"
    verbose_name = "chatparity"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from . import checks  # noqa: F401  (registers the system checks)
