"""Rate limits and budgets, reserved atomically across processes and machines.

Per key: requests and tokens per minute, requests in flight, and a token or
cost budget per day or month; per key and alias: requests and tokens per
minute, set on the alias. Counters live in Redis when
``CHATPARITY["REDIS_URL"]`` is set, else in Django's default cache (which
must be shared by every worker: Redis or memcached, not local memory, once
there is more than one process).

A request is admitted by :func:`admit`, which reserves everything it may use
before it runs: one request, for each choice its prompt (as the backend counts
it, else at the bound no tokenizer passes) and its completion cap (``max_tokens``,
else :func:`completion_cap`) in every tokens-per-minute window and the token
budget, that many tokens at the alias's prices in the cost budget, and a slot in
flight. Either all of it is reserved or none, with OpenAI's 429
(in Redis one Lua script does it, so concurrent workers can never pass a limit
together); a request with no key, an admin's trial, passes only the alias's
limits, as one more client of its own. :meth:`Admission.switch` moves it to a
fallback alias, under that alias's own limits; :meth:`Admission.settle` puts
what was really used in place of the reservation and frees the slot.

A slot in flight is a lease: a member of the key's set with a deadline
:data:`LEASE_SECONDS` ahead, renewed by each worker for its live requests
every :data:`RENEW_SECONDS`, dropped by the next admission once past its
deadline. A worker that dies leaves its slots for at most ``LEASE_SECONDS``.

When the counters cannot be reached (Redis stopped or frozen: every call has a
one-second time-out, and after a failure the store is left alone for a second),
``CHATPARITY["LIMITS_WHEN_UNAVAILABLE"]`` decides: ``"open"`` serves limited
keys unreserved, ``"closed"`` refuses them with a 503 ``service_unavailable``.
Either way it is logged once a minute, not per request, and settling never
raises.

Minute windows are fixed windows of the UTC clock, as OpenAI's reset headers
suggest.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import logging
import math
import time
import uuid
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field, replace
from decimal import Decimal
from typing import Any, NamedTuple, Protocol

from asgiref.sync import sync_to_async
from django.core.cache import DEFAULT_CACHE_ALIAS, cache, caches
from django.core.cache.backends.locmem import LocMemCache
from django.db import DatabaseError
from django.db.models import QuerySet, Sum
from django.utils.formats import number_format

from .. import signals
from ..conf import app_settings
from ..models import COST_PRECISION, ApiKey, DailyKeyUsage, ModelAlias, Plan
from ..protocol.errors import APIError
from ..protocol.events import Usage
from ..protocol.request import ChatRequest
from .batching import OncePerInterval, PerLoop

logger = logging.getLogger(__name__)

# Cost counters count hundredths of a millionth of a dollar (COST_PRECISION), as integers:
# a request's count is its row's cost exactly, however cheap (an embedding's 4e-7 USD).
COST_UNITS = Decimal(100_000_000)  # 1 / COST_PRECISION
LEASE_SECONDS = 30.0  # a slot not renewed for this long is free again
RENEW_SECONDS = 10.0  # how often a worker renews the slots of its live requests
# The completion tokens reserved per choice when neither the request nor its alias
# sets max_tokens and the backend's context window is unknown.
DEFAULT_COMPLETION_CAP = 4096
REDIS_TIMEOUT = 1.0  # seconds any call to the counters' Redis may take
_RESTING_SECONDS = 1.0  # after a failure the store is not tried again for this long
_LOG_INTERVAL = 60.0  # an outage is logged once per cause per interval
_WINDOW_TTL = 120


class Unavailable(Exception):
    """The counters' store cannot be reached."""


@dataclass
class Change:
    """One counter moved by ``amount``: refused if the result would pass ``limit``
    (None: never refused). ``seeded``: a budget, whose counter must exist (seeded
    from the log) before it is checked."""

    counter: str
    amount: int
    limit: int | None
    ttl: int
    seeded: bool = False


@dataclass
class Lease:
    """The slots in flight one request takes of a key that allows ``limit``: ``count``
    of them, one per choice it asks for. In Redis, one ``member`` of the set ``slots``
    whose name ends in ``:count``."""

    slots: str
    limit: int
    count: int = 1
    member: str = ""
    held: list[str] = field(default_factory=list)  # the cache keys of its slots, in the cache

    def __post_init__(self) -> None:
        if not self.member:
            self.member = f"{uuid.uuid4().hex}:{self.count}"


@dataclass(frozen=True)
class Refusal:
    """Why a reservation was refused: the change at ``index`` would pass its limit
    (``value`` is the counter), or the lease's set is full, or a budget counter
    is missing (``unseeded``)."""

    index: int  # -1: the lease
    value: int
    unseeded: bool = False


class Counters(Protocol):
    """Integer counters with a time to live, and sets of leases."""

    async def reserve(
        self, changes: Sequence[Change], lease: Lease | None
    ) -> tuple[Refusal | None, list[int]]:
        """Apply every change and take the lease, or none of it: (refusal, values now)."""

    async def settle(self, amounts: Sequence[tuple[str, int]], lease: Lease | None) -> None:
        """Add each amount to its counter where it still exists; give the lease back."""

    async def renew(self, leases: Sequence[Lease]) -> None:
        """Move the deadlines of ``leases`` (those not yet expired) ``LEASE_SECONDS`` ahead."""

    async def seed(self, counter: str, value: int, ttl: int) -> None:
        """Create ``counter`` with ``value`` unless it exists."""

    async def values(self, counters: Sequence[str]) -> list[int]:
        """The counters (0 when missing)."""

    async def in_flight(self, slots: str, limit: int) -> int:
        """The live leases in ``slots``."""


# A lease's member is named "<id>:<slots it takes>".
_WEIGHT = """
local function weight(member) return tonumber(string.match(member, ':(%d+)$')) or 1 end
"""
_RESERVE = (
    _WEIGHT
    + """
local n = tonumber(ARGV[1])
local values = {}
for i = 1, n do
  local at = 2 + (i - 1) * 4
  local raw = redis.call('GET', KEYS[i])
  if not raw and ARGV[at + 3] == '1' then return {2, i - 1, 0} end
  local value = tonumber(raw or '0')
  local amount, limit = tonumber(ARGV[at]), tonumber(ARGV[at + 1])
  if limit >= 0 and amount > 0 and value + amount > limit then return {1, i - 1, value} end
  values[i] = value
end
if #KEYS > n then
  local slots, at = KEYS[n + 1], 2 + n * 4
  local clock = redis.call('TIME')
  local now = tonumber(clock[1]) * 1000 + math.floor(tonumber(clock[2]) / 1000)
  redis.call('ZREMRANGEBYSCORE', slots, '-inf', now)
  local live = 0
  for _, member in ipairs(redis.call('ZRANGE', slots, 0, -1)) do live = live + weight(member) end
  if live + weight(ARGV[at]) > tonumber(ARGV[at + 1]) then return {1, -1, live} end
  redis.call('ZADD', slots, now + tonumber(ARGV[at + 2]), ARGV[at])
  redis.call('PEXPIRE', slots, 2 * tonumber(ARGV[at + 2]))
end
local result = {0, 0, 0}
for i = 1, n do
  local at = 2 + (i - 1) * 4
  if tonumber(ARGV[at]) ~= 0 then
    values[i] = redis.call('INCRBY', KEYS[i], ARGV[at])
    redis.call('EXPIRE', KEYS[i], ARGV[at + 2], 'NX')
  end
  result[3 + i] = values[i]
end
return result
"""
)
_SETTLE = """
local n = #KEYS
if ARGV[1] ~= '' then
  redis.call('ZREM', KEYS[n], ARGV[1])
  n = n - 1
end
for i = 1, n do
  if redis.call('EXISTS', KEYS[i]) == 1 then redis.call('INCRBY', KEYS[i], ARGV[i + 1]) end
end
"""
_RENEW = """
local clock = redis.call('TIME')
local now = tonumber(clock[1]) * 1000 + math.floor(tonumber(clock[2]) / 1000)
local lease = tonumber(ARGV[1])
for i = 1, #KEYS do
  redis.call('ZADD', KEYS[i], 'XX', 'GT', now + lease, ARGV[i + 1])
  redis.call('PEXPIRE', KEYS[i], 2 * lease)
end
"""
_IN_FLIGHT = (
    _WEIGHT
    + """
local clock = redis.call('TIME')
local now = tonumber(clock[1]) * 1000 + math.floor(tonumber(clock[2]) / 1000)
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
local live = 0
for _, member in ipairs(redis.call('ZRANGE', KEYS[1], 0, -1)) do live = live + weight(member) end
return live
"""
)


class _Resting:
    """A store that failed is left alone for a moment: while Redis is frozen, one
    request in a second waits for its time-out instead of every request."""

    def __init__(self) -> None:
        self._until = 0.0

    def check(self) -> None:
        if time.monotonic() < self._until:
            raise Unavailable("resting after a failure")

    def failed(self) -> None:
        self._until = time.monotonic() + _RESTING_SECONDS


class RedisCounters:
    """Counters in Redis, each reservation or settlement one Lua script: atomic
    across machines. Calls time out after :data:`REDIS_TIMEOUT`; a pooled connection
    that died is replaced and the call tried once more."""

    def __init__(self, url: str) -> None:
        self.url = url
        self._resting = _Resting()
        # A client per event loop: redis.asyncio connections cannot move between loops.
        self._clients: PerLoop[Any] = PerLoop(self._connect)

    def _connect(self) -> Any:
        from redis.asyncio import Redis
        from redis.asyncio.retry import Retry
        from redis.backoff import NoBackoff
        from redis.exceptions import ConnectionError

        return Redis.from_url(
            self.url,
            socket_timeout=REDIS_TIMEOUT,
            socket_connect_timeout=REDIS_TIMEOUT,
            health_check_interval=30,
            # Only a refused or broken connection is retried: a script that timed
            # out may have run, and must not run twice.
            retry=Retry(NoBackoff(), 1, supported_errors=(ConnectionError,)),
        )

    async def ping(self) -> None:
        """Raise unless Redis answers (within :data:`REDIS_TIMEOUT`)."""
        await self._clients.get().ping()

    async def run(self, script: str, keys: Sequence[str], args: Sequence[Any]) -> Any:
        """Run another module's Lua ``script`` here (the deployments' state), with the
        same time-out and rest after a failure; :class:`Unavailable` if it fails so."""
        return await self._eval(script, keys, args)

    async def _eval(self, script: str, keys: Sequence[str], args: Sequence[Any]) -> Any:
        from redis.exceptions import ConnectionError, TimeoutError

        self._resting.check()
        try:
            return await self._clients.get().eval(script, len(keys), *keys, *args)
        except (ConnectionError, TimeoutError, OSError) as exc:
            self._resting.failed()
            raise Unavailable(str(exc)) from exc

    async def reserve(
        self, changes: Sequence[Change], lease: Lease | None
    ) -> tuple[Refusal | None, list[int]]:
        keys = [change.counter for change in changes]
        args: list[Any] = [len(changes)]
        for change in changes:
            limit = -1 if change.limit is None else change.limit
            args += [change.amount, limit, change.ttl, int(change.seeded)]
        if lease is not None:
            keys.append(lease.slots)
            args += [lease.member, lease.limit, int(LEASE_SECONDS * 1000)]
        status, index, value, *values = await self._eval(_RESERVE, keys, args)
        if status:
            return Refusal(int(index), int(value), unseeded=status == 2), []
        return None, [int(v) for v in values]

    async def settle(self, amounts: Sequence[tuple[str, int]], lease: Lease | None) -> None:
        keys = [counter for counter, _ in amounts]
        args: list[Any] = ["" if lease is None else lease.member]
        args += [amount for _, amount in amounts]
        if lease is not None:
            keys.append(lease.slots)
        await self._eval(_SETTLE, keys, args)

    async def renew(self, leases: Sequence[Lease]) -> None:
        args: list[Any] = [int(LEASE_SECONDS * 1000), *(lease.member for lease in leases)]
        await self._eval(_RENEW, [lease.slots for lease in leases], args)

    async def seed(self, counter: str, value: int, ttl: int) -> None:
        await self._eval("return redis.call('SET', KEYS[1], ARGV[1], 'EX', ARGV[2], 'NX')",
                         [counter], [value, ttl])  # fmt: skip

    async def values(self, counters: Sequence[str]) -> list[int]:
        script = "return redis.call('MGET', unpack(KEYS))"
        return [int(value or 0) for value in await self._eval(script, counters, [])]

    async def in_flight(self, slots: str, limit: int) -> int:
        return int(await self._eval(_IN_FLIGHT, [slots], []))


class CacheCounters:
    """Counters in Django's default cache, as atomic as the cache allows: each counter
    changes by the cache's ``incr`` (atomic in Redis, memcached and local memory), and a
    reservation that would pass a limit is taken back, so a race can refuse a request
    that would have fitted, never admit one that does not; but a reservation across
    several counters is not one step. A slot in flight is one of ``limit`` cache keys,
    claimed with ``add`` (atomic) for ``LEASE_SECONDS`` and renewed with ``touch``; a
    slot that expires between a renewal's read and its touch may be renewed for
    another request."""

    def __init__(self) -> None:
        self._resting = _Resting()

    async def call(self, function: Callable[..., Any], *args: Any) -> Any:
        """Call ``function(*args)`` on Django's cache for another module (the deployments'
        state), resting after a failure; :class:`Unavailable` if it fails so."""
        return await self._call(function, *args)

    async def _call(self, function: Callable[..., Any], *args: Any) -> Any:
        self._resting.check()
        try:
            return await _sync(function, *args)
        except Exception as exc:  # each cache backend raises its own errors
            self._resting.failed()
            raise Unavailable(repr(exc)) from exc

    async def reserve(
        self, changes: Sequence[Change], lease: Lease | None
    ) -> tuple[Refusal | None, list[int]]:
        for index, change in enumerate(changes):
            if change.seeded and await self._call(cache.get, change.counter) is None:
                return Refusal(index, 0, unseeded=True), []
        values: list[int] = []
        for index, change in enumerate(changes):
            value = await self._call(_add, change.counter, change.amount, change.ttl)
            values.append(value)
            if change.limit is not None and change.amount > 0 and value > change.limit:
                await self._undo(changes[: index + 1])
                return Refusal(index, value - change.amount), []
        if lease is not None:
            lease.held = await self._call(_claim, lease)
            if not lease.held:
                await self._undo(changes)
                return Refusal(-1, lease.limit), []
        return None, values

    async def _undo(self, changes: Sequence[Change]) -> None:
        for change in changes:
            await self._call(_add, change.counter, -change.amount, change.ttl)

    async def settle(self, amounts: Sequence[tuple[str, int]], lease: Lease | None) -> None:
        if lease is not None:
            for slot in lease.held:
                await self._call(_release, slot, lease.member)
        for counter, amount in amounts:
            await self._call(_add_if_present, counter, amount)

    async def renew(self, leases: Sequence[Lease]) -> None:
        for lease in leases:
            for slot in lease.held:
                await self._call(_touch, slot, lease.member)

    async def seed(self, counter: str, value: int, ttl: int) -> None:
        await self._call(cache.add, counter, value, ttl)

    async def values(self, counters: Sequence[str]) -> list[int]:
        found = await self._call(cache.get_many, counters)
        return [int(found.get(counter, 0)) for counter in counters]

    async def in_flight(self, slots: str, limit: int) -> int:
        return len(await self._call(cache.get_many, _slot_keys(slots, limit)))


def _add(key: str, amount: int, ttl: int) -> int:
    while True:
        cache.add(key, 0, ttl)
        try:
            return int(cache.incr(key, amount))
        except ValueError:  # expired between the two calls
            continue


def _add_if_present(key: str, amount: int) -> None:
    with contextlib.suppress(ValueError):  # expired, or a budget seeded later from the log
        cache.incr(key, amount)


def _slot_keys(slots: str, limit: int) -> list[str]:
    return [f"{slots}:{index}" for index in range(limit)]


def _claim(lease: Lease) -> list[str]:
    """The slots claimed for ``lease``: all ``count`` of them, or none."""
    held: list[str] = []
    for slot in _slot_keys(lease.slots, lease.limit):
        if cache.add(slot, lease.member, LEASE_SECONDS):
            held.append(slot)
            if len(held) == lease.count:
                return held
    for slot in held:
        _release(slot, lease.member)
    return []


def _touch(slot: str, member: str) -> None:
    if cache.get(slot) == member:
        cache.touch(slot, LEASE_SECONDS)


def _release(slot: str, member: str) -> None:
    if cache.get(slot) == member:
        cache.delete(slot)


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


# -- leases renewed while their requests live -----------------------------------


class _Renewer:
    """The live leases of this event loop, renewed every ``RENEW_SECONDS`` by one task
    that runs while there are any."""

    def __init__(self) -> None:
        self.leases: dict[str, tuple[Counters, Lease]] = {}
        self._task: asyncio.Task[None] | None = None

    def add(self, store: Counters, lease: Lease) -> None:
        self.leases[lease.member] = (store, lease)
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._run())

    def remove(self, lease: Lease) -> None:
        self.leases.pop(lease.member, None)
        if not self.leases and self._task is not None:
            self._task.cancel()
            self._task = None

    async def _run(self) -> None:
        while self.leases:
            await asyncio.sleep(RENEW_SECONDS)
            by_store: dict[int, tuple[Counters, list[Lease]]] = {}
            for store, lease in list(self.leases.values()):
                by_store.setdefault(id(store), (store, []))[1].append(lease)
            for store, leases in by_store.values():
                try:
                    await store.renew(leases)
                except Unavailable as exc:
                    _outage_log.warning("chatparity: slots in flight not renewed: %s", exc)


_renewers = PerLoop(_Renewer)
"""This event loop's renewer."""

# During an outage every request fails the same way: one line per cause per interval.
_outage_log = OncePerInterval(logger, interval=_LOG_INTERVAL)


# -- the rules ----------------------------------------------------------------


def _reset(seconds: float) -> str:
    """A duration as OpenAI's reset headers write it: ``17ms``, ``12s``, ``6m0s``."""
    if seconds < 1:
        return f"{max(1, round(seconds * 1000))}ms"
    minutes, rest = divmod(math.ceil(seconds), 60)
    return f"{minutes}m{rest}s" if minutes else f"{rest}s"


def rate_limited(message: str, kind: str, retry_after: float, headers: dict[str, str]) -> APIError:
    """OpenAI's 429 for a limit of ``kind`` (``requests`` or ``tokens``)."""
    error = APIError(message, status=429, type=kind, code="rate_limit_exceeded")
    error.headers = {**headers, "retry-after": str(max(1, math.ceil(retry_after)))}
    return error


def insufficient_quota(retry_after: float, detail: str = "") -> APIError:
    """OpenAI's 429 for a spent budget, followed by ``detail`` (which budget, how much)."""
    error = APIError(
        "You exceeded your current quota, please check your plan and billing details."
        + (f" {detail}" if detail else ""),
        status=429,
        type="insufficient_quota",
        code="insufficient_quota",
    )
    error.headers = {"retry-after": str(max(1, math.ceil(retry_after)))}
    return error


def limits_unavailable() -> APIError:
    """The 503 a limited key gets while its limits cannot be checked (fail-closed)."""
    error = APIError(
        "The rate limiter is unavailable at the moment; please retry shortly.",
        status=503,
        type="server_error",
        code="service_unavailable",
    )
    error.headers = {"retry-after": "1"}
    return error


def _period(
    period: str, now: datetime.datetime
) -> tuple[str, datetime.datetime, datetime.datetime]:
    """The budget period (``day`` or ``month``) ``now`` falls in: its label, start and
    end (UTC)."""
    day = now.replace(hour=0, minute=0, second=0, microsecond=0)
    if period == "day":
        return day.strftime("%Y%m%d"), day, day + datetime.timedelta(days=1)
    start = day.replace(day=1)
    end = (start + datetime.timedelta(days=32)).replace(day=1)
    return start.strftime("%Y%m"), start, end


def completion_cap(alias: ModelAlias) -> int:
    """The completion tokens one choice may use on ``alias`` when the request sets no
    ``max_tokens`` (nor does the alias's defaults): the model's own cap on its output
    (``max_output_tokens``), else the alias's context window, else the local model's
    ``n_ctx``, else :data:`DEFAULT_COMPLETION_CAP`."""
    if alias.max_output_tokens:
        return int(alias.max_output_tokens)
    if alias.context_window:
        return int(alias.context_window)
    if alias.backend.kind == "local":
        options = {**app_settings.LOCAL_MODEL, **(alias.backend.options or {})}
        return int(options["n_ctx"])
    return DEFAULT_COMPLETION_CAP


@dataclass(frozen=True)
class Estimate:
    """What a request may use, as reserved at admission: its prompt once for each choice
    (an upstream that answers one choice a call is sent it as many times)."""

    prompt_tokens: int
    completion_tokens: int
    choices: int = 1
    """The slots in flight it takes: a choice is generated as a request is."""
    fits: bool = False
    """The request set no ``max_tokens``: its completion may be cut to what a limit has
    left (:meth:`fitted`), down to one token a choice."""
    completion_limit: int | None = None
    """The completion tokens a choice may use once cut: the backend is told."""

    @property
    def total(self) -> int:
        return self.prompt_tokens + self.completion_tokens

    @property
    def prompt_per_choice(self) -> int:
        """The prompt of one upstream call."""
        return self.prompt_tokens // self.choices

    @classmethod
    def of(cls, chat: ChatRequest, alias: ModelAlias, prompt_tokens: int) -> Estimate:
        """For each choice the prompt (``prompt_tokens``: counted by the backend, or its
        bound) and ``max_tokens`` or the cap."""
        prompt = prompt_tokens * chat.n
        if chat.max_tokens is not None:
            return cls(prompt, chat.max_tokens * chat.n, chat.n)
        return cls(prompt, completion_cap(alias) * chat.n, chat.n, fits=True)

    def fitted(self, charge: Charge, used: int, alias: ModelAlias | None) -> Estimate | None:
        """This estimate with its completion cut to what ``charge``'s limit has left (its
        counter at ``used``, without this request's own reservation), when the request set
        no ``max_tokens``, the limit counts tokens or cost, and at least one token a choice
        is left; else None."""
        if not self.fits or charge.kind == "requests":
            return None
        left = charge.limit - used
        if charge.kind == "tokens":
            completion = left - self.prompt_tokens
        elif alias is not None:
            completion = _affordable(alias, self.prompt_tokens, left)
        else:
            return None
        per_choice = completion // self.choices
        if per_choice < 1 or per_choice * self.choices >= self.completion_tokens:
            return None
        return replace(self, completion_tokens=per_choice * self.choices,
                       completion_limit=per_choice)  # fmt: skip


def _most_cost(alias: ModelAlias, prompt_tokens: int, completion_tokens: int) -> Decimal:
    """The most a request of these tokens can be charged on ``alias`` (USD): every prompt
    token written to the provider's cache for the longest lifetime, at the usual prices
    (:meth:`~chatparity.models.Prices.dearest`)."""
    return alias.cost_of(alias.prices.dearest(prompt_tokens, completion_tokens))


def _affordable(alias: ModelAlias, prompt_tokens: int, cost_units: int) -> int:
    """The completion tokens ``cost_units`` (:data:`COST_UNITS`) pay for on ``alias``,
    with the prompt."""
    left = cost_units - _most_cost(alias, prompt_tokens, 0) * COST_UNITS
    per_token = alias.cost_of(Usage(0, 1)) * COST_UNITS
    return int(left // per_token) if per_token > 0 else 0


NOTHING = Estimate(0, 0)
"""What a request that generates nothing reserves: it reads what its key stored, or
names no model it may use. Counted as a request, in flight while it lasts."""


@dataclass
class Charge:
    """One counter this request reserved in: a minute window (``requests`` or
    ``tokens``), or a budget (``tokens`` or ``cost`` in :data:`COST_UNITS`)."""

    kind: str
    counter: str
    limit: int
    reserved: int
    ttl: int
    budget: bool = False
    resets_in: float = 0.0

    def headers(self, used: int) -> dict[str, str]:
        return {
            f"x-ratelimit-limit-{self.kind}": str(self.limit),
            f"x-ratelimit-remaining-{self.kind}": str(max(0, self.limit - used)),
            f"x-ratelimit-reset-{self.kind}": _reset(self.resets_in),
        }


@dataclass
class Admission:
    """What an admitted request reserved, made exact by :meth:`settle`."""

    key: ApiKey | None
    alias: ModelAlias | None  # None: under the key's own limits alone
    store: Counters
    charges: list[Charge] = field(default_factory=list)
    lease: Lease | None = None
    headers: dict[str, str] = field(default_factory=dict)
    settled: bool = False
    completion_limit: int | None = None
    """The completion tokens a choice may use, when its limits cut what a request that set
    no ``max_tokens`` reserved (:meth:`Estimate.fitted`): the backend is told."""

    async def switch(self, alias: ModelAlias | None, estimate: Estimate) -> None:
        """Move the request, before it used anything, to ``alias`` (a fallback): reserve it
        under ``alias``'s own limits and budgets at its prices (OpenAI's 429 if they would
        be passed, leaving this admission as it was), and give back the tokens the
        previous alias reserved, in one step.

        The request stays counted once against the key, and once against each alias
        it was sent to. Its cost will be counted at ``alias``'s prices.
        """
        held = {charge.counter: charge.reserved for charge in self.charges}

        def changes(planned: list[Charge]) -> list[Change]:
            kept = {charge.counter for charge in planned}
            return [
                Change(c.counter, c.reserved - held.get(c.counter, 0), c.limit, c.ttl, c.budget)
                for c in planned
            ] + [
                Change(charge.counter, -charge.reserved, None, charge.ttl)
                for charge in self.charges
                if charge.counter not in kept and charge.kind == "tokens" and charge.reserved
            ]

        planned = _plan(self.key, alias, estimate)
        if not changes(planned):
            self.charges, self.completion_limit = planned, estimate.completion_limit
        elif reserved := await _reserve(self, alias, estimate, planned, changes, None, held):
            self.charges, self.completion_limit = reserved
        self.alias = alias

    async def settle(self, usage: Usage) -> None:
        """Count what the request really used (``usage``, at the alias's prices) in place
        of its reservation and give its slot back: once only. A store that cannot be
        reached is logged (once a minute), never raised: the slot expires on its own, the
        reservation with its window."""
        if self.settled:
            return
        self.settled = True
        if self.lease is not None:
            _renewers.get().remove(self.lease)
        used = {
            "requests": 1,
            "tokens": usage.total_tokens,
            "cost": 0 if self.alias is None else _units(self.alias.cost_of(usage)),
        }
        amounts = [
            (charge.counter, used[charge.kind] - charge.reserved)
            for charge in self.charges
            if used[charge.kind] != charge.reserved
        ]
        if not amounts and self.lease is None:
            return
        try:
            await self.store.settle(amounts, self.lease)
        except Unavailable as exc:
            _outage_log.warning("chatparity: limits not settled (counters unavailable): %s", exc)


async def admit(key: ApiKey | None, alias: ModelAlias | None, estimate: Estimate) -> Admission:
    """Reserve one request of ``estimate`` for ``key`` on ``alias``, or raise 429.

    With no key (an admin's trial) only ``alias``'s limits apply, counted as for one
    more key of its own: no key's limits, budgets or slots are touched. With no alias
    (a request that reads stored responses, or names no model it may use) only the
    key's windows and slots in flight apply, and no budget.
    """
    admission = Admission(key, alias, counters())
    if not _limited(key, alias):
        return admission
    lease = None
    if key is not None and key.max_concurrent is not None:
        lease = Lease(_in_flight(key), key.max_concurrent, estimate.choices)

    def changes(charges: list[Charge]) -> list[Change]:
        return [Change(c.counter, c.reserved, c.limit, c.ttl, seeded=c.budget) for c in charges]

    charges = _plan(key, alias, estimate)
    if not charges and lease is None:
        return admission
    reserved = await _reserve(admission, alias, estimate, charges, changes, lease, {})
    if reserved is not None:
        (admission.charges, admission.completion_limit), admission.lease = reserved, lease
        if lease is not None:
            _renewers.get().add(admission.store, lease)
    else:  # served unreserved: what it uses is counted when it ends
        for charge in charges:
            charge.reserved = 0
        admission.charges = charges
    return admission


async def _reserve(
    admission: Admission,
    alias: ModelAlias | None,
    estimate: Estimate,
    charges: list[Charge],
    changes: Callable[[list[Charge]], list[Change]],
    lease: Lease | None,
    held: dict[str, int],
) -> tuple[list[Charge], int | None] | None:
    """Reserve ``estimate`` on ``alias`` (its ``charges``, applied as ``changes`` makes
    them; ``held``: what the request holds already in each counter) and take ``lease``,
    or raise the 429 of the limit that refuses it. A request that set no ``max_tokens`` is
    reserved again with its completion cut to what the refusing limit has left, while
    one token a choice is left.

    The charges reserved and the completion limit of a choice (when cut); None: the
    store is unavailable and the policy serves the request unreserved (else its 503)."""
    store = admission.store
    seeded: set[str] = set()
    try:
        while True:
            refusal, values = await store.reserve(changes(charges), lease)
            if refusal is not None and refusal.unseeded:
                counter = charges[refusal.index].counter
                if counter in seeded:
                    raise _keeps_nothing(counter)
                seeded.add(counter)
                await _seed(store, admission.key, charges[refusal.index])
                continue
            if refusal is None or refusal.index < 0:
                break
            refused = charges[refusal.index]
            fitted = estimate.fitted(refused, refusal.value - held.get(refused.counter, 0), alias)
            if fitted is None:
                break
            estimate, charges = fitted, _plan(admission.key, alias, fitted)
    except (Unavailable, DatabaseError) as exc:
        closed = app_settings.LIMITS_WHEN_UNAVAILABLE == "closed"
        policy = "refused" if closed else "served unchecked"
        _outage_log.warning("chatparity: limited keys %s (counters unavailable): %s", policy, exc)
        if closed:
            _count_refusal("unavailable")
            raise limits_unavailable() from exc
        return None
    if refusal is not None:
        raise _refused(admission, charges, refusal, lease, estimate)
    _note_headers(admission, charges, values)
    return charges, estimate.completion_limit


def _note_headers(admission: Admission, charges: list[Charge], values: list[int]) -> None:
    """The rate-limit headers: for requests and for tokens, the window with the least left."""
    remaining: dict[str, int] = {}
    for charge, used in zip(charges, values, strict=False):
        if charge.budget:
            continue
        if charge.kind not in remaining or charge.limit - used < remaining[charge.kind]:
            remaining[charge.kind] = charge.limit - used
            admission.headers.update(charge.headers(used))


def _count_refusal(kind: str) -> None:
    for observer in signals.observers:
        observer.rate_limited(kind)


def _refused(
    admission: Admission,
    charges: list[Charge],
    refusal: Refusal,
    lease: Lease | None,
    estimate: Estimate,
) -> APIError:
    if refusal.index < 0:
        _count_refusal("concurrent")
        limit = admission.key.max_concurrent if admission.key is not None else None
        count = lease.count if lease is not None else 1
        asked = f"; this request's {count} choices count as {count}" if count > 1 else ""
        return rate_limited(
            f"Too many requests in flight for this key: limit {limit}{asked}.",
            "requests",
            1,
            admission.headers,
        )
    charge = charges[refusal.index]
    # A request that set no max_tokens was cut to what was left, down to one token a choice.
    fitting = (
        " This request sets no max_tokens: it was offered what was left, less than its"
        f" prompt ({estimate.prompt_tokens} tokens) and one completion token a choice."
        if estimate.fits and charge.kind != "requests"
        else ""
    )
    if charge.budget:
        _count_refusal("budget")
        detail = _budget_refusal(admission.key, charge, refusal.value)
        return insufficient_quota(charge.resets_in, detail + fitting)
    _count_refusal(charge.kind)
    admission.headers.update(charge.headers(refusal.value))
    return rate_limited(
        f"Rate limit reached for {charge.kind} per minute: limit {charge.limit},"
        f" used {refusal.value}, requested {charge.reserved}.{fitting}",
        charge.kind,
        charge.resets_in,
        admission.headers,
    )


def _budget_refusal(key: ApiKey | None, charge: Charge, used: int) -> str:
    """Which budget refused a request, and what it asked of it."""
    budget = next(b for b in _budgets(key) if b.counter == charge.counter) if key else None
    name = budget.name if budget is not None else charge.kind
    if charge.kind == "cost":
        return (
            f"Budget: {name}, limit ${charge.limit / COST_UNITS}, used"
            f" ${used / COST_UNITS}, requested ${charge.reserved / COST_UNITS}."
        )
    return f"Budget: {name}, limit {charge.limit}, used {used}, requested {charge.reserved}."


def _limited(key: ApiKey | None, alias: ModelAlias | None) -> bool:
    """Whether any limit applies to ``key`` on ``alias`` (most requests: none, and
    planning nothing costs as much as a request's admission otherwise does)."""
    if alias is not None and (
        alias.requests_per_minute is not None or alias.tokens_per_minute is not None
    ):
        return True
    if key is None:
        return False
    plan = key.owner_plan
    return (
        key.requests_per_minute is not None
        or key.tokens_per_minute is not None
        or key.max_concurrent is not None
        or key.token_budget is not None
        or key.cost_budget is not None
        or (plan is not None and plan.has_owner_budget)
        or (plan is not None and key.needs_plan and plan.has_key_budget)
    )


def _plan(key: ApiKey | None, alias: ModelAlias | None, estimate: Estimate) -> list[Charge]:
    """Every counter a request of ``estimate`` on ``alias`` reserves in: the key's
    windows, its windows on the alias, then the key's budgets and its owner's."""
    now = time.time()
    minute = int(now // 60)
    reset_in = (minute + 1) * 60 - now
    charges = []
    scopes: list[tuple[str, ApiKey | ModelAlias]] = []
    if key is not None:
        scopes.append((_key_scope(key), key))
    if alias is not None:  # else only the key's windows: nothing is spent
        scopes.append((_alias_scope(key, alias), alias))
    for scope, source in scopes:
        for kind, limit, amount in (
            ("requests", source.requests_per_minute, 1),
            ("tokens", source.tokens_per_minute, estimate.total),
        ):
            if limit is not None:
                counter = _window(scope, kind, minute)
                charges.append(Charge(kind, counter, limit, amount, _WINDOW_TTL,
                                      resets_in=reset_in))  # fmt: skip
    if key is not None and alias is not None:
        cost = _most_cost(alias, estimate.prompt_tokens, estimate.completion_tokens) * COST_UNITS
        for budget in _budgets(key):
            amount = estimate.total if budget.kind == "tokens" else math.ceil(cost)
            charges.append(Charge(budget.kind, budget.counter, budget.limit, amount, budget.ttl,
                                  budget=True, resets_in=budget.resets_in))  # fmt: skip
    return charges


@dataclass(frozen=True)
class Budget:
    """A token or cost budget in the current period (cost in :data:`COST_UNITS`): a key's,
    its owner's (which all of the owner's keys share), or the one that bounds together
    the keys a user made under a plan (revoked ones too)."""

    kind: str  # "tokens" or "cost"
    counter: str
    limit: int
    ttl: int
    resets_in: float
    start: datetime.datetime
    end: datetime.datetime
    period: str  # "day" or "month"
    spent_by: tuple[tuple[str, Any], ...]
    """Whose daily rollups it counts: a filter of :class:`DailyKeyUsage`."""
    whose: str = ""
    """Whose budget it is, where its use is shown (blank: the key's)."""

    @property
    def name(self) -> str:
        """What the budget is called where its use is shown."""
        name = f"{self.kind} this {self.period}"
        return f"{name} ({self.whose})" if self.whose else name

    def spending(self) -> QuerySet[DailyKeyUsage]:
        """The daily rollups of what was spent from this budget in its period: kept when
        the log's rows are pruned, and with the owner of a key since deleted."""
        days = DailyKeyUsage.objects.filter(day__gte=self.start.date(), day__lt=self.end.date())
        return days.filter(**dict(self.spent_by))


def _budgets(key: ApiKey) -> list[Budget]:
    """``key``'s budgets, then its owner's and those of the keys its owner made under a
    plan (from the plan read with the key)."""
    budgets = _period_budgets(
        str(key.pk), key.token_budget, key.cost_budget, key.budget_period, (("api_key", key.pk),)
    )
    plan, owner_id = key.owner_plan, key.owner_id
    if plan is None or owner_id is None:
        return budgets
    if plan.has_owner_budget:
        budgets += _owner_budgets(owner_id, plan)
    if key.needs_plan:
        budgets += _planned_keys_budgets(owner_id, plan)
    return budgets


def _owner_budgets(owner_id: int, plan: Plan) -> list[Budget]:
    return _period_budgets(f"o{owner_id}", plan.owner_token_budget, plan.owner_cost_budget,
                           plan.owner_budget_period, (("owner", owner_id),),
                           "all your keys")  # fmt: skip


def _planned_keys_budgets(owner_id: int, plan: Plan) -> list[Budget]:
    """What the keys a user makes under ``plan`` may spend together, whichever of them are
    revoked: ``PORTAL["MAX_KEYS"]`` times its budget of each key, what the most keys the
    user may hold at once could spend. Revoking a key and making another gives nothing
    back."""
    most = int(app_settings.PORTAL["MAX_KEYS"])
    tokens = None if plan.token_budget is None else plan.token_budget * most
    cost = None if plan.cost_budget is None else plan.cost_budget * most
    spent_by = (("owner", owner_id), ("api_key__needs_plan", True))
    return _period_budgets(f"p{owner_id}", tokens, cost, plan.budget_period, spent_by,
                           "all your keys made under your plan")  # fmt: skip


def _period_budgets(
    scope: str,
    tokens: int | None,
    cost: Decimal | None,
    period: str,
    spent_by: tuple[tuple[str, Any], ...],
    whose: str = "",
) -> list[Budget]:
    if tokens is None and cost is None:
        return []
    now = datetime.datetime.now(datetime.UTC)
    label, start, end = _period(period, now)
    ttl = int((end - now).total_seconds()) + 3600
    budgets = []
    for kind, limit in (("tokens", tokens), ("cost", None if cost is None else _units(cost))):
        if limit is not None:
            counter = f"cp:budget:{scope}:{_COUNTED[kind]}:{label}"
            resets_in = (end - now).total_seconds()
            budgets.append(
                Budget(kind, counter, limit, ttl, resets_in, start, end, period, spent_by, whose)
            )
    return budgets


# What each kind of budget counter counts, in its name: a counter of micro-dollars, as an
# earlier version kept, is never read as one of COST_UNITS.
_COUNTED = {"tokens": "tokens", "cost": "usd1e-8"}


async def _seed(store: Counters, key: ApiKey | None, charge: Charge) -> None:
    """Create a budget's counter from what the daily rollups say was spent (as after a
    cache flush, a restart without Redis, or at the start of a period)."""
    assert key is not None
    budget = next(b for b in _budgets(key) if b.counter == charge.counter)
    await store.seed(budget.counter, await _spent(budget), budget.ttl)


async def _spent(budget: Budget) -> int:
    column = "total_tokens" if budget.kind == "tokens" else "cost"
    total = (await budget.spending().aaggregate(total=Sum(column)))["total"] or 0
    return total if budget.kind == "tokens" else _units(Decimal(total))


def _units(cost: Decimal) -> int:
    """A cost in :data:`COST_UNITS`, rounded as the log rounds it (half to even): what a
    request's row says it cost, and what its rollups sum (SQLite's sums are floats)."""
    return int(cost.quantize(COST_PRECISION) * COST_UNITS)


# -- an upstream's own quota (a deployment's) ---------------------------------------

CACHE_SLOTS = 64
"""In Django's cache, the requests in flight of an upstream without a maximum are counted
up to this many (each a cache key, see :class:`CacheCounters`); beyond, served uncounted."""


@dataclass(frozen=True)
class Quota:
    """What one upstream (a deployment of an alias) may take, whichever clients ask:
    requests and tokens per minute and requests in flight (None: no limit), counted
    under ``scope``. Its requests in flight are counted even with no limit."""

    scope: str
    requests_per_minute: int | None = None
    tokens_per_minute: int | None = None
    max_in_flight: int | None = None

    def counters(self, minute: int) -> tuple[str, str]:
        """The counters of its requests and its tokens in ``minute``."""
        return _window(self.scope, "requests", minute), _window(self.scope, "tokens", minute)

    @property
    def slots(self) -> str:
        """The set (in Redis; the prefix of its slots in the cache) of its requests in flight."""
        return f"{self.scope}:inflight"


async def hold(quota: Quota, tokens: int) -> Admission | None:
    """Reserve one request of ``tokens`` under ``quota``, with a slot in flight: an
    :class:`Admission` (of no key or alias) that :meth:`Admission.settle` makes exact
    and frees, whose slot is renewed meanwhile; None when the quota refuses it. Never
    raises: while the counters cannot be reached, the request is held unreserved (an
    upstream over its quota says so itself, with a 429)."""
    store = counters()
    admission = Admission(None, None, store)
    minute = int(time.time() // 60)
    reset_in = (minute + 1) * 60 - time.time()
    requests, tokens_counter = quota.counters(minute)
    limits = (quota.requests_per_minute, quota.tokens_per_minute)
    charges = [
        Charge(kind, counter, limit or 0, amount, _WINDOW_TTL, resets_in=reset_in)
        for kind, counter, limit, amount in (
            ("requests", requests, limits[0], 1),
            ("tokens", tokens_counter, limits[1], tokens),
        )
    ]
    limited = quota.max_in_flight is not None
    if limited:
        most = quota.max_in_flight
    else:
        most = 2**31 if isinstance(store, RedisCounters) else CACHE_SLOTS
    lease: Lease | None = Lease(quota.slots, int(most or 0))
    changes = [
        Change(charge.counter, charge.reserved, limit, charge.ttl)
        for charge, limit in zip(charges, limits, strict=True)
    ]
    try:
        refusal, _ = await store.reserve(changes, lease)
        if refusal is not None and refusal.index < 0 and not limited:
            lease = None  # a cache's slots all taken: served, uncounted in flight
            refusal, _ = await store.reserve(changes, None)
    except Unavailable as exc:
        _outage_log.warning("chatparity: deployment quotas not checked: %s", exc)
        return admission
    if refusal is not None:
        return None
    admission.charges, admission.lease = charges, lease
    if lease is not None:
        _renewers.get().add(store, lease)
    return admission


# The bytes each key's stored responses hold, counted from the database this often.
STORED_TTL = 3600


async def stored_bytes(key_id: int, count: Callable[[], Awaitable[int]]) -> int | None:
    """The bytes the stored responses of the key ``key_id`` hold as counted: started from
    ``count()`` (what the database holds) when the counters have no count, or an hour
    old, then moved by :func:`count_stored`. None while the counters cannot be reached
    (logged): the bound it serves is not checked then."""
    change = Change(f"cp:stored:{key_id}", 0, None, STORED_TTL, seeded=True)
    try:
        return await _seeded_value(counters(), change, count)
    except Unavailable as exc:
        _outage_log.warning("chatparity: stored bytes not checked (counters unavailable): %s", exc)
        return None


async def count_stored(key_id: int, amount: int) -> None:
    """Add ``amount`` bytes (fewer, when negative) to what the key ``key_id`` stores, if
    the counters have its count; never raises."""
    try:
        await counters().settle([(f"cp:stored:{key_id}", amount)], None)
    except Unavailable as exc:
        _outage_log.warning("chatparity: stored bytes not counted (counters unavailable): %s", exc)


class Standing(NamedTuple):
    """What one limit allows and how much of it is used now: counts, or US dollars
    (a :class:`~decimal.Decimal`) for a cost; both None while the counters cannot be
    read (``name`` then says what is unknown)."""

    name: str
    used: int | Decimal | None
    allowed: int | Decimal | None

    @property
    def used_text(self) -> str:
        return amount_text(self.used)

    @property
    def allowed_text(self) -> str:
        return amount_text(self.allowed)


def amount_text(amount: int | Decimal | None) -> str:
    """A count or a cost as a page shows it, with the locale's thousands separators:
    ``12,345``, ``$1,234.5000``; "unknown" for None."""
    if amount is None:
        return "unknown"
    if isinstance(amount, Decimal):
        return f"${number_format(amount, 4, force_grouping=True)}"
    return number_format(amount, force_grouping=True)


async def standing(key: ApiKey) -> list[Standing]:
    """What ``key`` has used of each of its limits right now, its owner's budgets
    included when the key was read with its owner's plan (``key.owner_plan``); while the
    counters cannot be reached, one row that says so."""
    try:
        return await _standing(key)
    except Unavailable:
        return [Standing("usage (the counters are unavailable)", None, None)]


async def _standing(key: ApiKey) -> list[Standing]:
    store = counters()
    minute = int(time.time() // 60)
    rows = []
    for name, limit in (("requests", key.requests_per_minute), ("tokens", key.tokens_per_minute)):
        if limit is not None:
            (used,) = await store.values([_window(_key_scope(key), name, minute)])
            rows.append(Standing(f"{name} this minute", used, limit))
    if key.max_concurrent is not None:
        in_flight = await store.in_flight(_in_flight(key), key.max_concurrent)
        rows.append(Standing("requests in flight", in_flight, key.max_concurrent))
    return rows + await _budget_standing(store, _budgets(key))


async def owner_standing(owner_id: int, plan: Plan) -> list[Standing]:
    """What the user ``owner_id``'s keys have used together of the owner budgets of
    ``plan`` and of what all the keys they made under it may spend, as :func:`standing`
    says it."""
    budgets = _owner_budgets(owner_id, plan) + _planned_keys_budgets(owner_id, plan)
    try:
        return await _budget_standing(counters(), budgets)
    except Unavailable:
        return [Standing("usage (the counters are unavailable)", None, None)]


async def _budget_standing(store: Counters, budgets: list[Budget]) -> list[Standing]:
    rows = []
    for budget in budgets:
        used = await _budget_used(store, budget)
        if budget.kind == "cost":
            rows.append(Standing(budget.name, used / COST_UNITS, budget.limit / COST_UNITS))
        else:
            rows.append(Standing(budget.name, used, budget.limit))
    return rows


async def _budget_used(store: Counters, budget: Budget) -> int:
    """What ``budget``'s counter holds, seeded from the rollups only when it has none: a
    page showing what is left sums no month of rollups while the counter lives."""
    change = Change(budget.counter, 0, None, budget.ttl, seeded=True)
    return await _seeded_value(store, change, lambda: _spent(budget))


async def _seeded_value(
    store: Counters, change: Change, count: Callable[[], Awaitable[int]]
) -> int:
    """What the counter of ``change`` (an amount of 0) holds, seeded with ``count()`` when
    it has none; :class:`Unavailable` if it still has none after that."""
    for _ in range(2):
        refusal, values = await store.reserve([change], None)
        if refusal is None:
            return values[0]
        await store.seed(change.counter, await count(), change.ttl)
    raise _keeps_nothing(change.counter)


def _keeps_nothing(counter: str) -> Unavailable:
    """A counter seeded that is still missing: a store that keeps nothing (Django's dummy
    cache) would have the request seed it again from the database for ever."""
    return Unavailable(f"the counters keep nothing ({counter} is gone once seeded)")


def _key_scope(key: ApiKey) -> str:
    return f"cp:rl:{key.pk}"


def _alias_scope(key: ApiKey | None, alias: ModelAlias) -> str:
    return f"cp:rl:{'admin' if key is None else key.pk}:a{alias.pk}"


def _window(scope: str, name: str, minute: int) -> str:
    return f"{scope}:{name[0]}:{minute}"


def _in_flight(key: ApiKey) -> str:
    return f"cp:rl:{key.pk}:inflight"
