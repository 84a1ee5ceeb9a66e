from typing import Any

from django.apps import AppConfig, apps
from django.core.checks import CheckMessage, Error, register
from django.template import TemplateDoesNotExist
from django.template.loader import get_template

from ..conf import app_settings

REQUIRED_APPS = ("django.contrib.auth", "django.contrib.sessions", "django.contrib.messages")


def check_portal(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    """The apps the portal runs on are installed, its base template exists, and its
    numbers are numbers."""
    errors: list[CheckMessage] = [
        Error(f"chatparity.portal needs {name!r} in INSTALLED_APPS.", id="chatparity_portal.E001")
        for name in REQUIRED_APPS
        if not apps.is_installed(name)
    ]
    portal = app_settings.PORTAL
    errors += [
        Error(
            f'CHATPARITY["PORTAL"]["{name}"] must be a whole number above 0, not {portal[name]!r}.',
            id="chatparity_portal.E003",
        )
        for name in ("MAX_KEYS", "RECENT_REQUESTS")
        if not (isinstance(portal[name], int) and not isinstance(portal[name], bool))
        or portal[name] < 1
    ]
    base = portal["BASE_TEMPLATE"]
    try:
        get_template(base)
    except TemplateDoesNotExist:
        errors.append(
            Error(
                f'CHATPARITY["PORTAL"]["BASE_TEMPLATE"] names {base!r}, which no template'
                " loader finds.",
                hint="Name the site's base template (with blocks 'title' and 'content'), or"
                " leave the default.",
                id="chatparity_portal.E002",
            )
        )
    return errors


class PortalConfig(AppConfig):
    name = "chatparity.portal"
    label = "chatparity_portal"
    verbose_name = "chatparity self-service portal"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        register(check_portal)
