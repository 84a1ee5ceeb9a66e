"""What the dashboard's live tail needs beside it, named by ``manage.py check``."""

from typing import Any

from django.apps import apps
from django.conf import settings
from django.core.checks import CheckMessage, Error


def check_channels(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    """Channels is installed, with a default channel layer the tail is sent through."""
    problems: list[CheckMessage] = []
    if not apps.is_installed("channels"):
        problems.append(
            Error(
                "chatparity.dashboard needs 'channels' in INSTALLED_APPS.",
                hint="pip install 'django-chatparity[dashboard]' and add it.",
                id="chatparity_dashboard.E001",
            )
        )
    layers = getattr(settings, "CHANNEL_LAYERS", None)
    if not isinstance(layers, dict) or "default" not in layers:
        problems.append(
            Error(
                "chatparity.dashboard needs CHANNEL_LAYERS with a 'default' layer: the live"
                " tail is sent through it.",
                hint="One process: {'default': {'BACKEND':"
                " 'channels.layers.InMemoryChannelLayer'}}; several workers:"
                " channels_redis.core.RedisChannelLayer (pip install channels-redis).",
                id="chatparity_dashboard.E002",
            )
        )
    return problems
