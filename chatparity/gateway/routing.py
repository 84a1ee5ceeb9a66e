"""Routing: the deployment of an alias that serves a request, a stage of the one pipeline.

An alias is served by its deployments (:class:`~chatparity.models.Deployment`).
Before the backend is called, :meth:`Route.next` chooses one: among the
deployments of the first tier that has one available (not cooling down, the
one trial out of a cooldown not taken, within its quota), by the alias's
strategy (:func:`choose`), the session's deployment first when the alias sticks
sessions; the deployment's quota is held (:func:`~chatparity.accounting.limits.hold`)
and the request noted as asked of it. Its first event is :meth:`Route.answered`;
a failure before it is :meth:`Route.failed`, which says whether another
deployment may serve: a deployment's failure (a 429, a 5xx, a refused
connection, a time-out), never the client's. Only there, before the client has
seen a byte, does a request move on; when the alias's deployments are all spent
the pipeline turns to its fallbacks, as before.

When every deployment is cooling down, a request waits for the first to come back
if it does within ``ROUTING["MAX_WAIT_SECONDS"]`` and before the request's deadline
(``FIRST_BYTE_TIMEOUT``, or the client's own: the ``x-stainless-timeout`` header
OpenAI's and Anthropic's SDKs send); else it is answered 503 with the
``Retry-After`` of the first deployment to come back.

The state routing reads and keeps is shared by every worker and host
(:mod:`chatparity.accounting.deployments`). An alias of one deployment without a
quota of its own reads and keeps none: it is served as an alias of one backend
always was. docs/routing.md tells the strategies, and the failure modes of other
routers each avoids.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import random
import time
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from .. import signals
from ..accounting import deployments as shared
from ..accounting import limits
from ..accounting.batching import OncePerInterval, detached
from ..accounting.deployments import Health, Outcome, Snapshot, scope
from ..accounting.ledger import Accounting
from ..accounting.limits import Admission, Unavailable
from ..backends import backend_class
from ..backends.base import asks_again
from ..conf import app_settings
from ..models import Backend, Deployment, ModelAlias, Routing, StickySessions
from ..protocol import errors
from ..protocol.errors import APIError
from ..protocol.events import Usage

logger = logging.getLogger(__name__)
_outage_log = OncePerInterval(logger, interval=60.0)

GOLDEN = (math.sqrt(5) - 1) / 2
"""The golden ratio's fraction: its multiples, modulo 1, spread over [0, 1) more evenly
than any other sequence (each new one falls in the widest gap left)."""
SESSION_HEADER = "x-session-id"
DEADLINE_HEADER = "x-stainless-timeout"
"""Seconds the client waits in all: OpenAI's and Anthropic's SDKs send it."""
POLL_SECONDS = 0.25
"""How often a request waiting for a deployment's trial to end looks again."""
MAX_SESSION_CHARS = 512

T = TypeVar("T")

chance = random.Random()
"""Breaks ties and picks exploration; tests seed it."""


def retryable(error: APIError) -> bool:
    """Whether ``error`` is the deployment's failure rather than the request's: its
    limits (429), or a server's error, a refused connection, a time-out (5xx)."""
    return error.status == 429 or error.status >= 500


def position(sequence: int) -> float:
    """Where the ``sequence``-th request of an alias falls in [0, 1)."""
    return (sequence * GOLDEN) % 1.0


# -- choosing ------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Candidate:
    """A deployment that may serve the request now, with its shared state."""

    deployment: Deployment
    health: Health


def by_weight(candidates: Sequence[Candidate], at: float) -> Candidate:
    """The candidate whose share of the weights holds ``at`` (in [0, 1))."""
    total = sum(candidate.deployment.weight for candidate in candidates)
    point = at * total
    for candidate in candidates:
        point -= candidate.deployment.weight
        if point < 0:
            return candidate
    return candidates[-1]


def headroom(candidate: Candidate) -> float:
    """The least share left of ``candidate``'s quota this minute (requests, tokens, in
    flight); 1 with no quota."""
    deployment, health = candidate.deployment, candidate.health
    shares = [
        (limit - used) / limit
        for limit, used in (
            (deployment.requests_per_minute, health.used_requests),
            (deployment.tokens_per_minute, health.used_tokens),
            (deployment.max_in_flight, health.in_flight),
        )
        if limit
    ]
    return min(shares, default=1.0)


def choose(
    strategy: str,
    candidates: Sequence[Candidate],
    at: float,
    *,
    percent: float = 50.0,
    exploration: float = 0.05,
    rng: random.Random = chance,
) -> Candidate:
    """The candidate ``strategy`` (a :class:`~chatparity.models.Routing`) chooses:
    ``at`` is the request's place in its alias's sequence (:func:`position`)."""
    if len(candidates) == 1:
        return candidates[0]
    if strategy == Routing.LEAST_BUSY:
        loads = [c.health.in_flight / c.deployment.weight for c in candidates]
        least = min(loads)
        return rng.choice([c for c, load in zip(candidates, loads, strict=True) if load == least])
    if strategy == Routing.LOWEST_LATENCY:
        return _fastest(candidates, at, percent, exploration, rng)
    if strategy == Routing.MOST_HEADROOM:
        rooms = [headroom(candidate) for candidate in candidates]
        most = max(rooms)
        roomy = [c for c, room in zip(candidates, rooms, strict=True) if room == most]
        return by_weight(roomy, at)
    return by_weight(candidates, at)


def _fastest(
    candidates: Sequence[Candidate],
    at: float,
    percent: float,
    exploration: float,
    rng: random.Random,
) -> Candidate:
    """The candidate of the lowest percentile of recent times to first event; one of
    the others (those never measured first) for an ``exploration`` share of requests;
    by weight while none was measured."""
    latencies = [shared.percentile(c.health.samples, percent) for c in candidates]
    measured = [latency for latency in latencies if latency is not None]
    if not measured:
        return by_weight(candidates, at)
    best = min(measured)
    fastest = [c for c, latency in zip(candidates, latencies, strict=True) if latency == best]
    if len(fastest) < len(candidates) and rng.random() < exploration:
        unmeasured = [c for c, lat in zip(candidates, latencies, strict=True) if lat is None]
        return rng.choice(unmeasured or [c for c in candidates if c not in fastest])
    return fastest[0] if len(fastest) == 1 else rng.choice(fastest)


# -- an alias's deployments ------------------------------------------------------------


@dataclass(frozen=True)
class Group:
    """The deployments of an alias that serve an endpoint, by tier (1 first)."""

    tiers: tuple[tuple[Deployment, ...], ...]
    sticky: bool
    """Sessions stick to their deployment."""

    @property
    def deployments(self) -> list[Deployment]:
        return [deployment for tier in self.tiers for deployment in tier]

    @property
    def shared(self) -> bool:
        """Whether routing reads and keeps shared state: more than one deployment."""
        return sum(map(len, self.tiers)) > 1


def group(alias: ModelAlias, serves: Callable[[Backend], bool]) -> Group:
    """``alias``'s deployments that ``serves`` (its endpoint's test of a backend),
    worked out once per alias read."""
    groups: dict[Any, Group] = alias.__dict__.setdefault("_chatparity_groups", {})
    found = groups.get(serves)
    if found is None:
        usable = [d for d in shared.serving(alias) if serves(d.backend)]
        tiers: dict[int, list[Deployment]] = {}
        for deployment in usable:
            tiers.setdefault(deployment.tier, []).append(deployment)
        sticky = alias.sticky_sessions == StickySessions.ON or (
            alias.sticky_sessions == StickySessions.AUTO
            and any(_caches_prompts(d.backend) for d in usable)
        )
        found = groups[serves] = Group(
            tuple(tuple(tiers[tier]) for tier in sorted(tiers)), sticky and len(usable) > 1
        )
    return found


def _caches_prompts(backend: Backend) -> bool:
    """Whether the upstreams of ``backend``'s kind reuse a prompt they saw (their class
    says ``prompt_caching``)."""
    try:
        return bool(getattr(backend_class(backend.kind), "prompt_caching", False))
    except (KeyError, ImportError):
        return False


def session_of(body: Any, headers: Mapping[str, str]) -> str:
    """The session a request names: its ``x-session-id`` header, else its
    ``prompt_cache_key``, Anthropic's ``metadata.user_id``, ``safety_identifier`` or
    ``user``; "" if none."""
    named = headers.get(SESSION_HEADER, "")
    if not named and isinstance(body, dict):
        metadata = body.get("metadata")
        user_id = metadata.get("user_id") if isinstance(metadata, dict) else None
        for value in (
            body.get("prompt_cache_key"),
            user_id,
            body.get("safety_identifier"),
            body.get("user"),
        ):
            if isinstance(value, str) and value:
                named = value
                break
    return named[:MAX_SESSION_CHARS]


def client_deadline(headers: Mapping[str, str]) -> float | None:
    """Seconds the client said it waits (``x-stainless-timeout``), if it said."""
    try:
        seconds = float(headers.get(DEADLINE_HEADER, ""))
    except ValueError:
        return None
    return seconds if math.isfinite(seconds) and seconds > 0 else None


# -- a request's route ---------------------------------------------------------------

_cooling: dict[str, float] = {}
"""What this process learnt of cooldowns (by state scope: the moment each ends), gone by
when the shared state cannot be read, and added to it when it can."""
_sequences: dict[int, int] = {}
"""Each alias's weighted sequence in this process, while the shared one cannot be read."""
_telling: set[asyncio.Task[None]] = set()


async def first_answer(route: Route, ask: Callable[[Deployment], Awaitable[T]]) -> T | APIError:
    """What ``ask(deployment)`` answers for the first deployment of ``route``'s alias
    that answers (its first event, its vectors); else why none did."""
    while True:
        try:
            deployment = await route.next()
        except APIError as unavailable:
            return unavailable
        try:
            with route.asking():
                answer = await ask(deployment)
        except APIError as error:
            if not await route.failed(error):
                return error
            continue
        except asyncio.CancelledError:
            route.interrupted(asyncio.get_running_loop().time())
            raise
        route.answered()
        return answer


def forget() -> None:
    """Forget what this process learnt of cooldowns and sequences (tests: the ids they
    were kept by are those of another test's rows)."""
    _cooling.clear()
    _sequences.clear()


async def told() -> None:
    """Wait until what this process tells the shared state in the background is told
    (a worker stopping; tests)."""
    while _telling:
        await asyncio.gather(*_telling, return_exceptions=True)


class Route:
    """One request's way through the deployments of ``alias``."""

    def __init__(
        self,
        alias: ModelAlias,
        accounting: Accounting,
        serves: Callable[[Backend], bool],
        *,
        stream: bool = False,
        deadline: float | None = None,
    ) -> None:
        """``deadline``: when (the event loop's time) the request stops waiting for a
        first event; the client's own deadline (from its headers) too."""
        self.alias, self.accounting, self.stream = alias, accounting, stream
        self.group = group(alias, serves)
        loop = asyncio.get_running_loop()
        record = accounting.record
        given = client_deadline(record.headers)
        if given is not None:
            client = loop.time() + given - (time.perf_counter() - record.started)
            deadline = client if deadline is None else min(deadline, client)
        self.deadline = deadline
        self.failures: set[str] = set()
        """The deployments that failed this request."""
        self.skipped: set[str] = set()
        """The deployments found at their quota since the state was read."""
        self.waiting: set[str] = set()
        """The deployments whose trial another request took since the state was read."""
        self.failure: APIError | None = None
        self.current: Deployment | None = None
        self.trial = False
        self.asked_at = 0.0
        self.session = ""
        if self.group.sticky and alias.pk is not None:
            named = session_of(record.request_body, record.headers)
            if named:
                self.session = shared.session_key(alias.pk, accounting.caller, named)

    @property
    def empty(self) -> bool:
        """No deployment of the alias serves the endpoint."""
        return not self.group.tiers

    async def next(self) -> Deployment:
        """The deployment to ask now, its quota held and the request noted as asked of
        it; the alias's unavailability as an :class:`APIError` when none may serve."""
        if not self.group.shared and self.current is None:
            (deployment,) = self.group.deployments
            if not deployment.has_quota:  # as an alias of one backend always was served
                self._asked(deployment, None, trial=False)
                return deployment
        snapshot = await self._read()
        while True:
            pick = self._pick(snapshot)
            if pick is None:
                wait = self._wait(snapshot)
                if wait is None:
                    raise self._unavailable(snapshot)
                await asyncio.sleep(wait)
                self.skipped.clear()
                self.waiting.clear()
                snapshot = await self._read()
                continue
            candidate, trial = pick
            deployment = candidate.deployment
            if trial and not await self._claim(deployment):
                self.waiting.add(scope(deployment))  # another request's trial is out
                continue
            hold = await self._hold(deployment)
            if hold is False:
                if trial:
                    await self._unclaim(deployment)
                self.skipped.add(scope(deployment))
                continue
            self._asked(deployment, hold if isinstance(hold, Admission) else None, trial)
            return deployment

    def _asked(self, deployment: Deployment, hold: Admission | None, trial: bool) -> None:
        self.current, self.trial = deployment, trial
        self.asked_at = time.perf_counter()
        self.accounting.deployed(deployment, hold)

    @contextlib.contextmanager
    def asking(self) -> Iterator[None]:
        """While the deployment asked last is waited for: its backend asks its upstream
        again itself only when no other deployment may serve instead."""
        token = asks_again.set(not self.group.shared)
        try:
            yield
        finally:
            asks_again.reset(token)

    def answered(self) -> None:
        """The deployment asked last sent its first event: told in the background (its
        time to first event, the session's deployment, a trial's success)."""
        record = self.accounting.record
        seconds = time.perf_counter() - self.asked_at
        for observer in signals.observers:
            observer.deployment_answered(record, seconds, None)
        if self.group.shared and self.current is not None:
            outcome = Outcome(
                failed=False,
                trial=self.trial,
                first_event_ms=seconds * 1000,
                samples="stream" if self.stream else "whole",
                session=self.session,
            )
            task = detached(self._told(self.current, outcome))
            _telling.add(task)
            task.add_done_callback(_telling.discard)

    async def failed(self, error: APIError) -> bool:
        """The deployment asked last failed with ``error`` before its first event: its
        quota given back, the failure told when it is the deployment's. Whether another
        deployment may serve the request."""
        deployment = self.current
        assert deployment is not None, "a deployment was asked"
        for observer in signals.observers:
            observer.deployment_answered(
                self.accounting.record, time.perf_counter() - self.asked_at, error
            )
        hold, self.accounting.deployment_hold = self.accounting.deployment_hold, None
        if hold is not None:
            await hold.settle(Usage(0, 0))
        if not retryable(error):
            return False
        self.failures.add(scope(deployment))
        self.failure = error
        retry_after = getattr(error, "retry_after", None)
        if retry_after is not None:
            error.headers.setdefault("retry-after", str(max(1, math.ceil(retry_after))))
        if not self.group.shared:
            return False
        outcome = Outcome(
            failed=True,
            trial=self.trial,
            retry_after=retry_after,
            rate_limited=error.status == 429,
        )
        await self._told(deployment, outcome)
        return any(scope(d) not in self.failures for d in self.group.deployments)

    def interrupted(self, loop_time: float) -> None:
        """The request stopped waiting for the deployment asked last: its deadline
        passed (told as the deployment's failure), or the client left (not its)."""
        if self.current is None or not self.group.shared:
            return
        if self.deadline is not None and loop_time >= self.deadline:
            task = detached(self._told(self.current, Outcome(failed=True, trial=self.trial)))
            _telling.add(task)
            task.add_done_callback(_telling.discard)

    # -- the shared state ------------------------------------------------------------

    async def _read(self) -> Snapshot:
        """The group's state now (what this process knows, when it cannot be read)."""
        if not self.group.shared:
            return Snapshot(time.time(), {})
        deployments = self.group.deployments
        strategy = self.alias.routing
        try:
            snapshot = await shared.snapshot(
                deployments,
                self.alias.pk or 0,
                sequence=strategy
                in (Routing.WEIGHTED, Routing.MOST_HEADROOM, Routing.LOWEST_LATENCY),
                samples=("stream" if self.stream else "whole")
                if strategy == Routing.LOWEST_LATENCY
                else "",
                session=self.session,
            )
        except Unavailable as exc:
            _outage_log.warning("chatparity: routing by what this worker knows: %s", exc)
            alias_id = self.alias.pk or 0
            sequence = _sequences[alias_id] = (
                _sequences.get(alias_id, chance.randrange(1 << 20)) + 1
            )
            return Snapshot(time.time(), {}, sequence=sequence)
        return snapshot

    async def _told(self, deployment: Deployment, outcome: Outcome) -> None:
        """Tell the shared state ``outcome``; a cooldown noted here too, and observed."""
        name = scope(deployment)
        try:
            until = await shared.told(deployment, outcome)
        except Unavailable as exc:
            _outage_log.warning("chatparity: deployment health not kept: %s", exc)
            until = time.time() + outcome.retry_after if outcome.retry_after else 0.0
        if until > _cooling.get(name, 0.0):
            _cooling[name] = until
            for observer in signals.observers:
                observer.deployment_cooled(
                    self.alias.public_id, deployment.label, until - time.time()
                )

    async def _hold(self, deployment: Deployment) -> Admission | bool:
        """``deployment``'s quota held for this request (False: it is full; True: there
        is nothing to hold, one deployment without a quota)."""
        if not self.group.shared and not deployment.has_quota:
            return True
        estimate = self.accounting.estimate
        held = await limits.hold(shared.quota(deployment), estimate.total if estimate else 0)
        return False if held is None else held

    async def _claim(self, deployment: Deployment) -> bool:
        try:
            return await shared.claim(deployment, app_settings.FIRST_BYTE_TIMEOUT)
        except Unavailable:
            return True

    async def _unclaim(self, deployment: Deployment) -> None:
        with contextlib.suppress(Unavailable):  # else the claim expires on its own
            await shared.unclaim(deployment)

    # -- the choice ------------------------------------------------------------------

    def _candidates(self, tier: Sequence[Deployment], snapshot: Snapshot) -> list[Candidate]:
        passed = self.failures | self.skipped | self.waiting
        return [
            Candidate(d, snapshot.health.get(scope(d), shared.HEALTHY))
            for d in tier
            if scope(d) not in passed
        ]

    def _available(self, candidate: Candidate, now: float) -> bool | None:
        """Whether ``candidate`` may be asked now (None: only as its cooldown's trial)."""
        health, deployment = candidate.health, candidate.deployment
        if health.cooling(now) or (
            self.group.shared and _cooling.get(scope(deployment), 0.0) > time.time()
        ):
            return False
        estimate = self.accounting.estimate
        tokens = estimate.total if estimate else 0
        full = (
            (deployment.max_in_flight and health.in_flight >= deployment.max_in_flight)
            or (
                deployment.requests_per_minute
                and health.used_requests >= deployment.requests_per_minute
            )
            or (
                deployment.tokens_per_minute
                and health.used_tokens + tokens > deployment.tokens_per_minute
            )
        )
        if full:
            return False
        if health.half_open:
            return None if not health.probing else False
        return True

    def _pick(self, snapshot: Snapshot) -> tuple[Candidate, bool] | None:
        """The candidate of the first tier with one available, and whether it is asked
        as its cooldown's trial; None when no tier has one."""
        routing = app_settings.ROUTING
        at = position(
            snapshot.sequence if snapshot.sequence is not None else chance.randrange(1 << 30)
        )
        for tier in self.group.tiers:
            ready, trials = [], []
            for candidate in self._candidates(tier, snapshot):
                available = self._available(candidate, snapshot.now)
                if available:
                    ready.append(candidate)
                elif available is None:
                    trials.append(candidate)
            if not ready and not trials:
                continue
            sticky = next(
                (c for c in [*ready, *trials] if c.deployment.pk == snapshot.sticky), None
            )
            if sticky is not None:
                return sticky, sticky in trials
            if trials:  # a deployment back from its cooldown is tried before any other
                return trials[0], True
            chosen = choose(
                self.alias.routing,
                ready,
                at,
                percent=float(routing["LATENCY_PERCENTILE"]),
                exploration=float(routing["EXPLORATION"]),
            )
            return chosen, False
        return None

    def _wait(self, snapshot: Snapshot) -> float | None:
        """Seconds to wait for a deployment to come back, when one does soon enough."""
        soonest = math.inf
        for deployment in self.group.deployments:
            name = scope(deployment)
            if name in self.failures:
                continue
            health = snapshot.health.get(name, shared.HEALTHY)
            ends = max(health.cooling_until - snapshot.now, _cooling.get(name, 0.0) - time.time())
            if ends > 0:
                soonest = min(soonest, ends)
            elif health.probing or name in self.waiting:
                soonest = min(soonest, POLL_SECONDS)
        budget = float(app_settings.ROUTING["MAX_WAIT_SECONDS"])
        if self.deadline is not None:
            budget = min(budget, self.deadline - asyncio.get_running_loop().time())
        return soonest if soonest <= budget else None

    def _unavailable(self, snapshot: Snapshot) -> APIError:
        """Why no deployment serves: the last failure of this request, else a 503 with
        the Retry-After of the first deployment to come back."""
        if self.failure is not None:
            return self.failure
        name = self.alias.public_id
        ends = [
            max(health.cooling_until - snapshot.now, _cooling.get(key, 0.0) - time.time())
            for key, health in snapshot.health.items()
        ]
        cooling = [seconds for seconds in ends if seconds > 0]
        if not cooling:  # every deployment at its quota
            return limits.rate_limited(
                f"Every deployment of '{name}' is at its quota (its upstream's requests or"
                " tokens per minute, or requests in flight): retry shortly.",
                "requests",
                60 - time.time() % 60,
                {},
            )
        seconds = max(1, math.ceil(min(cooling)))
        error = errors.service_unavailable(
            f"Every deployment of '{name}' is cooling down after failures or its upstream's"
            f" rate limit: retry after {seconds} s."
        )
        error.headers["retry-after"] = str(seconds)
        return error
