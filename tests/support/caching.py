"""What the response cache's tests share: its store (Redis in CI's second pass, else this
process's memory), the settings that turn it on, and requests through the fast path."""

import os
from urllib.parse import urlsplit

import httpx
import orjson
from django.conf import settings
from django.core.cache import caches

from chatparity.gateway import cache
from tests.asgi import FastPathTestCase
from tests.scripted import SCRIPTED

STORE = "responses"


def store_config() -> dict:
    """The response cache's CACHES entry: a database of its own on the pass's Redis, else
    this process's memory."""
    url = os.environ.get("REDIS_URL", "")
    if url:
        location = urlsplit(url)._replace(path="/3").geturl()
        return {"BACKEND": "django.core.cache.backends.redis.RedisCache", "LOCATION": location}
    return {"BACKEND": "django.core.cache.backends.locmem.LocMemCache", "LOCATION": "responses"}


def cache_settings(**response_cache) -> dict:
    """CHATPARITY with the scripted backend and the response cache in :data:`STORE`."""
    return {**SCRIPTED, "RESPONSE_CACHE": {"CACHE": STORE, **response_cache}}


def with_store(config: dict | None = None) -> dict:
    """CACHES with the response cache's entry (``config``, else :func:`store_config`)."""
    return {**settings.CACHES, STORE: config or store_config()}


class CachingTestCase(FastPathTestCase):
    """Requests through the fast path with the response cache on; each test starts with
    an empty store."""

    def setUp(self):
        super().setUp()
        caches[STORE].clear()

    async def post(self, path, body, *, key=None, **headers):
        """The status, headers (a dict) and body of ``body`` posted to ``path`` with
        ``key`` (the test case's key unless given); the writes it started done."""
        sent = [
            ("authorization", f"Bearer {key or self.plaintext}"),
            ("content-type", "application/json"),
            *((name.replace("_", "-"), value) for name, value in headers.items()),
        ]
        start, content, communicator = await self.exchange("POST", path, orjson.dumps(body), sent)
        await communicator.wait(timeout=10)
        await cache.writes.get().drain()
        return start["status"], {k.decode(): v.decode() for k, v in start["headers"]}, content


def as_response(status, headers, content) -> httpx.Response:
    """What :meth:`CachingTestCase.post` returned, as the conformance judges read it."""
    return httpx.Response(status, headers=headers, content=content)
