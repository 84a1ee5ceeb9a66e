"""The Prometheus metrics of the gateway, and the observer that keeps them.

Defined once per process, in prometheus-client's default registry; under
``PROMETHEUS_MULTIPROC_DIR`` each worker writes its values there and a scrape adds
them up (gauges of requests in flight and rows pending: the sum over live workers).

Labels are bounded: an alias is named only when it is configured (what clients
invent is ``unknown``), backends by their configured name; never a key.
"""

from __future__ import annotations

import asyncio
import bisect
import functools
from collections import defaultdict
from typing import Any, NamedTuple

from prometheus_client import Counter, Gauge, Histogram

from ..accounting.record import UsageRecord
from ..models import RequestLog
from ..signals import Observer

UNKNOWN = "unknown"
"""The alias label of a request for a model no alias serves."""

_LATENCY = (0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)
_OVERHEAD = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1)

REQUESTS = Counter(
    "chatparity_requests",
    "Requests to /v1 that reached their endpoint's pipeline, once each has ended.",
    ["endpoint", "alias", "backend", "status_class", "stream"],
)
DURATION = Histogram(
    "chatparity_request_duration_seconds",
    "From the key checked to the reply's end.",
    ["endpoint", "alias", "stream"],
    buckets=_LATENCY,
)
TIME_TO_FIRST_TOKEN = Histogram(
    "chatparity_time_to_first_token_seconds",
    "From the key checked to the first text or tool-call delta.",
    ["endpoint", "alias"],
    buckets=_LATENCY,
)
OVERHEAD = Histogram(
    "chatparity_overhead_seconds",
    "The gateway's own time in a request: its duration less the time waiting on backends.",
    ["endpoint", "stream"],
    buckets=_OVERHEAD,
)
TOKENS = Counter(
    "chatparity_tokens",
    "Tokens used, as logged, by kind: prompt (every input token), completion; and parts of"
    " them: cache_read, cache_write_5m, cache_write_1h (of the prompt), reasoning (of the"
    " completion).",
    ["alias", "kind"],
)
# The kinds of tokens counted, by the log's column of each.
TOKEN_KINDS = {
    "prompt_tokens": "prompt",
    "completion_tokens": "completion",
    "cached_tokens": "cache_read",
    "cache_write_5m_tokens": "cache_write_5m",
    "cache_write_1h_tokens": "cache_write_1h",
    "reasoning_tokens": "reasoning",
}
COST = Counter("chatparity_cost", "Cost at the alias's prices, as logged.", ["alias"])
IN_FLIGHT = Gauge(
    "chatparity_requests_in_flight",
    "Requests begun and not ended.",
    multiprocess_mode="livesum",
)
RATE_LIMITED = Counter(
    "chatparity_rate_limited", "Requests refused by a limit, by the limit's kind.", ["kind"]
)
UPSTREAM_ERRORS = Counter(
    "chatparity_backend_errors",
    "Backends that failed a request: before their first event, or midway.",
    ["backend", "when"],
)
UPSTREAM_RETRIES = Counter(
    "chatparity_upstream_retries", "Upstream HTTP requests asked again.", ["backend"]
)
FALLBACKS = Counter(
    "chatparity_fallbacks",
    "Requests moved to a fallback alias, by the backend that failed.",
    ["backend"],
)
DEPLOYMENT_REQUESTS = Counter(
    "chatparity_deployment_requests",
    "Requests asked of each deployment of an alias, by how it answered before its first"
    " event: answered, failed (a 5xx, refused, timed out), rate_limited (a 429), refused"
    " (another 4xx).",
    ["alias", "deployment", "outcome"],
)
DEPLOYMENT_FIRST_EVENT = Histogram(
    "chatparity_deployment_first_event_seconds",
    "From a deployment asked to its first event (the first token of a stream, the whole"
    " answer otherwise): what lowest-latency routing ranks by.",
    ["alias", "deployment"],
    buckets=_LATENCY,
)
DEPLOYMENT_COOLDOWNS = Counter(
    "chatparity_deployment_cooldowns",
    "Times a deployment was cooled down (by this worker's requests).",
    ["alias", "deployment"],
)
LOG_ROWS = Counter(
    "chatparity_log_rows",
    "Request log rows: written, spooled (the database was away), lost, drained from the spool.",
    ["outcome"],
)
LOG_ROWS_PENDING = Gauge(
    "chatparity_log_rows_pending",
    "Request log rows waiting for their write.",
    multiprocess_mode="livesum",
)
SPOOL_ERRORS = Counter(
    "chatparity_spool_errors",
    "Uses of the spool folder that failed: drain (the log writer's pass), count (a scrape's),"
    " keep (rows the database could not take).",
    ["operation"],
)
CACHE_LOOKUPS = Counter(
    "chatparity_cache_lookups",
    "Reads of the key and alias cache: a hit, else a load from the database.",
    ["cache", "result"],
)


_STATUS_CLASSES = ("1xx", "1xx", "2xx", "3xx", "4xx", "5xx")

FLUSH_SECONDS = 1.0
"""The longest a worker keeps what requests added before it reaches the metrics."""


class _Tally:
    """What requests added since the last flush, in plain numbers on the event loop's
    thread: prometheus-client takes a lock per value changed (and under multiprocess
    mode writes a shared file), 25 µs a request here against 3 for this. Applied
    within :data:`FLUSH_SECONDS`, and before each scrape.

    Histograms are counted into their own buckets and added through the child's
    ``_sum`` and ``_buckets``, which prometheus-client's ``observe`` itself updates.
    """

    def __init__(self) -> None:
        self.amounts: defaultdict[Any, float] = defaultdict(float)
        self.observed: dict[Any, list[float]] = {}  # a bucket's count each, then the sum
        self._timer: asyncio.TimerHandle | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    def observe(self, histogram: Any, value: float) -> None:
        counts = self.observed.get(histogram)
        if counts is None:
            counts = self.observed[histogram] = [0.0] * (len(histogram._upper_bounds) + 1)
        counts[bisect.bisect_left(histogram._upper_bounds, value)] += 1
        counts[-1] += value

    def soon(self) -> None:
        """Flush within :data:`FLUSH_SECONDS`, on this event loop (at once without one)."""
        if self._timer is not None and self._loop is not None and not self._loop.is_closed():
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            self.flush()
            return
        self._loop, self._timer = loop, loop.call_later(FLUSH_SECONDS, self.flush)

    def flush(self) -> None:
        self._timer = None
        amounts, self.amounts = self.amounts, defaultdict(float)
        observed, self.observed = self.observed, {}
        for child, amount in amounts.items():
            if amount:
                child.inc(amount)
        for histogram, counts in observed.items():
            histogram._sum.inc(counts[-1])
            for bucket, count in zip(histogram._buckets, counts, strict=False):
                if count:
                    bucket.inc(count)


_tally = _Tally()


def flush() -> None:
    """Apply what this process's requests added to the metrics (before a scrape)."""
    _tally.flush()


class _Children(NamedTuple):
    """The labelled metrics one kind of request counts in."""

    requests: Any
    duration: Any
    time_to_first_token: Any
    overhead: Any
    tokens: dict[str, Any]
    """By the log's column (:data:`TOKEN_KINDS`)."""
    cost: Any


# Looked up once per kind of request: labels() checks and locks on every call, and the
# labels are bounded, so the cache is too.
@functools.cache
def _children(
    endpoint: str, alias: str, backend: str, status_class: str, stream: bool
) -> _Children:
    streamed = "true" if stream else "false"
    return _Children(
        REQUESTS.labels(endpoint, alias, backend, status_class, streamed),
        DURATION.labels(endpoint, alias, streamed),
        TIME_TO_FIRST_TOKEN.labels(endpoint, alias),
        OVERHEAD.labels(endpoint, streamed),
        {column: TOKENS.labels(alias, kind) for column, kind in TOKEN_KINDS.items()},
        COST.labels(alias),
    )


@functools.cache
def _deployment(alias: str, deployment: str) -> tuple[Any, Any, Any, Any, Any]:
    return (
        DEPLOYMENT_REQUESTS.labels(alias, deployment, "answered"),
        DEPLOYMENT_REQUESTS.labels(alias, deployment, "failed"),
        DEPLOYMENT_REQUESTS.labels(alias, deployment, "rate_limited"),
        DEPLOYMENT_REQUESTS.labels(alias, deployment, "refused"),
        DEPLOYMENT_FIRST_EVENT.labels(alias, deployment),
    )


def _outcome(failure: BaseException) -> int:
    """Which of :func:`_deployment`'s counters a failure counts in."""
    status = getattr(failure, "status", 500)
    return 2 if status == 429 else 1 if status >= 500 else 3


@functools.cache
def _lookups(cache: str, hit: bool) -> Any:
    return CACHE_LOOKUPS.labels(cache, "hit" if hit else "miss")


@functools.cache
def _log_rows(outcome: str) -> Any:
    return LOG_ROWS.labels(outcome)


class Metrics(Observer):
    """Keeps the metrics above as requests go."""

    def started(self, record: UsageRecord) -> None:
        _tally.amounts[IN_FLIGHT] += 1

    def backend_answered(self, record: UsageRecord, failure: BaseException | None) -> None:
        if isinstance(failure, Exception):  # not a client that left, nor a time-out
            UPSTREAM_ERRORS.labels(record.backend, "before_first_event").inc()

    def writing(self, record: UsageRecord) -> None:
        _tally.amounts[LOG_ROWS_PENDING] += 1

    def ended(self, record: UsageRecord, row: RequestLog) -> None:
        amounts, observe = _tally.amounts, _tally.observe
        amounts[IN_FLIGHT] -= 1
        amounts[LOG_ROWS_PENDING] -= 1
        alias = row.alias if record.model_alias is not None else UNKNOWN
        status_class = _STATUS_CLASSES[min(row.status_code // 100, 5)]
        of = _children(row.endpoint, alias, row.backend, status_class, row.stream)
        amounts[of.requests] += 1
        duration = row.duration_ms / 1000
        observe(of.duration, duration)
        if row.time_to_first_token_ms is not None:
            observe(of.time_to_first_token, row.time_to_first_token_ms / 1000)
        waited = record.backend_seconds(record.started + duration)
        observe(of.overhead, max(duration - waited, 0.0))
        for column, child in of.tokens.items():
            if count := getattr(row, column):
                amounts[child] += count
        if row.cost:
            amounts[of.cost] += float(row.cost)
        if record.error is not None and record.backend_answered is not None:
            UPSTREAM_ERRORS.labels(record.backend, "midway").inc()
        _tally.soon()

    def deployment_answered(
        self, record: UsageRecord, seconds: float, failure: BaseException | None
    ) -> None:
        if isinstance(failure, asyncio.CancelledError):
            return
        of = _deployment(record.alias, record.deployment)
        if failure is None:
            _tally.amounts[of[0]] += 1
            _tally.observe(of[4], seconds)
        else:
            _tally.amounts[of[_outcome(failure)]] += 1
        _tally.soon()

    def deployment_cooled(self, alias: str, deployment: str, seconds: float) -> None:
        DEPLOYMENT_COOLDOWNS.labels(alias, deployment).inc()

    def rate_limited(self, kind: str) -> None:
        RATE_LIMITED.labels(kind).inc()

    def upstream_retry(self, backend: str) -> None:
        UPSTREAM_RETRIES.labels(backend).inc()

    def fallback(self, backend: str) -> None:
        FALLBACKS.labels(backend).inc()

    def log_rows(self, outcome: str, count: int) -> None:
        _log_rows(outcome).inc(count)  # once a request: after its row, not worth a tally

    def spool_failed(self, operation: str) -> None:
        SPOOL_ERRORS.labels(operation).inc()

    def lookup(self, cache: str, hit: bool) -> None:
        _tally.amounts[_lookups(cache, hit)] += 1
