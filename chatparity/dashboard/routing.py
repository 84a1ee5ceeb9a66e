"""WebSocket routes, each behind :class:`SameOriginValidator`; an ASGI application mounts them
behind AuthMiddlewareStack.

A browser sends the session cookie with a WebSocket handshake from any page of the same
site, which includes other ports and plain HTTP on the same host; only the Origin header
tells the admin's own pages apart. channels' ``AllowedHostsOriginValidator`` compares the
host alone, so the check here follows Django's CSRF origin check instead.
"""

from __future__ import annotations

import logging
from typing import Any
from urllib.parse import urlsplit

from channels.security.websocket import WebsocketDenier
from django.conf import settings
from django.core.exceptions import DisallowedHost
from django.http import HttpRequest
from django.urls import path
from django.utils.http import is_same_domain

from .consumers import LiveTailConsumer
from .tail import TAIL_PATH

logger = logging.getLogger(__name__)
_deny = WebsocketDenier.as_asgi()


class Handshake(HttpRequest):
    """A WebSocket handshake read as Django reads an HTTP request: ``get_host()`` (checked
    against ALLOWED_HOSTS, X-Forwarded-Host when USE_X_FORWARDED_HOST) and ``scheme``
    (``wss`` is https; SECURE_PROXY_SSL_HEADER applies)."""

    def __init__(self, scope: dict[str, Any]) -> None:
        super().__init__()
        self.secure_socket = scope.get("scheme") == "wss"
        server = scope.get("server") or ("unknown", 0)
        self.META = {"SERVER_NAME": server[0], "SERVER_PORT": str(server[1])}
        for raw_name, raw_value in scope.get("headers", []):
            name = "HTTP_" + raw_name.decode("latin1").upper().replace("-", "_")
            value = raw_value.decode("latin1")
            self.META[name] = f"{self.META[name]},{value}" if name in self.META else value

    def _get_scheme(self) -> str:
        return "https" if self.secure_socket else "http"


def same_origin(scope: dict[str, Any]) -> bool:
    """Whether the handshake's Origin is the origin it was opened on (scheme, host and port
    alike; the host in ALLOWED_HOSTS) or one of ``CSRF_TRUSTED_ORIGINS``.

    The same rule as Django's CSRF check of a form post; no Origin is refused."""
    handshake = Handshake(scope)
    origin = handshake.META.get("HTTP_ORIGIN")
    if origin is None:
        return False
    try:
        if origin == f"{handshake.scheme}://{handshake.get_host()}":
            return True
    except DisallowedHost:
        pass
    trusted: list[str] = settings.CSRF_TRUSTED_ORIGINS
    if origin in (pattern for pattern in trusted if "*" not in pattern):
        return True
    try:
        parts = urlsplit(origin)
    except ValueError:
        return False
    # "https://*.example.com": example.com and its subdomains, over https, default port.
    return any(
        parts.scheme == pattern.scheme and is_same_domain(parts.netloc, pattern.netloc.lstrip("*"))
        for pattern in map(urlsplit, trusted)
        if "*" in pattern.netloc
    )


class SameOriginValidator:
    """ASGI middleware refusing (HTTP 403) a WebSocket handshake from another origin."""

    def __init__(self, application: Any) -> None:
        self.application = application

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> Any:
        if same_origin(scope):
            return await self.application(scope, receive, send)
        logger.warning("WebSocket %s refused: its Origin is not this site's", scope.get("path"))
        return await _deny(scope, receive, send)


websocket_urlpatterns = [
    path(TAIL_PATH, SameOriginValidator(LiveTailConsumer.as_asgi()), name="chatparity-tail"),
]
