"""chatparity.backends._http1 against real servers on loopback: what it sends, every way
a body may be framed, keep-alive and its limits, and every way an upstream fails."""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import functools
import ipaddress
import socket
import ssl
import struct
import time
from collections.abc import Awaitable, Callable
from contextlib import closing
from dataclasses import dataclass

import pytest

from chatparity.backends import _http1
from chatparity.backends._http1 import Endpoint
from tests.backends import faulty_upstream


def run(test):
    """Run an async test on an event loop of its own (so with pools of its own)."""

    @functools.wraps(test)
    def wrapper(*args, **kwargs):
        return asyncio.run(asyncio.wait_for(test(*args, **kwargs), 30))

    return wrapper


def deadline(seconds: float = 5.0) -> float:
    return asyncio.get_running_loop().time() + seconds


def closed_port() -> int:
    with closing(socket.socket()) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def chunked(*pieces: bytes, extension: bytes = b"", end: bytes = b"0\r\n\r\n") -> bytes:
    return b"".join(b"%x%s\r\n%s\r\n" % (len(p), extension, p) for p in pieces) + end


SSE_HEAD = (
    b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
)


def fixed(body: bytes, status: bytes = b"200 OK", extra: bytes = b"") -> bytes:
    return b"HTTP/1.1 %s\r\n%sContent-Length: %d\r\n\r\n%s" % (status, extra, len(body), body)


def reset(writer: asyncio.StreamWriter) -> None:
    """Close with RST."""
    sock = writer.get_extra_info("socket")
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.transport.abort()


@dataclass
class Request:
    line: str
    headers: dict[str, str]
    body: bytes
    connection: int  # which connection, from 1
    nth: int  # which request on it, from 1


Respond = Callable[[Request, asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


class Server:
    """An HTTP/1.1 server on loopback: ``respond`` answers each request; the connection
    serves requests until either side closes it."""

    def __init__(self, respond: Respond, host="127.0.0.1", ssl_context=None):
        self.respond = respond
        self.host = host
        self.ssl_context = ssl_context
        self.connections = 0
        self.requests: list[Request] = []
        self.hangups = 0  # connections the client closed while the server waited for a request

    async def __aenter__(self):
        self.server = await asyncio.start_server(self.serve, self.host, 0, ssl=self.ssl_context)
        self.port = self.server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *exc_info):
        self.server.close()

    def url(self, path="/v1/chat/completions", host=None):
        host = host or (f"[{self.host}]" if ":" in self.host else self.host)
        scheme = "https" if self.ssl_context else "http"
        return f"{scheme}://{host}:{self.port}{path}"

    async def serve(self, reader, writer):
        self.connections += 1
        number, nth = self.connections, 0
        try:
            while not writer.is_closing():
                try:
                    head = (await reader.readuntil(b"\r\n\r\n")).decode()
                except asyncio.IncompleteReadError as exc:
                    self.hangups += not exc.partial
                    return
                line, *fields = head.removesuffix("\r\n\r\n").split("\r\n")
                headers = {}
                for field in fields:
                    name, _, value = field.partition(":")
                    headers[name.strip().lower()] = value.strip()
                body = await reader.readexactly(int(headers.get("content-length", 0)))
                nth += 1
                request = Request(line, headers, body, number, nth)
                self.requests.append(request)
                await self.respond(request, reader, writer)
                await writer.drain()
        except (ConnectionError, asyncio.CancelledError):
            pass  # the client went, or the test ended
        finally:
            writer.close()


def answer(*parts: bytes, close=False) -> Respond:
    """A responder writing ``parts`` (and closing the connection after, if ``close``)."""

    async def respond(request, reader, writer):
        for part in parts:
            writer.write(part)
            await writer.drain()
        if close:
            writer.close()

    return respond


async def lines_of(response: _http1.Response) -> list[str]:
    return [line async for line in response]


# -- the request ----------------------------------------------------------------------


@run
async def test_the_request_has_the_path_query_host_length_headers_and_body():
    async with Server(answer(fixed(b"{}"))) as server:
        endpoint = Endpoint(
            server.url("/v1/chat/completions?api-version=2"),
            {
                "Authorization": "Bearer k",
                "Content-Type": "application/json",
                "X-Extra": "1",
                "content-length": "999",  # not the client's to set
            },
        )
        response = await endpoint.post(b'{"a":1}', deadline())
        assert await response.read() == b"{}"
    (request,) = server.requests
    assert request.line == "POST /v1/chat/completions?api-version=2 HTTP/1.1"
    assert request.headers == {
        "host": f"127.0.0.1:{server.port}",
        "user-agent": "chatparity",
        "authorization": "Bearer k",
        "content-type": "application/json",
        "x-extra": "1",
        "content-length": "7",
    }
    assert request.body == b'{"a":1}'


@run
async def test_an_ipv6_literal_host():
    async with Server(answer(fixed(b"ok")), host="::1") as server:
        endpoint = Endpoint(server.url(), {"User-Agent": "mine"})
        assert await (await endpoint.post(b"", deadline())).read() == b"ok"
    assert server.requests[0].headers["host"] == f"[::1]:{server.port}"
    assert server.requests[0].headers["user-agent"] == "mine"


def test_what_cannot_be_sent_is_refused_up_front():
    with pytest.raises(_http1.InvalidURL):
        Endpoint("ftp://example.com/v1", {})
    with pytest.raises(_http1.InvalidURL):
        Endpoint("/chat/completions", {})
    with pytest.raises(_http1.InvalidURL):
        Endpoint("http://example.com:port/", {})
    with pytest.raises(_http1.InvalidURL):
        Endpoint("http://example.com/", {"X-Injected": "a\r\nEvil: 1"})


# -- bodies ---------------------------------------------------------------------------

LINES_BODY = b"data: one\n\ndata: two\r\n\r\n: caf\xc3\xa9 \xff\nlast"
LINES = ["data: one", "", "data: two", "", ": caf\u00e9 \ufffd", "last"]


@pytest.mark.parametrize("piecewise", [False, True], ids=["at-once", "byte-by-byte"])
@run
async def test_lines_of_a_chunked_body_split_anywhere_with_extensions_and_trailers(piecewise):
    # Chunks end mid-line, between CR and LF and inside a UTF-8 sequence.
    pieces = [LINES_BODY[:7], LINES_BODY[7:22], LINES_BODY[22:30], LINES_BODY[30:]]
    wire = SSE_HEAD + chunked(*pieces, extension=b";name=value", end=b"0\r\nX-T: 1\r\n\r\n")

    async def respond(request, reader, writer):
        for byte in [wire[i : i + 1] for i in range(len(wire))] if piecewise else [wire]:
            writer.write(byte)
            await writer.drain()
            await asyncio.sleep(0)

    async with Server(respond) as server:
        endpoint = Endpoint(server.url(), {})
        for _ in range(2):
            response = await endpoint.post(b"{}", deadline())
            assert response.status == 200
            assert response.headers["content-type"] == "text/event-stream"
            assert await lines_of(response) == LINES
            assert await response.readline() is None
            response.close()
    assert server.connections == 1  # read to its end: reused


@run
async def test_a_content_length_body_by_lines_and_whole():
    async with Server(answer(fixed(LINES_BODY))) as server:
        endpoint = Endpoint(server.url(), {})
        assert await lines_of(await endpoint.post(b"", deadline())) == LINES
        assert await (await endpoint.post(b"", deadline())).read() == LINES_BODY
    assert server.connections == 1


@run
async def test_a_body_delimited_by_the_end_of_the_connection_is_read_then_not_reused():
    async with Server(answer(b"HTTP/1.1 200 OK\r\n\r\nfirst\nsecond", close=True)) as server:
        endpoint = Endpoint(server.url(), {})
        for _ in range(2):
            response = await endpoint.post(b"", deadline())
            assert await lines_of(response) == ["first", "second"]
            response.close()
    assert server.connections == 2


@run
async def test_informational_responses_are_skipped_and_empty_bodies_end_at_once():
    interim = b"HTTP/1.1 103 Early Hints\r\nLink: </x>\r\n\r\n"
    async with Server(answer(interim + b"HTTP/1.1 204 No Content\r\n\r\n")) as server:
        endpoint = Endpoint(server.url(), {})
        for _ in range(2):
            response = await endpoint.post(b"", deadline())
            assert response.status == 204
            assert await response.read() == b""
    assert server.connections == 1


@run
async def test_a_large_body_is_read_with_reading_paused_and_resumed():
    body = b"".join(b"data: %08d %s\n\n" % (i, b"x" * 100) for i in range(20000))  # ~2.4 MB
    third = len(body) // 3
    async with Server(answer(SSE_HEAD + chunked(body[:third], body[third:]))) as server:
        endpoint = Endpoint(server.url(), {})
        lines = await lines_of(await endpoint.post(b"", deadline()))
        assert len(lines) == 40000
        assert lines[-2] == f"data: {19999:08d} {'x' * 100}"
        response = await endpoint.post(b"", deadline())
        assert await response.read() == body
    assert server.connections == 1


@pytest.mark.parametrize(
    "body",
    [b"data: " + b"x" * 5000 + b"\n\n", b"data: ok\n\ndata: " + b"x" * 5000],
    ids=["ended", "unfinished"],
)
@run
async def test_a_line_over_the_readers_limit_is_refused_and_its_connection_closed(body):
    async def respond(request, reader, writer):
        writer.write(SSE_HEAD + chunked(body) if request.connection == 1 else fixed(b"ok"))

    async with Server(respond) as server:
        endpoint = Endpoint(server.url(), {})
        response = await endpoint.post(b"", deadline())
        await asyncio.sleep(0.05)  # the whole body arrived: its connection could be reused

        async def read_to_the_end():
            while await response.readline(limit=4096) is not None:
                pass

        with pytest.raises(_http1.TooLarge):
            await read_to_the_end()
        response.close()
        assert await (await endpoint.post(b"", deadline())).read() == b"ok"
    assert server.connections == 2


@run
async def test_a_body_over_the_readers_limit_is_refused_and_its_connection_closed():
    async with Server(answer(fixed(b"x" * 5000))) as server:
        endpoint = Endpoint(server.url(), {})
        with pytest.raises(_http1.TooLarge):
            await (await endpoint.post(b"", deadline())).read(limit=4096)
        assert await (await endpoint.post(b"", deadline())).read(limit=5000) == b"x" * 5000
    assert server.connections == 2


@run
async def test_a_reader_that_stops_reading_stops_the_connection_reading():
    """Back-pressure: what is read from the socket but not yet by the reader stays small,
    however much the server has to send."""
    line = b"data: " + b"x" * 200 + b"\n\n"
    received = 0
    original = _http1._Connection.data_received

    def counting(connection, data):
        nonlocal received
        received += len(data)
        original(connection, data)

    async with Server(answer(SSE_HEAD + chunked(line * 50_000))) as server:  # ~10 MB
        endpoint = Endpoint(server.url(), {})
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(_http1._Connection, "data_received", counting)
            response = await endpoint.post(b"", deadline(30))
            for _ in range(10):
                assert (await response.readline()).startswith("data: x")
                await response.readline()
            await asyncio.sleep(0.5)  # the reader stops; the server keeps writing
            held = received - 10 * len(line)
            assert held <= 64 * 1024
            response.close()


# -- keep-alive -----------------------------------------------------------------------


@pytest.mark.parametrize(
    "head",
    [b"HTTP/1.1 200 OK\r\nConnection: close\r\n", b"HTTP/1.0 200 OK\r\n"],
    ids=["connection-close", "http-1.0"],
)
@run
async def test_a_connection_the_server_does_not_keep_alive_is_not_reused(head):
    async with Server(answer(head + b"Content-Length: 2\r\n\r\nok")) as server:
        endpoint = Endpoint(server.url(), {})
        for _ in range(2):
            assert await (await endpoint.post(b"", deadline())).read() == b"ok"
    assert server.connections == 2


@run
async def test_a_pooled_connection_the_server_closed_while_idle_is_not_used():
    async with Server(answer(fixed(b"ok"), close=True)) as server:
        endpoint = Endpoint(server.url(), {})
        for _ in range(2):
            assert await (await endpoint.post(b"", deadline())).read() == b"ok"
            await asyncio.sleep(0.05)  # the server's FIN arrives
    assert server.connections == 2
    assert len(server.requests) == 2  # no attempt on the closed one


@run
async def test_a_connection_idle_for_too_long_is_closed_not_reused(monkeypatch):
    monkeypatch.setattr(_http1, "KEEPALIVE_EXPIRY", 0.05)
    async with Server(answer(fixed(b"ok"))) as server:
        endpoint = Endpoint(server.url(), {})
        for pause in (0, 0.01, 0.1):
            await asyncio.sleep(pause)
            assert await (await endpoint.post(b"", deadline())).read() == b"ok"
        await asyncio.sleep(0.05)
        assert server.hangups == 1
    assert server.connections == 2


@pytest.mark.parametrize("how", ["close", "reset"])
@run
async def test_a_stale_pooled_connection_is_retried_once_on_a_new_one(how):
    async def respond(request, reader, writer):
        if request.nth == 2:  # the server had given up on this connection
            writer.close() if how == "close" else reset(writer)
        else:
            writer.write(fixed(b"ok"))

    async with Server(respond) as server:
        endpoint = Endpoint(server.url(), {})
        for _ in range(2):
            assert await (await endpoint.post(b"", deadline())).read() == b"ok"
    assert server.connections == 2
    assert [(r.connection, r.nth) for r in server.requests] == [(1, 1), (1, 2), (2, 1)]


@pytest.mark.parametrize(
    ("how", "error"),
    [("close", _http1.RemoteProtocolError), ("reset", _http1.ReadError)],
)
@run
async def test_a_new_connection_failing_before_the_response_is_an_error(how, error):
    async def respond(request, reader, writer):
        writer.close() if how == "close" else reset(writer)

    async with Server(respond) as server:
        with pytest.raises(error):
            await Endpoint(server.url(), {}).post(b"", deadline())
    assert server.connections == 1


@run
async def test_closing_a_response_early_closes_its_connection():
    hung_up = asyncio.Event()

    async def respond(request, reader, writer):
        writer.write(SSE_HEAD + chunked(b"data: 1\n\n", end=b""))
        await writer.drain()
        with contextlib.suppress(ConnectionError):
            await reader.read()  # endless: until the client goes
        hung_up.set()

    async with Server(respond) as server:
        endpoint = Endpoint(server.url(), {})
        response = await endpoint.post(b"", deadline())
        assert await response.readline() == "data: 1"
        response.close()
        await asyncio.wait_for(hung_up.wait(), 1)
        response = await endpoint.post(b"", deadline())
        response.close()
    assert server.connections == 2


@run
async def test_a_released_response_is_pooled_once_its_body_ends():
    async def respond(request, reader, writer):
        writer.write(SSE_HEAD + chunked(b"data: [DONE]\n\n", end=b""))
        await writer.drain()
        await asyncio.sleep(0.05)
        writer.write(b"0\r\n\r\n")

    async with Server(respond) as server:
        endpoint = Endpoint(server.url(), {})
        for _ in range(3):
            response = await endpoint.post(b"", deadline())
            assert await response.readline() == "data: [DONE]"
            response.release()  # before the last chunk came
            await asyncio.sleep(0.1)
    assert server.connections == 1


@run
async def test_a_released_response_whose_body_does_not_end_is_closed(monkeypatch):
    monkeypatch.setattr(_http1, "DRAIN_GRACE", 0.05)
    async with Server(answer(SSE_HEAD + chunked(b"data: [DONE]\n\n", end=b""))) as server:
        endpoint = Endpoint(server.url(), {})
        response = await endpoint.post(b"", deadline())
        assert await response.readline() == "data: [DONE]"
        response.release()
        await asyncio.sleep(0.2)
        assert server.hangups == 1
        (await endpoint.post(b"", deadline())).close()
    assert server.connections == 2


@run
async def test_every_concurrent_request_gets_a_connection_and_the_idle_ones_are_capped():
    arrived = asyncio.Event()

    async def respond(request, reader, writer):
        if len(server.requests) == 1000:
            arrived.set()
        await arrived.wait()  # all at once, each on its connection
        writer.write(fixed(b"ok"))

    async with Server(respond) as server:
        endpoint = Endpoint(server.url(), {})

        async def one():
            return await (await endpoint.post(b"", deadline(20))).read()

        assert await asyncio.gather(*(one() for _ in range(1000))) == [b"ok"] * 1000
        assert server.connections == 1000
        for _ in range(50):
            if server.hangups == 1000 - _http1.MAX_IDLE:
                break
            await asyncio.sleep(0.02)
        assert server.hangups == 1000 - _http1.MAX_IDLE


def test_each_event_loop_has_pools_of_its_own():
    upstream, stop = faulty_upstream.start("")
    try:
        endpoint = Endpoint(f"{upstream.base_url}/chat/completions", {})

        async def twice():
            for _ in range(2):
                response = await endpoint.post(b'{"model": "keep-alive"}', deadline())
                assert (await lines_of(response))[-2:] == ["data: [DONE]", ""]

        asyncio.run(twice())
        asyncio.run(twice())
        assert upstream.attempts["keep-alive"] == 4
        assert upstream.connections == 2
    finally:
        stop()


# -- failures -------------------------------------------------------------------------


@run
async def test_a_refused_connection_is_a_connect_error():
    with pytest.raises(_http1.ConnectError):
        await Endpoint(f"http://127.0.0.1:{closed_port()}/v1", {}).post(b"", deadline())


@pytest.mark.parametrize(
    "head",
    [
        b"HTTP/1.1 200 OK\r\nX-Big: " + b"a" * (70 * 1024) + b"\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nX-Big: " + b"a" * (70 * 1024),  # and not even finished
        b"HTTP/2 200\r\n\r\n",
        b"garbage\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nno colon\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nContent-Length: 1, 2\r\n\r\n",
        # Digits int() refuses: a superscript (isdigit() says yes), and thousands of them.
        b"HTTP/1.1 \xb200 OK\r\n\r\n",  # b"\xb2": "\N{SUPERSCRIPT TWO}" in a Latin-1 head
        b"HTTP/1.1 200 OK\r\nContent-Length: \xb2\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nContent-Length: " + b"9" * 5000 + b"\r\n\r\n",
    ],
    ids=[
        "oversize", "oversize-unfinished", "version", "status-line", "field", "length",
        "status-superscript", "length-superscript", "length-digits",
    ],
)  # fmt: skip
@run
async def test_a_malformed_head_is_a_protocol_error(head):
    async with Server(answer(head)) as server:
        with pytest.raises(_http1.RemoteProtocolError):
            await Endpoint(server.url(), {}).post(b"", deadline())


@pytest.mark.parametrize(
    ("wire", "error"),
    [
        (SSE_HEAD + chunked(b"data: ok\n", end=b"zz\r\n"), _http1.RemoteProtocolError),
        (SSE_HEAD + b"9\r\ndata: ok\nXX", _http1.RemoteProtocolError),
        (SSE_HEAD + chunked(b"data: ok\n", end=b"5\r\nda"), _http1.RemoteProtocolError),
        (fixed(b"data: ok\nmore")[:-2], _http1.RemoteProtocolError),
    ],
    ids=["chunk-size", "chunk-crlf", "cut-in-chunk", "cut-short-of-length"],
)
@run
async def test_a_broken_body_is_an_error_after_what_came_before_it(wire, error):
    async with Server(answer(wire, close=True)) as server:
        response = await Endpoint(server.url(), {}).post(b"", deadline())
        assert await response.readline() == "data: ok"
        with pytest.raises(error):
            await response.readline()


@run
async def test_a_connection_reset_mid_body_is_a_read_error():
    async def respond(request, reader, writer):
        writer.write(SSE_HEAD + chunked(b"data: ok\n", end=b""))
        await writer.drain()
        await asyncio.sleep(0.05)
        reset(writer)

    async with Server(respond) as server:
        response = await Endpoint(server.url(), {}).post(b"", deadline())
        assert await response.readline() == "data: ok"
        with pytest.raises(_http1.ReadError):
            await response.readline()


@run
async def test_the_deadline_bounds_the_wait_for_the_head():
    async def respond(request, reader, writer):
        await asyncio.sleep(10)

    async with Server(respond) as server:
        started = time.monotonic()
        with pytest.raises(_http1.Timeout):
            await Endpoint(server.url(), {}).post(b"", deadline(0.2))
        assert time.monotonic() - started < 1


@run
async def test_the_deadline_bounds_the_whole_body():
    async def respond(request, reader, writer):
        writer.write(SSE_HEAD)
        for i in range(100):
            writer.write(chunked(b"data: %d\n\n" % i, end=b""))
            await writer.drain()
            await asyncio.sleep(0.05)

    async with Server(respond) as server:
        started = time.monotonic()
        response = await Endpoint(server.url(), {}).post(b"", deadline(0.3))
        with pytest.raises(_http1.Timeout):
            async for _ in response:
                pass
        assert 0.3 <= time.monotonic() - started < 1


# -- TLS and proxies ------------------------------------------------------------------


@pytest.fixture(scope="module")
def certificate(tmp_path_factory):
    """A self-signed certificate for localhost: the server's context and a client's
    context trusting it."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")])
    now = datetime.datetime.now(datetime.UTC)
    names = [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(days=1))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.SubjectAlternativeName(names), critical=False)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    directory = tmp_path_factory.mktemp("tls")
    (directory / "cert.pem").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    (directory / "key.pem").write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    server = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server.load_cert_chain(directory / "cert.pem", directory / "key.pem")
    client = ssl.create_default_context(cafile=directory / "cert.pem")
    return server, client


@run
async def test_https_with_sni_and_keep_alive(certificate):
    server_context, client_context = certificate
    names = []
    server_context.sni_callback = lambda connection, name, context: names.append(name)
    async with Server(answer(fixed(b"secret")), ssl_context=server_context) as server:
        url = server.url(host="localhost")
        endpoint = Endpoint(url, {}, ssl_context=client_context, proxy="")
        for _ in range(2):
            assert await (await endpoint.post(b"", deadline())).read() == b"secret"
        assert server.connections == 1
        assert names == ["localhost"]
        assert server.requests[0].headers["host"] == f"localhost:{server.port}"
        with pytest.raises(_http1.ConnectError):  # the system does not trust it
            await Endpoint(url, {}, proxy="").post(b"", deadline())


class Tunnel:
    """A ``CONNECT`` proxy: pipes bytes to the host and port asked for."""

    def __init__(self, status=b"200 Connection established"):
        self.status = status
        self.requests: list[str] = []

    async def __call__(self, request, reader, writer):
        self.requests.append(f"{request.line} {request.headers.get('proxy-authorization')}")
        if not self.status.startswith(b"200"):
            writer.write(b"HTTP/1.1 %s\r\nContent-Length: 0\r\n\r\n" % self.status)
            return
        host, _, port = request.line.split()[1].rpartition(":")
        upstream_reader, upstream_writer = await asyncio.open_connection(host, int(port))
        writer.write(b"HTTP/1.1 %s\r\n\r\n" % self.status)

        async def pipe(source, sink):
            while data := await source.read(65536):
                sink.write(data)
                await sink.drain()
            sink.close()

        try:
            await asyncio.gather(pipe(reader, upstream_writer), pipe(upstream_reader, writer))
        finally:
            upstream_writer.close()


@run
async def test_https_through_a_connect_tunnel(certificate):
    server_context, client_context = certificate
    tunnel = Tunnel()
    async with (
        Server(answer(fixed(b"tunnelled")), ssl_context=server_context) as server,
        Server(tunnel) as proxy,
    ):
        endpoint = Endpoint(
            server.url(host="localhost"),
            {},
            ssl_context=client_context,
            proxy=f"http://user:p%40ss@127.0.0.1:{proxy.port}",
        )
        for _ in range(2):
            assert await (await endpoint.post(b"", deadline())).read() == b"tunnelled"
    credentials = "Basic dXNlcjpwQHNz"  # user:p@ss
    assert tunnel.requests == [f"CONNECT localhost:{server.port} HTTP/1.1 {credentials}"]
    assert server.connections == 1
    assert server.requests[0].line == "POST /v1/chat/completions HTTP/1.1"


@run
async def test_a_refused_tunnel_is_a_proxy_error(certificate):
    _, client_context = certificate
    async with Server(Tunnel(b"407 Proxy Authentication Required")) as proxy:
        endpoint = Endpoint(
            "https://localhost:1/v1",
            {},
            ssl_context=client_context,
            proxy=f"http://127.0.0.1:{proxy.port}",
        )
        with pytest.raises(_http1.ProxyError):
            await endpoint.post(b"", deadline())


@run
async def test_plain_http_through_the_environments_proxy_unless_bypassed(monkeypatch):
    async with Server(answer(fixed(b"proxied"))) as proxy:
        for name in ("http_proxy", "HTTP_PROXY", "all_proxy", "ALL_PROXY", "no_proxy", "NO_PROXY"):
            monkeypatch.delenv(name, raising=False)
        monkeypatch.setenv("HTTP_PROXY", f"127.0.0.1:{proxy.port}")
        endpoint = Endpoint("http://upstream.test:8080/v1/chat/completions?x=1", {})
        assert await (await endpoint.post(b"{}", deadline())).read() == b"proxied"
        (request,) = proxy.requests
        assert request.line == "POST http://upstream.test:8080/v1/chat/completions?x=1 HTTP/1.1"
        assert request.headers["host"] == "upstream.test:8080"

        monkeypatch.setenv("NO_PROXY", "localhost,127.0.0.1")
        async with Server(answer(fixed(b"direct"))) as server:
            endpoint = Endpoint(server.url(), {})
            assert await (await endpoint.post(b"{}", deadline())).read() == b"direct"
        assert len(proxy.requests) == 1
