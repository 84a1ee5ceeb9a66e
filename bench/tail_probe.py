"""The example project's ASGI application with a probe of what runs in the tail
(bench variant only; ``bench/tail.py`` serves it)::

    python -m uvicorn tail_probe:application --app-dir bench --lifespan off

On the worker's event loop, a timer due every :data:`PERIOD` seconds notes how late
it ran; for each stretch between two ticks it reads how the loop's thread spent it
(on a CPU, runnable but waiting for one, or neither: blocked, which on an event
loop is waiting for the GIL), how much CPU the worker's other threads used, and the
garbage collector's pauses (``gc.callbacks``). Each ``/v1`` request's time from the
ASGI call to its last byte handed to the server is noted, and so is each batch of
the log writer. ``GET /bench/probe`` answers all of it as JSON and starts afresh.
"""

from __future__ import annotations

import asyncio
import gc
import os
import sys
import threading
import time
import types as types_
from collections import Counter
from typing import Any

import orjson

from project.asgi import application as site  # sets Django up

# isort: split
from chatparity.accounting import writer

PERIOD = 0.002
"""Seconds between two ticks."""
LATE = 0.002
"""A tick this late is a stall, described in full."""

clock = time.perf_counter


def _thread_times(fd: int) -> tuple[float, float]:
    """A thread's CPU seconds and seconds runnable but not running, from its schedstat."""
    running, waiting, _ = os.pread(fd, 64, 0).split()
    return int(running) / 1e9, int(waiting) / 1e9


class Probe:
    """What the event loop's thread, the other threads and the collector did."""

    def __init__(self) -> None:
        self.loop: asyncio.AbstractEventLoop | None = None
        self._due = 0.0
        self.loop_thread = 0
        self._schedstat = -1
        self._others: dict[int, int] = {}  # native id -> CPU clock
        self.reset()
        gc.callbacks.append(self._gc)

    def reset(self) -> None:
        self.started = clock()
        self.ticks = 0
        self.lateness: list[float] = []  # of every tick, seconds
        self.stalls: list[dict[str, float]] = []
        self.requests: list[tuple[float, float, bool]] = []  # start, end, stream
        self.batches: list[tuple[float, float, int]] = []  # start, end, rows
        self.gc_pauses: list[tuple[float, float, int, bool]] = []  # start, end, gen, loop's
        self.gc_full_objects: list[int] = []  # objects tracked when a full collection began
        self._gc_started = self._gc_cpu_started = 0.0
        self._gc_in_window = 0.0
        self.gc_cpu = 0.0  # CPU seconds the collector's pauses took

    def start(self) -> None:
        """Begin ticking on the running loop (once)."""
        if self.loop is not None:
            return
        self.loop = asyncio.get_running_loop()
        self.loop_thread = threading.get_ident()
        self._schedstat = os.open(f"/proc/self/task/{threading.get_native_id()}/schedstat", 0)
        self._window = self._sample()
        self._due = clock() + PERIOD
        self.loop.call_later(PERIOD, self._tick)

    def _sample(self) -> tuple[float, float, float, float]:
        """Now, the loop thread's CPU and run-queue seconds, the other threads' CPU."""
        if len(self._others) != threading.active_count() - 1:
            self._others = {
                thread.native_id: time.pthread_getcpuclockid(thread.ident)
                for thread in threading.enumerate()
                if thread.ident != self.loop_thread and thread.ident and thread.native_id
            }
        others = 0.0
        for cpu_clock in self._others.values():
            try:
                others += time.clock_gettime(cpu_clock)
            except OSError:  # the thread ended
                self._others = {}
        running, waiting = _thread_times(self._schedstat)
        return clock(), running, waiting, others

    def _tick(self) -> None:
        sample = self._sample()
        now = sample[0]
        late = now - self._due
        self.ticks += 1
        self.lateness.append(late)
        previous = self._window
        if late >= LATE:
            wall = now - previous[0]
            self.stalls.append(
                {
                    "end": now,
                    "wall": wall,
                    "late": late,
                    "loop_cpu": sample[1] - previous[1],
                    "loop_runqueue": sample[2] - previous[2],
                    "others_cpu": max(0.0, sample[3] - previous[3]),
                    "gc": self._gc_in_window,
                }
            )
        self._gc_in_window = 0.0
        self._window = sample
        self._due = now + PERIOD
        assert self.loop is not None
        self.loop.call_later(PERIOD, self._tick)

    def _gc(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            if info["generation"] == 2:
                self.gc_full_objects.append(len(gc.get_objects()))
            self._gc_started = clock()
            self._gc_cpu_started = time.thread_time()
            return
        end = clock()
        on_loop = threading.get_ident() == self.loop_thread
        self.gc_pauses.append((self._gc_started, end, info["generation"], on_loop))
        self.gc_cpu += time.thread_time() - self._gc_cpu_started
        if on_loop:
            self._gc_in_window += end - self._gc_started

    def report(self) -> dict[str, Any]:
        return {
            "seconds": clock() - self.started,
            "period": PERIOD,
            "ticks": self.ticks,
            "lateness": self.lateness,
            "stalls": self.stalls,
            "requests": self.requests,
            "batches": self.batches,
            "gc_pauses": self.gc_pauses,
            "gc_full_objects": self.gc_full_objects,
            "gc_cpu": self.gc_cpu,
            "cpu": time.process_time(),
            "gc_thresholds": gc.get_threshold(),
            "gc_frozen": gc.get_freeze_count(),
            "gc_counts": gc.get_count(),
            "switch_interval": sys.getswitchinterval(),
            "heap": _heap(),
        }


def _heap() -> dict[str, Any]:
    """Objects the collector tracks, per generation, and the commonest types of the
    oldest (which a full collection scans; frozen ones are not in it)."""
    oldest = gc.get_objects(2)
    types = Counter(type(thing).__qualname__ for thing in oldest)
    modules = Counter(
        thing.__name__.split(".")[0] for thing in oldest if isinstance(thing, types_.ModuleType)
    )
    return {
        "generations": [len(gc.get_objects(generation)) for generation in range(3)],
        "oldest types": types.most_common(25),
        "modules not frozen": modules.most_common(),
    }


probe = Probe()

# Variants to compare (bench/tail.py --variant): the collector's thresholds, and the
# URLconf loaded (and frozen) before the first request instead of by it.
if os.environ.get("BENCH_GC_THRESHOLD"):
    gc.set_threshold(*map(int, os.environ["BENCH_GC_THRESHOLD"].split("/")))
if os.environ.get("BENCH_URLCONF_AT_START"):
    from django.urls import get_resolver

    get_resolver().url_patterns  # noqa: B018 (imports the URLconf)
    gc.freeze()

_save = writer.LogWriter.save


async def _timed_save(self: writer.LogWriter, rows: list[Any]) -> None:
    started = clock()
    try:
        await _save(self, rows)
    finally:
        probe.batches.append((started, clock(), len(rows)))


writer.LogWriter.save = _timed_save  # type: ignore[method-assign]


async def application(scope: dict[str, Any], receive: Any, send: Any) -> None:
    probe.start()
    if scope["type"] != "http" or not scope["path"].startswith(("/v1/", "/bench/probe")):
        await site(scope, receive, send)
        return
    if scope["path"] == "/bench/probe":
        body = orjson.dumps(probe.report())
        probe.reset()
        headers = [(b"content-type", b"application/json")]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": body})
        return
    started = clock()
    streamed = False

    async def timed_send(message: dict[str, Any]) -> None:
        nonlocal streamed
        await send(message)
        if message["type"] == "http.response.body":
            if message.get("more_body"):
                streamed = True
            else:
                probe.requests.append((started, clock(), streamed))

    await site(scope, receive, timed_send)
