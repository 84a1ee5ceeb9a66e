from typing import Any

from django.apps import AppConfig, apps
from django.core.checks import CheckMessage, Error, register

# Token authentication needs authtoken's model; the schema view needs drf_spectacular.
REQUIRED_APPS = ("rest_framework", "rest_framework.authtoken", "drf_spectacular")


def check_required_apps(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    """The apps the management API runs on are installed beside it."""
    return [
        Error(
            f"chatparity.api needs {name!r} in INSTALLED_APPS.",
            hint="pip install 'django-chatparity[api]' and add it.",
            id="chatparity_api.E001",
        )
        for name in REQUIRED_APPS
        if not apps.is_installed(name)
    ]


class ApiConfig(AppConfig):
    name = "chatparity.api"
    label = "chatparity_api"
    verbose_name = "chatparity management API"

    def ready(self) -> None:
        register(check_required_apps)
