"""Profile chatparity's hot path with py-spy while wrk loads it through the stub.

    .venv/bin/python bench/hotpath.py [--duration 8] [--server uvicorn] [--workers 1]

One worker serves the ``openai`` backend pointed at the fast stub (as in
``bench/run.py``: request logging on, SQLite in a temporary file). For each
workload (non-stream and stream, concurrency 1 and 32) two py-spy samplers
watch the worker while wrk runs:

- ``gil``: only the thread holding the GIL, i.e. the Python work that one
  process serialises (what caps a worker's requests/s);
- ``busy``: every thread that is not parked in a known wait, which adds the
  work done with the GIL released (SQLite query, commit, fsync) and the time
  threads wait to take the GIL back. uvloop waits in epoll with no Python frame
  on the stack, as it does its own work: the loop thread's samples with no
  frame past the loop's entry are left out of this view (the ``gil`` view
  counts them: there they are uvloop's own work).

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

# Stages of a request, each recognised by a frame on the sampled stack. py-spy names
# frames ``Class.method (package/module.py:line)``. The stack is first cut below the
# event loop's entry (see ROOT), then:
#
# 1. PRIORITY stages, first match wins, in this order, whatever the frame's depth: the
#    database work (told apart by the chatparity function the sync_to_async thread runs,
#    or by the Django call that opens or closes a connection), Django's request handler
#    (only requests outside /v1 reach it; its signals are not told apart from the model
#    signals every ``Model.__init__`` sends), and the thread hops;
# 2. else, when the innermost frame of the server, chatparity, Django, asgiref or
#    channels is the server's, the ASGI server (uvicorn's protocol, its transport writes
#    in ``RequestResponseCycle.send``): chatparity calls it to send, and it calls
#    chatparity's FastPath, so only the innermost of them says who is working;
# 3. else the OWNER stages, first match wins, in this order: a part of chatparity (the
#    more specific first), then Django, then asyncio;
# 4. else, for a stack with no frame past the loop's entry (uvloop is Cython: its own
#    work shows no Python frame), the event loop's internals.
PRIORITY: tuple[tuple[str, str], ...] = (
    (
        "DB: open connection + PRAGMA (once per thread, again after a broken one)",
        r"(get_new_connection|\.connect|init_connection_state) \(django/db",
    ),
    (
        "DB: close connection (Django's request_finished, a broken connection)",
        r"(close_old_connections|BaseDatabaseWrapper\._?close|DatabaseWrapper\.close) \(django/db",
    ),
    (
        "DB: INSERT RequestLog batch and rollups (inserts.insert_rows: executemany, BEGIN, COMMIT)",
        r"insert_rows \(chatparity/accounting/inserts\.py",
    ),
    (
        "DB: UPDATE ApiKey.last_used_at (inserts.mark_used, once a minute per key)",
        r"mark_used \(chatparity/accounting/inserts\.py",
    ),
    (
        "DB: SELECT key, aliases on a cache miss (keys: loads on a cache miss)",
        r"_load\w* \(chatparity/accounting/keys\.py",
    ),
    (
        "DB: other statements (budgets, Django views)",
        r"((SQL\w*Compiler)\.execute_sql|CursorWrapper\.execute) \(django/",
    ),
    (
        "Django request handler and middleware (requests outside /v1 only)",
        r"\(django/core/handlers/|Middleware\.\w+ \(django/",
    ),
    (
        "thread hops: sync_to_async (log batches, cache misses), executor, loop wake-ups",
        r"\(asgiref/|\(concurrent/futures/|\(threading\.py|_write_to_self|call_soon_threadsafe",
    ),
)
SERVER = (
    "ASGI server (uvicorn: httptools protocol, transport writes; daphne+twisted)",
    r"\((uvicorn|httptools|uvloop|daphne|twisted|autobahn)/",
)
# The packages whose innermost frame decides between the server and the owner stages.
OWNERS = re.compile(
    r"\((uvicorn|httptools|uvloop|daphne|twisted|autobahn|chatparity|django|asgiref|channels)/"
)
OWNER: tuple[tuple[str, str], ...] = (
    ("chatparity: live tail publish (channel layer)", r"\(chatparity/dashboard/tail\.py"),
    ("chatparity: rate limit admit/settle, cost", r"\(chatparity/accounting/limits\.py"),
    ("chatparity: settings reads (conf.AppSettings.__getattr__)", r"\(chatparity/conf\.py"),
    (
        "chatparity: HTTP/1.1 client to the upstream (backends/_http1.py)",
        r"\(chatparity/backends/_http1\.py",
    ),
    (
        "chatparity: openai backend, SSE to events (backends/upstream.py, protocol/upstream.py)",
        r"\(chatparity/backends/upstream\.py|\(chatparity/protocol/upstream\.py",
    ),
    ("chatparity: request parse/validate", r"\(chatparity/protocol/request\.py"),
    (
        "chatparity: chunk encode, accumulate, SSE frames",
        r"\(chatparity/protocol/(stream|completion)\.py",
    ),
    (
        "chatparity: log row and batching (record.py, writer.py, batching.py, journal.py)",
        r"\(chatparity/accounting/(record|writer|batching|journal|inserts|rollups)\.py",
    ),
    (
        "chatparity: key and alias cache hits (accounting/keys.py, gateway/auth.py)",
        r"\(chatparity/(accounting/keys|gateway/auth)\.py",
    ),
    (
        "chatparity: endpoint (gateway/*.py: pipeline, wires; accounting/ledger.py)",
        r"\(chatparity/(gateway/\w+|accounting/ledger)\.py",
    ),
    (
        "chatparity: ASGI fast path (transport/fastpath.py: route, headers, body, send)",
        r"\(chatparity/transport/fastpath\.py",
    ),
    ("chatparity: other", r"\(chatparity/"),
    ("Django: other (ORM objects, URL resolver, settings)", r"\(django/"),
    (
        "asyncio (tasks, futures, timeouts; the loop itself without uvloop)",
        r"\(asyncio/|\(selectors\.py",
    ),
)
LOOP = "event loop internals (uvloop: Cython, no Python frame)"
OTHER = "other (interpreter, GC, imports)"
STAGES: tuple[tuple[str, str], ...] = (*PRIORITY, SERVER, *OWNER, (LOOP, ""))
COMPILED = {label: re.compile(pattern) for label, pattern in STAGES if pattern}

# Where a thread's stack enters the event loop: the frames up to it (uvicorn's start-up,
# asyncio.run) are on every sample of the loop's thread and say nothing of the work.
ROOT = re.compile(r"^(Runner\.run|run) \(asyncio/runners\.py")


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
    r"Connection\._recv |SimpleQueue\.get |Queue\.get |select |sleep |"
    # The journal's thread between two notes of progress (time.sleep: no frame of its own).
    r"Journal\._note_progress )"
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


def parse(path: Path, view: str) -> Samples:
    """Fold py-spy's collapsed stacks (``root;...;leaf count``) into Samples.

    A stack of the loop's thread with no frame past the loop's entry is uvloop's own
    Cython work in the ``gil`` view (the thread holds the GIL), but in the ``busy`` view
    it is mostly uvloop waiting in epoll, which cannot be told apart: left out there.
    """
    result = Samples()
    for line in path.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack:
            continue
        frames = [short(frame) for frame in stack.split(";")]
        frames = [f for f in frames if not f.startswith(("process ", "thread "))]
        n = int(count)
        work = below_root(frames)
        if not frames or WAITS.match(frames[-1]) or (view == "busy" and work == []):
            result.waiting += n
            continue
        result.samples += n
        result.own[frames[-1]] += n
        result.packages[LOOP_PACKAGE if work == [] else package(frames[-1])] += n
        for frame in set(frames):
            result.inclusive[without_line(frame)] += n
        result.stages[stage(frames if work is None else work)] += n
    return result


LOOP_PACKAGE = "event loop (no Python frame)"


def below_root(frames: list[str]) -> list[str] | None:
    """The frames past the event loop's entry (see ROOT), or None if it is not there
    (a thread other than the loop's)."""
    for index in range(len(frames) - 1, -1, -1):
        if ROOT.match(frames[index]):
            return frames[index + 1 :]
    return None


def package(frame: str) -> str:
    """The top-level package (or stdlib module) of a frame's file."""
    match = FRAME.match(frame)
    if not match:
        return "?"
    return match["file"].split("/")[0].removesuffix(".py")


def stage(frames: list[str]) -> str:
    """The request stage a sampled stack belongs to (see PRIORITY, SERVER and OWNER)."""
    if not frames:
        return LOOP
    for label, _ in PRIORITY:
        if any(COMPILED[label].search(frame) for frame in frames):
            return label
    innermost = next((frame for frame in reversed(frames) if OWNERS.search(frame)), "")
    if COMPILED[SERVER[0]].search(innermost):
        return SERVER[0]
    for label, _ in OWNER:
        if any(COMPILED[label].search(frame) for frame in frames):
            return label
    return OTHER


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
        "| stage (a sample counts once: the rules are in `bench/hotpath.py`) | GIL | busy |",
        "|---|---:|---:|",
    ]
    for label, _ in STAGES:
        if gil.stages[label] or busy.stages[label]:
            out.append(
                f"| {label} | {share(gil.stages[label], gil.samples)} |"
                f" {share(busy.stages[label], busy.samples)} |"
            )
    out.append(
        f"| {OTHER} | {share(gil.stages[OTHER], gil.samples)} |"
        f" {share(busy.stages[OTHER], busy.samples)} |"
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
        if re.search(r"\((chatparity|django/db|asgiref)/", frame)
    ]
    out += ["", "Inclusive time (GIL view) of chatparity, Django's ORM and asgiref:", ""]
    out += frames_table(ours, gil.samples, 15)
    return out


# The profile before the /v1 fast path, as bench/PROFILE.md recorded it at commit 0720710
# (same script, uvicorn, 1 worker; on asyncio and h11, as installed then): Django's views
# behind its ASGI handler and middleware, httpx to the upstream, a database query per
# request for the key and the alias, the log row written on the request's path.
# Workload: (req/s, worker CPU ms per request).
BEFORE = {
    "non-stream, concurrency 1": (50, 18.8),
    "non-stream, concurrency 32": (50, 18.9),
    "stream, concurrency 1": (45, 20.4),
    "stream, concurrency 32": (52, 18.4),
}


def before_and_after(workloads: list[Workload]) -> list[str]:
    out = [
        "",
        "## Before and after the /v1 fast path",
        "",
        "Before (this document at commit 0720710, measured the same way): Django's views"
        " behind its ASGI handler and middleware, httpx to the upstream, a database query"
        " per request for the key and the alias, the log row written on the request's path,"
        " uvicorn on asyncio and h11: about 50 req/s and 19 ms of worker CPU per request in"
        " every workload. Now: `chatparity.asgi.FastPath` serves /v1 on the event loop, keys"
        " and aliases are cached in process, log rows are written in batches after the reply,"
        " the upstream is reached by `chatparity.backends._http1`, uvicorn runs on uvloop and"
        " httptools.",
        "",
        "| workload | req/s before | req/s now | worker CPU per request before | now |",
        "|---|---:|---:|---:|---:|",
    ]
    for w in workloads:
        rps, cpu = BEFORE.get(w.name, (0, 0.0))
        then = f"| {rps} | {w.rps:.0f} ({w.rps / rps:.0f}x) | {cpu} ms" if rps else "| ? | ? | ?"
        out.append(f"| {w.name} {then} | {w.cpu_ms_per_request:.2f} ms |")
    return out


def summary_table(workloads: list[Workload]) -> list[str]:
    """Each workload's CPU per request and its stages' shares of the GIL samples."""
    lines = [
        "| | " + " | ".join(w.name for w in workloads) + " |",
        "|---|" + "---:|" * len(workloads),
        "| worker CPU per request | "
        + " | ".join(f"{w.cpu_ms_per_request:.2f} ms" for w in workloads)
        + " |",
    ]
    for label in [label for label, _ in STAGES] + [OTHER]:
        shares = [share(w.views["gil"].stages[label], w.views["gil"].samples) for w in workloads]
        if any(value not in ("", "0.0%") for value in shares):
            lines.append(f"| {label} (GIL) | " + " | ".join(shares) + " |")
    return lines


def report(workloads: list[Workload], anatomy: str, server: str, workers: int, seconds: int) -> str:
    out = [
        "# chatparity hot path profile",
        "",
        f"Produced by `.venv/bin/python bench/hotpath.py`: {server}, {workers} worker(s), the"
        " `openai` backend to the fast stub, request logging on, SQLite in a temporary file,"
        f" {seconds} s of wrk per workload. Two py-spy views of the same run: **GIL** (the"
        " thread holding the GIL: the Python work one process serialises) and **busy** (every"
        " thread not parked in a wait: adds what runs with the GIL released, mostly SQLite,"
        " and threads waiting to take the GIL back). Raw collapsed stacks: `bench/profile/`."
        f" The machine has {os.cpu_count()} CPUs, which wrk, the stub and the samplers share"
        " with the worker: req/s varies from run to run more than the worker's CPU per"
        " request, the steadier figure.",
        *before_and_after(workloads),
        "",
        "## This run",
        "",
        "| workload | req/s (profiled) | p50 ms | worker CPU per request |",
        "|---|---:|---:|---:|",
    ]
    for w in workloads:
        out.append(f"| {w.name} | {w.rps:.0f} | {w.p50_ms:.1f} | {w.cpu_ms_per_request:.2f} ms |")
    out += ["", "Stages by workload (GIL view; each workload's section has both views):", ""]
    out += summary_table(workloads)
    out += [
        "",
        "## One request, counted (in-process)",
        "",
        "`bench/anatomy.py` calls `project.asgi:application` (the object uvicorn serves:"
        " `FastPath` in front of Django) directly, with no HTTP server, and wraps library and"
        " chatparity functions to count and time them. Times are wall times, so a stage"
        " includes the rows that run inside it and, with 32 requests at a time, its waits for"
        " the others. Counts are per request, as measured: a count below 1 is something only"
        " some requests do.",
        "",
        anatomy.strip(),
    ]
    for w in workloads:
        out += workload_section(w)
    return "\n".join(out) + "\n"


def server_name(server: str) -> str:
    """``server`` and its version; for uvicorn, what its default ``--loop auto`` and
    ``--http auto`` pick: uvloop and httptools ("not installed": asyncio and h11)."""
    version = harness.package_version(harness.PYTHON, server)
    if server != "uvicorn":
        return f"{server} {version}"
    loop = harness.package_version(harness.PYTHON, "uvloop")
    http = harness.package_version(harness.PYTHON, "httptools")
    return f"uvicorn {version} (loop auto: uvloop {loop}; http auto: httptools {http})"


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
                views={view: parse(OUT / f"{slug}-{view}.txt", view) for view in VIEWS},
            )
            workloads.append(workload)
            log(
                f"  {name}: {workload.rps:.0f} req/s, {workload.cpu_ms_per_request:.1f} ms CPU"
                " per request"
            )
    args.out.write_text(
        report(workloads, anatomy, server_name(args.server), args.workers, args.duration)
    )
    print("\n".join(summary_table(workloads)))
    log(f"Wrote {args.out} and {OUT}/")


if __name__ == "__main__":
    main()
