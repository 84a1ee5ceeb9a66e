"""Side-by-side gateway benchmark: direct stub vs chatparity vs LiteLLM, on loopback.

    .venv/bin/python bench/run.py [--duration 10] [--rounds 1] [--base REVISION]
        [--streams 1000] [--skip-litellm] [--skip-scaling] [--skip-busbar] [--skip-memory]
        [--skip-local]

One command. It installs what it lacks (wrk from apt when root; LiteLLM
pinned in ``bench/.venv-litellm``; matplotlib and py-spy in
``bench/.venv-tools``), starts a fast canonical stub upstream, then measures,
with the same wrk load (non-stream and stream of 20 chunks, at concurrency 1
and 32): the stub directly; chatparity through its ``openai`` backend under
daphne and uvicorn (one worker each), request logging on, SQLite in a temporary
file; the uvicorn worker again through ``/v1/responses`` (not stored, as chat
completions are not), ``/v1/messages`` and ``/v1/embeddings`` (one input, the
stub's 1,536 numbers); with ``--base``, another revision of chatparity served the
same way beside this one; chatparity on PostgreSQL and Redis (servers of its own)
with one, two and four uvicorn workers, and the database statements and Redis
commands one request costs there (with a key without limits and one with them);
the LiteLLM proxy (one worker, no database); GetBusbar's row: a stub that answers
after 20 ms, 256 connections, non-stream, through uvicorn with one worker and two
(PostgreSQL + Redis, or SQLite with ``--skip-scaling``) and LiteLLM. ``--rounds``
repeats the measurements, each round in the other order of targets; the tables
give the medians, and each ratio is the median of the ratios within a round. Then
the memory per open stream with many concurrent slow streams held by one worker
of each server and by two uvicorn workers, and the local model's tokens/s
through the HTTP stream against raw llama-cpp-python. It writes
``bench/RESULTS.md``, ``bench/results.json`` and ``bench/results.png``.

Quote the ratios, which come from one run on one machine; the absolute numbers
move with whatever else the machine is doing.
"""

from __future__ import annotations

import argparse
import datetime
import importlib.util
import json
import os
import platform
import re
import statistics
import subprocess
import tempfile
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import asdict, dataclass, field
from pathlib import Path

import harness
import local_model
import slow_streams
from harness import BENCH, CHUNKS, Cell, Chatparity, log

DIRECT = "direct (stub)"
LITELLM = "LiteLLM proxy x1"
DAPHNE = "chatparity daphne x1"
UVICORN = "chatparity uvicorn x1"
ONE_WORKER = (DAPHNE, UVICORN)
# The uvicorn worker, loaded through the other endpoints (within 10% of chat: the target).
RESPONSES = f"{UVICORN}, /v1/responses"
MESSAGES = f"{UVICORN}, /v1/messages"
EMBEDDINGS = f"{UVICORN}, /v1/embeddings"
ENDPOINTS = (
    (RESPONSES, harness.RESPONSES),
    (MESSAGES, harness.MESSAGES),
    (EMBEDDINGS, harness.EMBEDDINGS),
)
# GetBusbar's method: an upstream that answers after 20 ms, 256 connections, non-stream;
# uvicorn with one worker and two: (label, workers).
BUSBAR_LATENCY_S = 0.020
BUSBAR_ALIAS = "stub-20ms"
BUSBAR = tuple((f"chatparity uvicorn x{n}, 20 ms upstream", n) for n in (1, 2))
BUSBAR_LITELLM = f"{LITELLM}, 20 ms upstream"
BUSBAR_WORKLOADS = ((False, 256),)
# The slow streams' servers: (ASGI server, workers).
MEMORY_SERVERS = (("daphne", 1), ("uvicorn", 1), ("uvicorn", 2))
# uvicorn workers on PostgreSQL + Redis: (label, workers).
SCALED = tuple((f"chatparity uvicorn x{n}, PostgreSQL + Redis", n) for n in (1, 2, 4))
WORKLOADS = ((False, 1), (False, 32), (True, 1), (True, 32))  # (stream, concurrency)


@dataclass
class Target:
    """Something wrk can load: its base URL, key and model name, the endpoint loaded, and
    the chatparity site serving it (None: not chatparity)."""

    name: str
    url: str
    key: str
    model: str
    api: harness.Api = harness.CHAT
    site: Chatparity | None = None


@dataclass
class Results:
    """Everything one run measured, as written to results.json."""

    title: str
    environment: dict[str, str]
    rounds: list[list[Cell]] = field(default_factory=list)
    cells: list[Cell] = field(default_factory=list)  # the medians over rounds
    request_log: dict[str, dict[str, int]] = field(default_factory=dict)
    round_trips: dict[str, harness.RoundTrips] = field(default_factory=dict)
    memory: dict[str, slow_streams.Report] = field(default_factory=dict)
    local: dict[str, tuple[local_model.Run, local_model.Run]] = field(default_factory=dict)
    server_logs: dict[str, dict[str, int]] = field(default_factory=dict)

    def cell(self, target: str, stream: bool, concurrency: int) -> Cell | None:
        return next(
            (
                c
                for c in self.cells
                if (c.target, c.stream, c.concurrency) == (target, stream, concurrency)
            ),
            None,
        )

    def ratio(self, target: str, other: str, stream: bool, concurrency: int) -> float | None:
        """The median over rounds of ``target``'s req/s over ``other``'s in the same round."""
        ratios = []
        for cells in self.rounds:
            by_target = {
                c.target: c for c in cells if (c.stream, c.concurrency) == (stream, concurrency)
            }
            if target in by_target and other in by_target and by_target[other].rps:
                ratios.append(by_target[target].rps / by_target[other].rps)
        return statistics.median(ratios) if ratios else None

    def summarise(self) -> None:
        """``cells``: each cell's median over the rounds (failures summed)."""
        measured: dict[tuple[str, bool, int], list[Cell]] = {}
        for cells in self.rounds:
            for c in cells:
                measured.setdefault((c.target, c.stream, c.concurrency), []).append(c)
        self.cells = [
            Cell(
                target=target,
                stream=stream,
                concurrency=concurrency,
                requests=sum(c.requests for c in runs),
                rps=statistics.median(c.rps for c in runs),
                p50_ms=statistics.median(c.p50_ms for c in runs),
                p99_ms=statistics.median(c.p99_ms for c in runs),
                failures=sum(c.failures for c in runs),
                upstream_requests=sum(c.upstream_requests for c in runs),
                upstream_connections=sum(c.upstream_connections for c in runs),
            )
            for (target, stream, concurrency), runs in measured.items()
        ]

    def as_json(self) -> dict[str, object]:
        return {
            "title": self.title,
            "environment": self.environment,
            "cells": [cell.as_dict() for cell in self.cells],
            "rounds": [[cell.as_dict() for cell in cells] for cells in self.rounds],
            "request_log": self.request_log,
            "round_trips": {name: asdict(trips) for name, trips in self.round_trips.items()},
            "memory": {
                name: {**asdict(r), "kib_per_stream": r.kib_per_stream, "dropped": r.dropped}
                for name, r in self.memory.items()
            },
            "local": {
                name: {"raw": asdict(raw), "http": asdict(http)}
                for name, (raw, http) in self.local.items()
            },
            "server_logs": self.server_logs,
        }


# -- environment ------------------------------------------------------------------


def environment(litellm: bool) -> dict[str, str]:
    """Machine, date and versions, for the report."""
    lscpu = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
    model = re.search(r"Model name:\s+(.*)", lscpu)
    wrk = subprocess.run(["wrk", "-v"], capture_output=True, text=True)
    meminfo = Path("/proc/meminfo").read_text().split()
    python = harness.PYTHON
    versions = {
        name: harness.package_version(python, name)
        for name in ("Django", "daphne", "uvicorn", "asgiref", "httpx", "llama_cpp_python")
    }
    loop = "uvloop" if importlib.util.find_spec("uvloop") else "asyncio"
    http = "httptools" if importlib.util.find_spec("httptools") else "h11"
    return {
        "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "cpu": f"{model.group(1) if model else platform.processor()}, {os.cpu_count()} cores",
        "memory": f"{int(meminfo[1]) // 1024 // 1024} GiB",
        "kernel": platform.release(),
        "load": " ".join(f"{load:.2f}" for load in os.getloadavg()),
        "python": platform.python_version(),
        **versions,
        "uvicorn loop/http": f"{loop} + {http}",
        "litellm": harness.package_version(harness.LITELLM_VENV / "bin" / "python", "litellm")
        if litellm
        else "skipped",
        "wrk": (wrk.stdout + wrk.stderr).split("[")[0].strip(),
    }


# -- the measurements ---------------------------------------------------------------


def start_chatparity(
    stack: ExitStack, name: str, server: str, workers: int, site: Chatparity, work: Path
) -> str:
    """Serve ``site`` with ``workers`` workers of ``server`` until ``stack`` closes; its
    /v1 URL."""
    port = harness.free_port()
    url = f"http://127.0.0.1:{port}/v1"
    command = harness.chatparity_command(server, port, workers)
    auth = {"Authorization": f"Bearer {site.key}"}
    log_file = work / f"{slug(name)}.log"
    stack.enter_context(
        harness.serve(command, f"{url}/models", auth, site.env, log_file, cwd=site.tree)
    )
    return url


def start_litellm(stack: ExitStack, name: str, stub_url: str, work: Path) -> Target:
    """The LiteLLM proxy (one worker, no database) in front of the stub at ``stub_url``,
    until ``stack`` closes."""
    port = harness.free_port()
    url = f"http://127.0.0.1:{port}/v1"
    config = work / f"{slug(name)}.yaml"
    config.write_text(
        "model_list:\n  - model_name: stub\n    litellm_params:\n"
        f"      model: openai/{harness.STUB_MODEL}\n      api_base: {stub_url}\n"
        "      api_key: sk-stub\n"
    )
    master = "sk-bench-" + os.urandom(16).hex()  # keys checked, as chatparity checks its own
    env = {
        **os.environ,
        "LITELLM_MASTER_KEY": master,
        "LITELLM_LOCAL_MODEL_COST_MAP": "True",
        "LITELLM_TELEMETRY": "False",
        "LITELLM_LOG": "ERROR",
    }
    command = [
        str(harness.LITELLM_VENV / "bin" / "litellm"),
        "--config",
        str(config),
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--num_workers",
        "1",
    ]
    auth = {"Authorization": f"Bearer {master}"}
    stack.enter_context(
        harness.serve(command, f"{url}/models", auth, env, work / f"{slug(name)}.log")
    )
    return Target(name, url, master, "stub")


def start_gateways(
    stack: ExitStack,
    sites: dict[str, Chatparity],
    stub_url: str,
    work: Path,
    litellm: bool,
) -> list[Target]:
    """Start every target (stub already up); they idle while another is measured. ``sites``:
    the SQLite site, and, when measured, the other revision's and the PostgreSQL one."""
    targets = [Target(DIRECT, stub_url, "sk-stub", harness.STUB_MODEL)]
    site = sites["sqlite"]
    for name, server in ((DAPHNE, "daphne"), (UVICORN, "uvicorn")):
        url = start_chatparity(stack, name, server, 1, site, work)
        targets.append(Target(name, url, site.key, "stub", site=site))
        if name == UVICORN:
            targets += [Target(label, url, site.key, "stub", api, site) for label, api in ENDPOINTS]
    for name, base in sites.items():
        if name.startswith(UVICORN):  # another revision
            url = start_chatparity(stack, name, "uvicorn", 1, base, work)
            targets.append(Target(name, url, base.key, "stub", site=base))
    if "postgresql" in sites:
        scaled = sites["postgresql"]
        for name, workers in SCALED:
            url = start_chatparity(stack, name, "uvicorn", workers, scaled, work)
            targets.append(Target(name, url, scaled.key, "stub", site=scaled))
    if litellm:
        targets.append(start_litellm(stack, LITELLM, stub_url, work))
    return targets


def start_busbar(
    stack: ExitStack, site: Chatparity, stub_url: str, work: Path, litellm: bool
) -> list[Target]:
    """GetBusbar's targets, in front of the stub that answers after 20 ms (``stub_url``,
    alias ``BUSBAR_ALIAS`` of ``site``): uvicorn with one worker and with two, and
    LiteLLM."""
    targets = []
    for name, workers in BUSBAR:
        url = start_chatparity(stack, name, "uvicorn", workers, site, work)
        targets.append(Target(name, url, site.key, BUSBAR_ALIAS, site=site))
    if litellm:
        targets.append(start_litellm(stack, BUSBAR_LITELLM, stub_url, work))
    return targets


def slug(name: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")


def gateways(
    results: Results,
    targets: list[Target],
    seconds: int,
    rounds: int,
    work: Path,
    stub_stats: str,
    workloads: tuple[tuple[bool, int], ...] = WORKLOADS,
) -> None:
    """Every workload, each target in turn, so drift hits them alike; each round takes the
    targets in the other order (its cells join those of the same round measured before)."""
    for number in range(rounds):
        order = targets if number % 2 == 0 else targets[::-1]
        if number == len(results.rounds):
            results.rounds.append([])
        cells = results.rounds[number]
        for stream, concurrency in workloads:
            for target in order:
                if stream and not target.api.streams:
                    continue
                cell = harness.measure(
                    target.name,
                    target.url,
                    target.key,
                    target.model,
                    stream=stream,
                    concurrency=concurrency,
                    seconds=seconds,
                    work=work,
                    stub_stats=stub_stats,
                    api=target.api,
                )
                cells.append(cell)
                log(
                    f"  {number + 1}/{rounds} {target.name:45} {cell.workload:18}"
                    f" c={concurrency:<3} {cell.rps:9.1f} req/s  p50 {cell.p50_ms:8.2f} ms"
                    f"  p99 {cell.p99_ms:8.2f} ms  failures {cell.failures}"
                )
    results.summarise()


LIMITED_KEY = (
    "from chatparity.models import ApiKey\n"
    "_, plaintext = ApiKey.objects.create_key('limited', requests_per_minute=10**7,"
    " tokens_per_minute=2 * 10**9, max_concurrent=1000)\n"
    "print(plaintext)\n"
)


def round_trips(results: Results, targets: list[Target], seconds: int, work: Path) -> None:
    """What one request costs the database and Redis, one worker on PostgreSQL + Redis:
    with the bench's key (no limits) and with a key with limits (admitted in Redis)."""
    target = next(t for t in targets if t.name == SCALED[0][0])
    assert target.site is not None
    limited = target.site.manage("shell", "--no-imports", "-c", LIMITED_KEY)
    for label, key in (("key without limits", target.key), ("key with limits", limited)):
        for stream in (False, True):
            trips = harness.count_round_trips(
                target.site, target.url, key, stream=stream, seconds=seconds, work=work
            )
            name = f"{label}, {'stream' if stream else 'non-stream'}"
            results.round_trips[name] = trips
            log(
                f"  {name}: {trips.per_request(trips.database_round_trips):.2f} database"
                f" round trips ({trips.per_request(trips.statements):.2f} statements),"
                f" {trips.per_request(trips.redis_commands):.2f} Redis commands per request"
            )


def memory(results: Results, site: Chatparity, count: int, slow_url: str, work: Path) -> None:
    """``count`` concurrent slow streams held by fresh workers: one of each ASGI server,
    and two of uvicorn (GetBusbar's 1,000 streams held; memory is that of every
    process)."""
    auth = {"Authorization": f"Bearer {site.key}"}
    control = slow_url.removesuffix("/v1") + "/bench"
    for server, workers in MEMORY_SERVERS:
        name = f"chatparity {server} x{workers}"
        port = harness.free_port()
        url = f"http://127.0.0.1:{port}/v1"
        command = harness.chatparity_command(server, port, workers)
        log_file = work / f"memory-{server}-x{workers}.log"
        with harness.serve(command, f"{url}/models", auth, site.env, log_file) as process:
            report = slow_streams.measure_held(url, site.key, control, count=count, pid=process.pid)
        results.memory[name] = report
        log(
            f"  {name}: {report.kib_per_stream:.0f} KiB per stream, {report.opened} opened,"
            f" {report.completed} completed, threads {report.threads_before} ->"
            f" {report.threads_open}, failures {report.failures}"
        )


def local(results: Results, site: Chatparity, tokens: int, work: Path) -> None:
    """The local model through each ASGI server (one worker) against raw in-process."""
    site.manage("chatparity_bootstrap")
    auth = {"Authorization": f"Bearer {site.key}"}
    for server in ("daphne", "uvicorn"):
        name = f"chatparity {server} x1"
        port = harness.free_port()
        url = f"http://127.0.0.1:{port}/v1"
        log_file = work / f"local-{server}.log"
        command = harness.chatparity_command(server, port)
        with harness.serve(command, f"{url}/models", auth, site.env, log_file):
            raw, http = local_model.compare(url, site.key, site.env, tokens=tokens)
        results.local[name] = (raw, http)
        share = http.tokens_per_second / raw.tokens_per_second
        log(
            f"  {name}: raw {raw.tokens_per_second:.1f} tokens/s,"
            f" HTTP {http.tokens_per_second:.1f} ({share:.1%})"
        )


def scan_logs(work: Path) -> dict[str, dict[str, int]]:
    """Tracebacks and notable errors in each server's output."""
    patterns = {
        "tracebacks": "Traceback (most recent call last)",
        "database is locked": "database is locked",
        "500 responses": '" 500 ',
    }
    found = {}
    for path in sorted(work.glob("*.log")):
        text = path.read_text(errors="replace")
        counts = {label: text.count(pattern) for label, pattern in patterns.items()}
        if any(counts.values()):
            found[path.stem] = counts
    return found


# -- the report ---------------------------------------------------------------------


def _ratio(value: float) -> str:
    return f"{value:.2f}x" if value < 10 else f"{value:.0f}x"


def main_table(results: Results) -> list[str]:
    lines = [
        "| target | workload | conc. | req/s | p50 ms | p99 ms | p99 / p50 |"
        " p50 added over direct, ms | req/s vs LiteLLM | failures |"
        " upstream connections per request |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for stream, concurrency in WORKLOADS:
        direct = results.cell(DIRECT, stream, concurrency)
        for cell in (
            c for c in results.cells if (c.stream, c.concurrency) == (stream, concurrency)
        ):
            added = f"{cell.p50_ms - direct.p50_ms:+.2f}" if direct and cell is not direct else ""
            ratio = results.ratio(cell.target, LITELLM, stream, concurrency)
            versus = _ratio(ratio) if ratio and cell.target.startswith("chatparity") else ""
            reuse = (
                f"{cell.upstream_connections / cell.upstream_requests:.2f}"
                if cell is not direct and cell.upstream_requests
                else ""
            )
            # None finished in a short run (LiteLLM at c=32): no spread to show.
            spread = f"{cell.p99_ms / cell.p50_ms:.1f}" if cell.p50_ms else ""
            lines.append(
                f"| {cell.target} | {cell.workload} | {concurrency} | {cell.rps:,.0f} |"
                f" {cell.p50_ms:.2f} | {cell.p99_ms:.2f} | {spread} |"
                f" {added} | {versus} | {cell.failures} | {reuse} |"
            )
    return lines


def issue_table(results: Results) -> list[str]:
    """Issue 28's table: each workload direct, through chatparity (uvicorn x1, and the
    other revision when measured) and through LiteLLM, and the ratio of requests/s."""
    gateways = [UVICORN, *(c.target for c in results.cells if c.target.startswith(f"{UVICORN} at"))]
    gateways = list(dict.fromkeys(gateways))
    head = " | ".join(gateways)
    ratios = " | ".join(f"{name} / LiteLLM" for name in gateways)
    lines = [
        f"| workload | direct | {head} | LiteLLM | {ratios} |",
        "|---|---|" + "---|" * len(gateways) + "---|" + "---:|" * len(gateways),
    ]
    for stream, concurrency in WORKLOADS:
        direct = results.cell(DIRECT, stream, concurrency)
        litellm = results.cell(LITELLM, stream, concurrency)
        cells = [results.cell(name, stream, concurrency) for name in gateways]
        if direct is None or None in cells:
            continue

        def shown(cell: Cell | None, over: Cell | None = None) -> str:
            """A cell's figures; ``over``: with its p50 added over that one's."""
            if cell is None:
                return ""
            text = f"{cell.rps:,.0f} req/s, p50 {cell.p50_ms:.2f} ms"
            if over is not None:
                text += f" (**{cell.p50_ms - over.p50_ms:+.2f} ms**)"
            return text + f", p99 {cell.p99_ms:.2f} ms"

        versus = [results.ratio(name, LITELLM, stream, concurrency) for name in gateways]
        lines.append(
            f"| {'stream 20 chunks' if stream else 'non-stream'} c={concurrency} |"
            f" {shown(direct)} | "
            + " | ".join(shown(cell, direct if concurrency == 1 else None) for cell in cells)
            + f" | {shown(litellm)} | "
            + " | ".join(_ratio(ratio) if ratio else "" for ratio in versus)
            + " |"
        )
    return lines


def scaling_table(results: Results) -> list[str]:
    lines = [
        "| configuration | workload | conc. | req/s | p50 ms | p99 ms | vs one worker |",
        "|---|---|---:|---:|---:|---:|---:|",
    ]
    for stream, concurrency in WORKLOADS:
        for name, _ in SCALED:
            cell = results.cell(name, stream, concurrency)
            if cell is None:
                continue
            versus = results.ratio(name, SCALED[0][0], stream, concurrency)
            lines.append(
                f"| {name} | {cell.workload} | {concurrency} | {cell.rps:,.0f} |"
                f" {cell.p50_ms:.2f} | {cell.p99_ms:.2f} | {versus:.2f}x |"
            )
    return lines


def busbar_table(results: Results) -> list[str]:
    """GetBusbar's row: the stub answering after 20 ms, 256 connections."""
    lines = [
        "| configuration | req/s | p50 ms | p99 ms | req/s vs LiteLLM | failures |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for name in (*(name for name, _ in BUSBAR), BUSBAR_LITELLM):
        stream, concurrency = BUSBAR_WORKLOADS[0]
        cell = results.cell(name, stream, concurrency)
        if cell is None:
            continue
        ratio = results.ratio(name, BUSBAR_LITELLM, stream, concurrency)
        versus = _ratio(ratio) if ratio and name != BUSBAR_LITELLM else ""
        lines.append(
            f"| {name} | {cell.rps:,.0f} | {cell.p50_ms:.2f} | {cell.p99_ms:.2f} | {versus} |"
            f" {cell.failures} |"
        )
    return lines


def round_trips_table(results: Results) -> list[str]:
    lines = [
        "| one request, one worker on PostgreSQL + Redis | requests | SQL statements |"
        " of which log rows | of which COMMIT (log batches) | database round trips |"
        " Redis commands sent | of which scripts (EVAL) |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for name, trips in results.round_trips.items():
        per = trips.per_request
        lines.append(
            f"| {name} | {trips.requests:,} | {per(trips.statements):.2f} | {per(trips.rows):.2f} |"
            f" {per(trips.transactions):.3f} | {per(trips.database_round_trips):.2f} |"
            f" {per(trips.redis_commands):.2f} | {per(trips.redis_scripts):.2f} |"
        )
    return lines


def targets_table(results: Results) -> list[str]:
    """Issue 28's targets, each against the one-worker configurations measured."""
    lines = ["| target | configuration | measured | met |", "|---|---|---|:---:|"]

    def row(goal: str, name: str, measured: str, met: bool) -> None:
        lines.append(f"| {goal} | {name} | {measured} | {'yes' if met else '**no**'} |")

    one_worker = [
        *ONE_WORKER,
        *dict.fromkeys(c.target for c in results.cells if c.target.startswith(f"{UVICORN} at")),
    ]
    for name in one_worker:
        direct, cell = results.cell(DIRECT, False, 1), results.cell(name, False, 1)
        if direct and cell:
            added = cell.p50_ms - direct.p50_ms
            row(
                "added p50 over direct, c=1, non-stream, logging on: <= 0.5 ms",
                name,
                f"{added:.2f} ms",
                added <= 0.5,
            )
    for name in one_worker:
        for stream in (False, True):
            cell = results.cell(name, stream, 32)
            if cell:
                row(
                    f"p99 <= 3x p50 at c=32, {cell.workload}",
                    name,
                    f"{cell.p99_ms / cell.p50_ms:.1f}x ({cell.p99_ms:.1f} vs {cell.p50_ms:.1f} ms)",
                    cell.p99_ms <= 3 * cell.p50_ms,
                )
    for name in one_worker:
        for stream in (False, True):
            cell, litellm = results.cell(name, stream, 32), results.cell(LITELLM, stream, 32)
            ratio = results.ratio(name, LITELLM, stream, 32)
            if cell and litellm and ratio:
                row(
                    f"req/s at c=32, {cell.workload}: >= 30x LiteLLM",
                    name,
                    f"{ratio:.1f}x ({cell.rps:.0f} vs {litellm.rps:.0f})",
                    ratio >= 30,
                )
    for endpoint, api in ENDPOINTS:
        for stream, concurrency in WORKLOADS:
            chat = results.cell(UVICORN, stream, concurrency)
            other = results.cell(endpoint, stream, concurrency)
            direct = results.cell(DIRECT, stream, concurrency)
            ratio = results.ratio(endpoint, UVICORN, stream, concurrency)
            if chat and other and direct and ratio:
                added = [cell.p50_ms - direct.p50_ms for cell in (chat, other)]
                row(
                    f"/v1/{api.path} within 10% of chat completions, {chat.workload},"
                    f" c={concurrency}",
                    endpoint,
                    f"{ratio:.2f}x req/s, added p50 {added[1]:+.2f} vs {added[0]:+.2f} ms",
                    ratio >= 0.9,
                )
    for name, report in results.memory.items():
        row(
            f"{report.count:,} open streams: < 64 KiB each, none dropped",
            name,
            f"{report.kib_per_stream:.0f} KiB each, {report.dropped} dropped",
            report.kib_per_stream < 64 and report.dropped == 0,
        )
    for name, (raw, http) in results.local.items():
        share = http.tokens_per_second / raw.tokens_per_second
        row("local model through HTTP: >= 95% of raw tokens/s", name, f"{share:.1%}", share >= 0.95)
    return lines


def report(results: Results, seconds: int, rounds: int, chart: bool) -> str:
    env = results.environment
    out = [
        "# chatparity gateway benchmark",
        "",
        "Produced by `.venv/bin/python bench/run.py` (one command; see its docstring)."
        " Quote the ratios: they come from one run on one machine, while the absolute"
        " numbers move with whatever else the machine is doing.",
        "",
        f"- **Date:** {env['date']}",
        f"- **Machine:** {env['cpu']}, {env['memory']} RAM, Linux {env['kernel']};"
        f" load average at the start {env['load']} (the machine is shared)",
        f"- **Versions:** Python {env['python']}, Django {env['Django']}, daphne"
        f" {env['daphne']}, uvicorn {env['uvicorn']} ({env['uvicorn loop/http']}), asgiref"
        f" {env['asgiref']}, httpx {env['httpx']}, LiteLLM {env['litellm']}, llama-cpp-python"
        f" {env['llama_cpp_python']}, {env['wrk']}",
        "",
        "## Set-up",
        "",
        f"- Everything on loopback, sharing the same {env['cpu'].split(', ')[-1]}: the load"
        " tool, the stub, the gateway.",
        "- Upstream: `bench/stub_upstream.py`, a canonical OpenAI-compatible stub (asyncio,"
        f" keep-alive, canned bodies): {CHUNKS} content chunks per answer.",
        "- Load: wrk, one thread, keep-alive, `--timeout 30s`; per cell a 1 s warm-up, then"
        f" {seconds:g} s measured. Every 200 response is checked (all {CHUNKS} chunks there,"
        " a stream ending in `[DONE]`); failures count socket errors, time-outs, non-2xx and"
        " wrong bodies. Latencies are per whole response (the last byte of a stream).",
        "- chatparity: the example project (`project.asgi:application`: `/v1` through the"
        " ASGI fast path, `chatparity.asgi.FastPath`), `DEBUG=0`, an `openai` backend pointed"
        " at the stub, a key with no limits, **request logging on** (one RequestLog row per"
        " request, the default, written once the response is sent), the database **SQLite in"
        " a temporary file** on local disk (WAL), local-memory cache. daphne: one process;"
        " uvicorn: `--workers N --lifespan off --no-access-log`. The uvicorn worker also"
        " serves the `/v1/responses` (`store: false`), `/v1/messages` and `/v1/embeddings`"
        " (one input) rows. A target `... at REVISION` is another revision served the same"
        " way from a checkout of its own.",
        "- PostgreSQL + Redis: servers of the bench's own on loopback (PostgreSQL with"
        " `fsync=off`, as CI runs it, and pg_stat_statements), the same project with"
        " `DATABASE_URL` and `REDIS_URL` (Redis for the cache, the limits and the channel"
        " layer), one, two and four uvicorn workers on the same cores.",
        "- Upstream connections per request: connections the stub accepted / completions it"
        " served during the cell; 1.00 means no upstream connection was reused.",
        "- LiteLLM: `litellm[proxy]` from PyPI in `bench/.venv-litellm`, `--num_workers 1`,"
        " no database, a master key (keys are checked on both sides), pointed at the same stub"
        " (its own venv brings uvloop).",
        f"- {rounds} round(s), each taking the targets in the other order; the tables give"
        " each cell's median, and each ratio is the median of the ratios within a round.",
        "",
        "## Issue 28's table",
        "",
        *issue_table(results),
        "",
        "## Requests",
        "",
        *main_table(results),
        "",
    ]
    if chart:
        out += ["![requests/s and p50 latency per target and workload](results.png)", ""]
    out += ["## Targets", "", *targets_table(results), ""]
    if any(name in {c.target for c in results.cells} for name, _ in SCALED):
        out += [
            "## Workers on PostgreSQL + Redis",
            "",
            *scaling_table(results),
            "",
        ]
    if any(c.target == name for c in results.cells for name, _ in BUSBAR):
        out += [
            "## An upstream that answers after 20 ms, 256 connections",
            "",
            "GetBusbar's method (published, 4 cores: LiteLLM 608 req/s): the stub waits"
            f" {BUSBAR_LATENCY_S * 1000:.0f} ms before each answer, wrk holds 256 keep-alive"
            " connections, non-stream; chatparity under uvicorn with one worker and with two"
            " (on PostgreSQL + Redis when measured, else SQLite), LiteLLM (one worker) on the"
            " same stub, in the same rounds. Streams held: the memory table below.",
            "",
            *busbar_table(results),
            "",
        ]
    if results.round_trips:
        out += [
            "## What one request costs the database and Redis",
            "",
            "One worker on PostgreSQL + Redis, one request at a time for a few seconds, counted"
            " by the servers: the statements PostgreSQL ran (pg_stat_statements, top level:"
            " BEGIN and COMMIT included), of which the log rows' INSERTs, which psycopg sends"
            " as one round trip per batch (an `executemany` in pipeline mode), hence the round"
            " trips; and the commands clients sent Redis (MONITOR, those its Lua scripts run"
            " left out). Keys and aliases are cached for `CACHE_SECONDS`, so"
            " their loads per request fall as the request rate rises. The key with limits has"
            " requests and tokens per minute and a concurrency limit.",
            "",
            *round_trips_table(results),
            "",
        ]
    if results.memory:
        out += [
            "## Memory per open stream",
            "",
            "Fresh workers; a short warm-up; then concurrent slow streams through the"
            " `openai` backend to the stub, which trickles a chunk a second and holds every"
            " stream open until all are open and RSS was sampled. Per stream = (RSS with all"
            " open - RSS before) / streams, RSS summed over the server's processes (x2: its"
            " supervisor and two workers). Dropped = not ending with HTTP 200, no error frame"
            " and `[DONE]`.",
            "",
            "| configuration | streams | seconds to open all | RSS before | RSS all open |"
            " per stream | threads before -> open | dropped |",
            "|---|---:|---:|---:|---:|---:|---:|---:|",
        ]
        for name, r in results.memory.items():
            failures = f" ({', '.join(f'{k}: {v}' for k, v in r.failures.items())})"
            out.append(
                f"| {name} | {r.count:,} | {r.seconds_to_open:.1f} |"
                f" {r.rss_before_kib / 1024:.0f} MiB | {r.rss_open_kib / 1024:.0f} MiB |"
                f" **{r.kib_per_stream:.0f} KiB** | {r.threads_before} -> {r.threads_open} |"
                f" {r.dropped}{failures if r.failures else ''} |"
            )
        out.append("")
    if results.local:
        raw_tokens = next(iter(results.local.values()))[0].tokens
        out += [
            "## Local model tokens/s",
            "",
            f"SmolLM2-135M-Instruct, greedy, {raw_tokens} tokens, decode speed (first to last"
            " token, prompt evaluation left out), best of 5 alternating runs. Raw: the same"
            " GGUF, chat template, threads per context and token loop, in-process, nothing"
            " around it (`bench/local_model.py`). HTTP: chatparity's SSE stream as an httpx"
            " client reads it.",
            "",
            "| configuration | raw llama-cpp-python | through HTTP | HTTP / raw |",
            "|---|---:|---:|---:|",
        ]
        for name, (raw, http) in results.local.items():
            out.append(
                f"| {name} | {raw.tokens_per_second:.1f} | {http.tokens_per_second:.1f} |"
                f" {http.tokens_per_second / raw.tokens_per_second:.1%} |"
            )
        out.append("")
    out += [
        "## Request log and server errors under load",
        "",
        "RequestLog rows of the measured chatparity requests, by User-Agent. When wrk stops it"
        " drops the requests in flight (up to 1 or 32 per cell): the server logs them as"
        " cancelled, or as 200 when it had already answered, so rows can exceed the"
        " requests wrk counted by that much, never fall short of them.",
        "",
        "| configuration | requests completed (wrk) | rows | 200 | cancelled | errors | 5xx |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for name, counts in results.request_log.items():
        done = sum(c.requests for c in results.cells if c.target == name)
        out.append(
            f"| {name} | {done:,} | {counts['rows']:,} | {counts['ok']:,} |"
            f" {counts['cancelled']} | {counts['errors']} | {counts['5xx']} |"
        )
    out += ["", "Server output:", ""]
    if results.server_logs:
        for name, counts in results.server_logs.items():
            out.append(f"- `{name}`: " + ", ".join(f"{k}: {v}" for k, v in counts.items()))
    else:
        out.append("- no tracebacks, 500s or locked-database errors in any server's output.")
    out += ["", "The profile of the hot path and the proposed changes: [PROFILE.md](PROFILE.md)."]
    return "\n".join(out) + "\n"


# -- main -------------------------------------------------------------------------------


def step(title: str, action: Callable[[], None]) -> None:
    log(f"\n== {title}")
    action()


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--duration", type=int, default=10, help="measured seconds per cell")
    parser.add_argument("--rounds", type=int, default=1, help="rounds, in alternating order")
    parser.add_argument("--base", metavar="REVISION", help="a revision to serve beside this one")
    parser.add_argument("--streams", type=int, default=1000, help="slow streams, memory test")
    parser.add_argument("--tokens", type=int, default=200, help="local model tokens per run")
    parser.add_argument("--skip-litellm", action="store_true")
    parser.add_argument("--skip-scaling", action="store_true", help="no PostgreSQL + Redis")
    parser.add_argument("--skip-busbar", action="store_true", help="no 20 ms upstream row")
    parser.add_argument("--skip-memory", action="store_true")
    parser.add_argument("--skip-local", action="store_true")
    parser.add_argument("--out", type=Path, default=BENCH / "RESULTS.md")
    args = parser.parse_args()

    harness.ensure_wrk()
    litellm = not args.skip_litellm
    if litellm:
        harness.ensure_litellm()
    tools = harness.ensure_tools()
    harness.raise_file_limit()
    env = environment(litellm)
    log("Versions: " + ", ".join(f"{k} {v}" for k, v in env.items()))

    work = Path(tempfile.mkdtemp(prefix="chatparity-bench-"))
    log(f"Work directory (database, server logs): {work}")
    stub_port, slow_port = harness.free_port(), harness.free_port()
    stub_url = f"http://127.0.0.1:{stub_port}/v1"
    slow_url = f"http://127.0.0.1:{slow_port}/v1"
    results = Results(
        title=f"chatparity vs LiteLLM vs direct, {env['cpu']}, {env['date']}", environment=env
    )
    with ExitStack() as stack:
        (work / "sqlite").mkdir()
        sites = {"sqlite": harness.make_chatparity(work / "sqlite")}
        if args.base:
            (work / "base").mkdir()
            tree = harness.checkout(stack, args.base, work / "base" / "tree")
            sites[f"{UVICORN} at {args.base}"] = harness.make_chatparity(work / "base", tree)
        if not args.skip_scaling:
            services = stack.enter_context(harness.services(work))
            (work / "postgresql").mkdir()
            sites["postgresql"] = harness.make_chatparity(work / "postgresql", services=services)
        for site in sites.values():
            site.add_upstream("stub", stub_url)
        busbar_port = harness.free_port()
        sites.get("postgresql", sites["sqlite"]).add_upstream(
            BUSBAR_ALIAS, f"http://127.0.0.1:{busbar_port}/v1"
        )
        site = sites["sqlite"]
        site.add_upstream("slow", slow_url)
        stack.enter_context(harness.serve(harness.stub_command(stub_port), f"{stub_url}/models"))
        slow = harness.stub_command(slow_port, "--hold")
        stack.enter_context(harness.serve(slow, f"{slow_url}/models"))
        with ExitStack() as servers:
            targets = start_gateways(servers, sites, stub_url, work, litellm)
            stats = stub_url.removesuffix("/v1") + "/bench/stats"
            step(
                "Gateways",
                lambda: gateways(results, targets, args.duration, args.rounds, work, stats),
            )
            if not args.skip_scaling:
                step(
                    "Database and Redis round trips",
                    lambda: round_trips(results, targets, args.duration, work),
                )
        if not args.skip_busbar:
            busbar_site = sites.get("postgresql", site)
            with ExitStack() as servers:
                busbar_stub_url = f"http://127.0.0.1:{busbar_port}/v1"
                latency = ("--latency", str(BUSBAR_LATENCY_S))
                command = harness.stub_command(busbar_port, *latency)
                servers.enter_context(harness.serve(command, f"{busbar_stub_url}/models"))
                busbar = start_busbar(servers, busbar_site, busbar_stub_url, work, litellm)
                stats = busbar_stub_url.removesuffix("/v1") + "/bench/stats"
                step(
                    "An upstream that answers after 20 ms, 256 connections",
                    lambda: gateways(
                        results, busbar, args.duration, args.rounds, work, stats, BUSBAR_WORKLOADS
                    ),
                )
            targets += busbar
        for target in targets:
            if target.site is not None:
                results.request_log[target.name] = target.site.request_log(f"bench/{target.name}/")
        if not args.skip_memory:
            step(
                f"{args.streams} slow streams",
                lambda: memory(results, site, args.streams, slow_url, work),
            )
        if not args.skip_local:
            step("Local model", lambda: local(results, site, args.tokens, work))
    results.server_logs = scan_logs(work)

    data = BENCH / "results.json"
    data.write_text(json.dumps(results.as_json(), indent=2) + "\n")
    chart = BENCH / "results.png"
    drawn = subprocess.run([str(tools), str(BENCH / "chart.py"), str(data), str(chart)])
    text = report(results, args.duration, args.rounds, drawn.returncode == 0)
    kept = harness.kept_section(args.out)  # the HTTP clients compared, bench/transports.py's
    args.out.write_text(text + ("\n" + kept if kept else ""))
    print(text)
    log(f"Wrote {args.out}, {data} and {chart}; server logs in {work}")


if __name__ == "__main__":
    main()
