"""The Prometheus metrics of the gateway, and the observer that keeps them.

Defined once per process, in prometheus-client's default registry; under
``PROMETHEUS_MULTIPROC_DIR`` each worker writes its values there and a scrape adds
them up (gauges of requests in flight and rows pending: the sum over live workers).

Labels are bounded: an alias is named only when it is configured (what clients
invent is ``unknown``), backends by their configured name; never a key.
"""

from __future__ import annotations

import functools
from typing import Any, NamedTuple

from prometheus_client import Counter, Gauge, Histogram

from ..models import RequestLog
from ..signals import Observer
from ..usage import UsageRecord

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
    "chatparity_tokens", "Tokens used, as logged.", ["alias", "kind"]
)  # kind: prompt | completion
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
CACHE_LOOKUPS = Counter(
    "chatparity_cache_lookups",
    "Reads of the key and alias cache: a hit, else a load from the database.",
    ["cache", "result"],
)


_STATUS_CLASSES = ("1xx", "1xx", "2xx", "3xx", "4xx", "5xx")


class _Children(NamedTuple):
    """The labelled metrics one kind of request counts in."""

    requests: Any
    duration: Any
    time_to_first_token: Any
    overhead: Any
    prompt_tokens: Any
    completion_tokens: Any
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
        TOKENS.labels(alias, "prompt"),
        TOKENS.labels(alias, "completion"),
        COST.labels(alias),
    )


class Metrics(Observer):
    """Keeps the metrics above as requests go."""

    def started(self, record: UsageRecord) -> None:
        IN_FLIGHT.inc()

    def backend_answered(self, record: UsageRecord, failure: BaseException | None) -> None:
        if isinstance(failure, Exception):  # not a client that left, nor a time-out
            UPSTREAM_ERRORS.labels(record.backend, "before_first_event").inc()

    def writing(self, record: UsageRecord) -> None:
        LOG_ROWS_PENDING.inc()

    def ended(self, record: UsageRecord, row: RequestLog) -> None:
        IN_FLIGHT.dec()
        LOG_ROWS_PENDING.dec()
        alias = row.alias if record.model_alias is not None else UNKNOWN
        status_class = _STATUS_CLASSES[min(row.status_code // 100, 5)]
        of = _children(row.endpoint, alias, row.backend, status_class, row.stream)
        of.requests.inc()
        duration = row.duration_ms / 1000
        of.duration.observe(duration)
        if row.time_to_first_token_ms is not None:
            of.time_to_first_token.observe(row.time_to_first_token_ms / 1000)
        waited = record.backend_seconds(record.started + duration)
        of.overhead.observe(max(duration - waited, 0.0))
        if row.prompt_tokens:
            of.prompt_tokens.inc(row.prompt_tokens)
        if row.completion_tokens:
            of.completion_tokens.inc(row.completion_tokens)
        if row.cost:
            of.cost.inc(float(row.cost))
        if record.error is not None and record.backend_answered is not None:
            UPSTREAM_ERRORS.labels(record.backend, "midway").inc()

    def rate_limited(self, kind: str) -> None:
        RATE_LIMITED.labels(kind).inc()

    def upstream_retry(self, backend: str) -> None:
        UPSTREAM_RETRIES.labels(backend).inc()

    def fallback(self, backend: str) -> None:
        FALLBACKS.labels(backend).inc()

    def log_rows(self, outcome: str, count: int) -> None:
        LOG_ROWS.labels(outcome).inc(count)

    def lookup(self, cache: str, hit: bool) -> None:
        _lookups(cache, hit).inc()


@functools.cache
def _lookups(cache: str, hit: bool) -> Any:
    return CACHE_LOOKUPS.labels(cache, "hit" if hit else "miss")
