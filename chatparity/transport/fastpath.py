"""The ASGI fast path: ``/v1`` served in front of Django's request handler.

Wrap the project's ASGI application::

    from chatparity.transport.fastpath import FastPath
    application = FastPath(get_asgi_application())

Requests whose URL resolves to a chatparity ``/v1`` view (wherever the
URLconf mounts ``chatparity.urls``) are answered here, on the event loop,
with no thread per request and no middleware; everything else goes to Django
untouched. The answers are the same as the views'; only the site's middleware
does not see ``/v1`` requests (mount the views without ``FastPath`` if it must).
What Django itself does before a view is done here too, from the same settings:
a Host not in ``ALLOWED_HOSTS`` gets a 400 and, when the site runs
``SecurityMiddleware``, plain HTTP is redirected to HTTPS (``SECURE_SSL_REDIRECT``)
and replies carry its headers (HSTS over HTTPS, ``nosniff``, ...). Browsers'
cross-origin requests, preflights included, get the same CORS answers as from
the views (:mod:`chatparity.transport.cors`). The body is read only once the key is
valid, and must arrive within ``BODY_TIMEOUT``.
The request's accounting (limits settled, log row written) is closed once the
reply is sent, so it costs the client nothing. A worker whose spool folder is refused
does not start (:func:`~chatparity.accounting.spool.open_for_serving`).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncGenerator, Coroutine, Generator, Mapping
from contextlib import suppress
from functools import cache
from typing import Any, cast

from django.conf import settings
from django.core.exceptions import DisallowedHost
from django.core.signals import setting_changed
from django.dispatch import receiver
from django.http import HttpRequest, HttpResponse
from django.middleware.security import SecurityMiddleware
from django.urls import Resolver404, get_resolver, resolve

from ..accounting import spool
from ..conf import app_settings
from ..gateway import pipeline
from ..gateway.pipeline import Call, Endpoint, Reply
from ..protocol.errors import APIError
from .cors import is_preflight, policy

Scope = dict[str, Any]
Message = dict[str, Any]
Receive = Any
Send = Any
Route = tuple[Endpoint, dict[str, Any]]
# Headers added to a reply unless it has its own: (lower-case name, encoded pair).
AddedHeaders = tuple[tuple[str, tuple[bytes, bytes]], ...]

# Distinct paths whose route is remembered (/v1/models/<anything> is unbounded).
MAX_ROUTES = 1024
# Distinct Host headers remembered as allowed (a wildcard in ALLOWED_HOSTS admits many).
MAX_HOSTS = 1024

# Where Django's handler logs a refused Host.
security_logger = logging.getLogger("django.security.DisallowedHost")


class FastPath:
    """An ASGI application serving chatparity's endpoints itself, and passing
    every other request (and every other protocol) to ``application``."""

    def __init__(self, application: Any) -> None:
        # Before anything is served: the spool folder is resolved, made and opened, or
        # the worker refuses to start (ImproperlyConfigured) rather than serve without
        # its durability.
        spool.open_for_serving()
        self.application = application
        self._routes: dict[str, Route | None] = {}
        # The URLconf and all it imports, loaded at start-up rather than by the first
        # request: what the site freezes then (chatparity.asgi.tune_gc_for_serving)
        # includes them, so the collector never scans them again.
        get_resolver().url_patterns  # noqa: B018

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


class _Probe(HttpRequest):
    """A bare request holding only what ``get_host()`` and ``SecurityMiddleware``
    read, so that Django's own code decides for the fast path."""

    def __init__(self, scheme: str) -> None:
        super().__init__()
        self._scheme = scheme

    def _get_scheme(self) -> str:
        return self._scheme


class _Edge:
    """What Django does with a request before its view, worked out once from the
    settings: the ``ALLOWED_HOSTS`` check of ``HttpRequest.get_host()`` and, when
    the site runs ``SecurityMiddleware``, its HTTPS redirect and response headers."""

    def __init__(self) -> None:
        self.forwarded_host: bool = settings.USE_X_FORWARDED_HOST
        self.proxy_ssl_header: tuple[str, str] | None = None
        if settings.SECURE_PROXY_SSL_HEADER:
            meta_name, secure_value = settings.SECURE_PROXY_SSL_HEADER
            # Only HTTP_* names come from request headers (ASGIRequest.META).
            if meta_name.startswith("HTTP_"):
                header = meta_name.removeprefix("HTTP_").lower().replace("_", "-")
                self.proxy_ssl_header = (header, secure_value)
        self.security: SecurityMiddleware | None = None
        if "django.middleware.security.SecurityMiddleware" in settings.MIDDLEWARE:
            # Only its settings and its process_request/process_response are used.
            self.security = SecurityMiddleware(lambda request: HttpResponse())
        # The middleware when it redirects plain HTTP (SECURE_SSL_REDIRECT).
        self.redirect = self.security if self.security and self.security.redirect else None
        self.added_headers = {secure: self._added_headers(secure) for secure in (False, True)}
        self._allowed_hosts: set[str] = set()

    def _added_headers(self, secure: bool) -> AddedHeaders:
        """The headers ``SecurityMiddleware`` adds to a response over HTTPS or HTTP."""
        if self.security is None:
            return ()
        response = HttpResponse()
        own = set(response.headers)
        self.security.process_response(_Probe("https" if secure else "http"), response)
        added = ((name.lower(), value) for name, value in response.items() if name not in own)
        return tuple(
            (name, (name.encode("latin-1"), value.encode("latin-1"))) for name, value in added
        )

    def is_secure(self, scope: Scope, headers: Mapping[str, str]) -> bool:
        """``HttpRequest.is_secure()``: the proxy's header when set, else the scheme."""
        if self.proxy_ssl_header is not None:
            header, secure_value = self.proxy_ssl_header
            value = headers.get(header)
            if value is not None:
                return value.split(",", 1)[0].strip() == secure_value
        return bool(scope.get("scheme") == "https")

    def refusal(self, scope: Scope, headers: Mapping[str, str], secure: bool) -> Reply | None:
        """Django's answer before the view, if any: a 400 for a Host that is not in
        ``ALLOWED_HOSTS``, else ``SecurityMiddleware``'s redirect to HTTPS."""
        host = headers.get("x-forwarded-host") if self.forwarded_host else None
        if host is None:
            host = headers.get("host")
        redirect = None if secure else self.redirect
        if host is not None and host in self._allowed_hosts and redirect is None:
            return None
        probe = _Probe("https" if secure else "http")
        probe.path = scope["path"]
        probe.META["QUERY_STRING"] = scope.get("query_string", b"").decode(errors="replace")
        if host is not None:
            probe.META["HTTP_HOST"] = host
        else:  # get_host() rebuilds it from the server's address
            server = scope.get("server")
            probe.META["SERVER_NAME"] = str(server[0]) if server else "unknown"
            probe.META["SERVER_PORT"] = str(server[1]) if server else "0"
            if "x-forwarded-port" in headers:
                probe.META["HTTP_X_FORWARDED_PORT"] = headers["x-forwarded-port"]
        try:
            probe.get_host()
        except DisallowedHost as refused:
            security_logger.error("%s", refused, extra={"status_code": 400})
            return pipeline.error_reply(
                APIError(
                    "The Host header names a host this server does not serve.",
                    code="invalid_host",
                )
            )
        if host is not None:
            if len(self._allowed_hosts) >= MAX_HOSTS:
                self._allowed_hosts.clear()
            self._allowed_hosts.add(host)
        if redirect is not None:
            response = redirect.process_request(probe)  # None: an exempt path
            if response is not None:
                response_headers = {name.lower(): value for name, value in response.items()}
                return Reply(response.status_code, response_headers, response.content)
        return None


@cache
def _edge() -> _Edge:
    return _Edge()


@receiver(setting_changed)
def _settings_changed(**kwargs: Any) -> None:
    _edge.cache_clear()


async def serve(route: Route, scope: Scope, receive: Receive, send: Send) -> None:
    """Answer one request with ``route``'s endpoint; stop it if the client leaves."""
    headers = _headers(scope["headers"])
    edge = _edge()
    secure = edge.is_secure(scope, headers)
    added = edge.added_headers[secure]
    refusal = edge.refusal(scope, headers, secure)
    if refusal is not None:
        await _start(send, refusal, added)
        await send({"type": "http.response.body", "body": refusal.body})
        return
    origin = headers.get("origin")
    if origin is not None and is_preflight(scope["method"], headers):
        await _answer_preflight(send, headers, added)
        return
    inbox = _Inbox(receive)
    client = scope.get("client")
    call = Call(
        method=scope["method"],
        path=scope["path"],
        headers=headers,
        read_body=inbox.read_body,
        client_ip=client[0] if client else None,
        query=scope.get("query_string", b"").decode("latin-1"),
    )
    handler, kwargs = route
    reply: Reply | None = None

    async def respond() -> None:
        nonlocal reply
        # An endpoint cancelled before its reply (the client left) accounts for itself.
        reply = await handler(call, **kwargs)
        if origin is not None and (cors := policy()) is not None:
            cors.add_response_headers(origin, reply.headers)
        await _send(send, reply, added)

    exchange = asyncio.ensure_future(respond())
    hangup = asyncio.ensure_future(inbox.disconnected())
    try:
        await asyncio.wait((exchange, hangup), return_when=asyncio.FIRST_COMPLETED)
    finally:
        hangup.cancel()
        exchange.cancel()  # a no-op once it is done
        try:
            with suppress(asyncio.CancelledError, OSError):  # OSError: the client left
                await exchange
        finally:
            # Here, not in the exchange: a client that hangs up once it has the whole
            # reply (as servers report one that is done) must not cut the closing short.
            if reply is not None:
                await reply.close()


def _headers(raw: list[tuple[bytes, bytes]]) -> dict[str, str]:
    """The request's headers by lower-case name. A header sent more than once has its
    values joined with "," as Django's ``ASGIRequest`` joins them: two ``Host`` headers
    are then no valid host, a 400 here as there (RFC 9112), never the last one's."""
    headers = {name.decode("latin-1").lower(): value.decode("latin-1") for name, value in raw}
    if len(headers) == len(raw):
        return headers
    joined: dict[str, str] = {}
    for name, value in raw:
        text, value_text = name.decode("latin-1").lower(), value.decode("latin-1")
        joined[text] = f"{joined[text]},{value_text}" if text in joined else value_text
    return joined


async def _answer_preflight(send: Send, headers: Mapping[str, str], added: AddedHeaders) -> None:
    """A browser's CORS preflight: 200, with no body, granting what it asks only to an
    allowed origin."""
    cors = policy()
    answer = Reply(200, {"content-length": "0"})
    if cors is not None:
        answer.headers.update(cors.preflight_headers(headers))
    await _start(send, answer, added)
    await send({"type": "http.response.body", "body": b""})


class _Inbox:
    """The request's one reader of ``receive``: the body when the endpoint asks for
    it (once the key is checked), within ``BODY_TIMEOUT``, then the client's disconnect."""

    def __init__(self, receive: Receive) -> None:
        self._receive = receive
        self._body_read = asyncio.Event()
        self._reader: asyncio.Task[Any] | None = None  # while it reads the body
        self._started = 0.0
        self._deadline: asyncio.TimerHandle | None = None
        self._expired = False

    async def read_body(self, limit: int) -> bytes:
        loop = asyncio.get_running_loop()
        reader = self._reader = asyncio.current_task()
        assert reader is not None  # the request's own task
        self._started = loop.time()
        # Runs only once this task has had to wait for the body: a body already
        # received, as nearly every one is, costs no timer.
        loop.call_soon(self._arm_deadline)
        try:
            body = await _read_body(self._receive, limit)
        except asyncio.CancelledError:
            if self._expired and reader.uncancel() == 0:  # only the deadline cancelled
                raise TimeoutError from None
            raise
        finally:
            self._reader = None
            if self._deadline is not None:
                self._deadline.cancel()
            self._body_read.set()
        if body is None:
            raise asyncio.CancelledError  # the client left before it finished sending
        return body

    def _arm_deadline(self) -> None:
        if self._reader is not None:
            loop = asyncio.get_running_loop()
            delay = self._started + app_settings.BODY_TIMEOUT - loop.time()
            self._deadline = loop.call_later(delay, self._expire)

    def _expire(self) -> None:
        if self._reader is not None:
            self._expired = True
            self._reader.cancel()

    async def disconnected(self) -> None:
        await self._body_read.wait()
        while (await self._receive())["type"] != "http.disconnect":
            pass


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


async def _start(send: Send, reply: Reply, added: AddedHeaders) -> None:
    headers = [
        (name.encode("latin-1"), value.encode("latin-1")) for name, value in reply.headers.items()
    ]
    headers.extend(pair for name, pair in added if name not in reply.headers)
    await send({"type": "http.response.start", "status": reply.status, "headers": headers})


async def _send(send: Send, reply: Reply, added: AddedHeaders) -> None:
    try:
        await _start(send, reply, added)
        if reply.stream is None:
            await send({"type": "http.response.body", "body": reply.body})
            return
        await _send_frames(send, reply.stream)
    except BaseException:  # cancelled (the client left) or OSError (it is gone)
        reply.cancel()
        raise


async def _send_frames(send: Send, frames: AsyncGenerator[bytes, None]) -> None:
    """Send ``frames``, those ready together as one body message, which the server
    writes to the socket at once: an upstream's packet of twenty events costs one write,
    not twenty, and the last frames go with the end of the body. No frame waits for the
    next: each step of ``frames`` runs until it has to wait, and what is ready is sent
    before that wait."""
    ready: list[bytes] = []
    while True:
        step = frames.__anext__()
        try:
            waiting = step.send(None)
        except StopIteration as frame:  # ready without a wait
            ready.append(frame.value)
            continue
        except StopAsyncIteration:
            break
        if ready:
            body = b"".join(ready)
            ready.clear()
            try:
                await send({"type": "http.response.body", "body": body, "more_body": True})
            except BaseException:
                await _unwind(step, waiting)
                raise
        try:
            ready.append(await _Rest(step, waiting))
        except StopAsyncIteration:
            break
    await send({"type": "http.response.body", "body": b"".join(ready)})


class _Rest:
    """The rest of a step that ran until it had to wait for ``waiting`` (what it gave the
    event loop): awaited, it waits in the step's place, and the task resumes it (or
    cancels it) as if the step had been awaited from its start."""

    def __init__(self, step: Coroutine[Any, Any, bytes], waiting: Any) -> None:
        self.step = step
        self.waiting = waiting

    def __await__(self) -> Generator[Any, Any, bytes]:
        step, waiting = self.step, self.waiting
        while True:
            try:
                try:
                    resumed = yield waiting
                except GeneratorExit:
                    step.close()
                    raise
                except BaseException as exc:  # cancelled while it waits
                    waiting = step.throw(exc)
                else:
                    waiting = step.send(resumed)
            except StopIteration as done:
                return cast(bytes, done.value)


async def _unwind(step: Coroutine[Any, Any, bytes], waiting: Any) -> None:
    """End a step left waiting when what was ready could not be sent: its wait is
    cancelled and it runs on to its end (what it raises then, or yields, is dropped)."""
    if isinstance(waiting, asyncio.Future):
        waiting.cancel()
    with suppress(BaseException):
        await _Rest(step, waiting)
