"""Memory per open stream: many concurrent slow streams through one gateway worker.

The stub (``--hold``) keeps every stream open, trickling a chunk a second,
until it is released. The client opens ``count`` streams (at most ``ramp``
being set up at once, so the listen backlog never overflows), waits until
every one has received data, samples the worker's RSS, releases the stub and
checks that every stream ended with HTTP 200, all its chunks, no error frame
and ``[DONE]``.
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass, field

import httpx
from harness import rss_kib, thread_count

MARKERS = (b"data: ", b"data: [DONE]", b'{"error"')


@dataclass
class Stream:
    """What one client stream saw."""

    status: bytes = b""
    opened: bool = False
    done: bool = False
    error: bool = False
    failure: str = ""


@dataclass
class Report:
    count: int
    opened: int
    completed: int
    seconds_to_open: float
    rss_before_kib: int
    rss_open_kib: int
    threads_before: int
    threads_open: int
    failures: dict[str, int] = field(default_factory=dict)

    @property
    def dropped(self) -> int:
        return self.count - self.completed

    @property
    def kib_per_stream(self) -> float:
        return (self.rss_open_kib - self.rss_before_kib) / self.count


async def _one(
    host: str, port: int, request: bytes, stream: Stream, ramp: asyncio.Semaphore
) -> None:
    """Open one stream and read it to its end (the server closes the connection)."""
    await ramp.acquire()
    try:
        reader, writer = await asyncio.open_connection(host, port)
        writer.write(request)
        await writer.drain()
        tail = b""
        while data := await reader.read(65536):
            window = tail + data
            if not stream.status:
                stream.status = window.split(b"\r\n", 1)[0]
            if not stream.opened and MARKERS[0] in window:
                stream.opened = True
                ramp.release()
            stream.done = stream.done or MARKERS[1] in window
            stream.error = stream.error or MARKERS[2] in window
            tail = window[-32:]
        writer.close()
    except (OSError, asyncio.IncompleteReadError) as exc:
        stream.failure = type(exc).__name__
    finally:
        if not stream.opened:
            ramp.release()


def _request(host: str, port: int, key: str, model: str) -> bytes:
    body = json.dumps(
        {"model": model, "messages": [{"role": "user", "content": "hi"}], "stream": True}
    ).encode()
    head = (
        f"POST /v1/chat/completions HTTP/1.1\r\nHost: {host}:{port}\r\n"
        f"Authorization: Bearer {key}\r\nContent-Type: application/json\r\n"
        f"User-Agent: bench/slow-streams\r\nContent-Length: {len(body)}\r\n"
        "Connection: close\r\n\r\n"
    )
    return head.encode() + body


async def warm_up(url: str, key: str, model: str, rounds: int = 3, width: int = 32) -> None:
    """Serve some fast requests first, so imports and pools are in place before measuring."""
    headers = {"Authorization": f"Bearer {key}"}
    async with httpx.AsyncClient(timeout=60, headers=headers) as client:
        for _ in range(rounds):
            await asyncio.gather(
                *(
                    client.post(
                        f"{url}/chat/completions",
                        json={
                            "model": model,
                            "messages": [{"role": "user", "content": "hi"}],
                            "stream": index % 2 == 0,
                        },
                    )
                    for index in range(width)
                )
            )


async def run(
    url: str,
    key: str,
    model: str,
    *,
    count: int,
    release_url: str,
    pid: int,
    ramp: int = 64,
    open_timeout: float = 300,
    finish_timeout: float = 60,
) -> Report:
    """Open ``count`` held streams through the gateway at ``url``; measure; release."""
    parsed = httpx.URL(url)
    host, port = parsed.host, parsed.port or 80
    request = _request(host, port, key, model)
    streams = [Stream() for _ in range(count)]
    gate = asyncio.Semaphore(ramp)
    await asyncio.sleep(1)
    before, threads_before = rss_kib(pid), thread_count(pid)
    started = time.monotonic()
    tasks = [asyncio.create_task(_one(host, port, request, s, gate)) for s in streams]
    while time.monotonic() - started < open_timeout:
        if all(s.opened or s.failure for s in streams):
            break
        await asyncio.sleep(0.2)
    opened_in = time.monotonic() - started
    await asyncio.sleep(3)  # a few trickled chunks go through every stream
    samples, threads = [], []
    for _ in range(5):
        samples.append(rss_kib(pid))
        threads.append(thread_count(pid))
        await asyncio.sleep(0.4)
    opened = sum(1 for s in streams if s.opened and not s.failure)
    async with httpx.AsyncClient() as client:
        await client.post(release_url)
    _, pending = await asyncio.wait(tasks, timeout=finish_timeout)
    for task in pending:
        task.cancel()
    await asyncio.gather(*pending, return_exceptions=True)
    failures: dict[str, int] = {}
    for s in streams:
        reason = s.failure or (
            "not 200"
            if not s.status.endswith(b" 200 OK")
            else "error frame"
            if s.error
            else "no [DONE]"
            if not s.done
            else ""
        )
        if reason:
            failures[reason] = failures.get(reason, 0) + 1
    return Report(
        count=count,
        opened=opened,
        completed=count - sum(failures.values()),
        seconds_to_open=opened_in,
        rss_before_kib=before,
        rss_open_kib=max(samples),
        threads_before=threads_before,
        threads_open=max(threads),
        failures=failures,
    )


def measure_held(url: str, key: str, control: str, *, count: int, pid: int) -> Report:
    """Hold the stub's streams (``control``: its ``/bench`` URL), warm the gateway at
    ``url`` up, then :func:`run` ``count`` held streams through it."""
    httpx.post(f"{control}/hold")
    asyncio.run(warm_up(url, key, "stub"))
    return asyncio.run(
        run(url, key, "slow", count=count, release_url=f"{control}/release", pid=pid)
    )
