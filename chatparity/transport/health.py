"""``GET /healthz``: is this worker able to serve? For load balancers, no API key needed.

The answer names each dependency and whether it answered in time, never how it
failed: errors (which may carry hosts or user names) go to the log only.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
from collections.abc import Awaitable, Callable

from asgiref.sync import sync_to_async
from django.conf import settings
from django.core.cache import caches
from django.db import connections, router
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.views.decorators.http import require_http_methods

from ..accounting import limits
from ..models import RequestLog

logger = logging.getLogger(__name__)

# Load balancers poll every few seconds with a short time-out of their own: answer
# before theirs expires, so a hung dependency reads as "timeout", not as a dead worker.
CHECK_TIMEOUT = 2.0
CACHE_KEY_PREFIX = "chatparity:healthz:"
CHANNEL_GROUP = "chatparity.healthz"  # never joined: a send costs two Redis round trips


def _ping_database() -> None:
    # The database chatparity writes its request log to.
    with connections[router.db_for_write(RequestLog)].cursor() as cursor:
        cursor.execute("SELECT 1")
        cursor.fetchone()


def _ping_cache() -> None:
    cache = caches["default"]
    key, token = CACHE_KEY_PREFIX + secrets.token_hex(8), secrets.token_hex(8)
    cache.set(key, token, timeout=10)
    if cache.get(key) != token:
        raise LookupError("the cache did not return the value just set")


def _has_channel_layer() -> bool:
    """Whether the site configures a default channel layer (the dashboard's live tail uses it)."""
    return "default" in getattr(settings, "CHANNEL_LAYERS", {})


async def _ping_channel_layer() -> None:
    # channels is optional (chatparity.dashboard): imported only when a layer is configured,
    # so a layer configured without it fails this check.
    from channels.layers import get_channel_layer

    await get_channel_layer().group_send(CHANNEL_GROUP, {"type": "healthz.ping"})


async def _outcome(name: str, check: Callable[[], Awaitable[None]]) -> str:
    try:
        async with asyncio.timeout(CHECK_TIMEOUT):
            await check()
    except TimeoutError:
        logger.warning("healthz: %s did not answer within %ss", name, CHECK_TIMEOUT)
        return "timeout"
    except Exception as exc:
        logger.warning("healthz: %s failed: %r", name, exc)
        return "fail"
    return "ok"


def _checks(*, counters: bool) -> dict[str, Callable[[], Awaitable[None]]]:
    checks: dict[str, Callable[[], Awaitable[None]]] = {
        "database": sync_to_async(_ping_database),
        # Off the request's thread, so a database call that hangs cannot hold it up too.
        "cache": sync_to_async(_ping_cache, thread_sensitive=False),
    }
    if _has_channel_layer():
        checks["channel_layer"] = _ping_channel_layer
    store = limits.counters()
    if counters and isinstance(store, limits.RedisCounters):
        checks["redis"] = store.ping
    return checks


async def dependencies(*, counters: bool = False) -> dict[str, str]:
    """Each dependency's outcome (``ok``, ``fail``, ``timeout``): the database, the
    cache, the channel layer if configured, and with ``counters`` the rate limits'
    Redis if set (not a reason to take a worker out of service: see
    ``LIMITS_WHEN_UNAVAILABLE``)."""
    checks = _checks(counters=counters)
    outcomes = await asyncio.gather(*(_outcome(name, check) for name, check in checks.items()))
    return dict(zip(checks, outcomes, strict=True))


@require_http_methods(["GET", "HEAD"])
async def healthz(request: HttpRequest) -> HttpResponse:
    """200 ``{"status": "ok", "checks": {...}}`` when the database, the cache and the
    channel layer (if configured) all answer; else 503 with ``"status": "fail"``."""
    results = await dependencies()
    healthy = all(outcome == "ok" for outcome in results.values())
    response = JsonResponse(
        {"status": "ok" if healthy else "fail", "checks": results}, status=200 if healthy else 503
    )
    response["Cache-Control"] = "no-store"
    if request.method == "HEAD":
        response.content = b""
    return response
