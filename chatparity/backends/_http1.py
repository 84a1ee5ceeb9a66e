"""A small, fast asyncio HTTP/1.1 client: the ``openai`` backend's way to its upstream.

It does what the backend needs and no more: ``POST`` a body to one URL with fixed
headers and read the answer line by line (an SSE stream) or whole (an error body),
for a fraction of httpx's CPU per request. Responses are parsed as their bytes
arrive, in the protocol's callbacks; a body may be framed by ``Content-Length``,
by chunked transfer-coding (extensions and trailers ignored) or by the end of
the connection. Bytes are taken 16 KiB at a time, and reading pauses while 8
KiB of a body wait to be read (back-pressure: a stream whose reader stops
holds at most 32 KiB); a reader may also cap a line's or a body's length
(:class:`TooLarge`, the connection closed).

Why a client of its own, private to the backend: ``bench/transports.py`` put it,
aiohttp 3.14 (C parser) and httpcore 1.0 (what httpx runs on) under the backend
in turn, side by side in one run of 7 alternating rounds on 2026-11-24
(``bench/RESULTS.md``). Against this client, aiohttp took 2.1x the CPU per
request in the backend alone (1.5x streamed); through the gateway its worker
took 1.13-1.22x the CPU per request and did 0.86-0.93x the requests/s (1.14x
the added p50 at c=1), and it held 43 KiB per open stream against 34. httpcore
took 5-6x the CPU alone (22-38x at 32 requests at once), did 0.14-0.56x the
requests/s, held 51 KiB per stream, and gives a connection back to its pool
only in a task of its own, so a request right after a stream opens another.
aiohttp passed every backend test; it is still slower on every measure, and
it would be a dependency the core does not otherwise need.

Connections are pooled per event loop and per origin: reused while the server
keeps them alive (HTTP/1.1, no ``Connection: close``, the body read to its end),
as many as the requests in flight, and at most :data:`MAX_IDLE` kept idle for at
most :data:`KEEPALIVE_EXPIRY` seconds. A pooled connection that failed before the
first byte of its response (the server had closed it) is replaced once by a new
one.

Each request has one deadline, a single timer for the whole exchange: when it
passes, the connection is closed and the next read that must wait raises
:class:`Timeout`. The connect timeout bounds connecting (TLS and a proxy
tunnel included).

Proxies are taken from the environment as httpx did: ``HTTP_PROXY``,
``HTTPS_PROXY``, ``ALL_PROXY`` and ``NO_PROXY``, read when an :class:`Endpoint`
is made. ``http://`` and ``https://`` proxies are supported (a plain-HTTP
upstream is asked in absolute form, an HTTPS one through a ``CONNECT`` tunnel);
SOCKS proxies are not. HTTPS upstreams are verified with the system's CA
certificates (certifi's when the system has none).
"""

from __future__ import annotations

import asyncio
import base64
import re
import ssl
import weakref
from collections.abc import Mapping
from typing import NoReturn, cast
from urllib.parse import SplitResult, quote, unquote, urlsplit
from urllib.request import getproxies, proxy_bypass

MAX_HEAD = 64 * 1024
"""The largest response head accepted, in bytes."""
MAX_IDLE = 100
"""Idle connections kept per event loop and origin."""
KEEPALIVE_EXPIRY = 5.0
"""Seconds an idle connection is kept (as httpx): older ones may have been dropped
silently by a server or a middlebox."""
DRAIN_GRACE = 1.0
"""Seconds the rest of a released body may take to arrive before its connection is closed."""
MAX_DRAIN = 64 * 1024
"""Bytes of a released body discarded at most before its connection is closed."""
USER_AGENT = "chatparity"

# A response's unread bytes stay within two high waters and a read (lines of one batch
# decoded while the body refills), so a reader that stops reading holds at most 32 KiB
# beyond the kernel's socket buffer: the ASGI server buffers what it could not send yet
# too (uvicorn until its transport's high water). Smaller reads cost more wake-ups than
# they save.
_READ_SIZE = 16 * 1024  # bytes taken from the socket at once
_HIGH_WATER = 8 * 1024  # buffered body bytes at which reading pauses
_STATUS = re.compile(r"[0-9]{3}")
_LENGTH_VALUE = re.compile(r"[0-9]{1,18}")  # ASCII digits only, few enough for int()
_SAFE = "!$&'()*+,/:;=?@~%"  # kept as they are in a path or query
_CHUNK_SIZE = re.compile(rb"([0-9A-Fa-f]{1,16})[ \t]*(?:;[^\r\n]*)?\r?\n")  # extensions ignored

# Connection states.
_IDLE, _HEAD, _BODY, _DONE = range(4)
# Body framings.
_LENGTH, _CHUNKED, _UNTIL_EOF = range(3)
# ``_Connection.remaining`` in chunked framing, when no chunk data is left to read.
_SIZE_LINE, _DATA_END, _TRAILERS = 0, -1, -2


class HTTPError(Exception):
    """A request failed: the base of this module's errors."""


class InvalidURL(HTTPError):
    """The URL, a header or the proxy setting cannot be used."""


class ConnectError(HTTPError):
    """No connection: refused, unreachable, a name not resolved, TLS failed."""


class ProxyError(HTTPError):
    """The proxy refused to open a tunnel."""


class Timeout(HTTPError):
    """The deadline or the connect timeout passed."""


class ReadError(HTTPError):
    """The connection was reset or lost while a response was expected."""


class RemoteProtocolError(HTTPError):
    """The server broke HTTP/1.1: a bad or oversized head, bad framing, a body cut short."""


class TooLarge(RemoteProtocolError):
    """A line or a body is above the limit its reader set."""


class _Connection(asyncio.BufferedProtocol):
    """One connection; it parses the current response as its bytes arrive, read
    ``_READ_SIZE`` bytes at a time, and stops reading while ``_HIGH_WATER``
    bytes of its body wait to be read."""

    transport: asyncio.Transport

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.read_buffer = memoryview(bytearray(_READ_SIZE))
        self.raw = bytearray()  # received, not parsed yet
        self.body = bytearray()  # the body's bytes not read yet
        self.state = _IDLE
        self.lost = False  # the peer ended the connection, or it was closed
        self.reused = False
        self.paused = False
        self.error: HTTPError | None = None
        self.waiter: asyncio.Future[None] | None = None
        self.timer: asyncio.TimerHandle | None = None
        self.release_to: _Pool | None = None  # where it goes once a released body ends
        self.drained = 0
        self.idle_since = 0.0
        self._reset(no_body=False)

    def _reset(self, no_body: bool) -> None:
        self.received = False  # a byte of the current response arrived
        self.no_body = no_body
        self.status = 0
        self.reason = ""
        self.headers: dict[str, str] = {}
        self.keep_alive = False
        self.framing = _LENGTH
        self.remaining = 0

    # -- the exchange, driven by Endpoint and Response --------------------------------

    def begin(self, deadline: float, *, no_body: bool = False) -> None:
        """Expect a new response, due by ``deadline`` (loop time)."""
        self._reset(no_body)
        self.state = _HEAD
        self.body.clear()
        self.release_to = None
        self._cancel_timer()
        self.timer = self.loop.call_at(deadline, self._expire)

    async def head(self) -> None:
        """Until the response's head arrived."""
        while self.state == _HEAD:
            await self.wait()

    async def wait(self) -> None:
        """Until more of the response arrived; raises what ended it early."""
        if self.lost and self.error is None:
            self.error = ReadError("the connection is closed")
        if self.error is not None:
            raise self.error.with_traceback(None)
        if self.paused:
            self.paused = False
            self.transport.resume_reading()
        waiter = self.waiter = self.loop.create_future()
        try:
            await waiter
        finally:
            self.waiter = None

    def drain_into(self, pool: _Pool) -> None:
        """Discard the rest of the body as it arrives, then go back to ``pool``."""
        self.body.clear()
        self.release_to = pool
        self.drained = 0
        self._cancel_timer()
        self.timer = self.loop.call_later(DRAIN_GRACE, self._expire)
        if self.paused:
            self.paused = False
            self.transport.resume_reading()

    def usable(self) -> bool:
        """Whether an idle connection can take a request: open, and nothing unasked sent."""
        return not self.lost and not self.raw and not self.transport.is_closing()

    def abort(self) -> None:
        """Close at once, unsent bytes dropped."""
        self.lost = True
        self._cancel_timer()
        self.transport.abort()

    def _cancel_timer(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None

    def _expire(self) -> None:
        self.timer = None
        if self.state in (_HEAD, _BODY) and self.error is None:
            self.error = Timeout("the upstream did not answer in time")
        self.abort()
        self._wake()

    def _wake(self) -> None:
        waiter = self.waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def _fail(self, error: HTTPError) -> None:
        if self.error is None:
            self.error = error
        self.abort()
        self._wake()

    def _done(self) -> None:
        self.state = _DONE
        self._cancel_timer()
        if self.release_to is not None:
            self.release_to.checkin(self)

    # -- asyncio.Protocol -------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast("asyncio.Transport", transport)

    def get_buffer(self, sizehint: int) -> memoryview:
        return self.read_buffer

    def buffer_updated(self, nbytes: int) -> None:
        self.data_received(self.read_buffer[:nbytes])

    def data_received(self, data: bytes | memoryview) -> None:
        if self.state in (_IDLE, _DONE):
            self.keep_alive = False  # bytes nobody asked for: the connection is not reusable
            if self.state == _IDLE:
                self.abort()
            return
        self.received = True
        draining = self.release_to is not None
        raw = self.raw
        raw += data
        try:
            if self.state == _HEAD:
                self._parse_head()
            if self.state == _BODY:
                if self.framing == _CHUNKED:
                    self._parse_chunks()
                elif self.framing == _LENGTH:
                    take = min(len(raw), self.remaining)
                    self.body += raw[:take]
                    del raw[:take]
                    self.remaining -= take
                    if not self.remaining:
                        self._done()
                else:
                    self.body += raw
                    raw.clear()
        except RemoteProtocolError as error:
            self._fail(error)
            return
        if draining:
            self.drained += len(self.body)
            self.body.clear()
            if self.drained > MAX_DRAIN and self.release_to is not None:  # still not ended
                self.abort()
        elif len(self.body) > _HIGH_WATER and self.state == _BODY and not self.paused:
            self.paused = True
            self.transport.pause_reading()
        self._wake()

    def eof_received(self) -> bool:
        self._ended()
        return False  # close the transport

    def connection_lost(self, exc: Exception | None) -> None:
        if exc is not None and self.error is None and self.state in (_HEAD, _BODY):
            self.error = ReadError(str(exc) or type(exc).__name__)
        self._ended()

    def _ended(self) -> None:
        self.lost = True
        self._cancel_timer()
        if self.state == _BODY and self.framing == _UNTIL_EOF and self.error is None:
            self._done()
        elif self.state in (_HEAD, _BODY) and self.error is None:
            self.error = RemoteProtocolError(
                "the server disconnected without sending a response"
                if self.state == _HEAD and not self.received
                else "the server disconnected before the response ended"
            )
        self._wake()

    # -- parsing ----------------------------------------------------------------------

    def _parse_head(self) -> None:
        raw = self.raw
        while self.state == _HEAD:
            end = raw.find(b"\r\n\r\n")
            if end < 0 and len(raw) <= MAX_HEAD:
                return
            if end < 0 or end > MAX_HEAD:
                raise RemoteProtocolError(f"the response head is over {MAX_HEAD} bytes")
            head = raw[:end].decode("latin-1")
            del raw[: end + 4]
            status_line, *lines = head.split("\r\n")
            version, _, rest = status_line.partition(" ")
            code, _, self.reason = rest.partition(" ")
            if version not in ("HTTP/1.1", "HTTP/1.0") or not _STATUS.fullmatch(code):
                raise RemoteProtocolError(f"malformed status line {status_line[:80]!r}")
            self.status = int(code)
            if self.status < 200 and self.status != 101:
                continue  # informational: the final head follows
            self.headers = _headers(lines)
            self._framing(version == "HTTP/1.1")

    def _framing(self, http11: bool) -> None:
        """How the body is delimited, and whether the connection may be reused after."""
        headers = self.headers
        tokens = headers.get("connection", "").lower().split(",")
        self.keep_alive = http11 and "close" not in (token.strip() for token in tokens)
        coding = headers.get("transfer-encoding")
        length = headers.get("content-length")
        if self.no_body or self.status in (101, 204, 304):
            self.framing, self.remaining = _LENGTH, 0
        elif coding is not None:
            chunked = coding.rpartition(",")[2].strip().lower() == "chunked"
            self.framing, self.remaining = (_CHUNKED, _SIZE_LINE) if chunked else (_UNTIL_EOF, 0)
            self.keep_alive = self.keep_alive and chunked and length is None
        elif length is not None:
            values = {value.strip() for value in length.split(",")}
            value = values.pop()
            if values or not _LENGTH_VALUE.fullmatch(value):
                raise RemoteProtocolError(f"bad Content-Length {length[:40]!r}")
            self.framing, self.remaining = _LENGTH, int(value)
        else:
            self.framing, self.remaining = _UNTIL_EOF, 0
            self.keep_alive = False
        self.state = _BODY
        if self.framing == _LENGTH and not self.remaining:
            self._done()

    def _parse_chunks(self) -> None:
        raw, body, match = self.raw, self.body, _CHUNK_SIZE.match
        pos, end, remaining = 0, len(raw), self.remaining
        ended = False
        try:
            while pos < end:
                if remaining == _SIZE_LINE:
                    size_line = match(raw, pos)
                    if size_line is None:
                        newline = raw.find(b"\n", pos)
                        if newline >= 0 or end - pos > MAX_HEAD:
                            bad = bytes(raw[pos : pos + 40])
                            raise RemoteProtocolError(f"bad chunk size line {bad!r}")
                        break
                    start = size_line.end()
                    size = int(size_line[1], 16)
                    stop = start + size
                    if not size:
                        pos, remaining = start, _TRAILERS
                    elif stop + 2 <= end and raw[stop] == 13 and raw[stop + 1] == 10:
                        body += raw[start:stop]  # the whole chunk is here: the common case
                        pos = stop + 2
                    else:
                        pos, remaining = start, size
                elif remaining > 0:  # the rest of a chunk's data
                    take = min(remaining, end - pos)
                    body += raw[pos : pos + take]
                    pos += take
                    remaining = remaining - take or _DATA_END
                elif remaining == _DATA_END:
                    if end - pos < 2:
                        break
                    if raw[pos] != 13 or raw[pos + 1] != 10:
                        raise RemoteProtocolError("a chunk's data is not followed by CRLF")
                    pos += 2
                    remaining = _SIZE_LINE
                else:  # the trailer section
                    newline = raw.find(b"\n", pos)
                    if newline < 0:
                        if end - pos > MAX_HEAD:
                            raise RemoteProtocolError("the trailer section is too large")
                        break
                    blank = not raw[pos:newline].strip()
                    pos = newline + 1
                    if blank:
                        ended = True
                        break  # trailer fields are ignored
        finally:
            del raw[:pos]
            self.remaining = remaining
        if ended:
            self._done()


def _headers(lines: list[str]) -> dict[str, str]:
    """Header fields by lower-case name; repeated ones joined with commas."""
    headers: dict[str, str] = {}
    name = ""
    for line in lines:
        if line[:1] in (" ", "\t") and name:  # obsolete line folding
            headers[name] = f"{headers[name]} {line.strip()}"
            continue
        name, colon, value = line.partition(":")
        name = name.strip().lower()
        if not colon or not name:
            raise RemoteProtocolError(f"malformed header line {line[:80]!r}")
        value = value.strip()
        headers[name] = f"{headers[name]}, {value}" if name in headers else value
    return headers


class _Pool:
    """The idle connections to one origin on one event loop, the latest used first."""

    __slots__ = ("idle",)

    def __init__(self) -> None:
        self.idle: list[_Connection] = []

    def checkout(self, now: float) -> _Connection | None:
        while self.idle:
            connection = self.idle.pop()
            if connection.usable() and now - connection.idle_since < KEEPALIVE_EXPIRY:
                return connection
            connection.abort()
        return None

    def checkin(self, connection: _Connection) -> None:
        """Keep a connection whose response ended, if it may take another request."""
        reusable = (
            connection.keep_alive
            and connection.error is None
            and connection.usable()
            and not connection.transport.get_write_buffer_size()
            and len(self.idle) < MAX_IDLE
        )
        if not reusable:
            connection.abort()
            return
        connection.state = _IDLE
        connection.release_to = None
        connection.reused = True
        connection.idle_since = now = connection.loop.time()
        idle = self.idle
        while idle and now - idle[0].idle_since >= KEEPALIVE_EXPIRY:
            idle.pop(0).abort()  # the oldest, expired
        idle.append(connection)


_pools: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[object, _Pool]] = (
    weakref.WeakKeyDictionary()
)


class Response:
    """A response whose head arrived. Read its body with :meth:`readline` (or ``async
    for``) or :meth:`read`; then :meth:`release` or :meth:`close` it."""

    __slots__ = ("_connection", "_lines", "_pool", "headers", "reason", "status")

    def __init__(self, connection: _Connection, pool: _Pool) -> None:
        self._connection = connection
        self._pool: _Pool | None = pool
        self._lines: list[str] = []  # decoded, last first
        self.status = connection.status
        self.reason = connection.reason
        self.headers = connection.headers  # lower-case names

    async def readline(self, limit: int | None = None) -> str | None:
        """The body's next line without its ``\\n`` or ``\\r\\n`` (UTF-8, errors replaced),
        the last one also when unterminated; ``None`` at the end of the body (the
        response is then closed). :class:`TooLarge` if a line is over ``limit`` bytes."""
        if self._lines:
            return self._lines.pop()
        if self._pool is None:
            return None  # closed or released
        connection = self._connection
        body = connection.body
        while True:
            last = body.rfind(b"\n")
            longest = max(last, len(body) - last - 1)  # at least the longest line's length
            if limit is not None and longest > limit and _longest_line(body) > limit:
                self._refuse(f"a line is over {limit} bytes")
            if last >= 0:  # every complete line here, decoded at once
                lines = take_lines(body, last)
                line = lines.pop()
                self._lines = lines
                return line
            if connection.state == _DONE:
                if not body:
                    self.close()
                    return None
                line = body.decode("utf-8", "replace")
                body.clear()
                return line
            await connection.wait()

    def __aiter__(self) -> Response:
        return self

    async def __anext__(self) -> str:
        line = await self.readline()
        if line is None:
            raise StopAsyncIteration
        return line

    async def read(self, limit: int | None = None) -> bytes:
        """The whole body (not for a body partly read by lines); the response is closed
        after. :class:`TooLarge` if it is over ``limit`` bytes."""
        if self._pool is None:
            return b""  # closed or released
        connection = self._connection
        try:
            while True:
                if limit is not None and len(connection.body) > limit:
                    self._refuse(f"the body is over {limit} bytes")
                if connection.state == _DONE:
                    return bytes(connection.body)
                await connection.wait()
        finally:
            connection.body.clear()
            self.close()

    def _refuse(self, problem: str) -> NoReturn:
        """Raise :class:`TooLarge`, the connection closed: an upstream that sends too much
        once is not asked again on it."""
        self._pool = None
        self._lines.clear()
        self._connection.abort()
        raise TooLarge(problem)

    def release(self) -> None:
        """Done with the body, although it may not have ended: the connection goes back
        to the pool once the rest (normally only the chunked body's last, empty chunk)
        arrived within :data:`DRAIN_GRACE` seconds, and is closed otherwise."""
        connection, pool = self._connection, self._pool
        if pool is None:
            return
        if connection.state == _BODY and connection.keep_alive and connection.error is None:
            self._pool = None
            self._lines.clear()
            connection.drain_into(pool)
        else:
            self.close()

    def close(self) -> None:
        """Done with the response: its connection is pooled if the body was read to its
        end, else closed at once."""
        connection, pool = self._connection, self._pool
        if pool is None:
            return
        self._pool = None
        self._lines.clear()
        if connection.state == _DONE:
            pool.checkin(connection)
        else:
            connection.abort()


def take_lines(body: bytearray, last: int) -> list[str]:
    """The complete lines of ``body`` up to its newline at ``last``, removed from it,
    decoded at once, without their line ends, in reverse order (pop the first)."""
    text = body[:last].decode("utf-8", "replace")
    del body[: last + 1]
    lines = text.split("\n")
    if "\r" in text:
        lines = [line[:-1] if line[-1:] == "\r" else line for line in lines]
    lines.reverse()
    return lines


def _longest_line(body: bytearray) -> int:
    """The length of the longest line in ``body``, the last one perhaps unfinished."""
    return max(map(len, body.split(b"\n")))


_ssl_context: ssl.SSLContext | None = None


def default_ssl_context() -> ssl.SSLContext:
    """The verifying TLS context, made once: the system's CAs, else certifi's."""
    global _ssl_context
    if _ssl_context is None:
        context = ssl.create_default_context()
        if not context.cert_store_stats()["x509_ca"]:
            try:
                import certifi
            except ImportError:
                pass
            else:
                context.load_verify_locations(certifi.where())
        context.set_alpn_protocols(["http/1.1"])
        _ssl_context = context
    return _ssl_context


def _split(url: str) -> tuple[SplitResult, str, int]:
    """The parts of an http(s) URL, its host (IPv6 without brackets) and port."""
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as exc:
        raise InvalidURL(f"{url!r}: {exc}") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise InvalidURL(f"not an http:// or https:// URL: {url!r}")
    return parts, parts.hostname, port or (443 if parts.scheme == "https" else 80)


def _authority(host: str, port: int | None) -> str:
    """``host[:port]``, an IPv6 address in brackets."""
    bracketed = f"[{host}]" if ":" in host else host
    return bracketed if port is None else f"{bracketed}:{port}"


def _basic(parts: SplitResult) -> str | None:
    """The Basic credentials in a URL's user information, if any."""
    if parts.username is None:
        return None
    secret = f"{unquote(parts.username)}:{unquote(parts.password or '')}"
    return "Basic " + base64.b64encode(secret.encode()).decode()


def _proxy(scheme: str, host: str) -> str | None:
    """The proxy URL the environment sets for an upstream, if any."""
    proxies = getproxies()
    url = proxies.get(scheme) or proxies.get("all")
    if not url or proxy_bypass(host):
        return None
    return url if "://" in url else f"http://{url}"


class Endpoint:
    """``POST`` requests to one URL with fixed headers, over pooled connections.

    The request head is prepared once; each request adds ``Content-Length`` and its
    body and is written in one piece.
    """

    def __init__(
        self,
        url: str,
        headers: Mapping[str, str],
        *,
        connect_timeout: float = 10.0,
        ssl_context: ssl.SSLContext | None = None,
        proxy: str | None = None,
    ) -> None:
        """``headers`` may replace ``Host`` and ``User-Agent``, not the framing headers.
        ``proxy`` (``http(s)://[user:password@]host:port``) defaults to the environment's
        for ``url``; an empty string means none."""
        parts, host, port = _split(url)
        self.connect_timeout = connect_timeout
        self._host = host
        https = parts.scheme == "https"
        self._ssl = (ssl_context or default_ssl_context()) if https else None
        authority = _authority(host, None if parts.port is None else port)
        target = quote(parts.path or "/", safe=_SAFE)
        if parts.query:
            target += "?" + quote(parts.query, safe=_SAFE)
        # By lower-case name: the given headers replace the defaults whatever their case.
        fields = {"host": ("Host", authority), "user-agent": ("User-Agent", USER_AGENT)}
        credentials = _basic(parts)
        if credentials:
            fields["authorization"] = ("Authorization", credentials)
        for name, value in headers.items():
            fields[name.lower()] = (name, value)
        for framing in ("content-length", "transfer-encoding"):
            fields.pop(framing, None)

        proxy = _proxy(parts.scheme, host) if proxy is None else proxy or None
        self._via: tuple[str, int, ssl.SSLContext | None] = (host, port, self._ssl)
        self._tunnel: bytes | None = None
        if proxy is not None:
            proxy_parts, proxy_host, proxy_port = _split(proxy)
            proxy_ssl = None
            if proxy_parts.scheme == "https":
                proxy_ssl = ssl_context or default_ssl_context()
            self._via = (proxy_host, proxy_port, proxy_ssl)
            proxy_fields = {}
            proxy_credentials = _basic(proxy_parts)
            if proxy_credentials:
                proxy_fields["proxy-authorization"] = ("Proxy-Authorization", proxy_credentials)
            if https:
                tunnel = _authority(host, port)
                connect = {"host": ("Host", tunnel), **proxy_fields}
                self._tunnel = _head(f"CONNECT {tunnel} HTTP/1.1", connect) + b"\r\n"
            else:
                target = f"http://{authority}{target}"
                fields.update(proxy_fields)
        self._prefix = _head(f"POST {target} HTTP/1.1", fields)
        # Connections are shared by endpoints that would open them the same way.
        self._key = (parts.scheme, host, port, self._via, self._ssl, self._tunnel)

    def _pool(self, loop: asyncio.AbstractEventLoop) -> _Pool:
        pools = _pools.get(loop)
        if pools is None:
            pools = _pools[loop] = {}
        pool = pools.get(self._key)
        if pool is None:
            pool = pools[self._key] = _Pool()
        return pool

    async def post(self, body: bytes, deadline: float, head: bytes = b"") -> Response:
        """The response to ``body`` once its head arrived, whatever its status.

        ``deadline`` (event loop time) bounds the whole exchange, body included. ``head``:
        this request's own header lines (``Name: value\\r\\n`` each), e.g. a trace's."""
        loop = asyncio.get_running_loop()
        pool = self._pool(loop)
        message = b"%s%sContent-Length: %d\r\n\r\n%s" % (self._prefix, head, len(body), body)
        connection = pool.checkout(loop.time())
        while True:
            if connection is None:
                connection = await self._connect(deadline)
            connection.begin(deadline)
            connection.transport.write(message)
            try:
                await connection.head()
            except (ReadError, RemoteProtocolError):
                connection.abort()
                if connection.reused and not connection.received:
                    connection = None  # the server had closed it: once more, on a new one
                    continue
                raise
            except BaseException:
                connection.abort()
                raise
            return Response(connection, pool)

    async def _connect(self, deadline: float) -> _Connection:
        loop = asyncio.get_running_loop()
        connection = _Connection(loop)
        host, port, context = self._via
        try:
            async with asyncio.timeout(min(self.connect_timeout, deadline - loop.time())):
                await loop.create_connection(
                    lambda: connection,
                    host,
                    port,
                    ssl=context,
                    server_hostname=host if context else None,
                )
                if self._tunnel is not None:
                    await self._open_tunnel(connection, deadline)
        except TimeoutError:
            _abort(connection)
            raise Timeout("connecting to the upstream timed out") from None
        except OSError as exc:
            _abort(connection)
            raise ConnectError(str(exc) or type(exc).__name__) from None
        except BaseException:
            _abort(connection)
            raise
        return connection

    async def _open_tunnel(self, connection: _Connection, deadline: float) -> None:
        """Ask the proxy for a tunnel to the upstream, then speak TLS through it."""
        assert self._tunnel is not None
        assert self._ssl is not None
        connection.begin(deadline, no_body=True)
        connection.transport.write(self._tunnel)
        await connection.head()
        if not 200 <= connection.status < 300:
            raise ProxyError(f"the proxy answered {connection.status} to CONNECT")
        connection.state = _IDLE
        transport = await connection.loop.start_tls(
            connection.transport, connection, self._ssl, server_hostname=self._host
        )
        if transport is None:
            raise ConnectError("TLS through the proxy failed")
        connection.transport = transport


def _abort(connection: _Connection) -> None:
    if hasattr(connection, "transport"):
        connection.abort()


def _head(request_line: str, fields: dict[str, tuple[str, str]]) -> bytes:
    """A request head without its final blank line; ``fields`` by lower-case name."""
    lines = [request_line]
    for name, value in fields.values():
        if not name or any(c in name for c in ":\r\n") or any(c in value for c in "\r\n"):
            raise InvalidURL(f"invalid header {name!r}")
        lines.append(f"{name}: {value}")
    return ("\r\n".join(lines) + "\r\n").encode()
