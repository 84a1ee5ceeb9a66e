"""The ``openai`` backend's HTTP client, decided by measurement: http1 vs aiohttp vs httpcore.

    .venv/bin/pip install aiohttp   # httpcore comes with httpx
    .venv/bin/python bench/transports.py [--rounds 5] [--duration 5] [--requests 1000]
                                         [--streams 1000] [--skip-memory]

Each client is put under the backend in place of ``chatparity.backends._http1``
(``UpstreamBackend.transport``) through an adapter below that gives it the same
interface: ``post`` to one URL with fixed headers, a response read by lines or
whole, ``release`` (pooled once the body ended) or ``close`` (at once), the
same errors. Written for the client's speed: aiohttp with one session per
event loop, no cookie jar, no connection limit; httpcore with one pool per
event loop, lines split from whole chunks as http1 splits them. In one run,
on the same stub upstream (``bench/stub_upstream.py``, 20 chunks):

1. **Behaviour**: ``tests/backends/test_upstream.py`` (streams, whole
   completions, retries, time-outs, connection reuse, client hang-up) with each
   client under the backend (``pytest -p with_transport``).
2. **The gateway**: one uvicorn worker per client (``bench/with_transport.py``,
   the example project's application, request logging on, SQLite), and the
   stub directly; wrk non-stream and stream at c=1 and c=32. Rounds alternate
   the clients (each round in a different order); per cell: req/s, p50, the
   worker's CPU per request (utime + stime from /proc, ASGI server and Django
   included) and upstream connections per request.
3. **The backend alone**: in this process, on uvloop, ``UpstreamBackend.stream``
   to the stub, ``--requests`` requests at c=1 and c=32 per cell, rounds
   alternating: CPU per request (the stub runs in its own process).
4. **Memory per open stream**: ``--streams`` slow streams through a fresh worker
   per client, as ``bench/run.py`` measures them.

Medians over the rounds, and ratios against http1 (the median of the ratios in each
round, so that drift between rounds cancels out), from one run. Writes the
"HTTP client" section of ``bench/RESULTS.md`` (``bench/run.py`` keeps it).
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
import weakref
from collections.abc import Callable, Iterator, Mapping
from contextlib import ExitStack, asynccontextmanager, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import aiohttp
import harness
import httpcore
import httpx
import slow_streams
from harness import BENCH, ROOT, SECTION_END, SECTION_START, log

from chatparity.backends import _http1
from chatparity.backends.base import BackendConfig
from chatparity.backends.upstream import UpstreamBackend
from chatparity.protocol.request import parse_chat_request

WORKLOADS = ((False, 1), (False, 32), (True, 1), (True, 32))  # (stream, concurrency)
DIRECT = "direct (stub)"


# -- the adapters ---------------------------------------------------------------------


class _LineResponse:
    """What the backend reads of an :class:`_http1.Response`, over ``_more`` (the next
    bytes of the body, ``b""`` at its end): lines split from whole chunks as http1 does."""

    status: int
    headers: Mapping[str, str]

    def __init__(self) -> None:
        self._body = bytearray()
        self._lines: list[str] = []
        self._ended = False

    async def _more(self) -> bytes:
        raise NotImplementedError

    async def _finish(self) -> None:
        """The body ended: give the connection back."""
        raise NotImplementedError

    async def readline(self) -> str | None:
        if self._lines:
            return self._lines.pop()
        if self._ended:
            return None
        body = self._body
        while True:
            last = body.rfind(b"\n")
            if last >= 0:
                lines = _http1.take_lines(body, last)
                line = lines.pop()
                self._lines = lines
                return line
            data = await self._more()
            if not data:
                self._ended = True
                await self._finish()
                if not body:
                    return None
                line = body.decode("utf-8", "replace")
                body.clear()
                return line
            body += data


_background: set[asyncio.Task[None]] = set()


def _spawn(work: Any) -> None:
    """Run ``work`` on its own, kept referenced until it ends."""
    task = asyncio.ensure_future(work)
    _background.add(task)
    task.add_done_callback(_background.discard)


class _AiohttpResponse(_LineResponse):
    def __init__(self, response: aiohttp.ClientResponse) -> None:
        super().__init__()
        self._response = response
        self.status = response.status
        self.headers = response.headers  # case-insensitive

    async def _more(self) -> bytes:
        with _aiohttp_errors():
            return await self._response.content.readany()

    async def _finish(self) -> None:
        self._response.release()

    async def read(self) -> bytes:
        with _aiohttp_errors():
            try:
                return await self._response.read()
            finally:
                self._response.release()

    def release(self) -> None:
        if self._response.content.is_eof():
            self._response.release()
        else:
            _spawn(self._drain())

    async def _drain(self) -> None:
        try:
            async with asyncio.timeout(_http1.DRAIN_GRACE):
                await self._response.read()
        except (TimeoutError, aiohttp.ClientError):
            self._response.close()
        else:
            self._response.release()

    def close(self) -> None:
        self._response.close()


@contextmanager
def _aiohttp_errors() -> Iterator[None]:
    """aiohttp's errors as http1's."""
    try:
        yield
    except TimeoutError:
        raise _http1.Timeout("the upstream did not answer in time") from None
    except aiohttp.ClientConnectorError as exc:
        raise _http1.ConnectError(str(exc)) from None
    except aiohttp.InvalidURL as exc:
        raise _http1.InvalidURL(str(exc)) from None
    except aiohttp.ClientPayloadError as exc:
        raise _http1.RemoteProtocolError(str(exc)) from None
    except aiohttp.ClientError as exc:
        raise _http1.ReadError(str(exc) or type(exc).__name__) from None


class AiohttpEndpoint:
    """_http1.Endpoint's interface on aiohttp: a session per event loop, its connector
    unlimited, idle connections kept 5 s, the environment's proxy read once (as http1
    does: aiohttp's ``trust_env`` looks it up in a thread per request, 0.4 ms of CPU)."""

    def __init__(
        self, url: str, headers: Mapping[str, str], *, connect_timeout: float = 10.0
    ) -> None:
        self.url = url
        self.headers = {"User-Agent": _http1.USER_AGENT, **headers}
        self.connect_timeout = connect_timeout
        parts = urlsplit(url)
        self._proxy = _http1._proxy(parts.scheme, parts.hostname or "")
        self._sessions: weakref.WeakKeyDictionary[
            asyncio.AbstractEventLoop, aiohttp.ClientSession
        ] = weakref.WeakKeyDictionary()

    def _session(self, loop: asyncio.AbstractEventLoop) -> aiohttp.ClientSession:
        session = self._sessions.get(loop)
        if session is None:
            connector = aiohttp.TCPConnector(
                limit=0, keepalive_timeout=_http1.KEEPALIVE_EXPIRY, ssl=_http1.default_ssl_context()
            )
            session = self._sessions[loop] = aiohttp.ClientSession(
                connector=connector,
                headers=self.headers,
                skip_auto_headers=("Accept-Encoding",),  # as http1: nothing compressed
                cookie_jar=aiohttp.DummyCookieJar(),
                proxy=self._proxy,
            )
        return session

    async def aclose(self) -> None:
        """Close this event loop's session."""
        session = self._sessions.pop(asyncio.get_running_loop(), None)
        if session is not None:
            await session.close()

    async def post(self, body: bytes, deadline: float) -> _AiohttpResponse:
        loop = asyncio.get_running_loop()
        timeout = aiohttp.ClientTimeout(total=deadline - loop.time(), connect=self.connect_timeout)
        with _aiohttp_errors():
            response = await self._session(loop).post(self.url, data=body, timeout=timeout)
        return _AiohttpResponse(response)


class _HttpcoreResponse(_LineResponse):
    def __init__(self, response: httpcore.Response, deadline: float) -> None:
        super().__init__()
        self._response = response
        self._chunks = response.aiter_stream()
        self._deadline = deadline
        self.status = response.status
        self.headers = {
            name.decode("latin-1").lower(): value.decode("latin-1")
            for name, value in response.headers
        }

    async def _more(self) -> bytes:
        # httpcore bounds each read, not the exchange: the deadline is checked between reads.
        if asyncio.get_running_loop().time() > self._deadline:
            await self._response.aclose()
            raise _http1.Timeout("the upstream did not answer in time")
        async with _httpcore_errors():
            return await anext(self._chunks, b"")

    async def _finish(self) -> None:
        await self._response.aclose()

    async def read(self) -> bytes:
        try:
            async with _httpcore_errors():
                return b"".join([chunk async for chunk in self._chunks])
        finally:
            await self._response.aclose()

    def release(self) -> None:
        _spawn(self._drain())

    async def _drain(self) -> None:
        try:
            async with asyncio.timeout(_http1.DRAIN_GRACE):
                async for _ in self._chunks:
                    pass
        except (TimeoutError, httpcore.NetworkError, httpcore.ProtocolError):
            pass
        await self._response.aclose()

    def close(self) -> None:
        _spawn(self._response.aclose())


@asynccontextmanager
async def _httpcore_errors() -> Any:
    """httpcore's errors as http1's."""
    try:
        yield
    except httpcore.TimeoutException:
        raise _http1.Timeout("the upstream did not answer in time") from None
    except httpcore.ConnectError as exc:
        raise _http1.ConnectError(str(exc)) from None
    except httpcore.ProxyError as exc:
        raise _http1.ProxyError(str(exc)) from None
    except (httpcore.UnsupportedProtocol, httpcore.LocalProtocolError) as exc:
        raise _http1.InvalidURL(str(exc)) from None
    except httpcore.RemoteProtocolError as exc:
        raise _http1.RemoteProtocolError(str(exc)) from None
    except httpcore.NetworkError as exc:
        raise _http1.ReadError(str(exc) or type(exc).__name__) from None


class HttpcoreEndpoint:
    """_http1.Endpoint's interface on httpcore (what httpx runs on): a pool per event
    loop, unlimited, 100 idle connections kept 5 s, the environment's proxy."""

    def __init__(
        self, url: str, headers: Mapping[str, str], *, connect_timeout: float = 10.0
    ) -> None:
        self.url = url
        self.connect_timeout = connect_timeout
        parts = httpcore.URL(url)
        fields = {"host": parts.host.decode() + (f":{parts.port}" if parts.port else "")}
        fields["user-agent"] = _http1.USER_AGENT
        fields.update({name.lower(): value for name, value in headers.items()})
        self.headers = [(name.encode(), value.encode()) for name, value in fields.items()]
        proxy = _http1._proxy(parts.scheme.decode(), parts.host.decode())
        self._proxy = httpcore.Proxy(proxy) if proxy else None
        self._pools: weakref.WeakKeyDictionary[
            asyncio.AbstractEventLoop, httpcore.AsyncConnectionPool
        ] = weakref.WeakKeyDictionary()

    def _pool(self, loop: asyncio.AbstractEventLoop) -> httpcore.AsyncConnectionPool:
        pool = self._pools.get(loop)
        if pool is None:
            pool = self._pools[loop] = httpcore.AsyncConnectionPool(
                ssl_context=_http1.default_ssl_context(),
                proxy=self._proxy,
                max_connections=None,
                max_keepalive_connections=_http1.MAX_IDLE,
                keepalive_expiry=_http1.KEEPALIVE_EXPIRY,
            )
        return pool

    async def aclose(self) -> None:
        """Close this event loop's pool."""
        pool = self._pools.pop(asyncio.get_running_loop(), None)
        if pool is not None:
            await pool.aclose()

    async def post(self, body: bytes, deadline: float) -> _HttpcoreResponse:
        loop = asyncio.get_running_loop()
        left = deadline - loop.time()
        timeouts = {"connect": min(self.connect_timeout, left), "read": left, "write": left}
        request = httpcore.Request(
            "POST",
            self.url,
            headers=[*self.headers, (b"content-length", b"%d" % len(body))],
            content=body,
            extensions={"timeout": {**timeouts, "pool": left}},
        )
        try:
            async with _httpcore_errors():
                response = await self._pool(loop).handle_async_request(request)
        except _http1.ConnectError as exc:  # anyio's message does not name the upstream
            raise _http1.ConnectError(f"{self.url}: {exc}") from None
        return _HttpcoreResponse(response, deadline)


CLIENTS: dict[str, Callable[..., Any]] = {
    "http1": _http1.Endpoint,
    "aiohttp": AiohttpEndpoint,
    "httpcore": HttpcoreEndpoint,
}


def use(client: str) -> None:
    """Put ``client`` under every ``openai`` backend made from now on."""
    UpstreamBackend.transport = CLIENTS[client]  # type: ignore[assignment]


# -- behaviour -----------------------------------------------------------------------


@dataclass
class Behaviour:
    passed: int
    failed: list[str]


def behaviour(client: str) -> Behaviour:
    """tests/backends/test_upstream.py with ``client`` under the backend."""
    path = os.pathsep.join(filter(None, (str(BENCH), os.environ.get("PYTHONPATH"))))
    env = {**os.environ, "PYTHONPATH": path, "BENCH_TRANSPORT": client}
    command = [
        harness.PYTHON,
        "-m",
        "pytest",
        "tests/backends/test_upstream.py",
        "-q",
        "-rf",
        "-p",
        "with_transport",
        "-p",
        "no:cacheprovider",
    ]
    run = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True)
    passed = re.search(r"(\d+) passed", run.stdout)
    failed = re.findall(r"^FAILED \S+::(\w+)", run.stdout, re.MULTILINE)
    if run.returncode and not failed:
        raise RuntimeError(f"pytest with {client} did not run:\n{run.stdout}\n{run.stderr}")
    return Behaviour(int(passed[1]) if passed else 0, failed)


# -- the gateway ---------------------------------------------------------------------


@dataclass
class Sample:
    """One wrk run of one target under one workload."""

    target: str
    stream: bool
    concurrency: int
    rps: float
    p50_ms: float
    cpu_ms: float  # the worker's CPU per request
    connections: float  # upstream connections per request
    failures: int


def cpu_seconds(pid: int) -> float:
    """utime + stime of ``pid``, from /proc."""
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def sample(
    target: str,
    url: str,
    key: str,
    model: str,
    pid: int | None,
    stream: bool,
    concurrency: int,
    seconds: int,
    stats: str,
    work: Path,
) -> Sample:
    """A 1 s warm-up, then ``seconds`` of wrk, the worker's CPU and the stub's counters
    read around it."""
    agent = f"bench/transports/{target}/{'stream' if stream else 'json'}/c{concurrency}"
    common: dict[str, Any] = {"stream": stream, "concurrency": concurrency, "work": work}
    harness.wrk(url, key, model, seconds=1, agent=agent + "/warm-up", **common)
    before = httpx.get(stats).json()
    cpu = cpu_seconds(pid) if pid else 0.0
    summary = harness.wrk(url, key, model, seconds=seconds, agent=agent, **common)
    cpu = cpu_seconds(pid) - cpu if pid else 0.0
    after = httpx.get(stats).json()
    requests = max(int(summary["requests"]), 1)
    failures = sum(int(summary[n]) for n in ("connect", "read", "write", "status", "timeout"))
    return Sample(
        target=target,
        stream=stream,
        concurrency=concurrency,
        rps=summary["requests"] / summary["seconds"],
        p50_ms=summary["p50_us"] / 1000,
        cpu_ms=cpu * 1000 / requests,
        connections=(after["connections"] - before["connections"]) / requests,
        failures=failures + int(summary["bad"]),
    )


def gateways(
    site: harness.Chatparity,
    stub_url: str,
    clients: list[str],
    rounds: int,
    seconds: int,
    work: Path,
) -> list[Sample]:
    """Every workload, every client, round after round, each round in another order."""
    samples: list[Sample] = []
    stats = stub_url.removesuffix("/v1") + "/bench/stats"
    with ExitStack() as stack:
        targets = [(DIRECT, stub_url, "sk-stub", harness.STUB_MODEL, None)]
        for client in clients:
            url, process = start_gateway(stack, site, client, work)
            targets.append((client, url, site.key, "stub", process.pid))
        for number in range(rounds):
            order = targets[:1] + rotated(targets[1:], number)
            log(f"  round {number + 1}/{rounds}: {', '.join(t[0] for t in order)}")
            for stream, concurrency in WORKLOADS:
                for target, url, key, model, pid in order:
                    cell = sample(
                        target, url, key, model, pid, stream, concurrency, seconds, stats, work
                    )
                    samples.append(cell)
                    log(
                        f"    {target:14} {'stream' if stream else 'json':6} c={concurrency:<3}"
                        f" {cell.rps:8.0f} req/s  p50 {cell.p50_ms:6.2f} ms"
                        f"  cpu {cell.cpu_ms:5.2f} ms/req  conn/req {cell.connections:.2f}"
                        f"  failures {cell.failures}"
                    )
    return samples


def start_gateway(
    stack: ExitStack, site: harness.Chatparity, client: str, work: Path, name: str = ""
) -> tuple[str, Any]:
    """A uvicorn worker serving the example project with ``client`` under the backend."""
    port = harness.free_port()
    url = f"http://127.0.0.1:{port}/v1"
    command = [
        harness.PYTHON,
        "-m",
        "uvicorn",
        "with_transport:application",
        "--app-dir",
        str(BENCH),
        *f"--host 127.0.0.1 --port {port} --lifespan off".split(),
        *harness.UVICORN_QUIET,
    ]
    env = {**site.env, "BENCH_TRANSPORT": client}
    auth = {"Authorization": f"Bearer {site.key}"}
    log_file = work / f"{name or 'gateway'}-{client}.log"
    process = stack.enter_context(harness.serve(command, f"{url}/models", auth, env, log_file))
    return url, process


def rotated(items: list[Any], by: int) -> list[Any]:
    by %= len(items)
    return items[by:] + items[:by]


# -- the backend alone ---------------------------------------------------------------


@dataclass
class BackendSample:
    client: str
    stream: bool
    concurrency: int
    cpu_us: float  # this process's CPU per request
    connections: float


async def backend_round(
    client: str, stub_url: str, stream: bool, concurrency: int, requests: int
) -> BackendSample:
    """``requests`` completions through UpstreamBackend.stream with ``client``, every
    event read, ``concurrency`` at a time; CPU per request, after a warm-up."""
    use(client)
    backend = UpstreamBackend(
        BackendConfig(name=f"bench-{client}", kind="openai", base_url=stub_url, timeout=30)
    )
    body = {"model": "stub", "messages": [{"role": "user", "content": "hi"}], "stream": stream}
    request = parse_chat_request(body)

    async def worker(count: int) -> None:
        for _ in range(count):
            async for _event in backend.stream(request, harness.STUB_MODEL):
                pass

    async def burst(count: int) -> None:
        await asyncio.gather(*(worker(count // concurrency) for _ in range(concurrency)))

    stats = stub_url.removesuffix("/v1") + "/bench/stats"
    await burst(max(requests // 10, concurrency))
    async with httpx.AsyncClient() as stub:
        before = (await stub.get(stats)).json()
        started = time.process_time()
        await burst(requests)
        cpu = time.process_time() - started
        after = (await stub.get(stats)).json()
    done = requests // concurrency * concurrency
    close = getattr(backend._endpoint, "aclose", None)  # http1's pools end with the loop
    if close is not None:
        await close()
    return BackendSample(
        client,
        stream,
        concurrency,
        cpu * 1e6 / done,
        (after["connections"] - before["connections"]) / done,
    )


def backend_alone(
    stub_url: str, clients: list[str], rounds: int, requests: int
) -> list[BackendSample]:
    import uvloop

    samples: list[BackendSample] = []
    for number in range(rounds):
        for stream, concurrency in WORKLOADS:
            for client in rotated(clients, number):
                cell = uvloop.run(backend_round(client, stub_url, stream, concurrency, requests))
                samples.append(cell)
                log(
                    f"    round {number + 1} {client:9} {'stream' if stream else 'json':6}"
                    f" c={concurrency:<3} {cell.cpu_us:6.0f} us CPU/req"
                    f"  conn/req {cell.connections:.2f}"
                )
    return samples


# -- memory per open stream ------------------------------------------------------------


def memory(
    site: harness.Chatparity, slow_url: str, clients: list[str], count: int, work: Path
) -> dict[str, slow_streams.Report]:
    """``count`` held streams through a fresh worker per client."""
    reports = {}
    control = slow_url.removesuffix("/v1") + "/bench"
    for client in clients:
        with ExitStack() as stack:
            url, process = start_gateway(stack, site, client, work, "memory")
            report = slow_streams.measure_held(url, site.key, control, count=count, pid=process.pid)
        reports[client] = report
        log(
            f"  {client}: {report.kib_per_stream:.0f} KiB per stream,"
            f" {report.dropped} dropped {report.failures or ''}"
        )
    return reports


# -- the report ------------------------------------------------------------------------


def median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def section(
    env: dict[str, str],
    args: argparse.Namespace,
    clients: list[str],
    behaviours: dict[str, Behaviour],
    samples: list[Sample],
    alone: list[BackendSample],
    memories: dict[str, slow_streams.Report],
) -> str:
    """The markdown section of RESULTS.md."""

    out = [
        SECTION_START,
        "## HTTP client of the `openai` backend: http1 vs aiohttp vs httpcore",
        "",
        f"Produced by `.venv/bin/python bench/transports.py` (see its docstring) on"
        f" {env['date']}; load average at the start {env['load']}. Versions: aiohttp"
        f" {env['aiohttp']}, httpcore {env['httpcore']} (h11 {env['h11']}, anyio"
        f" {env['anyio']}), uvicorn {env['uvicorn']} on uvloop + httptools. Each client sits"
        " under `UpstreamBackend` (http1 is `chatparity.backends._http1`, the others through"
        " adapters with its interface). Medians of"
        f" {args.rounds} rounds alternating the clients (each round in another order);"
        " ratios against http1 from the same run, each the median of the ratios in each round.",
    ]
    if behaviours:
        out += [
            "",
            "Behaviour: `tests/backends/test_upstream.py` with each client under the backend.",
            "",
            "| client | passed | failed |",
            "|---|---:|---|",
        ]
        for client, result in behaviours.items():
            failed = ", ".join(f"`{name}`" for name in result.failed) or "none"
            out.append(f"| {client} | {result.passed} | {failed} |")
    if samples:
        out += gateway_table(samples, clients, args.duration)
    if alone:
        out += alone_table(alone, clients, args.requests)
    if memories:
        out += memory_table(memories)
    out += ["", SECTION_END]
    return "\n".join(out) + "\n"


def paired(values: list[float], bases: list[float]) -> str:
    """The median of the ratios to the base round by round (the lists are in round
    order): drift in the machine's speed between rounds cancels out."""
    ratios = [value / base for value, base in zip(values, bases, strict=True) if base]
    return f"{median(ratios):.2f}x" if ratios else ""


def gateway_table(samples: list[Sample], clients: list[str], seconds: int) -> list[str]:
    def cells(target: str, stream: bool, concurrency: int) -> list[Sample]:
        return [
            s
            for s in samples
            if (s.target, s.stream, s.concurrency) == (target, stream, concurrency)
        ]

    out = [
        "",
        "Through the gateway: one uvicorn worker per client, the example project, request"
        f" logging on, wrk {seconds} s per cell after a 1 s warm-up, {harness.CHUNKS}"
        " chunks per answer. Added p50 is over the stub answering directly in the same"
        " round; CPU is the worker's (ASGI server, Django and the client) per request."
        " Ratios to http1 are medians of the ratios in each round.",
        "",
        "| client | workload | conc. | req/s | vs http1 | p50 ms | added p50 ms | vs http1"
        " | worker CPU ms/req | vs http1 | upstream conn./req | failures |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for stream, concurrency in WORKLOADS:
        workload = "stream" if stream else "non-stream"
        direct = [s.p50_ms for s in cells(DIRECT, stream, concurrency)]
        base = cells("http1", stream, concurrency)
        base_added = [s.p50_ms - d for s, d in zip(base, direct, strict=True)]
        for client in clients:
            mine = cells(client, stream, concurrency)
            rps = [s.rps for s in mine]
            added = [s.p50_ms - d for s, d in zip(mine, direct, strict=True)]
            cpu = [s.cpu_ms for s in mine]
            out.append(
                f"| {client} | {workload} | {concurrency} | {median(rps):,.0f}"
                f" | {paired(rps, [s.rps for s in base])}"
                f" | {median([s.p50_ms for s in mine]):.2f} | {median(added):+.2f}"
                f" | {paired(added, base_added)}"
                f" | {median(cpu):.2f} | {paired(cpu, [s.cpu_ms for s in base])}"
                f" | {median([s.connections for s in mine]):.2f}"
                f" | {sum(s.failures for s in mine)} |"
            )
    return out


def alone_table(alone: list[BackendSample], clients: list[str], requests: int) -> list[str]:
    def cpu(client: str, stream: bool, concurrency: int) -> list[BackendSample]:
        return [
            s for s in alone if (s.client, s.stream, s.concurrency) == (client, stream, concurrency)
        ]

    out = [
        "",
        "The backend alone: `UpstreamBackend.stream` in one process on uvloop, every"
        f" event read, {requests} requests per cell after a warm-up; this process's"
        " CPU per request (the stub runs in its own).",
        "",
        "| client | workload | conc. | CPU us/req | vs http1 | upstream conn./req |",
        "|---|---|---:|---:|---:|---:|",
    ]
    for stream, concurrency in WORKLOADS:
        base = [s.cpu_us for s in cpu("http1", stream, concurrency)]
        for client in clients:
            mine = cpu(client, stream, concurrency)
            values = [s.cpu_us for s in mine]
            out.append(
                f"| {client} | {'stream' if stream else 'non-stream'} | {concurrency}"
                f" | {median(values):,.0f} | {paired(values, base)}"
                f" | {median([s.connections for s in mine]):.2f} |"
            )
    return out


def memory_table(memories: dict[str, slow_streams.Report]) -> list[str]:
    out = [
        "",
        "Memory per open stream: slow streams held open through a fresh worker per"
        " client, measured as in the section above.",
        "",
        "| client | streams | RSS before | RSS all open | per stream | dropped |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for client, r in memories.items():
        out.append(
            f"| {client} | {r.count:,} | {r.rss_before_kib / 1024:.0f} MiB"
            f" | {r.rss_open_kib / 1024:.0f} MiB | **{r.kib_per_stream:.0f} KiB**"
            f" | {r.dropped} |"
        )
    return out


# -- main ------------------------------------------------------------------------------


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--duration", type=int, default=5, help="measured seconds per cell")
    parser.add_argument("--requests", type=int, default=1000, help="per backend-alone cell")
    parser.add_argument("--streams", type=int, default=1000, help="slow streams, memory test")
    parser.add_argument("--clients", default=",".join(CLIENTS))
    parser.add_argument("--skip-behaviour", action="store_true")
    parser.add_argument("--skip-gateway", action="store_true")
    parser.add_argument("--skip-alone", action="store_true")
    parser.add_argument("--skip-memory", action="store_true")
    parser.add_argument("--out", type=Path, default=BENCH / "RESULTS.md")
    args = parser.parse_args()
    clients = args.clients.split(",")

    harness.ensure_wrk()
    harness.raise_file_limit()
    env = {
        "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "load": " ".join(f"{load:.2f}" for load in os.getloadavg()),
        **{
            name: harness.package_version(harness.PYTHON, name)
            for name in ("aiohttp", "httpcore", "h11", "anyio", "uvicorn")
        },
    }
    log("Versions: " + ", ".join(f"{k} {v}" for k, v in env.items()))
    behaviours: dict[str, Behaviour] = {}
    if not args.skip_behaviour:
        log("\n== Behaviour: tests/backends/test_upstream.py per client")
        for client in clients:
            behaviours[client] = behaviour(client)
            log(f"  {client}: {behaviours[client]}")

    work = Path(tempfile.mkdtemp(prefix="chatparity-transports-"))
    log(f"Work directory (database, server logs): {work}")
    site = harness.make_chatparity(work)
    stub_port, slow_port = harness.free_port(), harness.free_port()
    stub_url = f"http://127.0.0.1:{stub_port}/v1"
    slow_url = f"http://127.0.0.1:{slow_port}/v1"
    site.add_upstream("stub", stub_url)
    site.add_upstream("slow", slow_url)
    samples: list[Sample] = []
    alone: list[BackendSample] = []
    memories: dict[str, slow_streams.Report] = {}
    with ExitStack() as stubs:
        stubs.enter_context(harness.serve(harness.stub_command(stub_port), f"{stub_url}/models"))
        if not args.skip_gateway:
            log("\n== The gateway, one uvicorn worker per client")
            samples = gateways(site, stub_url, clients, args.rounds, args.duration, work)
        if not args.skip_alone:
            log("\n== The backend alone, in this process")
            alone = backend_alone(stub_url, clients, args.rounds, args.requests)
        if not args.skip_memory:
            log(f"\n== {args.streams} slow streams per client")
            slow = harness.stub_command(slow_port, "--hold")
            stubs.enter_context(harness.serve(slow, f"{slow_url}/models"))
            memories = memory(site, slow_url, clients, args.streams, work)
    text = section(env, args, clients, behaviours, samples, alone, memories)
    harness.write_section(args.out, text)
    print(text)
    log(f"Wrote the section of {args.out}; server logs in {work}")


if __name__ == "__main__":
    sys.exit(main())
