from typing import Any

from django.apps import AppConfig, apps
from django.conf import settings
from django.contrib.auth.signals import user_logged_out
from django.core.checks import CheckMessage, Error, Tags, Warning, register
from django.shortcuts import resolve_url
from django.template import TemplateDoesNotExist
from django.template.loader import get_template
from django.urls import NoReverseMatch, Resolver404, resolve

from ..conf import app_settings

REQUIRED_APPS = (
    "django.contrib.auth",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
)


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
        for name in ("MAX_KEYS", "RECENT_REQUESTS", "PLAYGROUND_MINUTES")
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


def check_login_url(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    """``LOGIN_URL``, where the portal sends a visitor who is not signed in, is a page of
    this site's (or of another host)."""
    login_url = str(settings.LOGIN_URL)
    if "://" in login_url:
        return []  # a sign-in service of its own
    try:
        resolve(resolve_url(login_url).split("?")[0])
    except (NoReverseMatch, Resolver404):
        return [
            Warning(
                f"LOGIN_URL is {login_url!r}, which no URL of this site serves: visitors"
                " the portal sends to sign in get a 404.",
                hint='Set LOGIN_URL = "chatparity-portal:login" for the portal\'s own'
                " sign-in page, or to the site's.",
                id="chatparity_portal.W001",
            )
        ]
    return []


class PortalConfig(AppConfig):
    name = "chatparity.portal"
    label = "chatparity_portal"
    verbose_name = "chatparity self-service portal"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from .playground import revoke_on_sign_out

        register(check_portal)
        register(check_login_url, Tags.urls)
        user_logged_out.connect(revoke_on_sign_out, dispatch_uid="chatparity_portal_playground")
