"""The spans of a request, made as it goes by the :class:`Tracing` observer.

``chat {model}`` (kind SERVER, a child of whatever span is current: a site's ASGI or
Django instrumentation; a client's ``traceparent`` is linked to, or with
``CHATPARITY["TRACE_CLIENT_PARENT"]`` its parent) has the GenAI attributes of what the
client asked and got; its children are ``chatparity.admission``, one ``chat
{upstream model}`` (kind CLIENT) per backend asked (a fallback's too) and
``chatparity.log``. The prompt and the completion are on the request's span only
when ``CHATPARITY["TRACE_CONTENT"]`` is on.
"""

from __future__ import annotations

from collections.abc import Mapping
from contextvars import Token
from dataclasses import dataclass
from typing import Any

import orjson
from opentelemetry import context, propagate, trace
from opentelemetry.context import Context
from opentelemetry.trace import Link, Span, SpanKind, Status, StatusCode

from ..accounting.record import UsageRecord
from ..conf import app_settings
from ..models import Endpoint, RequestLog
from ..protocol.completion import CompletionAccumulator
from ..signals import Observer

OPERATION = "chat"
"""``gen_ai.operation.name`` of a request, until its endpoint says otherwise."""
SYSTEM = "openai"
"""``gen_ai.provider.name``: the wire the gateway speaks, whatever serves it."""

# Sampling parameters put on the spans, by their names in the request body.
_REQUEST_PARAMETERS = {
    "max_tokens": "gen_ai.request.max_tokens",
    "max_completion_tokens": "gen_ai.request.max_tokens",
    "max_output_tokens": "gen_ai.request.max_tokens",
    "temperature": "gen_ai.request.temperature",
    "top_p": "gen_ai.request.top_p",
    "seed": "gen_ai.request.seed",
    "frequency_penalty": "gen_ai.request.frequency_penalty",
    "presence_penalty": "gen_ai.request.presence_penalty",
}

tracer = trace.get_tracer("chatparity")


@dataclass
class _Spans:
    """One request's open spans."""

    request: Span
    admission: Span | None = None
    backend: Span | None = None
    backend_context: Token[Context] | None = None
    log: Span | None = None

    def child(self, name: str, kind: SpanKind = SpanKind.INTERNAL) -> Span:
        return tracer.start_span(name, trace.set_span_in_context(self.request), kind=kind)


def _spans(record: UsageRecord) -> _Spans | None:
    """The request's spans; None for one that began before tracing did."""
    spans = record.trace
    return spans if isinstance(spans, _Spans) else None


def _operation(record: UsageRecord) -> str:
    """The GenAI operation of the request: ``embeddings``, or ``chat`` (every other wire
    carries a conversation)."""
    return "embeddings" if record.endpoint == Endpoint.EMBEDDINGS else OPERATION


def _failed(span: Span, failure: BaseException) -> None:
    span.set_attribute("error.type", getattr(failure, "code", None) or type(failure).__name__)
    span.set_status(Status(StatusCode.ERROR, str(failure)[:200]))


class Tracing(Observer):
    """Makes the spans of every request."""

    def started(self, record: UsageRecord) -> None:
        # Whatever span is current (a site's instrumentation of its server), else a
        # trace of its own; a client's traceparent only as TRACE_CLIENT_PARENT says.
        parent, links = _client_trace(record.headers)
        span = tracer.start_span(
            OPERATION,
            parent,
            kind=SpanKind.SERVER,
            links=links,
            attributes={
                "gen_ai.operation.name": OPERATION,
                "gen_ai.provider.name": SYSTEM,
                "chatparity.request_id": record.request_id,
                "chatparity.endpoint": record.endpoint,
            },
        )
        record.trace = _Spans(span)
        if app_settings.TRACE_CONTENT and record.body is None:
            record.body = CompletionAccumulator()

    def admitting(self, record: UsageRecord) -> None:
        if (spans := _spans(record)) is not None:
            spans.admission = spans.child("chatparity.admission")

    def admitted(self, record: UsageRecord, refusal: BaseException | None) -> None:
        spans = _spans(record)
        if spans is None or spans.admission is None:
            return
        if refusal is not None:
            _failed(spans.admission, refusal)
        spans.admission.end()
        spans.admission = None

    def calling_backend(self, record: UsageRecord) -> None:
        spans = _spans(record)
        if spans is None:
            return
        operation = _operation(record)
        span = spans.child(f"{operation} {record.upstream_model}".rstrip(), SpanKind.CLIENT)
        span.set_attributes(
            {
                "gen_ai.operation.name": operation,
                "gen_ai.provider.name": SYSTEM,
                "gen_ai.request.model": record.upstream_model,
                "chatparity.backend": record.backend,
            }
        )
        spans.backend = span
        # Current while the backend is asked for its first event, in this task: what
        # the upstream's HTTP request propagates as its traceparent.
        spans.backend_context = context.attach(trace.set_span_in_context(span))

    def backend_answered(self, record: UsageRecord, failure: BaseException | None) -> None:
        spans = _spans(record)
        if spans is None:
            return
        if spans.backend_context is not None:
            context.detach(spans.backend_context)
            spans.backend_context = None
        if failure is not None and spans.backend is not None:
            _failed(spans.backend, failure)
            spans.backend.end()
            spans.backend = None

    def backend_done(self, record: UsageRecord) -> None:
        spans = _spans(record)
        if spans is None or spans.backend is None:
            return
        span, spans.backend = spans.backend, None
        span.set_attributes(_outcome(record))
        if record.error is not None:
            _failed(span, record.error)
        span.end()

    def writing(self, record: UsageRecord) -> None:
        if (spans := _spans(record)) is not None:
            spans.log = spans.child("chatparity.log")

    def ended(self, record: UsageRecord, row: RequestLog) -> None:
        spans = _spans(record)
        if spans is None:
            return
        if spans.log is not None:
            spans.log.end()
        if spans.backend is not None:  # answered, but never read (abandoned)
            self.backend_done(record)
        span = spans.request
        model = row.alias
        operation = _operation(record)
        span.update_name(f"{operation} {model}".rstrip())
        span.set_attributes(
            {
                "gen_ai.operation.name": operation,
                "chatparity.endpoint": row.endpoint,
                "gen_ai.request.model": model,
                "gen_ai.response.model": model,
                "http.response.status_code": row.status_code,
                "chatparity.backend": row.backend,
                "chatparity.stream": row.stream,
                "chatparity.cancelled": row.cancelled,
                **_requested(record.request_body),
                **_outcome(record),
            }
        )
        if record.body is not None and app_settings.TRACE_CONTENT:
            span.set_attributes(_content(record))
        if record.error is not None:
            _failed(span, record.error)
        span.end()

    def upstream_headers(self) -> bytes:
        carrier: dict[str, str] = {}
        propagate.inject(carrier)
        return "".join(f"{name}: {value}\r\n" for name, value in carrier.items()).encode()


def _client_trace(headers: Mapping[str, str]) -> tuple[Context | None, list[Link]]:
    """The parent of a request's span and its links: the client's ``traceparent`` is its
    parent with ``TRACE_CLIENT_PARENT``, else only linked to (a key holder chooses
    neither the trace nor whether it is sampled)."""
    if "traceparent" not in headers:
        return None, []
    client = propagate.extract(headers)
    if app_settings.TRACE_CLIENT_PARENT:
        return client, []
    span_context = trace.get_current_span(client).get_span_context()
    return None, [Link(span_context)] if span_context.is_valid else []


def _requested(body: Any) -> dict[str, Any]:
    """The sampling parameters of the request ``body``, as GenAI attributes."""
    if not isinstance(body, dict):
        return {}
    attributes: dict[str, Any] = {}
    for name, attribute in _REQUEST_PARAMETERS.items():
        value = body.get(name)
        if isinstance(value, int | float) and not isinstance(value, bool):
            attributes[attribute] = value
    return attributes


def _outcome(record: UsageRecord) -> dict[str, Any]:
    """What the backend answered, as GenAI attributes."""
    usage = record.tokens
    attributes: dict[str, Any] = {
        "gen_ai.usage.input_tokens": usage.prompt_tokens,
        "gen_ai.usage.output_tokens": usage.completion_tokens,
        "gen_ai.response.finish_reasons": [
            record.finish_reasons[index] for index in sorted(record.finish_reasons)
        ],
    }
    if record.completion_id:
        attributes["gen_ai.response.id"] = record.completion_id
    return attributes


def _content(record: UsageRecord) -> dict[str, str]:
    """The prompt and the answer (opted in), as JSON."""
    body = record.request_body if isinstance(record.request_body, dict) else {}
    prompt = body.get("messages", body.get("input"))
    assert record.body is not None
    return {
        "gen_ai.input.messages": orjson.dumps(prompt).decode(),
        "gen_ai.output.messages": orjson.dumps(record.body.completion()).decode(),
    }
