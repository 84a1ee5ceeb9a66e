"""Cross-origin requests to ``/v1`` from browser pages (CORS), for both transports.

``CHATPARITY["CORS_ALLOWED_ORIGINS"]`` lists the origins (``scheme://host[:port]``)
whose pages may call the API, or ``["*"]`` for any. A preflight (``OPTIONS`` with
``Access-Control-Request-Method``) is answered before any endpoint runs: a 200
with no body, whose ``Access-Control-Allow-*`` headers are there only for an
allowed origin (so a browser refuses the others). Every other reply to an
allowed origin, errors and streams included, names the origin and exposes
chatparity's own headers (``x-request-id``, ``x-ratelimit-*``, ``retry-after``...)
to the page.

The key travels in ``Authorization``, never in a cookie, so credentials are
never allowed (no ``Access-Control-Allow-Credentials``): a page can only spend
a key it was given. A request without an ``Origin`` header costs nothing here.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from functools import cache
from typing import Any

from django.core.signals import setting_changed
from django.dispatch import receiver

from ..conf import app_settings

# Every method some /v1 endpoint serves: an endpoint that does not serve the one a
# page asks for answers it with its 405, which the page can then read.
ALLOWED_METHODS = "GET, POST, DELETE"
# Seconds a browser may keep a preflight's answer (Chromium keeps it at most 7,200).
MAX_AGE = "86400"
# A comma-separated list of header names (RFC 9110 tokens), as a preflight asks for them.
_HEADER_NAMES = re.compile(
    r"[!#$%&'*+.^_`|~0-9A-Za-z-]+(?:[ \t]*,[ \t]*[!#$%&'*+.^_`|~0-9A-Za-z-]+)*"
)
# Response headers a page may read without their being exposed (CORS-safelisted).
_SAFELISTED = frozenset(
    {
        "cache-control",
        "content-language",
        "content-length",
        "content-type",
        "expires",
        "last-modified",
        "pragma",
    }
)
# An origin as CORS_ALLOWED_ORIGINS must spell it: a scheme, a host and maybe a port.
ORIGIN = re.compile(
    r"[a-z][a-z0-9+.-]*://(?:\[[0-9a-f:.]+\]|[^\s/?#@:\[\]]+)(?::[0-9]{1,5})?", re.IGNORECASE
)


class CorsPolicy:
    """Which origins may call ``/v1``, and the headers that tell a browser so."""

    def __init__(self, origins: list[str]) -> None:
        self.any_origin = "*" in origins
        # Browsers send an origin in lower case; a setting may not.
        self.origins = frozenset(origin.lower() for origin in origins)

    def allows(self, origin: str) -> bool:
        return self.any_origin or origin in self.origins

    def preflight_headers(self, headers: Mapping[str, str]) -> dict[str, str]:
        """The answer's headers to the preflight whose request has ``headers``
        (lower-case names): none for an origin that is not allowed."""
        origin = headers.get("origin")
        if origin is None or not self.allows(origin):
            return {}
        answer = {
            "access-control-allow-origin": origin,
            "access-control-allow-methods": ALLOWED_METHODS,
            "access-control-max-age": MAX_AGE,
            "vary": "origin, access-control-request-headers",
        }
        # A page may send any header (a key travels in Authorization, the SDKs add
        # their x-stainless-* ones): the names asked for are granted as they are.
        requested = headers.get("access-control-request-headers", "").strip()
        if _HEADER_NAMES.fullmatch(requested):
            answer["access-control-allow-headers"] = requested
        return answer

    def add_response_headers(self, origin: str, reply_headers: dict[str, str]) -> None:
        """Let the page of ``origin`` read the reply whose headers (lower-case names)
        are ``reply_headers``, and every header of its own there."""
        if not self.allows(origin):
            return
        exposed = ", ".join(name for name in reply_headers if name not in _SAFELISTED)
        reply_headers["access-control-allow-origin"] = origin
        if exposed:
            reply_headers["access-control-expose-headers"] = exposed
        vary = reply_headers.get("vary")
        reply_headers["vary"] = f"{vary}, origin" if vary else "origin"


def is_preflight(method: str, headers: Mapping[str, str]) -> bool:
    """Whether a request is a browser's CORS preflight (``headers``: lower-case names)."""
    return method == "OPTIONS" and "access-control-request-method" in headers


@cache
def policy() -> CorsPolicy | None:
    """The configured policy, or None when no origin is allowed."""
    origins = app_settings.CORS_ALLOWED_ORIGINS
    if not origins or not isinstance(origins, list | tuple):  # chatparity.E060 says so
        return None
    return CorsPolicy([origin for origin in origins if isinstance(origin, str)])


@receiver(setting_changed)
def _settings_changed(**kwargs: Any) -> None:
    policy.cache_clear()


def origin_problem(origin: Any) -> str | None:
    """Why ``origin`` cannot be an entry of ``CORS_ALLOWED_ORIGINS``, if it cannot."""
    if not isinstance(origin, str):
        return f"{origin!r} is not a string"
    if origin == "*":
        return None
    if not ORIGIN.fullmatch(origin):
        return (
            f"{origin!r} is not an origin: a scheme, '://', a host and maybe ':port',"
            " with no path (not even '/')"
        )
    return None
