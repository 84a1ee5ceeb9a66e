"""Where one chatparity request's time goes: an in-process, instrumented count.

    .venv/bin/python bench/anatomy.py [--requests 300] [--concurrency 32]

Calls the example project's ASGI application (``project.asgi:application``,
the object uvicorn serves: the ``/v1`` fast path in front of Django) directly,
with no HTTP server, on uvloop when it is installed (as uvicorn picks it), with
requests to an ``openai`` backend pointed at the fast stub,
request logging on, SQLite in a temporary file. This process only wraps
library and chatparity functions to count and time them; nothing in
chatparity changes. Per request it reports: wall time (to the reply sent, and
to the application's return, i.e. the log row written); the stages of the fast
path; key and alias lookups, cache hits against database loads; the upstream
exchange and the connections it opened; log rows and the batches that wrote
them; sync_to_async thread hops; threads started; database connections opened
and closed and the time they took; each SQL statement and commit and its time;
the garbage collector's passes by generation. Two workloads send one request at
a time (non-stream, stream), a third 32 at a time, which shows what only
concurrency does: log rows sharing a batch, cache entries expiring under
requests in flight. Prints a markdown section (``bench/PROFILE.md`` takes it).
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import gc
import os
import re
import sys
import tempfile
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import harness

Message = dict[str, Any]


class Meter:
    """Counts and wall time per label, from any thread."""

    def __init__(self) -> None:
        self.count: Counter[str] = Counter()
        self.seconds: defaultdict[str, float] = defaultdict(float)
        self.lock = threading.Lock()

    def add(self, label: str, seconds: float) -> None:
        with self.lock:
            self.count[label] += 1
            self.seconds[label] += seconds

    def reset(self) -> None:
        self.count.clear()
        self.seconds.clear()


METER = Meter()
WATCHED: list[str] = []  # every fixed label wrapped, in order: those never counted are listed


def timed(label: str | Callable[..., str], function: Callable[..., Any]) -> Callable[..., Any]:
    """``function``, counted and timed under ``label`` (or ``label(*args)``)."""
    if isinstance(label, str):
        WATCHED.append(label)

    @functools.wraps(function)  # a hop through sync_to_async is named after the function
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        started = time.perf_counter()
        try:
            return function(*args, **kwargs)
        finally:
            name = label(*args, **kwargs) if callable(label) else label
            METER.add(name, time.perf_counter() - started)

    return wrapper


def atimed(label: str, function: Callable[..., Awaitable[Any]]) -> Callable[..., Any]:
    """The coroutine function ``function``, counted and timed (wall) under ``label``."""
    WATCHED.append(label)

    @functools.wraps(function)
    async def wrapper(*args: Any, **kwargs: Any) -> Any:
        started = time.perf_counter()
        try:
            return await function(*args, **kwargs)
        finally:
            METER.add(label, time.perf_counter() - started)

    return wrapper


def patch(owner: object, name: str, wrap: Callable[[Any], Any]) -> None:
    """Replace ``owner.name`` by ``wrap(owner.name)`` (in this process only)."""
    setattr(owner, name, wrap(getattr(owner, name)))


def statement(_cursor: Any, sql: str, *_: Any, **__: Any) -> str:
    """``SQL SELECT chatparity_apikey`` from a statement's text."""
    verb = sql.split(None, 1)[0].upper()
    table = re.search(r'(?:FROM|INTO|UPDATE)\s+"?(\w+)"?', sql, re.IGNORECASE)
    return f"SQL {verb} {table.group(1) if table else ''}".rstrip()


HOPS = "sync_to_async hops (own cost: await minus work; with queueing for the thread)"
LOAD_GRANT = "keys._load_grant (key from the DB: cache miss)"
LOAD_ALIASES = "keys._load_aliases (aliases from the DB: cache miss)"
DJANGO = "requests handed to Django's ASGI handler (not /v1)"

# (module, attribute, label) of the coroutine functions timed as they are awaited. Each
# is looked up through its module at call time (``keys.grant(...)``, or a global of
# the module calling it), so replacing the module's attribute catches every call.
ASYNC = (
    ("fastpath", "serve", "stage: fastpath.serve (FastPath: the whole request, log row included)"),
    ("pipeline", "_authenticate", "stage: pipeline._authenticate (keys.grant)"),
    ("keys", "grant", "keys.grant (key: cache hit, or load below)"),
    ("pipeline", "_resolve", "stage: pipeline._resolve (keys.aliases)"),
    ("keys", "aliases", "keys.aliases (aliases: cache hit, or load below)"),
    ("limits", "admit", "stage: limits.admit"),
    ("pipeline", "_begin", "stage: pipeline._begin (admission, backend to its first event)"),
    ("writer", "_insert_with_retries", "usage log batches (one sync_to_async hop each)"),
    ("tail", "publish", "tail.publish (live tail, in-memory layer)"),
)
# The same for plain functions (those in threads: through sync_to_async).
SYNC = (
    ("fastpath", "resolve", "FastPath: URL resolved (a path not seen before)"),
    ("keys", "_load_grant", LOAD_GRANT),
    ("keys", "_load_aliases", LOAD_ALIASES),
    ("inserts", "insert_rows", "inserts.insert_rows (one executemany in one transaction)"),
    ("inserts", "mark_used", "inserts.mark_used (last_used_at, once a minute per key)"),
)


def instrument() -> None:
    """Wrap the library and chatparity functions whose calls and time are counted."""
    from asgiref.sync import SyncToAsync
    from django.contrib.staticfiles.handlers import ASGIStaticFilesHandler
    from django.db.backends.base.base import BaseDatabaseWrapper
    from django.db.backends.sqlite3 import base as sqlite

    from chatparity.accounting import inserts, keys, ledger, limits, record, writer
    from chatparity.backends import _http1
    from chatparity.dashboard import tail
    from chatparity.gateway import pipeline
    from chatparity.transport import fastpath

    modules = {
        "fastpath": fastpath,
        "pipeline": pipeline,
        "keys": keys,
        "limits": limits,
        "tail": tail,
        "record": record,
        "writer": writer,
        "inserts": inserts,
    }
    original_call = SyncToAsync.__call__

    async def hop(self: SyncToAsync[Any, Any], *args: Any, **kwargs: Any) -> Any:
        """Time the await, less the work done in the thread: the hop's own cost."""
        work, spent = self.func, 0.0

        def run(*args: Any, **kwargs: Any) -> Any:
            nonlocal spent
            started = time.perf_counter()
            try:
                return work(*args, **kwargs)
            finally:
                spent = time.perf_counter() - started

        self.func = run
        started = time.perf_counter()
        try:
            return await original_call(self, *args, **kwargs)
        finally:
            self.func = work
            METER.add(HOPS, time.perf_counter() - started - spent)
            METER.add(f"hop: {getattr(work, '__qualname__', type(work).__name__)}", 0)

    patch(SyncToAsync, "__call__", lambda _: hop)
    collecting: list[float] = []

    def collected(phase: str, info: dict[str, int]) -> None:
        """The garbage collector's passes, by generation (a pass holds the GIL throughout)."""
        if phase == "start":
            collecting.append(time.perf_counter())
        elif collecting:
            label = f"GC: generation {info['generation']} collections"
            METER.add(label, time.perf_counter() - collecting.pop())

    gc.callbacks.append(collected)
    patch(threading.Thread, "start", lambda f: timed("threads started", f))
    patch(
        sqlite.DatabaseWrapper,
        "get_new_connection",
        lambda f: timed("DB connect (+ PRAGMA, SQL functions)", f),
    )
    patch(BaseDatabaseWrapper, "_close", lambda f: timed("DB close (WAL checkpoint)", f))
    patch(BaseDatabaseWrapper, "_commit", lambda f: timed("DB COMMIT", f))
    patch(sqlite.SQLiteCursorWrapper, "execute", lambda f: timed(statement, f))
    patch(sqlite.SQLiteCursorWrapper, "executemany", lambda f: timed(statement, f))
    # What FastPath does not serve itself goes on to Django (the static files handler first).
    patch(ASGIStaticFilesHandler, "__call__", lambda f: atimed(DJANGO, f))
    patch(
        _http1.Endpoint, "post", lambda f: atimed("upstream: _http1.Endpoint.post (to the head)", f)
    )
    patch(
        _http1.Endpoint,
        "_connect",
        lambda f: atimed("upstream: connections opened (_http1.Endpoint._connect)", f),
    )
    patch(
        ledger.Accounting,
        "close",
        lambda f: atimed("stage: Accounting.close (after the reply: settle, log row, tail)", f),
    )
    patch(writer.LogWriter, "write", lambda f: atimed("writer.LogWriter.write (rows)", f))
    patch(record.UsageRecord, "row", lambda f: timed("record.UsageRecord.row (the log row)", f))
    patch(limits.Admission, "settle", lambda f: atimed("ratelimit Admission.settle", f))
    for module, name, label in ASYNC:
        patch(modules[module], name, functools.partial(atimed, label))
    for module, name, label in SYNC:
        patch(modules[module], name, functools.partial(timed, label))


async def call(
    application: Callable[[Message, Any, Any], Awaitable[None]], key: str, stream: bool
) -> tuple[int, float]:
    """One POST /v1/chat/completions through the ASGI app, as uvicorn makes it: the
    response's status, and when its last byte was sent (perf_counter)."""
    body = (
        '{"model":"stub","messages":[{"role":"user","content":"hi"}],"stream":%s}'
        % ("true" if stream else "false")
    ).encode()
    scope: Message = {
        "type": "http",
        "asgi": {"version": "3.0", "spec_version": "2.4"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": "/v1/chat/completions",
        "raw_path": b"/v1/chat/completions",
        "query_string": b"",
        "root_path": "",
        "headers": [
            (b"host", b"127.0.0.1"),
            (b"authorization", f"Bearer {key}".encode()),
            (b"content-type", b"application/json"),
            (b"content-length", str(len(body)).encode()),
            (b"user-agent", b"bench/anatomy"),
        ],
        "client": ("127.0.0.1", 40000),
        "server": ("127.0.0.1", 8000),
        "state": {},
    }
    sent = asyncio.Event()
    status, done = 0, 0.0
    messages = [{"type": "http.request", "body": body, "more_body": False}]

    async def receive() -> Message:
        # As uvicorn: the body, then nothing until the response is complete, then
        # http.disconnect.
        if messages:
            return messages.pop()
        await sent.wait()
        return {"type": "http.disconnect"}

    async def send(message: Message) -> None:
        nonlocal status, done
        if message["type"] == "http.response.start":
            status = message["status"]
        elif not message.get("more_body"):
            done = time.perf_counter()
            sent.set()

    await application(scope, receive, send)
    return status, done


@dataclass
class Run:
    """One workload's sequential requests: per-request wall times and the meter's totals."""

    requests: int
    seconds: float  # the whole run
    reply_ms: float  # request start to its reply's last byte sent
    return_ms: float  # request start to the application's return (log row written)
    cpu_ms: float  # this process's CPU (all threads), instrumentation included
    items: dict[str, tuple[float, float]]  # label: (count, ms) per request

    def total(self, label: str) -> float:
        """How many times ``label`` was counted in the whole run."""
        return round(self.items.get(label, (0.0, 0.0))[0] * self.requests)


async def measure(key: str, requests: int, stream: bool, concurrency: int) -> Run:
    """``requests`` calls, ``concurrency`` at a time, after a warm-up (imports, pools, caches)."""
    from project.asgi import application

    for _ in range(20):
        await asyncio.gather(*(call(application, key, stream) for _ in range(concurrency)))
    METER.reset()
    reply = returned = 0.0
    left = requests

    async def client() -> None:
        nonlocal reply, returned, left
        while left > 0:
            left -= 1
            begun = time.perf_counter()
            status, done = await call(application, key, stream)
            end = time.perf_counter()
            if status != 200:
                raise RuntimeError(f"a request failed ({status})")
            reply += done - begun
            returned += end - begun

    cpu = time.process_time()
    started = time.perf_counter()
    await asyncio.gather(*(client() for _ in range(concurrency)))
    seconds = time.perf_counter() - started
    cpu = time.process_time() - cpu
    items = {
        label: (METER.count[label] / requests, METER.seconds[label] * 1000 / requests)
        for label in sorted(METER.count, key=lambda name: -METER.seconds[name])
    }
    return Run(
        requests=requests,
        seconds=seconds,
        reply_ms=reply * 1000 / requests,
        return_ms=returned * 1000 / requests,
        cpu_ms=cpu * 1000 / requests,
        items=items,
    )


def count_cell(count: float) -> str:
    """A per-request count: ``1``, ``2.5``, ``0.00333`` (rare events stay visible)."""
    return f"{count:.3g}"


def section(results: dict[str, Run], loop: str, cache_seconds: float) -> str:
    """The markdown report: per request, count and ms of each item, per workload."""
    names = list(results)
    labels: list[str] = []
    for run in results.values():
        labels += [label for label in run.items if label not in labels]
    head = " | ".join(f"{name}: count | ms" for name in names)

    def bold(value: Callable[[Run], float]) -> str:
        return " | ".join(f" | **{value(run):.3f}**" for run in results.values())

    lines = [
        f"| per request | {head} |",
        "|---|" + "---:|---:|" * len(names),
        f"| **wall time to the reply sent** | {bold(lambda run: run.reply_ms)} |",
        "| **wall time to the application's return (log row written)** |"
        f" {bold(lambda run: run.return_ms)} |",
        f"| **CPU time of this process (instrumented)** | {bold(lambda run: run.cpu_ms)} |",
    ]
    for label in (label for label in labels if not label.startswith("hop: ")):
        cells = []
        for run in results.values():
            count, ms = run.items.get(label, (0.0, 0.0))
            cells.append(
                f"{count_cell(count)} | {ms:.3f}" if ms >= 0.0005 else f"{count_cell(count)} | "
            )
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    absent = [
        label
        for label in dict.fromkeys(WATCHED)
        if all(label not in run.items for run in results.values())
    ]
    runs = "; ".join(
        f"{name}: {run.requests} requests in {run.seconds:.2f} s" for name, run in results.items()
    )
    loads = "; ".join(
        f"{name}: {run.total(LOAD_GRANT):g} key and {run.total(LOAD_ALIASES):g} alias loads"
        f" in {run.seconds / cache_seconds:.1f} periods"
        for name, run in results.items()
    )
    lines += [
        "",
        f"Event loop: {loop}. {runs}. Keys and aliases are cached for CACHE_SECONDS"
        f" ({cache_seconds:g} s), so their database loads per request depend on the request"
        f" rate, and on how many requests find an entry expired at once. Measured: {loads}.",
    ]
    if absent:
        lines += ["", "Never called in the measured requests: " + "; ".join(absent) + "."]
    for name, run in results.items():
        hops = [
            (label[5:], run.items[label][0])
            for label in labels
            if label.startswith("hop: ") and label in run.items
        ]
        listing = ", ".join(f"{hop} x{count_cell(count)}" for hop, count in hops) or "none"
        lines += ["", f"The sync_to_async hops of one {name} request (mean): {listing}."]
    return "\n".join(lines) + "\n"


def in_process_site(prefix: str, tree: Path = harness.ROOT) -> tuple[harness.Chatparity, int, str]:
    """The example project (of ``tree``: another revision's checkout) on a fresh SQLite
    file with an alias on the stub (to be started), set up to be imported into this
    process: the site, the stub's port and URL."""
    work = Path(tempfile.mkdtemp(prefix=prefix))
    site = harness.make_chatparity(work, tree)
    stub_port = harness.free_port()
    stub_url = f"http://127.0.0.1:{stub_port}/v1"
    site.add_upstream("stub", stub_url)
    os.environ.update(site.env)
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "project.settings")
    sys.path.insert(0, str(tree))
    return site, stub_port, stub_url


def event_loop() -> tuple[Callable[[], asyncio.AbstractEventLoop], str]:
    """uvloop when installed, as uvicorn's default ``--loop auto``: its factory and name."""
    try:
        import uvloop

        return uvloop.new_event_loop, f"uvloop {uvloop.__version__}"
    except ImportError:
        return asyncio.new_event_loop, "asyncio (uvloop is not installed)"


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--requests", type=int, default=300, help="per one-at-a-time workload")
    parser.add_argument("--concurrency", type=int, default=32, help="of the concurrent workload")
    parser.add_argument(
        "--concurrent-requests",
        type=int,
        default=3000,
        help="of the concurrent workload: enough to outlast CACHE_SECONDS a few times",
    )
    args = parser.parse_args()
    workloads = (
        ("non-stream", False, 1, args.requests),
        ("stream", True, 1, args.requests),
        (
            f"non-stream, {args.concurrency} at a time",
            False,
            args.concurrency,
            args.concurrent_requests,
        ),
    )
    site, stub_port, stub_url = in_process_site("chatparity-anatomy-")
    loop_factory, loop = event_loop()
    results = {}
    with harness.serve(harness.stub_command(stub_port), f"{stub_url}/models"):
        import django

        django.setup()
        from chatparity.conf import app_settings

        instrument()
        for name, stream, concurrency, requests in workloads:
            with asyncio.Runner(loop_factory=loop_factory) as runner:
                results[name] = runner.run(measure(site.key, requests, stream, concurrency))
    print(section(results, loop, float(app_settings.CACHE_SECONDS)))


if __name__ == "__main__":
    main()
