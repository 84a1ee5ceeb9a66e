"""What runs in the tail: one uvicorn worker under wrk, watched from inside.

    .venv/bin/python bench/tail.py [--duration 8] [--rounds 1] [--env NAME=VALUE ...]

The worker serves the example project through ``bench/tail_probe.py`` (the
``openai`` backend to the fast stub, request logging on, SQLite in a temporary
file, as ``bench/run.py``). For each workload at concurrency 32 (and 1) it prints
wrk's percentiles beside the server's own (ASGI call to last byte), then what the
event loop went through: how late its timer ran, and in the stretches where it ran
late (stalls) how the loop's thread spent the time: running (its own callbacks,
of which the collector's pauses), runnable but waiting for a CPU (the machine is
busy: load tool, stub, other processes), or blocked, which on an event loop means
waiting for the GIL (the worker's other threads ran meanwhile: the log writer's
database thread). Then the collector's pauses by generation, the log writer's
batches, and, for the slowest 1% of requests against the median ones, the share
of their time spent in stalls, in the collector and beside a log batch.

``--variant NAME[@TREE]:VAR=VALUE,...`` (repeatable) serves a worker per variant,
from the checkout ``TREE`` of another revision if given, with those environment
variables (``tail_probe`` reads ``BENCH_GC_THRESHOLD=700/10/10`` and
``BENCH_URLCONF_AT_START=1``), and measures them in alternating rounds
(``--rounds``): e.g. a revision before a change against the working tree.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import harness
import httpx
from harness import BENCH, PYTHON, UVICORN_QUIET, log

HEAPS: dict[str, dict[str, Any]] = {}  # by server URL: the heap after its last cell


def percentile(values: list[float], share: float) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(share * len(ordered)))]


def overlap(intervals: list[tuple[float, float]], start: float, end: float) -> float:
    """Seconds of [start, end] covered by ``intervals`` (sorted, not overlapping)."""
    total = 0.0
    for low, high in intervals:
        if high <= start:
            continue
        if low >= end:
            break
        total += min(high, end) - max(low, start)
    return total


def merged(intervals: list[tuple[float, float]]) -> list[tuple[float, float]]:
    out: list[tuple[float, float]] = []
    for low, high in sorted(intervals):
        if out and low <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], high))
        else:
            out.append((low, high))
    return out


def analyse(report: dict[str, Any]) -> dict[str, float]:
    """The figures of one workload from the probe's report."""
    seconds = report["seconds"]
    durations = [end - start for start, end, _ in report["requests"]]
    stalls = report["stalls"]
    lateness = report["lateness"]
    figures: dict[str, float] = {
        "server p50 ms": percentile(durations, 0.5) * 1000,
        "server p99 ms": percentile(durations, 0.99) * 1000,
        "loop lateness p50 ms": percentile(lateness, 0.5) * 1000,
        "loop lateness p99 ms": percentile(lateness, 0.99) * 1000,
        "loop lateness max ms": max(lateness, default=0) * 1000,
        "stalls per s": len(stalls) / seconds,
        "time in stalls %": sum(s["wall"] for s in stalls) / seconds * 100,
    }
    wall = sum(s["wall"] for s in stalls) or 1.0
    running = sum(min(s["loop_cpu"], s["wall"]) for s in stalls)
    queued = sum(min(s["loop_runqueue"], s["wall"] - min(s["loop_cpu"], s["wall"])) for s in stalls)
    figures["stalls: loop running %"] = running / wall * 100
    figures["stalls: of which GC %"] = sum(s["gc"] for s in stalls) / wall * 100
    figures["stalls: runnable, no CPU (machine) %"] = queued / wall * 100
    figures["stalls: blocked (GIL) %"] = max(0.0, wall - running - queued) / wall * 100
    figures["stalls: other threads' CPU %"] = sum(s["others_cpu"] for s in stalls) / wall * 100
    for generation in (0, 1, 2):
        pauses = [end - start for start, end, gen, _ in report["gc_pauses"] if gen == generation]
        figures[f"GC gen{generation} per s"] = len(pauses) / seconds
        figures[f"GC gen{generation} mean ms"] = statistics.fmean(pauses) * 1000 if pauses else 0
        figures[f"GC gen{generation} max ms"] = max(pauses, default=0) * 1000
    figures["objects the collector tracks (not frozen)"] = sum(report["heap"]["generations"])
    figures["objects frozen at start-up"] = report["gc_frozen"]
    figures["objects tracked when a full collection began"] = (
        statistics.fmean(report["gc_full_objects"]) if report["gc_full_objects"] else 0
    )
    figures["GC CPU ms per request"] = report["gc_cpu"] / max(1, len(report["requests"])) * 1000
    figures["GC share of time %"] = (
        sum(end - start for start, end, *_ in report["gc_pauses"]) / seconds * 100
    )
    batches = report["batches"]
    figures["log batches per s"] = len(batches) / seconds
    figures["log rows per batch"] = statistics.fmean(b[2] for b in batches) if batches else 0
    figures["log batch p50 ms"] = percentile([e - s for s, e, _ in batches], 0.5) * 1000
    figures["log batch max ms"] = max((e - s for s, e, _ in batches), default=0) * 1000
    writing = merged([(s, e) for s, e, _ in batches])
    figures["time a batch is being written %"] = sum(e - s for s, e in writing) / seconds * 100
    # The slowest 1% against the middle of the distribution: what they went through.
    stall_spans = merged([(s["end"] - s["wall"], s["end"]) for s in stalls])
    gc_spans = merged([(start, end) for start, end, *_ in report["gc_pauses"]])
    requests = sorted(report["requests"], key=lambda r: r[1] - r[0])
    tail = requests[int(len(requests) * 0.99) :]
    middle = requests[int(len(requests) * 0.45) : int(len(requests) * 0.55)]
    for label, group in (("slowest 1%", tail), ("median 10%", middle)):
        span = sum(end - start for start, end, _ in group) or 1.0
        for name, spans in (
            ("in stalls", stall_spans),
            ("in GC", gc_spans),
            ("beside a log batch", writing),
        ):
            covered = sum(overlap(spans, start, end) for start, end, _ in group)
            figures[f"{label}: {name} %"] = covered / span * 100
    return figures


Variant = tuple[str, Path, dict[str, str]]  # a name, the tree served, extra environment


def run_workloads(
    url: str, key: str, work: Path, seconds: int, probe_url: str, workloads: list[tuple[bool, int]]
) -> list[tuple[harness.Cell, dict[str, float]]]:
    out = []
    for stream, concurrency in workloads:
        common = {"stream": stream, "concurrency": concurrency, "work": work}
        harness.wrk(url, key, "stub", seconds=1, agent="bench/tail/warm-up", **common)  # type: ignore[arg-type]
        cpu = httpx.get(probe_url, timeout=60).json()["cpu"]  # the probe starts afresh
        summary = harness.wrk(url, key, "stub", seconds=seconds, agent="bench/tail", **common)  # type: ignore[arg-type]
        report = httpx.get(probe_url, timeout=60).json()
        cell = harness.cell_of("chatparity", stream, concurrency, summary)
        figures = {
            "worker CPU ms per request": (report["cpu"] - cpu) / max(1, cell.requests) * 1000
        }
        figures.update(analyse(report))
        HEAPS[url] = report["heap"]
        out.append((cell, figures))
        log(
            f"  {cell.workload:18} c={concurrency:<3} {cell.rps:8.0f} req/s p50 {cell.p50_ms:6.2f}"
            f" p99 {cell.p99_ms:7.2f} ms (p99/p50 {cell.p99_ms / cell.p50_ms:.1f}),"
            f" failures {cell.failures}"
        )
    return out


Rounds = dict[str, list[list[tuple[harness.Cell, dict[str, float]]]]]  # variant -> rounds


def table(rounds: Rounds, workloads: list[tuple[bool, int]]) -> str:
    """Medians over rounds, a column per workload and variant."""
    columns = [
        (variant, index, f"{variant}: {'stream' if s else 'non-stream'} c={c}")
        for index, (s, c) in enumerate(workloads)
        for variant in rounds
    ]
    lines = ["| measure | " + " | ".join(c[2] for c in columns) + " |"]
    lines.append("|---|" + "---:|" * len(columns))

    def row(name: str, pick: Any, digits: int = 2) -> None:
        values = [
            statistics.median(pick(one[index]) for one in rounds[variant])
            for variant, index, _ in columns
        ]
        lines.append(f"| {name} | " + " | ".join(f"{v:,.{digits}f}" for v in values) + " |")

    row("wrk req/s", lambda c: c[0].rps, 0)
    row("wrk p50 ms", lambda c: c[0].p50_ms)
    row("wrk p99 ms", lambda c: c[0].p99_ms)
    row("wrk p99 / p50", lambda c: c[0].p99_ms / c[0].p50_ms)
    first = next(iter(rounds.values()))[0][0][1]
    for name in first:
        row(name, lambda c, name=name: c[1][name])
    row("failures", lambda c: c[0].failures, 0)
    return "\n".join(lines)


def parse_variant(text: str) -> Variant:
    """``name[@tree]:NAME=VALUE,NAME=VALUE``: ``tree`` a checkout of another revision."""
    head, _, settings = text.partition(":")
    name, _, tree = head.partition("@")
    environment = dict(setting.split("=", 1) for setting in settings.split(",") if setting)
    return name, Path(tree).resolve() if tree else harness.ROOT, environment


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--duration", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument(
        "--variant",
        action="append",
        type=parse_variant,
        metavar="NAME:VAR=VALUE,...",
        help="a worker with this environment; several are measured in alternating rounds",
    )
    parser.add_argument("--workloads", default="0:32,1:32,0:1", help="stream:concurrency,...")
    args = parser.parse_args()
    variants: list[Variant] = args.variant or [("defaults", harness.ROOT, {})]
    workloads = [
        (bool(int(stream)), int(concurrency))
        for stream, concurrency in (pair.split(":") for pair in args.workloads.split(","))
    ]
    harness.ensure_wrk()
    harness.raise_file_limit()
    work = Path(tempfile.mkdtemp(prefix="chatparity-tail-"))
    stub_port = harness.free_port()
    stub_url = f"http://127.0.0.1:{stub_port}/v1"
    rounds: Rounds = {name: [] for name, *_ in variants}
    with ExitStack() as stack:
        stack.enter_context(harness.serve(harness.stub_command(stub_port), f"{stub_url}/models"))
        servers = {}
        for name, tree, settings in variants:
            (work / name).mkdir()
            site = harness.make_chatparity(work / name, tree)
            site.add_upstream("stub", stub_url)
            port = harness.free_port()
            command = [PYTHON, "-m", "uvicorn", "tail_probe:application", "--app-dir", str(BENCH)]
            command += ["--host", "127.0.0.1", "--port", str(port), "--lifespan", "off"]
            url = f"http://127.0.0.1:{port}/v1"
            stack.enter_context(
                harness.serve(
                    [*command, *UVICORN_QUIET],
                    f"{url}/models",
                    {"Authorization": f"Bearer {site.key}"},
                    {**site.env, **settings},
                    work / name / "server.log",
                    cwd=tree,
                )
            )
            servers[name] = (url, site.key, f"http://127.0.0.1:{port}/bench/probe")
        for number in range(args.rounds):
            order = variants if number % 2 == 0 else variants[::-1]
            for name, *_ in order:
                log(f"round {number + 1}/{args.rounds}: {name}")
                url, key, probe = servers[name]
                rounds[name].append(run_workloads(url, key, work, args.duration, probe, workloads))
    described = "; ".join(
        f"{name}: {tree.name if tree != harness.ROOT else 'this tree'},"
        f" {', '.join(f'{k}={v}' for k, v in settings.items()) or 'as shipped'}"
        for name, tree, settings in variants
    )
    print(f"\nOne uvicorn worker per variant ({described}); {args.rounds} alternating round(s)")
    print(f"of {args.duration} s; load average {' '.join(f'{x:.1f}' for x in os.getloadavg())}\n")
    print(table(rounds, workloads))
    for name, *_ in variants:
        heap = HEAPS[servers[name][0]]
        print(f"\n{name}, after its last cell: the oldest generation's commonest types:")
        print(", ".join(f"{kind} {count:,}" for kind, count in heap["oldest types"]) or "none")
        print("and the modules in it (not frozen), by package:")
        print(", ".join(f"{package} {count}" for package, count in heap["modules not frozen"]))
    sys.stdout.flush()


if __name__ == "__main__":
    main()
