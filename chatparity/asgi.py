"""The ASGI fast path: ``/v1`` served in front of Django's request handler.

Wrap the project's ASGI application::

    from chatparity.asgi import FastPath
    application = FastPath(get_asgi_application())

Requests whose URL resolves to a chatparity ``/v1`` view (wherever the
URLconf mounts ``chatparity.urls``) are answered here, on the event loop,
with no thread per request and no middleware; everything else goes to Django
untouched. The answers are the same as the views'; only the site's middleware
does not see ``/v1`` requests (mount the views without ``FastPath`` if it must).
The log row is written once the reply is sent, so it costs the client nothing.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from contextlib import aclosing, suppress
from typing import Any

from django.urls import Resolver404, resolve

from . import gateway
from .gateway import Call, Endpoint, Reply

Scope = dict[str, Any]
Message = dict[str, Any]
Receive = Any
Send = Any
Route = tuple[Endpoint, dict[str, Any]]

# Distinct paths whose route is remembered (/v1/models/<anything> is unbounded).
MAX_ROUTES = 1024


class FastPath:
    """An ASGI application serving chatparity's endpoints itself, and passing
    every other request (and every other protocol) to ``application``."""

    def __init__(self, application: Any) -> None:
        self.application = application
        self._routes: dict[str, Route | None] = {}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            route = self._route(scope)
            if route is not None:
                await serve(route, scope, receive, send)
                return
        await self.application(scope, receive, send)

    def _route(self, scope: Scope) -> Route | None:
        path: str = scope["path"]
        root: str = scope.get("root_path", "")
        if root and path.startswith(root):
            path = path[len(root) :]
        try:
            return self._routes[path]
        except KeyError:
            pass
        try:
            match = resolve(path)
        except Resolver404:
            route = None
        else:
            handler = getattr(match.func, "chatparity_endpoint", None)
            route = None if handler is None else (handler, match.kwargs)
        if len(self._routes) >= MAX_ROUTES:
            self._routes.clear()
        self._routes[path] = route
        return route


async def serve(route: Route, scope: Scope, receive: Receive, send: Send) -> None:
    """Answer one request with ``route``'s endpoint; stop it if the client leaves."""
    headers = {
        name.decode("latin-1").lower(): value.decode("latin-1") for name, value in scope["headers"]
    }
    body = await _read_body(receive, gateway.body_limit(headers))
    if body is None:
        return  # the client left before it finished sending
    client = scope.get("client")
    call = Call(
        method=scope["method"],
        path=scope["path"],
        headers=headers,
        body=body,
        client_ip=client[0] if client else None,
    )
    handler, kwargs = route
    exchange = asyncio.ensure_future(_respond(handler(call, **kwargs), call, send))
    hangup = asyncio.ensure_future(_disconnected(receive))
    try:
        await asyncio.wait((exchange, hangup), return_when=asyncio.FIRST_COMPLETED)
    finally:
        hangup.cancel()
        exchange.cancel()  # a no-op once it is done
        try:
            with suppress(asyncio.CancelledError, OSError):  # OSError: the client left
                await exchange
        finally:
            await gateway.finish(call)


async def _read_body(receive: Receive, limit: int) -> bytes | None:
    """Up to ``limit`` bytes of the body (enough to tell it is too large)."""
    parts: list[bytes] = []
    size = 0
    while size < limit:
        message = await receive()
        if message["type"] == "http.disconnect":
            return None
        part = message.get("body", b"")
        parts.append(part)
        size += len(part)
        if not message.get("more_body", False):
            break
    return b"".join(parts)


async def _disconnected(receive: Receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass


async def _respond(replying: Awaitable[Reply], call: Call, send: Send) -> None:
    reply = await replying
    await send(
        {
            "type": "http.response.start",
            "status": reply.status,
            "headers": [
                (name.encode("latin-1"), value.encode("latin-1"))
                for name, value in reply.headers.items()
            ],
        }
    )
    if reply.stream is None:
        await send({"type": "http.response.body", "body": reply.body})
        return
    async with aclosing(gateway.frames(call, reply.stream)) as frames:
        async for frame in frames:
            await send({"type": "http.response.body", "body": frame, "more_body": True})
    await send({"type": "http.response.body", "body": b""})
