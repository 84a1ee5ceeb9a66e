"""The shared state of deployments, which every worker and host routes by.

Kept where the limits' counters are (:func:`~chatparity.accounting.limits.counters`:
Redis, each read or change one Lua script, on Redis's clock; else Django's cache,
on each host's clock). Per deployment: its requests in flight (the leases of its
:class:`~chatparity.accounting.limits.Quota`, which expire if a worker dies), its
requests and tokens this minute, when its cooldown ends, whether the one request
that tries it again is out, its failures in a row and its requests and failures
over the failure window, and its recent times to first event. Per alias: the
sequence that spreads the weighted choice, and each session's deployment.

A deployment cools down as ``CHATPARITY["ROUTING"]`` says: for an upstream's
``Retry-After`` at once, else after failures in a row or a share of failures,
with backoff. A cooldown only ever grows until it ends; once it ends the
deployment is half-open: the first request to claim it (:func:`claim`) tries it,
the others keep away, and its success makes it healthy again (a failure cools it
down anew, for longer). A success only ends a cooldown when it is that trial's:
a request that was under way before the cooldown began cannot cut it short.

Every call raises :class:`~chatparity.accounting.limits.Unavailable` when the
store cannot be reached: the router then goes by what this process knows.
"""

from __future__ import annotations

import math
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from django.core.cache import cache

from ..conf import app_settings
from ..models import Deployment, ModelAlias
from . import limits

DAY = 86_400
HALF_OPEN_SECONDS = 3_600
"""How long a deployment stays half-open after its cooldown if no request tries it."""


def serving(alias: ModelAlias) -> list[Deployment]:
    """The deployments that may serve ``alias``, by tier: those enabled, with a weight
    above 0, on an enabled backend, as read with it (``deployments`` prefetched). Its
    own backend and model are its first deployment's, as the alias says them now; they
    alone serve an alias read without its deployments, or saved without any. Worked out
    once per alias read."""
    found: list[Deployment] | None = alias.__dict__.get("_chatparity_serving")
    if found is None:
        found = alias.__dict__["_chatparity_serving"] = _serving(alias)
    return found


def _serving(alias: ModelAlias) -> list[Deployment]:
    read = getattr(alias, "_prefetched_objects_cache", {}).get("deployments")
    rows = list(read) if read is not None else []
    own = next((row for row in rows if row.primary), None)
    if own is None:
        own = Deployment(alias=alias, backend=alias.backend, model=alias.model, primary=True)
        rows.insert(0, own)
    own.backend, own.model = alias.backend, alias.model
    usable = [row for row in rows if row.enabled and row.weight > 0 and row.backend.enabled]
    return sorted(usable, key=lambda row: row.tier)


def quota(deployment: Deployment) -> limits.Quota:
    """The counters of ``deployment``'s own quota and requests in flight."""
    return limits.Quota(
        scope(deployment),
        deployment.requests_per_minute,
        deployment.tokens_per_minute,
        deployment.max_in_flight,
    )


def scope(deployment: Deployment) -> str:
    """Where ``deployment``'s state is kept: by its id (an alias's own backend never
    saved as a deployment: by the alias's)."""
    if deployment.pk is not None:
        return f"cp:dp:{deployment.pk}"
    return f"cp:dp:a{deployment.alias_id}"


def _alias_scope(alias_id: int) -> str:
    return f"cp:rt:{alias_id}"


@dataclass(frozen=True, slots=True)
class Health:
    """One deployment as the shared state tells it."""

    in_flight: int = 0
    cooling_until: float = 0.0
    """When its cooldown ends (seconds since the epoch, on the store's clock); 0: none."""
    half_open: bool = False
    """Its cooldown ended: one request may try it (:func:`claim`)."""
    probing: bool = False
    """That request is out: the others keep away until it tells."""
    failures: int = 0
    """Failures in a row."""
    requests: int = 0
    """Requests that told how they went over the failure window (up to twice it)."""
    errors: int = 0
    """Of which failed."""
    used_requests: int = 0
    used_tokens: int = 0
    """This minute's, against its quota."""
    samples: tuple[float, ...] = ()
    """Recent times to first event (ms), newest first, of the kind asked."""

    def cooling(self, now: float) -> bool:
        return self.cooling_until > now

    @property
    def error_share(self) -> float | None:
        return self.errors / self.requests if self.requests else None


HEALTHY = Health()


@dataclass(frozen=True, slots=True)
class Snapshot:
    """The state of an alias's deployments read together, at ``now`` (store's clock)."""

    now: float
    health: dict[str, Health]
    """By :func:`scope`."""
    sequence: int | None = None
    """The alias's weighted sequence, moved on by one for this request."""
    sticky: int | None = None
    """The id of the deployment that served the session last."""


@dataclass(frozen=True)
class Wanted:
    """What a snapshot reads besides every deployment's health (:func:`snapshot`)."""

    alias_id: int
    sequence: bool = False
    samples: str = ""
    session: str = ""


@dataclass(frozen=True)
class Settings:
    """``CHATPARITY["ROUTING"]``, read once per call."""

    failures: int
    failure_share: float
    failure_window: float
    min_requests: int
    cooldown: float
    max_cooldown: float
    samples: int
    sticky_seconds: float

    @classmethod
    def read(cls) -> Settings:
        routing = app_settings.ROUTING
        return cls(
            failures=int(routing["FAILURES"]),
            failure_share=float(routing["FAILURE_SHARE"]),
            failure_window=float(routing["FAILURE_WINDOW"]),
            min_requests=int(routing["MIN_REQUESTS"]),
            cooldown=float(routing["COOLDOWN_SECONDS"]),
            max_cooldown=float(routing["MAX_COOLDOWN_SECONDS"]),
            samples=int(routing["LATENCY_SAMPLES"]),
            sticky_seconds=float(routing["STICKY_SECONDS"]),
        )

    def windows(self, now: float) -> tuple[int, int]:
        """The failure windows now and before."""
        window = int(now // self.failure_window)
        return window, window - 1


@dataclass(frozen=True)
class Outcome:
    """How one request to a deployment went, as :func:`told` records it."""

    failed: bool
    trial: bool = False
    """The request was the one trying the deployment after its cooldown."""
    retry_after: float | None = None
    """Seconds the upstream asked to wait (its ``Retry-After``)."""
    rate_limited: bool = False
    """The upstream said it is over its limits (a 429): it cools down at once."""
    first_event_ms: float | None = None
    samples: str = ""
    """Which samples ``first_event_ms`` goes with: ``stream`` or ``whole``."""
    session: str = ""
    """The session's key (:func:`session_key`), which now sticks to the deployment."""
    deployment_id: int | None = None


def session_key(alias_id: int, caller: str, session: str) -> str:
    """Where the alias ``alias_id`` remembers ``caller``'s ``session``: a digest, so
    neither the session nor who asked is kept as sent."""
    import hashlib

    digest = hashlib.sha256(f"{caller}\0{session}".encode()).hexdigest()[:32]
    return f"{_alias_scope(alias_id)}:s:{digest}"


def _keys(name: str, settings: Settings, now: float) -> dict[str, str]:
    current, previous = settings.windows(now)
    return {
        "until": f"{name}:until",
        "trial": f"{name}:trial",
        "failures": f"{name}:fails",
        "strikes": f"{name}:strikes",
        "requests": f"{name}:n:{current}",
        "requests_before": f"{name}:n:{previous}",
        "errors": f"{name}:f:{current}",
        "errors_before": f"{name}:f:{previous}",
    }


def _samples_key(name: str, kind: str) -> str:
    return f"{name}:ttft:{kind}"


# -- Redis ---------------------------------------------------------------------------

_NOW = """
local clock = redis.call('TIME')
local now = tonumber(clock[1]) * 1000 + math.floor(tonumber(clock[2]) / 1000)
"""
# KEYS: per deployment its 11 (see _RedisState.snapshot), then the sequence and the session.
# ARGV: deployments, move the sequence (1/0), read samples (1/0), read the session (1/0).
_SNAPSHOT = (
    _NOW
    + """
local count = tonumber(ARGV[1])
local out = {now}
for i = 0, count - 1 do
  local k = i * 11
  redis.call('ZREMRANGEBYSCORE', KEYS[k + 1], '-inf', now)
  out[#out + 1] = redis.call('ZCARD', KEYS[k + 1])
  out[#out + 1] = tonumber(redis.call('GET', KEYS[k + 2]) or '0')
  out[#out + 1] = redis.call('EXISTS', KEYS[k + 3])
  for j = 4, 10 do out[#out + 1] = tonumber(redis.call('GET', KEYS[k + j]) or '0') end
  if ARGV[3] == '1' then
    out[#out + 1] = redis.call('LRANGE', KEYS[k + 11], 0, -1)
  else
    out[#out + 1] = {}
  end
end
local at = count * 11
if ARGV[2] == '1' then
  out[#out + 1] = redis.call('INCR', KEYS[at + 1])
  redis.call('EXPIRE', KEYS[at + 1], 86400)
else
  out[#out + 1] = -1
end
if ARGV[4] == '1' then
  out[#out + 1] = tonumber(redis.call('GET', KEYS[at + 2]) or '-1')
else
  out[#out + 1] = -1
end
return out
"""
)
# KEYS: until, trial, failures, strikes, requests, requests before, errors, errors before,
# samples, session. ARGV: failed, trial, retry after (ms, -1: none), rate limited,
# failures, failure share, min requests, cooldown (ms), max cooldown (ms), window ttl,
# sample (ms, "": none), samples kept, session's deployment ("": none), session ttl.
_TOLD = (
    _NOW
    + """
local failed, trial = ARGV[1] == '1', ARGV[2] == '1'
redis.call('INCR', KEYS[5])
redis.call('EXPIRE', KEYS[5], ARGV[10])
local cooled = 0
if failed then
  redis.call('INCR', KEYS[7])
  redis.call('EXPIRE', KEYS[7], ARGV[10])
  local failures = redis.call('INCR', KEYS[3])
  redis.call('EXPIRE', KEYS[3], 86400)
  local function get(key) return tonumber(redis.call('GET', key) or '0') end
  local n, f = get(KEYS[5]) + get(KEYS[6]), get(KEYS[7]) + get(KEYS[8])
  local retry_after = tonumber(ARGV[3])
  local cool = 0
  if retry_after >= 0 then
    cool = math.min(retry_after, tonumber(ARGV[9]))
  elseif trial or ARGV[4] == '1' or failures >= tonumber(ARGV[5])
      or (n >= tonumber(ARGV[7]) and f >= tonumber(ARGV[6]) * n) then
    local strikes = redis.call('INCR', KEYS[4])
    redis.call('EXPIRE', KEYS[4], 86400)
    cool = math.min(tonumber(ARGV[8]) * 2 ^ (strikes - 1), tonumber(ARGV[9]))
  end
  if cool > 0 then
    local ends = now + math.floor(cool)
    if ends > tonumber(redis.call('GET', KEYS[1]) or '0') then
      redis.call('SET', KEYS[1], ends, 'PX', math.floor(cool) + 3600000)
    end
    redis.call('DEL', KEYS[3])
    cooled = ends
  end
  if trial then redis.call('DEL', KEYS[2]) end
else
  redis.call('DEL', KEYS[3])
  if trial then redis.call('DEL', KEYS[1], KEYS[2], KEYS[4], KEYS[5], KEYS[6], KEYS[7], KEYS[8]) end
  if ARGV[11] ~= '' then
    redis.call('LPUSH', KEYS[9], ARGV[11])
    redis.call('LTRIM', KEYS[9], 0, tonumber(ARGV[12]) - 1)
    redis.call('EXPIRE', KEYS[9], 86400)
  end
  if ARGV[13] ~= '' then redis.call('SET', KEYS[10], ARGV[13], 'PX', ARGV[14]) end
end
return cooled
"""
)


# The one trial of a deployment back from its cooldown, claimed only while it still is:
# a request whose snapshot was read before the last trial failed (and cooled it down
# anew) would otherwise claim a second trial. KEYS: trial, until. ARGV: token, ms.
_CLAIM = (
    _NOW
    + """
if tonumber(redis.call('GET', KEYS[2]) or '0') > now then return 0 end
return redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) and 1 or 0
"""
)


class _RedisState:
    def __init__(self, store: limits.RedisCounters) -> None:
        self.store = store

    async def snapshot(
        self, deployments: Sequence[Deployment], wanted: Wanted, settings: Settings
    ) -> Snapshot:
        alias_id, samples, session = wanted.alias_id, wanted.samples, wanted.session
        now = time.time()
        keys: list[str] = []
        for deployment in deployments:
            name, owned = scope(deployment), quota(deployment)
            named = _keys(name, settings, now)
            keys += [
                owned.slots,
                named["until"],
                named["trial"],
                named["failures"],
                named["requests"],
                named["requests_before"],
                named["errors"],
                named["errors_before"],
                *owned.counters(int(now // 60)),
                _samples_key(name, samples or "stream"),
            ]
        keys += [f"{_alias_scope(alias_id)}:seq", session or f"{_alias_scope(alias_id)}:none"]
        args = [len(deployments), int(wanted.sequence), int(bool(samples)), int(bool(session))]
        out = await self.store.run(_SNAPSHOT, keys, args)
        clock = out[0] / 1000
        health = {}
        for index, deployment in enumerate(deployments):
            at = 1 + index * 11
            (flight, until, trial, failures, n, n_before, f, f_before, used_r, used_t) = out[
                at : at + 10
            ]
            health[scope(deployment)] = Health(
                in_flight=int(flight),
                cooling_until=until / 1000,
                half_open=0 < until / 1000 <= clock,
                probing=bool(trial),
                failures=int(failures),
                requests=int(n + n_before),
                errors=int(f + f_before),
                used_requests=int(used_r),
                used_tokens=int(used_t),
                samples=tuple(float(sample) for sample in out[at + 10]),
            )
        seq, sticky = out[-2], out[-1]
        return Snapshot(
            clock,
            health,
            sequence=int(seq) if seq >= 0 else None,
            sticky=int(sticky) if sticky >= 0 else None,
        )

    async def claim(self, deployment: Deployment, seconds: float) -> bool:
        name = scope(deployment)
        keys = [f"{name}:trial", f"{name}:until"]
        args = [uuid.uuid4().hex, max(1, int(seconds * 1000))]
        return bool(await self.store.run(_CLAIM, keys, args))

    async def unclaim(self, deployment: Deployment) -> None:
        await self.store.run("redis.call('DEL', KEYS[1])", [f"{scope(deployment)}:trial"], [])

    async def told(self, deployment: Deployment, outcome: Outcome, settings: Settings) -> float:
        name = scope(deployment)
        named = _keys(name, settings, time.time())
        keys = [
            named["until"], named["trial"], named["failures"], named["strikes"],
            named["requests"], named["requests_before"], named["errors"], named["errors_before"],
            _samples_key(name, outcome.samples or "stream"),
            outcome.session or f"{name}:none",
        ]  # fmt: skip
        sample = outcome.first_event_ms
        args = [
            int(outcome.failed),
            int(outcome.trial),
            -1 if outcome.retry_after is None else int(outcome.retry_after * 1000),
            int(outcome.rate_limited),
            settings.failures,
            settings.failure_share,
            settings.min_requests,
            int(settings.cooldown * 1000),
            int(settings.max_cooldown * 1000),
            int(settings.failure_window * 2) + 1,
            "" if sample is None or not outcome.samples else f"{sample:.1f}",
            settings.samples,
            "" if not outcome.session or deployment.pk is None else str(deployment.pk),
            max(1, int(settings.sticky_seconds * 1000)),
        ]
        cooled = await self.store.run(_TOLD, keys, args)
        return float(cooled) / 1000


# -- Django's cache ------------------------------------------------------------------


def whole_seconds(ttl: float) -> int:
    """A timeout for Django's cache, rounded up: its Redis and memcached backends drop
    the fraction, and a timeout of 0 expires a value at once (a trial claimed for 0.3 s
    was no claim, a session kept 0.3 s not kept)."""
    return max(1, math.ceil(ttl))


def _count(key: str, amount: int, ttl: float) -> int:
    cache.add(key, 0, whole_seconds(ttl))
    try:
        return int(cache.incr(key, amount))
    except ValueError:  # expired in between
        cache.set(key, amount, whole_seconds(ttl))
        return amount


class _CacheState:
    """The same state in Django's cache: each value changes atomically (``add``,
    ``incr``), but a decision over several (a cooldown) is not one step, and the
    samples are read and written whole (two workers at once may lose one)."""

    def __init__(self, store: limits.CacheCounters) -> None:
        self.store = store

    async def snapshot(
        self, deployments: Sequence[Deployment], wanted: Wanted, settings: Settings
    ) -> Snapshot:
        result: Snapshot = await self.store.call(self._snapshot, deployments, wanted, settings)
        return result

    @staticmethod
    def _snapshot(
        deployments: Sequence[Deployment], wanted: Wanted, settings: Settings
    ) -> Snapshot:
        samples, session = wanted.samples, wanted.session
        now = time.time()
        keys: list[str] = []
        for deployment in deployments:
            name, owned = scope(deployment), quota(deployment)
            most = owned.max_in_flight or limits.CACHE_SLOTS
            keys += [*_keys(name, settings, now).values(), *owned.counters(int(now // 60))]
            keys += [f"{owned.slots}:{index}" for index in range(most)]
            if samples:
                keys.append(_samples_key(name, samples))
        if session:
            keys.append(session)
        found = cache.get_many(keys)
        health = {}
        for deployment in deployments:
            name, owned = scope(deployment), quota(deployment)
            named = _keys(name, settings, now)
            most = owned.max_in_flight or limits.CACHE_SLOTS
            until = float(found.get(named["until"], 0)) / 1000
            used_r, used_t = (int(found.get(c, 0)) for c in owned.counters(int(now // 60)))
            health[name] = Health(
                in_flight=sum(f"{owned.slots}:{index}" in found for index in range(most)),
                cooling_until=until,
                half_open=0 < until <= now,
                probing=named["trial"] in found,
                failures=int(found.get(named["failures"], 0)),
                requests=int(found.get(named["requests"], 0))
                + int(found.get(named["requests_before"], 0)),
                errors=int(found.get(named["errors"], 0))
                + int(found.get(named["errors_before"], 0)),
                used_requests=used_r,
                used_tokens=used_t,
                samples=tuple(found.get(_samples_key(name, samples), ())) if samples else (),
            )
        seq = _count(f"{_alias_scope(wanted.alias_id)}:seq", 1, DAY) if wanted.sequence else None
        sticky = found.get(session) if session else None
        return Snapshot(now, health, sequence=seq, sticky=sticky)

    async def claim(self, deployment: Deployment, seconds: float) -> bool:
        claimed: bool = await self.store.call(self._claim, scope(deployment), seconds)
        return claimed

    @staticmethod
    def _claim(name: str, seconds: float) -> bool:
        # As _CLAIM: a cooldown begun since the snapshot (the last trial failed) wins.
        if float(cache.get(f"{name}:until", 0)) > time.time() * 1000:
            return False
        return bool(cache.add(f"{name}:trial", uuid.uuid4().hex, whole_seconds(seconds)))

    async def unclaim(self, deployment: Deployment) -> None:
        await self.store.call(cache.delete, f"{scope(deployment)}:trial")

    async def told(self, deployment: Deployment, outcome: Outcome, settings: Settings) -> float:
        cooled: float = await self.store.call(self._told, deployment, outcome, settings)
        return cooled

    @staticmethod
    def _told(deployment: Deployment, outcome: Outcome, settings: Settings) -> float:
        now = time.time()
        name = scope(deployment)
        named = _keys(name, settings, now)
        window_ttl = settings.failure_window * 2 + 1
        _count(named["requests"], 1, window_ttl)
        if not outcome.failed:
            stale = [named["failures"]]
            if outcome.trial:
                stale += [key for role, key in named.items() if role != "failures"]
            cache.delete_many(stale)
            if outcome.first_event_ms is not None and outcome.samples:
                key = _samples_key(name, outcome.samples)
                kept = (outcome.first_event_ms, *cache.get(key, ()))[: settings.samples]
                cache.set(key, kept, DAY)
            if outcome.session and deployment.pk is not None:
                cache.set(outcome.session, deployment.pk, whole_seconds(settings.sticky_seconds))
            return 0.0
        _count(named["errors"], 1, window_ttl)
        failures = _count(named["failures"], 1, DAY)
        found = cache.get_many([named[k] for k in ("requests", "requests_before", "errors",
                                                   "errors_before", "until")])  # fmt: skip
        n = int(found.get(named["requests"], 0)) + int(found.get(named["requests_before"], 0))
        f = int(found.get(named["errors"], 0)) + int(found.get(named["errors_before"], 0))
        cool = _cooldown(
            outcome, failures, n, f, settings, lambda: _count(named["strikes"], 1, DAY)
        )
        if outcome.trial:
            cache.delete(named["trial"])
        if not cool:
            return 0.0
        ends = now + cool
        if ends * 1000 > float(found.get(named["until"], 0)):
            cache.set(named["until"], ends * 1000, whole_seconds(cool + HALF_OPEN_SECONDS))
        cache.delete(named["failures"])
        return ends


def _cooldown(
    outcome: Outcome,
    failures: int,
    requests: int,
    errors: int,
    settings: Settings,
    strike: Callable[[], int],
) -> float:
    """Seconds a failed deployment cools down for (0: none): the upstream's Retry-After
    when it sent one, else with backoff once a rule says so (``strike()`` counts the
    cooldowns in a row)."""
    if outcome.retry_after is not None:
        return min(max(outcome.retry_after, 0.0), settings.max_cooldown)
    if (
        outcome.trial
        or outcome.rate_limited
        or failures >= settings.failures
        or (requests >= settings.min_requests and errors >= settings.failure_share * requests)
    ):
        return float(min(settings.cooldown * 2 ** (strike() - 1), settings.max_cooldown))
    return 0.0


# -- the API -------------------------------------------------------------------------


def _state() -> _RedisState | _CacheState:
    store = limits.counters()
    if isinstance(store, limits.RedisCounters):
        return _RedisState(store)
    assert isinstance(store, limits.CacheCounters)
    return _CacheState(store)


async def snapshot(
    deployments: Sequence[Deployment],
    alias_id: int,
    *,
    sequence: bool = False,
    samples: str = "",
    session: str = "",
) -> Snapshot:
    """The state of ``deployments`` (of the alias ``alias_id``) now: with the alias's
    weighted sequence moved on when ``sequence``, their recent times to first event of
    kind ``samples`` (``stream`` or ``whole``; "": none), and the deployment that served
    ``session`` (:func:`session_key`) last."""
    wanted = Wanted(alias_id, sequence, samples, session)
    return await _state().snapshot(deployments, wanted, Settings.read())


async def claim(deployment: Deployment, seconds: float) -> bool:
    """Whether this request is the one to try ``deployment`` once its cooldown ended
    (for at most ``seconds``, after which another may)."""
    return await _state().claim(deployment, seconds)


async def unclaim(deployment: Deployment) -> None:
    """Give up the trial of ``deployment`` this request claimed (it did not ask it)."""
    await _state().unclaim(deployment)


async def told(deployment: Deployment, outcome: Outcome) -> float:
    """Record ``outcome`` of a request to ``deployment``; when it cools the deployment
    down, the moment its cooldown ends (seconds since the epoch), else 0."""
    return await _state().told(deployment, outcome, Settings.read())


def percentile(samples: Sequence[float], percent: float) -> float | None:
    """The ``percent`` percentile of ``samples`` (nearest rank); None without any."""
    if not samples:
        return None
    ordered = sorted(samples)
    return ordered[max(0, math.ceil(percent / 100 * len(ordered)) - 1)]
