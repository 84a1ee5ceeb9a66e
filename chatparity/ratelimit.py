"""Rate limits and budgets, enforced atomically across processes and machines.

Per key: requests and tokens per minute, requests in flight, and a token or
cost budget per day or month; per key and alias: requests and tokens per
minute, set on the alias. Counters live in Redis when
``CHATPARITY["REDIS_URL"]`` is set, else in Django's default cache (which
must be shared by every worker: Redis or memcached, not local memory, once
there is more than one process).

A request is admitted by :func:`admit`, which reserves what it may use (one
request, its prompt plus ``max_tokens``, one slot in flight) and raises
OpenAI's 429 when a limit would be passed (a request with no key, an admin's
trial, passes only the alias's limits, as one more client of its own);
:meth:`Admission.switch` moves it to a fallback alias, under that alias's own
limits; :meth:`Admission.settle` puts the real token count and cost in place
of the reservation when the request ends.
Minute windows are fixed windows of the UTC clock, as OpenAI's reset headers
suggest.
"""

from __future__ import annotations

import asyncio
import datetime
import math
import time
import weakref
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any, Protocol

from asgiref.sync import sync_to_async
from django.core.cache import DEFAULT_CACHE_ALIAS, cache, caches
from django.core.cache.backends.locmem import LocMemCache
from django.db.models import Sum

from .conf import app_settings
from .models import ApiKey, ModelAlias, RequestLog
from .protocol.errors import APIError

MICRO = Decimal(1_000_000)  # cost counters count micro-dollars, as integers
_CONCURRENCY_TTL = 3600  # a slot a crashed worker never gave back frees itself


class Counters(Protocol):
    """Integer counters with a time to live, changed atomically."""

    async def reserve(self, key: str, amount: int, limit: int, ttl: int) -> tuple[bool, int]:
        """Add ``amount`` unless the sum would pass ``limit``; (admitted, value now)."""

    async def add(self, key: str, amount: int, ttl: int) -> int:
        """Add ``amount`` (which may be negative); the value now."""

    async def get_or_seed(self, key: str, seed: int, ttl: int) -> int:
        """The value, set to ``seed`` first if the counter does not exist."""


_RESERVE = """
local value = tonumber(redis.call('GET', KEYS[1]) or '0')
if value + tonumber(ARGV[1]) > tonumber(ARGV[2]) then return {0, value} end
value = redis.call('INCRBY', KEYS[1], ARGV[1])
redis.call('EXPIRE', KEYS[1], ARGV[3], 'NX')
return {1, value}
"""
_ADD = """
local value = redis.call('INCRBY', KEYS[1], ARGV[1])
redis.call('EXPIRE', KEYS[1], ARGV[2], 'NX')
return value
"""


class RedisCounters:
    """Counters in Redis, each change one Lua script: atomic across machines."""

    def __init__(self, url: str) -> None:
        self.url = url
        # A client per event loop: redis.asyncio connections cannot move between loops.
        self._clients: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, Any] = (
            weakref.WeakKeyDictionary()
        )

    def _client(self) -> Any:
        from redis.asyncio import Redis

        loop = asyncio.get_running_loop()
        client = self._clients.get(loop)
        if client is None:
            client = self._clients[loop] = Redis.from_url(self.url)
        return client

    async def reserve(self, key: str, amount: int, limit: int, ttl: int) -> tuple[bool, int]:
        admitted, value = await self._client().eval(_RESERVE, 1, key, amount, limit, ttl)
        return bool(admitted), int(value)

    async def add(self, key: str, amount: int, ttl: int) -> int:
        return int(await self._client().eval(_ADD, 1, key, amount, ttl))

    async def get_or_seed(self, key: str, seed: int, ttl: int) -> int:
        client = self._client()
        await client.set(key, seed, ex=ttl, nx=True)
        return int(await client.get(key) or 0)


class CacheCounters:
    """Counters in Django's default cache. Its synchronous ``incr`` is atomic where
    the cache is shared (Redis, memcached) or in-process (local memory); its async
    ``aincr`` is a get and a set, so it is not used. A reservation that would pass
    its limit is taken back: a race can refuse a request that would have fitted,
    never admit one that does not."""

    async def reserve(self, key: str, amount: int, limit: int, ttl: int) -> tuple[bool, int]:
        value = await self.add(key, amount, ttl)
        if value > limit:
            return False, await _sync(cache.incr, key, -amount)
        return True, value

    async def add(self, key: str, amount: int, ttl: int) -> int:
        return int(await _sync(_add, key, amount, ttl))

    async def get_or_seed(self, key: str, seed: int, ttl: int) -> int:
        await _sync(cache.add, key, seed, ttl)
        return int(await _sync(cache.get, key, seed))


def _add(key: str, amount: int, ttl: int) -> int:
    while True:
        cache.add(key, 0, ttl)
        try:
            return int(cache.incr(key, amount))
        except ValueError:  # expired between the two calls
            continue


async def _sync(function: Callable[..., Any], *args: Any) -> Any:
    """Call the cache: directly when it is in this process's memory (no I/O to wait
    for), else in a worker thread, off the event loop."""
    if isinstance(caches[DEFAULT_CACHE_ALIAS], LocMemCache):
        return function(*args)
    return await sync_to_async(function, thread_sensitive=False)(*args)


_counters: dict[str, Counters] = {}


def counters() -> Counters:
    """The counters the settings ask for (one per Redis URL)."""
    url = app_settings.REDIS_URL or ""
    if url not in _counters:
        _counters[url] = RedisCounters(url) if url else CacheCounters()
    return _counters[url]


# -- the rules ----------------------------------------------------------------


def _reset(seconds: float) -> str:
    """A duration as OpenAI's reset headers write it: ``17ms``, ``12s``, ``6m0s``."""
    if seconds < 1:
        return f"{max(1, round(seconds * 1000))}ms"
    minutes, rest = divmod(math.ceil(seconds), 60)
    return f"{minutes}m{rest}s" if minutes else f"{rest}s"


@dataclass
class Window:
    """One per-minute limit as it stands for this request."""

    name: str  # "requests" or "tokens": the suffix of its headers
    key: str
    limit: int
    reserved: int  # what this request put in it
    used: int = 0

    def headers(self, reset_in: float) -> dict[str, str]:
        return {
            f"x-ratelimit-limit-{self.name}": str(self.limit),
            f"x-ratelimit-remaining-{self.name}": str(max(0, self.limit - self.used)),
            f"x-ratelimit-reset-{self.name}": _reset(reset_in),
        }


def rate_limited(message: str, kind: str, retry_after: float, headers: dict[str, str]) -> APIError:
    """OpenAI's 429 for a limit of ``kind`` (``requests`` or ``tokens``)."""
    error = APIError(message, status=429, type=kind, code="rate_limit_exceeded")
    error.headers = {**headers, "retry-after": str(max(1, math.ceil(retry_after)))}
    return error


def insufficient_quota(retry_after: float) -> APIError:
    error = APIError(
        "You exceeded your current quota, please check your plan and billing details.",
        status=429,
        type="insufficient_quota",
        code="insufficient_quota",
    )
    error.headers = {"retry-after": str(max(1, math.ceil(retry_after)))}
    return error


def _period(
    key: ApiKey, now: datetime.datetime
) -> tuple[str, datetime.datetime, datetime.datetime]:
    """The budget period ``now`` falls in: its label, start and end (UTC)."""
    day = now.replace(hour=0, minute=0, second=0, microsecond=0)
    if key.budget_period == "day":
        return day.strftime("%Y%m%d"), day, day + datetime.timedelta(days=1)
    start = day.replace(day=1)
    end = (start + datetime.timedelta(days=32)).replace(day=1)
    return start.strftime("%Y%m"), start, end


def cost_of(alias: ModelAlias, prompt_tokens: int, completion_tokens: int) -> Decimal:
    """USD for these tokens at ``alias``'s prices (per million tokens)."""
    return (prompt_tokens * alias.input_price + completion_tokens * alias.output_price) / MICRO


@dataclass
class Admission:
    """What an admitted request reserved, given back or made exact by :meth:`settle`.

    ``key_windows`` are the key's per-minute limits, ``alias_windows`` those the
    alias it is served by sets for each key.
    """

    key: ApiKey | None
    alias: ModelAlias
    key_windows: list[Window] = field(default_factory=list)
    alias_windows: list[Window] = field(default_factory=list)
    concurrency_key: str | None = None
    budget_keys: dict[str, tuple[str, int]] = field(default_factory=dict)
    headers: dict[str, str] = field(default_factory=dict)
    settled: bool = False

    async def switch(self, alias: ModelAlias, estimated_tokens: int) -> None:
        """Move the request, before it used anything, to ``alias`` (a fallback): reserve it
        under ``alias``'s own limits (OpenAI's 429 if they would be passed, leaving this
        admission as it was), then give back the tokens the previous alias reserved.

        The request stays counted once against the key, and once against each alias
        it was sent to. Its cost will be counted at ``alias``'s prices.
        """
        windows = await _reserve(self, _alias_scope(self.key, alias), alias, estimated_tokens)
        await _give_back(window for window in self.alias_windows if window.name == "tokens")
        self.alias, self.alias_windows = alias, windows

    async def settle(self, prompt_tokens: int, completion_tokens: int) -> None:
        """Count what the request really used; free its slot. Once only."""
        if self.settled:
            return
        self.settled = True
        store = counters()
        total = prompt_tokens + completion_tokens
        for window in (*self.key_windows, *self.alias_windows):
            if window.name == "tokens":
                await store.add(window.key, total - window.reserved, 120)
        if self.concurrency_key:
            await store.add(self.concurrency_key, -1, _CONCURRENCY_TTL)
        used = {
            "tokens": total,
            "cost": int(cost_of(self.alias, prompt_tokens, completion_tokens) * MICRO),
        }
        for kind, (counter, ttl) in self.budget_keys.items():
            if used[kind]:
                await store.add(counter, used[kind], ttl)


async def admit(key: ApiKey | None, alias: ModelAlias, estimated_tokens: int) -> Admission:
    """Reserve one request of ``estimated_tokens`` for ``key`` on ``alias``, or raise 429.

    With no key (an admin's trial) only ``alias``'s limits apply, counted as for one
    more key of its own: no key's limits, budgets or slots are touched.
    """
    admission = Admission(key, alias)
    if key is not None:
        await _check_budgets(admission, key)
        admission.key_windows = await _reserve(admission, _key_scope(key), key, estimated_tokens)
    try:
        admission.alias_windows = await _reserve(
            admission, _alias_scope(key, alias), alias, estimated_tokens
        )
        if key is not None and key.max_concurrent is not None:
            slot = _in_flight(key)
            admitted, _ = await counters().reserve(slot, 1, key.max_concurrent, _CONCURRENCY_TTL)
            if not admitted:
                raise rate_limited(
                    f"Too many requests in flight for this key: limit {key.max_concurrent}.",
                    "requests",
                    1,
                    admission.headers,
                )
            admission.concurrency_key = slot
    except APIError:  # a refused request uses nothing
        await _give_back((*admission.key_windows, *admission.alias_windows))
        raise
    return admission


async def _reserve(
    admission: Admission, scope: str, source: ApiKey | ModelAlias, estimated_tokens: int
) -> list[Window]:
    """Reserve one request and ``estimated_tokens`` in the per-minute windows ``source``
    limits under ``scope``: all of them, or none and OpenAI's 429. Their headers go to
    ``admission``."""
    now = time.time()
    minute = int(now // 60)
    reset_in = (minute + 1) * 60 - now
    taken: list[Window] = []
    for name, limit, amount in (
        ("requests", source.requests_per_minute, 1),
        ("tokens", source.tokens_per_minute, estimated_tokens),
    ):
        if limit is None:
            continue
        window = Window(name, _window(scope, name, minute), limit, reserved=amount)
        admitted, window.used = await counters().reserve(window.key, amount, limit, 120)
        admission.headers.update(window.headers(reset_in))
        if not admitted:
            await _give_back(taken)
            raise rate_limited(
                f"Rate limit reached for {name} per minute: limit {limit},"
                f" used {window.used}, requested {amount}.",
                name,
                reset_in,
                admission.headers,
            )
        taken.append(window)
    return taken


async def _give_back(windows: Iterable[Window]) -> None:
    """Take back what this request reserved in ``windows``."""
    store = counters()
    for window in windows:
        await store.add(window.key, -window.reserved, 120)


@dataclass(frozen=True)
class Budget:
    """A key's token or cost budget in the current period (cost in micro-dollars)."""

    kind: str  # "tokens" or "cost"
    counter: str
    limit: int
    used: int
    ttl: int
    resets_in: float


async def _budgets(key: ApiKey) -> list[Budget]:
    if key.token_budget is None and key.cost_budget is None:
        return []
    now = datetime.datetime.now(datetime.UTC)
    label, start, end = _period(key, now)
    ttl = int((end - now).total_seconds()) + 3600
    spent = RequestLog.objects.filter(api_key=key, created_at__gte=start, created_at__lt=end)
    store = counters()
    budgets = []
    for kind, limit, column, scale in (
        ("tokens", key.token_budget, "total_tokens", 1),
        ("cost", None if key.cost_budget is None else int(key.cost_budget * MICRO), "cost", MICRO),
    ):
        if limit is not None:
            counter = f"cp:budget:{key.pk}:{kind}:{label}"
            used = await store.get_or_seed(counter, await _spent(spent, column, scale), ttl)
            budgets.append(Budget(kind, counter, limit, used, ttl, (end - now).total_seconds()))
    return budgets


async def _check_budgets(admission: Admission, key: ApiKey) -> None:
    for budget in await _budgets(key):
        if budget.used >= budget.limit:
            raise insufficient_quota(budget.resets_in)
        admission.budget_keys[budget.kind] = (budget.counter, budget.ttl)


async def _spent(rows: Any, column: str, scale: Any) -> int:
    """What the request log says was spent: the seed of a budget counter the cache lost."""
    total = (await rows.aaggregate(total=Sum(column)))["total"]
    return int((total or 0) * scale)


async def standing(key: ApiKey) -> list[tuple[str, str, str]]:
    """What ``key`` has used of each of its limits right now: (limit, used, allowed)."""
    store = counters()
    minute = int(time.time() // 60)
    rows = []
    for name, limit in (("requests", key.requests_per_minute), ("tokens", key.tokens_per_minute)):
        if limit is not None:
            used = await store.get_or_seed(_window(_key_scope(key), name, minute), 0, 120)
            rows.append((f"{name} this minute", str(used), str(limit)))
    if key.max_concurrent is not None:
        in_flight = await store.get_or_seed(_in_flight(key), 0, _CONCURRENCY_TTL)
        rows.append(("requests in flight", str(in_flight), str(key.max_concurrent)))
    for budget in await _budgets(key):
        period = f"{budget.kind} this {key.budget_period}"
        if budget.kind == "cost":
            rows.append((period, f"${budget.used / MICRO:.4f}", f"${budget.limit / MICRO:.4f}"))
        else:
            rows.append((period, str(budget.used), str(budget.limit)))
    return rows


def _key_scope(key: ApiKey) -> str:
    return f"cp:rl:{key.pk}"


def _alias_scope(key: ApiKey | None, alias: ModelAlias) -> str:
    return f"cp:rl:{'admin' if key is None else key.pk}:a{alias.pk}"


def _window(scope: str, name: str, minute: int) -> str:
    return f"{scope}:{name[0]}:{minute}"


def _in_flight(key: ApiKey) -> str:
    return f"cp:rl:{key.pk}:inflight"
