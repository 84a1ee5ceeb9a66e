"""Where one chatparity request's time goes: an in-process, instrumented count.

    .venv/bin/python bench/anatomy.py [--requests 300]

Calls the example project's ASGI application directly (no HTTP server) with
requests to an ``openai`` backend pointed at the fast stub, one at a time,
request logging on, SQLite in a temporary file. This process only wraps
library functions to count and time them; nothing in chatparity changes. Per
request it reports: wall time; sync_to_async thread hops; threads started;
database connections opened and closed and the time they took; each SQL
statement and its time. Prints a markdown section (``bench/PROFILE.md`` takes it).
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import os
import re
import sys
import tempfile
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Awaitable, Callable
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


def timed(label: str | Callable[..., str], function: Callable[..., Any]) -> Callable[..., Any]:
    """``function``, counted and timed under ``label`` (or ``label(*args)``)."""

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
    """``SQL: SELECT chatparity_apikey`` from a statement's text."""
    verb = sql.split(None, 1)[0].upper()
    table = re.search(r'(?:FROM|INTO|UPDATE)\s+"?(\w+)"?', sql, re.IGNORECASE)
    return f"SQL {verb} {table.group(1) if table else ''}".rstrip()


def instrument() -> None:
    """Wrap the library functions whose calls and time are counted."""
    import httpx
    from asgiref.sync import SyncToAsync
    from django.db.backends.base.base import BaseDatabaseWrapper
    from django.db.backends.sqlite3 import base as sqlite

    from chatparity import ratelimit, views

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
    patch(threading.Thread, "start", lambda f: timed("threads started", f))
    patch(
        sqlite.DatabaseWrapper,
        "get_new_connection",
        lambda f: timed("DB connect (+ PRAGMA, SQL functions)", f),
    )
    patch(BaseDatabaseWrapper, "_close", lambda f: timed("DB close (WAL checkpoint)", f))
    patch(sqlite.SQLiteCursorWrapper, "execute", lambda f: timed(statement, f))
    patch(httpx.AsyncClient, "__init__", lambda f: timed("httpx AsyncClient created", f))
    patch(httpx.AsyncClient, "send", lambda f: atimed("upstream: httpx send (to headers)", f))
    patch(asyncio.BaseEventLoop, "create_connection", lambda f: atimed("TCP connections opened", f))
    # Stages of the view (inclusive of the DB work and hops above).
    for name, label in STAGES.items():
        patch(views, name, functools.partial(atimed, label))
    patch(ratelimit, "admit", lambda f: atimed("stage: ratelimit.admit", f))


HOPS = "sync_to_async hops (own cost: await minus work)"
STAGES = {
    "authenticate": "stage: auth.authenticate (key lookup)",
    "_resolve": "stage: views._resolve (scopes + alias)",
    "record_usage": "stage: usage.record_usage (log row, settle, tail, last_used_at)",
}


async def call(
    application: Callable[[Message, Any, Any], Awaitable[None]], key: str, stream: bool
) -> int:
    """One POST /v1/chat/completions through the ASGI app; the response's status."""
    body = (
        '{"model":"stub","messages":[{"role":"user","content":"hi"}],"stream":%s}'
        % ("true" if stream else "false")
    ).encode()
    scope: Message = {
        "type": "http",
        "asgi": {"version": "3.0"},
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
    }
    sent = asyncio.Event()
    status = 0
    messages = [{"type": "http.request", "body": body, "more_body": False}]

    async def receive() -> Message:
        if messages:
            return messages.pop()
        await sent.wait()
        return {"type": "http.disconnect"}

    async def send(message: Message) -> None:
        nonlocal status
        if message["type"] == "http.response.start":
            status = message["status"]
        elif not message.get("more_body"):
            sent.set()

    await application(scope, receive, send)
    return status


async def measure(key: str, requests: int, stream: bool) -> tuple[float, Meter]:
    """Mean wall ms per request, and the meter's totals, over ``requests`` sequential calls."""
    from project.asgi import application

    for _ in range(20):  # warm-up: imports, pools, the backend instance
        await call(application, key, stream)
    METER.reset()
    started = time.perf_counter()
    for _ in range(requests):
        if await call(application, key, stream) != 200:
            raise RuntimeError("a request failed")
    return (time.perf_counter() - started) / requests * 1000, METER


def section(results: dict[str, tuple[float, dict[str, tuple[float, float]]]]) -> str:
    """The markdown report: per request, count and ms of each item, per workload."""
    names = list(results)
    labels: list[str] = []
    for _, items in results.values():
        labels += [label for label in items if label not in labels]
    head = " | ".join(f"{name}: count | ms" for name in names)
    lines = [
        f"| per request | {head} |",
        "|---|" + "---:|---:|" * len(names),
        "| **wall time, in-process** | "
        + " | ".join(f" | **{wall:.2f}**" for wall, _ in results.values())
        + " |",
    ]
    hops = [label for label in labels if label.startswith("hop: ")]
    for label in (label for label in labels if not label.startswith("hop: ")):
        cells = []
        for _, items in results.values():
            count, ms = items.get(label, (0.0, 0.0))
            cells.append(f"{count:.1f} | {ms:.2f}" if ms >= 0.005 else f"{count:.1f} | ")
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    first = next(iter(results.values()))[1]
    listing = ", ".join(f"{label[5:]} x{first[label][0]:g}" for label in hops if label in first)
    lines += ["", f"The sync_to_async hops of one {names[0]} request: {listing}."]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--requests", type=int, default=300)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="chatparity-anatomy-"))
    site = harness.make_chatparity(work)
    stub_port = harness.free_port()
    stub_url = f"http://127.0.0.1:{stub_port}/v1"
    site.add_upstream("stub", stub_url)
    os.environ.update(site.env)
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "project.settings")
    sys.path.insert(0, str(harness.ROOT))
    results = {}
    with harness.serve(harness.stub_command(stub_port), f"{stub_url}/models"):
        import django

        django.setup()
        instrument()
        for stream in (False, True):
            wall, meter = asyncio.run(measure(site.key, args.requests, stream))
            items = {
                label: (
                    meter.count[label] / args.requests,
                    meter.seconds[label] * 1000 / args.requests,
                )
                for label in sorted(meter.count, key=lambda name: -meter.seconds[name])
            }
            results["stream" if stream else "non-stream"] = (wall, items)
    print(section(results))


if __name__ == "__main__":
    main()
