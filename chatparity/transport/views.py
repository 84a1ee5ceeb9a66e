"""The ``/v1`` endpoints as Django views: thin adapters around :mod:`chatparity.gateway.pipeline`.

Mounted through ``chatparity.urls``, they run behind the site's middleware.
:mod:`chatparity.transport.fastpath` serves the same endpoints faster, in front of Django.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Coroutine, Mapping
from typing import Any

from django.http import HttpRequest, HttpResponse, HttpResponseBase, StreamingHttpResponse
from django.views.decorators.csrf import csrf_exempt

from ..gateway import embeddings, messages, pipeline, responses
from ..gateway.pipeline import Call, Endpoint, Reply
from .cors import is_preflight, policy

View = Callable[..., Coroutine[Any, Any, HttpResponseBase]]


def django_view(handler: Endpoint) -> View:
    """A Django view serving ``handler``; the ASGI fast path finds ``handler`` on it."""

    @csrf_exempt
    async def view(request: HttpRequest, **kwargs: Any) -> HttpResponseBase:
        origin = request.headers.get("origin")
        if origin is not None and is_preflight(request.method or "", request.headers):
            return _preflight_response(request.headers)

        async def read_body(limit: int) -> bytes:
            # Read only once the key is checked. Under Django's ASGI handler the body
            # is already here (it reads the whole body before any view runs); under
            # WSGI the server reads it, within its own time-outs.
            return request.read(limit)

        call = Call(
            method=request.method or "GET",
            path=request.path,
            headers=request.headers,
            read_body=read_body,
            client_ip=request.META.get("REMOTE_ADDR"),
            query=request.META.get("QUERY_STRING", ""),
        )
        # An endpoint cancelled before its reply (the client left) accounts for itself.
        reply = await handler(call, **kwargs)
        if origin is not None and (cors := policy()) is not None:
            cors.add_response_headers(origin, reply.headers)
        if reply.stream is None:
            await reply.close()  # a view's work ends when it returns its response
            response: HttpResponseBase = HttpResponse(
                reply.body, status=reply.status, content_type=reply.content_type
            )
        else:
            response = StreamingHttpResponse(
                _sending(reply, reply.stream), status=reply.status, content_type=reply.content_type
            )
        for name, value in reply.headers.items():
            if name != "content-type":
                response[name] = value
        return response

    view.__name__ = view.__qualname__ = handler.__name__
    view.__doc__ = handler.__doc__
    view.chatparity_endpoint = handler  # type: ignore[attr-defined]
    return view


def _preflight_response(headers: Mapping[str, str]) -> HttpResponse:
    """A browser's CORS preflight: 200, with no body, granting what it asks only to an
    allowed origin."""
    response = HttpResponse()
    del response["content-type"]
    response["content-length"] = "0"
    cors = policy()
    if cors is not None:
        for name, value in cors.preflight_headers(headers).items():
            response[name] = value
    return response


async def _sending(reply: Reply, frames: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
    """``reply``'s ``frames``, for Django to send; the reply closed once they are sent
    or Django stopped asking for them (the client left)."""
    try:
        async for frame in frames:
            yield frame
    except BaseException:  # GeneratorExit or CancelledError: the client left
        reply.cancel()
        raise
    finally:
        await reply.close()


chat_completions = django_view(pipeline.chat_completions)
list_models = django_view(pipeline.list_models)
retrieve_model = django_view(pipeline.retrieve_model)
openapi = django_view(pipeline.openapi)
invalid_url = django_view(pipeline.invalid_url)
create_response = django_view(responses.create_response)
response = django_view(responses.response)
response_input_items = django_view(responses.input_items)
create_message = django_view(messages.create_message)
count_message_tokens = django_view(messages.count_tokens)
messages_not_found = django_view(messages.not_found)
create_embeddings = django_view(embeddings.embeddings)

__all__ = [
    "chat_completions",
    "count_message_tokens",
    "create_embeddings",
    "create_message",
    "create_response",
    "invalid_url",
    "list_models",
    "messages_not_found",
    "openapi",
    "response",
    "response_input_items",
    "retrieve_model",
]
