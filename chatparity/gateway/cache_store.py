"""The response cache's store: the entry of Django's ``CACHES`` that
``RESPONSE_CACHE["CACHE"]`` names, asked without ever blocking the event loop.

An entry of Django's Redis backend is asked with ``redis.asyncio`` on the event loop,
at its LOCATION, with Django's keys (``KEY_PREFIX``, ``VERSION``, ``KEY_FUNCTION``):
through a thread, each call would cost a hit more CPU than all the rest of it. An entry
in this process's memory is asked directly (nothing to wait for). Any other backend
(memcached, a database, files) is asked in a thread.

Every call is bounded by :data:`STORE_TIMEOUT`; a store that failed is left alone for
:data:`RESTING_SECONDS`, so that while it is down one request a second waits for its
time-out, not every request. Failures are :class:`Unavailable`, which the cache turns
into a request served uncached.
"""

from __future__ import annotations

import asyncio
import time
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from asgiref.sync import sync_to_async
from django.conf import settings
from django.core.cache import caches
from django.core.cache.backends.base import BaseCache
from django.core.cache.backends.locmem import LocMemCache
from django.core.cache.backends.redis import RedisCache

from ..accounting.batching import PerLoop

T = TypeVar("T")

STORE_TIMEOUT = 1.0
"""Seconds any call to the store may take: past it, the request goes on uncached."""
RESTING_SECONDS = 1.0


class Unavailable(Exception):
    """The store failed, timed out, or rests after a failure."""


@dataclass(frozen=True)
class Budget:
    """The bytes the store may take in writes: ``most`` counted in ``counters`` (the
    last, this window's, counts a write; each made for ``ttl`` seconds)."""

    counters: tuple[str, str]
    most: int
    ttl: int


class Store(ABC):
    """A CACHES entry, as the response cache uses it: bytes by key, and counters."""

    def __init__(self, cache: BaseCache) -> None:
        self.cache = cache
        self.resting_until = 0.0

    async def get(self, key: str) -> bytes | None:
        return (await self.get_many([key])).get(key)

    @abstractmethod
    async def get_many(self, keys: list[str]) -> dict[str, bytes]:
        """The values held of ``keys``, by key."""

    @abstractmethod
    async def write(self, entries: dict[str, bytes], ttl: int, budget: Budget) -> bool:
        """Keep each of ``entries`` for ``ttl`` seconds, and count their bytes in
        ``budget``, unless that would pass it; whether they were kept."""


class CacheStore(Store):
    """Django's cache API: called directly when the cache is in this process's memory,
    else in a thread."""

    async def _call(self, function: Callable[..., T], *args: Any) -> T:
        if isinstance(self.cache, LocMemCache):
            return function(*args)
        return await sync_to_async(function, thread_sensitive=False)(*args)

    async def get_many(self, keys: list[str]) -> dict[str, bytes]:
        held: dict[str, Any] = await self._call(self.cache.get_many, keys)
        return {key: value for key, value in held.items() if isinstance(value, bytes)}

    async def write(self, entries: dict[str, bytes], ttl: int, budget: Budget) -> bool:
        return await self._call(self._written, entries, ttl, budget)

    def _written(self, entries: dict[str, bytes], ttl: int, budget: Budget) -> bool:
        """As :meth:`write`, but not atomic: two writes at once may both fit."""
        held = self.cache.get_many(list(budget.counters))
        size = sum(map(len, entries.values()))
        if sum(v for v in held.values() if isinstance(v, int)) + size > budget.most:
            return False
        self.cache.set_many(entries, ttl)
        counter = budget.counters[-1]
        while True:
            self.cache.add(counter, 0, budget.ttl)
            try:
                self.cache.incr(counter, size)
                return True
            except ValueError:  # expired between the two calls
                continue


class RedisStore(Store):
    """Django's Redis backend's server (its first LOCATION, where Django writes), asked
    with ``redis.asyncio`` under Django's keys; values kept as the bytes they are."""

    def __init__(self, cache: BaseCache, url: str) -> None:
        super().__init__(cache)
        self.url = url
        # A client per event loop: redis.asyncio connections cannot move between loops.
        self._clients: PerLoop[Any] = PerLoop(self._connect)

    def _connect(self) -> Any:
        from redis.asyncio import Redis

        return Redis.from_url(
            self.url, socket_timeout=STORE_TIMEOUT, socket_connect_timeout=STORE_TIMEOUT
        )

    async def get_many(self, keys: list[str]) -> dict[str, bytes]:
        values = await self._clients.get().mget([self.cache.make_key(key) for key in keys])
        return {key: value for key, value in zip(keys, values, strict=True) if value is not None}

    async def write(self, entries: dict[str, bytes], ttl: int, budget: Budget) -> bool:
        keys = [self.cache.make_key(key) for key in (*budget.counters, *entries)]
        size = sum(map(len, entries.values()))
        arguments = [size, budget.most, budget.ttl, ttl, *entries.values()]
        written = await self._clients.get().eval(_WRITE, len(keys), *keys, *arguments)
        return bool(written)


# One step: the budget's two windows read, this one's counted, the entries set.
_WRITE = """
local before = tonumber(redis.call('GET', KEYS[1]) or '0')
local used = before + tonumber(redis.call('GET', KEYS[2]) or '0')
if used + tonumber(ARGV[1]) > tonumber(ARGV[2]) then return 0 end
redis.call('INCRBY', KEYS[2], ARGV[1])
redis.call('EXPIRE', KEYS[2], ARGV[3], 'NX')
for i = 3, #KEYS do redis.call('SET', KEYS[i], ARGV[i + 2], 'EX', ARGV[4]) end
return 1
"""


_stores: dict[str, Store] = {}


def store_of(name: str) -> Store:
    """The store of the CACHES entry ``name``, made once a process (``caches[name]`` is
    made anew in each request's context: a Redis connection pool each)."""
    config: dict[str, Any] = settings.CACHES.get(name) or {}
    where = f"{name} {config.get('BACKEND')} {config.get('LOCATION')}"
    store = _stores.get(where)
    if store is None:
        cache = caches.create_connection(name)
        location = config.get("LOCATION")
        if isinstance(cache, RedisCache) and location:
            first = location if isinstance(location, str) else location[0]
            store = RedisStore(cache, first.split(",")[0])
        else:
            store = CacheStore(cache)
        _stores[where] = store
    return store


async def call(name: str, method: str, *args: Any) -> Any:
    """``<method>(*args)`` of the store of ``name`` (a :class:`Store`'s), within
    :data:`STORE_TIMEOUT`; :class:`Unavailable` if it fails (the store then rests for
    :data:`RESTING_SECONDS`)."""
    store = store_of(name)
    if time.monotonic() < store.resting_until:
        raise Unavailable("resting after a failure")
    try:
        async with asyncio.timeout(STORE_TIMEOUT):
            return await getattr(store, method)(*args)
    except Exception as exc:  # each backend raises its own errors
        store.resting_until = time.monotonic() + RESTING_SECONDS
        raise Unavailable(f"{type(exc).__name__}: {exc}") from exc
