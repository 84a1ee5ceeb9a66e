"""What one request did, noted as it is served and turned into its RequestLog row."""

from __future__ import annotations

import functools
import ipaddress
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import orjson
from django.db.models import CharField

from ..conf import app_settings
from ..models import ApiKey, Endpoint, ModelAlias, RequestLog
from ..protocol.completion import CompletionAccumulator
from ..protocol.errors import APIError
from ..protocol.events import UpstreamCalls, Usage
from .settlement import settled_usage


@dataclass
class UsageRecord:
    """One request's facts, as its :class:`~chatparity.accounting.ledger.Accounting` notes them.

    ``key_prefix`` is the key's prefix unless given: a request with no key (an
    admin's trial) names who made it there instead.
    """

    request_id: str
    api_key: ApiKey | None = None
    endpoint: str = Endpoint.CHAT_COMPLETIONS
    key_prefix: str = ""
    client_ip: str | None = None
    user_agent: str = ""
    started: float = field(default_factory=time.perf_counter)
    completion_id: str = ""
    alias: str = ""
    backend: str = ""
    upstream_model: str = ""
    deployment: str = ""
    """The deployment of the alias that serves it (its label)."""
    deployments_tried: int = 0
    """Deployments asked so far, fallbacks' included."""
    stream: bool = False
    n: int = 1
    status_code: int = 200
    error: APIError | None = None
    cancelled: bool = False
    finish_reasons: dict[int, str] = field(default_factory=dict)
    usage: Usage | None = None
    """The usage the backend reported (its last event)."""
    completion_tokens_sent: int = 0
    reserved_prompt: int = 0
    """The prompt tokens its admission reserved for each upstream call."""
    upstream: UpstreamCalls = field(default_factory=UpstreamCalls)
    """The calls its backends made upstream, as they made them."""
    first_token_at: float | None = None
    request_body: Any = None
    model_alias: ModelAlias | None = None
    body: CompletionAccumulator | None = field(
        default_factory=lambda: CompletionAccumulator() if app_settings.LOG_BODIES else None
    )
    backend_started: float | None = None
    """When the first backend (of the alias or a fallback) was asked."""
    backend_answered: float | None = None
    """When the backend that serves the request sent its first event."""
    backend_ended: float | None = None
    """When that backend sent its last event, or failed."""
    trace: Any = None
    """The request's spans, when :mod:`chatparity.tracing` traces it."""
    headers: Mapping[str, str] = field(default_factory=dict)
    """The request's headers by lower-case name (a trace's ``traceparent``)."""
    omitted_tools: list[str] = field(default_factory=list)
    """The types of the hosted tools the serving alias left out (/v1/responses)."""
    cache: str = ""
    """What the response cache did (a :class:`~chatparity.models.CacheState`; "": its
    alias has none), ``cache_note`` why it was passed by or not written, and a semantic
    hit's ``cache_similarity``."""
    cache_note: str = ""
    cache_similarity: float | None = None
    saved: Usage | None = None
    """The usage of what the response cache answered: spent earlier, not now."""

    def __post_init__(self) -> None:
        if not self.key_prefix and self.api_key is not None:
            self.key_prefix = self.api_key.prefix

    def backend_seconds(self, now: float) -> float:
        """Seconds the request has waited on backends up to ``now``: from the first
        backend asked (fallbacks included) to the last event of the one that answered,
        or to its first event if it has not ended, or to ``now``."""
        if self.backend_started is None:
            return 0.0
        until = self.backend_ended or self.backend_answered or now
        return until - self.backend_started

    @property
    def tokens(self) -> Usage:
        """The usage the request is charged and logged with (:func:`settled_usage`)."""
        return settled_usage(
            self.reserved_prompt,
            self.upstream.prompts,
            self.usage,
            self.completion_tokens_sent,
            answered=self.backend_answered is not None,
        )

    def row(self) -> RequestLog:
        usage = self.tokens
        now = time.perf_counter()
        first = self.first_token_at
        generating = now - first if first is not None else 0.0
        log_bodies = app_settings.LOG_BODIES
        row = RequestLog(
            endpoint=self.endpoint,
            completion_id=self.completion_id,
            request_id=self.request_id,
            api_key=self.api_key,
            key_prefix=self.key_prefix,
            alias=self.alias,
            backend=self.backend,
            upstream_model=self.upstream_model,
            deployment=self.deployment,
            deployments_tried=self.deployments_tried,
            stream=self.stream,
            n=self.n,
            status_code=self.status_code,
            error_type=self.error.type if self.error else "",
            error_code=(self.error.code or "") if self.error else "",
            cancelled=self.cancelled,
            finish_reasons=[self.finish_reasons[index] for index in sorted(self.finish_reasons)],
            prompt_tokens=usage.prompt_tokens,
            completion_tokens=usage.completion_tokens,
            total_tokens=usage.total_tokens,
            cached_tokens=usage.cached_tokens,
            reasoning_tokens=usage.reasoning_tokens,
            cache_write_5m_tokens=usage.cache_write_5m_tokens,
            cache_write_1h_tokens=usage.cache_write_1h_tokens,
            usage_counted=usage.counted,
            omitted_tools=self.omitted_tools,
            time_to_first_token_ms=None if first is None else (first - self.started) * 1000,
            duration_ms=(now - self.started) * 1000,
            cost=self.model_alias.cost_of(usage) if self.model_alias else 0,
            cache=self.cache,
            cache_note=self.cache_note,
            cache_similarity=self.cache_similarity,
            cost_saved=self.model_alias.cost_of(saved)
            if self.model_alias and (saved := self.saved)
            else 0,
            output_tokens_per_second=usage.completion_tokens / generating
            if generating > 0
            else None,
            client_ip=ip_address(self.client_ip),
            user_agent=self.user_agent,
            request_body=storable(self.request_body) if log_bodies else None,
            # The body may be kept for a trace's sake alone (TRACE_CONTENT).
            response_body=orjson.dumps(self.body.completion()).decode()
            if self.body is not None and log_bodies
            else "",
        )
        return fit_columns(row)


def fit_columns(row: RequestLog) -> RequestLog:
    """``row`` with its bounded text columns cut to their length and without NUL
    characters, so PostgreSQL takes it."""
    for name, max_length in _text_columns():
        setattr(row, name, storable(getattr(row, name))[:max_length])
    return row


def storable(value: Any) -> Any:
    """``value`` without NUL characters, which PostgreSQL stores in neither text nor
    JSON: a client may send them (in a model name, a user agent, a message)."""
    if isinstance(value, str):
        return value.replace("\x00", "\ufffd")
    if isinstance(value, list):
        return [storable(item) for item in value]
    if isinstance(value, dict):
        return {storable(key): storable(item) for key, item in value.items()}
    return value


@functools.cache
def _text_columns() -> list[tuple[str, int]]:
    """The log's bounded text columns: a client's strings end up in several (the model
    it named, its user agent, an error code an upstream sent), and PostgreSQL refuses
    a row with a value longer than its column, which SQLite takes."""
    return [
        (field.attname, field.max_length)
        for field in RequestLog._meta.concrete_fields
        if isinstance(field, CharField) and field.max_length is not None
    ]


@functools.lru_cache(maxsize=4096)  # a worker sees the same clients again and again
def ip_address(address: str | None) -> str | None:
    """``address`` if it is an IP address: servers put other things in REMOTE_ADDR (a
    Unix socket's path, a test client's name), which PostgreSQL would refuse."""
    try:
        return str(ipaddress.ip_address(address or ""))
    except ValueError:
        return None
