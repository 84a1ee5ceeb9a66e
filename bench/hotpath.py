"""Profile chatparity's hot path with py-spy while wrk loads it through the stub.

    .venv/bin/python bench/hotpath.py [--duration 8] [--server uvicorn] [--workers 1]

One worker serves the ``openai`` backend pointed at the fast stub (as in
``bench/run.py``: request logging on, SQLite in a temporary file). For each
workload (non-stream and stream, concurrency 1 and 32) two py-spy samplers
watch the worker while wrk runs:

- ``gil``: only the thread holding the GIL, i.e. the Python work that one
  process serialises (what caps a worker's requests/s);
- ``busy``: every thread that is not parked in a known wait, which adds the
  work done with the GIL released (SQLite connect, query, checkpoint, fsync).

Their collapsed stacks go to ``bench/profile/`` (any flame graph tool opens
them, e.g. speedscope). ``bench/PROFILE.md`` gets the CPU used per request,
the share of samples in each stage of a request, the costliest lines
(file:line), and the in-process per-request budget of ``bench/anatomy.py``.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import harness
from harness import BENCH, log

OUT = BENCH / "profile"
WORKLOADS = ((False, 1), (False, 32), (True, 1), (True, 32))
VIEWS = {"gil": ["--gil"], "busy": ["--idle"]}

# Stages of a request, each recognised by a frame on the sampled stack (first match wins,
# in this order). py-spy names frames ``Class.method (package/module.py:line)``. DB work
# runs in sync_to_async threads whose stacks do not show the chatparity caller, so those
# stages are told apart by the Django call they make.
STAGES: tuple[tuple[str, str], ...] = (
    (
        "DB: open connection + PRAGMA (conn_max_age=0: one per request thread)",
        r"(get_new_connection|\.connect|init_connection_state|ensure_connection) \(django/db",
    ),
    (
        "DB: close connection (request_finished signal)",
        r"(close_old_connections|\.close|\._close) \(django/db",
    ),
    ("DB: INSERT RequestLog (usage.record_usage)", r"Model\.save_base \(django/"),
    ("DB: UPDATE ApiKey.last_used_at (usage.record_usage)", r"QuerySet\.update \(django/"),
    (
        "DB: SELECT key, key scopes, alias (auth, views._resolve)",
        r"(QuerySet\.(first|__iter__|_fetch_all)|Iterable\.__iter__) \(django/",
    ),
    (
        "Django middleware hooks (each one a sync_to_async hop)",
        r"Middleware\.(process_request|process_response|process_view) \(django/",
    ),
    ("Django signals (request_started/finished)", r"Signal\.(a?send|send_robust) \(django/"),
    (
        "thread hops: sync_to_async, per-request executor thread start/join, loop wake-ups",
        r"\(asgiref/|\(concurrent/futures/|\(threading\.py|_write_to_self|call_soon_threadsafe",
    ),
    ("chatparity: live tail publish (channel layer)", r"\(chatparity/tail\.py"),
    ("chatparity: rate limit admit/settle", r"\(chatparity/ratelimit\.py"),
    (
        "chatparity: openai backend incl. httpx (request, SSE parse, chunk read)",
        r"\(chatparity/backends/upstream\.py|\(chatparity/protocol/upstream\.py",
    ),
    ("chatparity: request parse/validate", r"\(chatparity/protocol/request\.py"),
    (
        "chatparity: chunk encode, accumulate, SSE frames",
        r"\(chatparity/protocol/(stream|completion)\.py",
    ),
    ("chatparity: views / usage / other", r"\(chatparity/"),
    ("Django ASGI handler, request/response objects", r"\(django/"),
    ("httpx / httpcore outside the backend (pool, connect)", r"\((httpx|httpcore|h11|anyio)/"),
    ("ASGI server (uvicorn+h11 / daphne+twisted)", r"\((uvicorn|daphne|twisted|autobahn)/"),
    ("asyncio event loop (select, callbacks)", r"\(asyncio/|\(selectors\.py"),
)


@dataclass
class Samples:
    """Aggregated py-spy samples of one view of one workload."""

    samples: int = 0  # working samples
    waiting: int = 0  # samples of waiting threads, left out
    own: Counter[str] = field(default_factory=Counter)
    packages: Counter[str] = field(default_factory=Counter)
    inclusive: Counter[str] = field(default_factory=Counter)
    stages: Counter[str] = field(default_factory=Counter)


@dataclass
class Workload:
    """One profiled wrk run and its views."""

    name: str
    requests: int
    cpu_seconds: float
    rps: float
    p50_ms: float
    views: dict[str, Samples]

    @property
    def cpu_ms_per_request(self) -> float:
        return self.cpu_seconds / self.requests * 1000 if self.requests else 0.0


# Leaves that are a thread waiting, not working: an idle executor thread, the event
# loop in epoll, a join. Samples ending in one of them are not CPU.
WAITS = re.compile(
    r"^(_worker \(concurrent/futures/thread\.py:81\)|Condition\.wait |Event\.wait |"
    r"EpollSelector\.select |_PollLikeSelector\.select |Thread\._wait_for_tstate_lock |"
    r"Connection\._recv |SimpleQueue\.get |Queue\.get |select |sleep )"
)
FRAME = re.compile(r"^(?P<function>.+) \((?P<file>[^()]+):(?P<line>\d+)\)$")


def short(frame: str) -> str:
    """``function (path/to/site-packages/pkg/mod.py:12)`` -> ``function (pkg/mod.py:12)``."""
    match = FRAME.match(frame)
    if not match:
        return frame
    path = match["file"]
    for marker in ("site-packages/", "/lib/python3.11/", str(harness.ROOT) + "/"):
        if marker in path:
            path = path.split(marker, 1)[1]
    return f"{match['function']} ({path}:{match['line']})"


def without_line(frame: str) -> str:
    return re.sub(r":\d+\)$", ")", frame)


def parse(path: Path) -> Samples:
    """Fold py-spy's collapsed stacks (``root;...;leaf count``) into Samples."""
    result = Samples()
    for line in path.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack:
            continue
        frames = [short(frame) for frame in stack.split(";")]
        frames = [f for f in frames if not f.startswith(("process ", "thread "))]
        n = int(count)
        if not frames or WAITS.match(frames[-1]):
            result.waiting += n
            continue
        result.samples += n
        result.own[frames[-1]] += n
        result.packages[package(frames[-1])] += n
        for frame in set(frames):
            result.inclusive[without_line(frame)] += n
        result.stages[stage(frames)] += n
    return result


def package(frame: str) -> str:
    """The top-level package (or stdlib module) of a frame's file."""
    match = FRAME.match(frame)
    if not match:
        return "?"
    return match["file"].split("/")[0].removesuffix(".py")


def stage(frames: list[str]) -> str:
    """The request stage a sampled stack belongs to (see STAGES)."""
    for label, pattern in STAGES:
        regex = re.compile(pattern)
        if any(regex.search(frame) for frame in frames):
            return label
    return "other (interpreter, GC, imports)"


def cpu_seconds(pids: list[int]) -> float:
    total = 0
    for pid in pids:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        total += int(fields[11]) + int(fields[12])
    return total / os.sysconf("SC_CLK_TCK")


def workers_of(pid: int) -> list[int]:
    children = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True)
    return [pid, *(int(child) for child in children.stdout.split())]


def record(
    py_spy: Path, pid: int, output: Path, seconds: int, rate: int, view: str, children: bool
) -> subprocess.Popen[bytes]:
    """A py-spy sampler of ``pid`` writing collapsed stacks to ``output``.

    Both views sample without pausing the worker. ``busy`` includes idle
    threads (py-spy's idle detection misreads threads blocked in ``queue.get``);
    :func:`parse` drops the samples that end in a wait instead.
    """
    options = f"--pid {pid} --rate {rate} --duration {seconds} --format raw --output {output}"
    command = [str(py_spy), "record", *options.split(), "--nonblocking", *VIEWS[view]]
    if children:
        command.append("--subprocesses")
    return subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def share(count: int, total: int) -> str:
    return f"{count / total:.1%}" if total else ""


def frames_table(rows: list[tuple[str, int]], total: int, limit: int) -> list[str]:
    lines = ["| share | frame |", "|---:|---|"]
    lines += [f"| {share(count, total)} | `{frame}` |" for frame, count in rows[:limit]]
    return lines


def workload_section(w: Workload) -> list[str]:
    gil, busy = w.views["gil"], w.views["busy"]
    out = [
        "",
        f"## {w.name}",
        "",
        f"{w.rps:.0f} req/s, p50 {w.p50_ms:.1f} ms, worker CPU {w.cpu_ms_per_request:.1f} ms"
        f" per request; {gil.samples} GIL samples, {busy.samples} busy-thread samples.",
        "",
        "| stage (a sample counts once, in the first stage it matches) | GIL | busy |",
        "|---|---:|---:|",
    ]
    for label, _ in STAGES:
        if gil.stages[label] or busy.stages[label]:
            out.append(
                f"| {label} | {share(gil.stages[label], gil.samples)} |"
                f" {share(busy.stages[label], busy.samples)} |"
            )
    rest = "other (interpreter, GC, imports)"
    out.append(
        f"| {rest} | {share(gil.stages[rest], gil.samples)} |"
        f" {share(busy.stages[rest], busy.samples)} |"
    )
    out += [
        "",
        "Own time by package (GIL): "
        + ", ".join(
            f"{name} {share(count, gil.samples)}" for name, count in gil.packages.most_common(8)
        )
        + ".",
    ]
    out += ["", "Costliest lines, GIL view:", ""]
    out += frames_table(gil.own.most_common(), gil.samples, 12)
    out += ["", "Costliest lines, busy-thread view:", ""]
    out += frames_table(busy.own.most_common(), busy.samples, 8)
    ours = [
        (frame, count)
        for frame, count in gil.inclusive.most_common()
        if re.search(r"\((chatparity|django/db|django/core/handlers|asgiref)/", frame)
    ]
    out += ["", "Inclusive time (GIL view) of chatparity, Django handler/DB and asgiref:", ""]
    out += frames_table(ours, gil.samples, 15)
    return out


def report(workloads: list[Workload], anatomy: str, server: str, workers: int, seconds: int) -> str:
    out = [
        "# chatparity hot path profile",
        "",
        f"Produced by `.venv/bin/python bench/hotpath.py`: {server}, {workers} worker(s), the"
        " `openai` backend to the fast stub, request logging on, SQLite in a temporary file,"
        f" {seconds} s of wrk per workload. Two py-spy views of the same run: **GIL** (the"
        " thread holding the GIL: the Python work one process serialises) and **busy** (every"
        " thread not parked in a wait: adds what runs with the GIL released, mostly SQLite)."
        " Raw collapsed stacks: `bench/profile/`.",
        "",
        "| workload | req/s (profiled) | p50 ms | worker CPU per request |",
        "|---|---:|---:|---:|",
    ]
    for w in workloads:
        out.append(f"| {w.name} | {w.rps:.0f} | {w.p50_ms:.1f} | {w.cpu_ms_per_request:.1f} ms |")
    out += [
        "",
        "## One request, counted (in-process, one at a time)",
        "",
        "`bench/anatomy.py` calls the ASGI application directly (no HTTP server) and wraps"
        " library functions to count and time them. Stage rows include the rows below them.",
        "",
        anatomy.strip(),
    ]
    for w in workloads:
        out += workload_section(w)
    return "\n".join(out) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--duration", type=int, default=8, help="profiled seconds per workload")
    parser.add_argument("--rate", type=int, default=200, help="py-spy samples per second")
    parser.add_argument("--server", choices=("uvicorn", "daphne"), default="uvicorn")
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--out", type=Path, default=BENCH / "PROFILE.md")
    args = parser.parse_args()

    harness.ensure_wrk()
    py_spy = harness.ensure_tools().parent / "py-spy"
    harness.raise_file_limit()
    log("Counting one request in-process (bench/anatomy.py)...")
    anatomy = subprocess.run(
        [sys.executable, str(BENCH / "anatomy.py")], capture_output=True, text=True, check=True
    ).stdout
    work = Path(tempfile.mkdtemp(prefix="chatparity-profile-"))
    site = harness.make_chatparity(work)
    stub_port, port = harness.free_port(), harness.free_port()
    stub_url = f"http://127.0.0.1:{stub_port}/v1"
    url = f"http://127.0.0.1:{port}/v1"
    site.add_upstream("stub", stub_url)
    OUT.mkdir(exist_ok=True)
    auth = {"Authorization": f"Bearer {site.key}"}
    command = harness.chatparity_command(args.server, port, args.workers)
    workloads = []
    with (
        harness.serve(harness.stub_command(stub_port), f"{stub_url}/models"),
        harness.serve(command, f"{url}/models", auth, site.env, work / "server.log") as server,
    ):
        pids = workers_of(server.pid)
        for stream, concurrency in WORKLOADS:
            name = f"{'stream' if stream else 'non-stream'}, concurrency {concurrency}"
            slug = f"{'stream' if stream else 'json'}-c{concurrency}"
            common = {"stream": stream, "concurrency": concurrency, "work": work}
            harness.wrk(url, site.key, "stub", seconds=1, agent="profile/warm-up", **common)  # type: ignore[arg-type]
            spies = {
                view: record(
                    py_spy,
                    server.pid,
                    OUT / f"{slug}-{view}.txt",
                    args.duration,
                    args.rate,
                    view,
                    args.workers > 1,
                )
                for view in VIEWS
            }
            time.sleep(0.5)  # the samplers attached
            before = cpu_seconds(pids)
            summary = harness.wrk(
                url,
                site.key,
                "stub",
                seconds=args.duration,
                agent="profile",
                **common,  # type: ignore[arg-type]
            )
            used = cpu_seconds(pids) - before
            for spy in spies.values():
                spy.wait()
            workload = Workload(
                name=name,
                requests=int(summary["requests"]),
                cpu_seconds=used,
                rps=summary["requests"] / summary["seconds"],
                p50_ms=summary["p50_us"] / 1000,
                views={view: parse(OUT / f"{slug}-{view}.txt") for view in VIEWS},
            )
            workloads.append(workload)
            log(
                f"  {name}: {workload.rps:.0f} req/s, {workload.cpu_ms_per_request:.1f} ms CPU"
                " per request"
            )
    args.out.write_text(report(workloads, anatomy, args.server, args.workers, args.duration))
    log(f"Wrote {args.out} and {OUT}/")


if __name__ == "__main__":
    main()
