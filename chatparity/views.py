"""Thin async views: authenticate -> validate -> route -> respond -> record."""

from __future__ import annotations

import asyncio
import logging
import re
import secrets
import string
import time
from collections.abc import AsyncIterator, Callable, Coroutine
from functools import wraps
from typing import Any

import orjson
from django.db import DatabaseError
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse, HttpResponseBase, StreamingHttpResponse
from django.views.decorators.csrf import csrf_exempt

from . import ratelimit
from .auth import allowed_alias_ids, authenticate
from .backends import ChatBackend, get_backend
from .conf import app_settings
from .models import ApiKey, ModelAlias
from .protocol import errors
from .protocol.completion import CompletionAccumulator
from .protocol.errors import APIError
from .protocol.events import Event
from .protocol.openapi import openapi_document
from .protocol.request import ChatRequest, Limits, decode_body, parse_chat_request
from .protocol.stream import DONE, ChunkEncoder, error_frame, sse
from .protocol.tokens import approximate_prompt_tokens
from .usage import UsageRecord, record_usage

logger = logging.getLogger(__name__)

_ALPHANUMERIC = string.ascii_letters + string.digits

View = Callable[..., Coroutine[Any, Any, HttpResponseBase]]


def json_response(payload: Any, status: int = 200) -> HttpResponse:
    return HttpResponse(orjson.dumps(payload), status=status, content_type="application/json")


def error_response(error: APIError) -> HttpResponse:
    response = json_response(error.envelope(), status=error.status)
    for name, value in error.headers.items():
        response[name] = value
    return response


def openai_endpoint(*methods: str) -> Callable[[View], View]:
    """Allow ``methods``, answer failures in OpenAI's envelope, and stamp every
    response with ``x-request-id``, ``openai-processing-ms`` and the headers the
    view put in ``request.chatparity_headers`` (rate limits)."""

    def decorate(view: View) -> View:
        @csrf_exempt
        @wraps(view)
        async def wrapper(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponseBase:
            started = time.perf_counter()
            response: HttpResponseBase
            request.chatparity_request_id = "req_" + secrets.token_hex(16)  # type: ignore[attr-defined]
            headers: dict[str, str] = {}
            request.chatparity_headers = headers  # type: ignore[attr-defined]
            if request.method not in methods:
                response = error_response(
                    APIError(
                        f"Invalid method for URL ({request.method} {request.path})", status=405
                    )
                )
            else:
                try:
                    response = await view(request, *args, **kwargs)
                except Exception as exc:
                    if not isinstance(exc, APIError):
                        logger.exception("chatparity: unexpected failure")
                    response = error_response(errors.as_api_error(exc))
            for name, value in headers.items():
                response.headers.setdefault(name, value)
            response["x-request-id"] = request.chatparity_request_id  # type: ignore[attr-defined]
            response["openai-processing-ms"] = str(round((time.perf_counter() - started) * 1000))
            return response

        return wrapper

    return decorate


def _usable_aliases(allowed: set[int] | None) -> QuerySet[ModelAlias]:
    aliases = ModelAlias.objects.filter(enabled=True)
    return aliases if allowed is None else aliases.filter(pk__in=allowed)


async def _resolve(model: str, key: ApiKey) -> ModelAlias:
    """The alias ``model`` names, if ``key`` may use it; else OpenAI's 404."""
    alias = (
        await _usable_aliases(await allowed_alias_ids(key))
        .select_related("backend")
        .filter(public_id__iexact=model, backend__enabled=True)
        .afirst()
    )
    if alias is None:
        raise errors.model_not_found(model)
    return alias


_DIGITS = re.compile(r"[0-9]+")


def _limits() -> Limits:
    return Limits(
        max_messages=app_settings.MAX_MESSAGES, max_content_chars=app_settings.MAX_CONTENT_CHARS
    )


def _decode(request: HttpRequest) -> Any:
    """The JSON body: a 413 above ``MAX_BODY_BYTES``, OpenAI's 400 if it is not JSON."""
    limit: int = app_settings.MAX_BODY_BYTES
    declared = request.META.get("CONTENT_LENGTH", "")
    if _DIGITS.fullmatch(declared) and int(declared) > limit:
        raise errors.request_too_large(limit)
    # Not request.body: it also applies DATA_UPLOAD_MAX_MEMORY_SIZE (2.5 MB by
    # default), whose exception would be a 500, and it chokes on a malformed
    # Content-Length. Reading one byte past the limit tells an oversized body
    # whatever Content-Length said.
    body = request.read(limit + 1)
    if len(body) > limit:
        raise errors.request_too_large(limit)
    return decode_body(body)


@openai_endpoint("POST")
async def chat_completions(request: HttpRequest) -> HttpResponseBase:
    key = await authenticate(request)
    record = UsageRecord(
        request_id=request.chatparity_request_id,  # type: ignore[attr-defined]
        api_key=key,
        client_ip=request.META.get("REMOTE_ADDR"),
        user_agent=request.headers.get("User-Agent", ""),
    )
    try:
        body = _decode(request)
        record.request_body = body
        chat = parse_chat_request(body, _limits())
        record.alias, record.stream, record.n = chat.model, chat.stream, chat.n
        alias = await _resolve(chat.model, key)
        record.alias = alias.public_id  # as configured, so reports group one alias once
        record.model_alias = alias
        estimate = approximate_prompt_tokens(chat.messages) + (chat.max_tokens or 0) * chat.n
        record.admission = await ratelimit.admit(key, alias, estimate)
        request.chatparity_headers.update(record.admission.headers)  # type: ignore[attr-defined]
        chat, backend, events, first = await _start(body, alias, key, record)
    except asyncio.CancelledError:
        record.cancelled = True
        await _record(record)
        raise
    except Exception as exc:
        record.fail(errors.as_api_error(exc))
        await _record(record)
        raise

    record.completion_id = "chatcmpl-" + "".join(secrets.choice(_ALPHANUMERIC) for _ in range(29))
    encoder = ChunkEncoder(
        completion_id=record.completion_id,
        created=int(time.time()),
        model=chat.model,
        system_fingerprint=backend.system_fingerprint,
        include_usage=chat.include_usage or not chat.stream,
        logprobs=chat.logprobs,
    )
    chunks = _chunks(first, events, encoder, record)
    if not chat.stream:
        accumulator = CompletionAccumulator()
        async for chunk in chunks:
            accumulator.add(chunk)
        return json_response(accumulator.completion())
    response = StreamingHttpResponse(
        _event_stream(chunks), content_type="text/event-stream; charset=utf-8"
    )
    response["Cache-Control"] = "no-cache"
    response["X-Accel-Buffering"] = "no"
    return response


# Failures that mean "this backend is unreachable": the next fallback alias may serve.
_UNAVAILABLE = frozenset({502, 503, 504})


async def _start(
    body: dict[str, Any], alias: ModelAlias, key: ApiKey, record: UsageRecord
) -> tuple[ChatRequest, ChatBackend, AsyncIterator[Event], Event]:
    """The first event from ``alias``'s backend, or else from its fallbacks in order.

    Only here, before the client has seen a byte, may a request move elsewhere.
    """
    fallbacks = list(alias.fallbacks)
    while True:
        chat = parse_chat_request({**alias.default_params, **body})
        record.backend, record.upstream_model = alias.backend.name, alias.model
        backend = get_backend(alias.backend)
        events = aiter(backend.stream(chat, alias.model))
        try:
            return chat, backend, events, await anext(events)
        except APIError as error:
            if error.status not in _UNAVAILABLE:
                raise
            fallback = await _first_usable(fallbacks, key)
            if fallback is None:
                raise
            logger.warning("chatparity: %s failed (%s), falling back to %s", alias, error, fallback)
            alias = fallback


async def _first_usable(public_ids: list[str], key: ApiKey) -> ModelAlias | None:
    """Pop ``public_ids`` up to the first alias that exists and ``key`` may use."""
    while public_ids:
        try:
            return await _resolve(public_ids.pop(0), key)
        except APIError:
            continue
    return None


async def _chunks(
    first: Event, events: AsyncIterator[Event], encoder: ChunkEncoder, record: UsageRecord
) -> AsyncIterator[dict[str, Any]]:
    """The request's chunks; usage is recorded once when they end, however they end."""

    async def all_events() -> AsyncIterator[Event]:
        yield first
        async for event in events:
            yield event

    try:
        async for event in all_events():
            record.observe(event)
            for chunk in encoder.encode(event):
                record.observe_chunk(chunk)
                yield chunk
    except asyncio.CancelledError:
        record.cancelled = True
        raise
    except Exception as exc:
        failure = errors.as_api_error(exc)
        record.fail(failure, streaming=record.stream)
        if failure is exc:
            raise
        logger.exception("chatparity: backend failed mid-response")
        raise failure from exc
    finally:
        await events.aclose()  # type: ignore[attr-defined]
        await _record(record)


async def _record(record: UsageRecord) -> None:
    """Write the request's log row. A database that refuses it even after retries is
    logged loudly, never made the client's error: the answer or the error the client
    was getting still reaches it (a stream still ends with [DONE])."""
    try:
        await record_usage(record)
    except DatabaseError:
        logger.exception("chatparity: the log row of %s was lost", record.request_id)


async def _event_stream(chunks: AsyncIterator[dict[str, Any]]) -> AsyncIterator[bytes]:
    """SSE frames; a failure after the first byte becomes one error frame + [DONE]."""
    try:
        async for chunk in chunks:
            yield sse(chunk)
    except APIError as error:
        yield error_frame(error)
    yield DONE


def _model_object(alias: ModelAlias) -> dict[str, Any]:
    return {
        "id": alias.public_id,
        "object": "model",
        "created": int(alias.created_at.timestamp()),
        "owned_by": alias.owned_by,
    }


@openai_endpoint("GET")
async def list_models(request: HttpRequest) -> HttpResponse:
    key = await authenticate(request)
    allowed = await allowed_alias_ids(key)
    aliases = _usable_aliases(allowed).filter(listed=True).order_by("public_id")
    return json_response({"object": "list", "data": [_model_object(a) async for a in aliases]})


@openai_endpoint("GET")
async def retrieve_model(request: HttpRequest, model: str) -> HttpResponse:
    key = await authenticate(request)
    allowed = await allowed_alias_ids(key)
    alias = await _usable_aliases(allowed).filter(public_id__iexact=model).afirst()
    if alias is None:
        raise APIError(
            f"The model '{model}' does not exist", status=404, param="model", code="model_not_found"
        )
    return json_response(_model_object(alias))


@openai_endpoint("GET", "POST", "PUT", "PATCH", "DELETE")
async def invalid_url(request: HttpRequest) -> HttpResponse:
    raise APIError(f"Invalid URL ({request.method} {request.path})", status=404)


@openai_endpoint("GET")
async def openapi(request: HttpRequest) -> HttpResponse:
    """The OpenAPI document of ``/v1``, stating the configured limits; no key needed."""
    document = openapi_document(
        server_url=request.path.rsplit("/", 1)[0],  # where /v1 is mounted
        limits=_limits(),
        max_body_bytes=app_settings.MAX_BODY_BYTES,
    )
    return json_response(document)


__all__ = ["ChatRequest", "chat_completions", "list_models", "openapi", "retrieve_model"]
