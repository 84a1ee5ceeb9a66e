"""Routing beside LiteLLM's router: the cost of a choice, and three stub upstreams under
the same load, weights and strategies.

    .venv/bin/python bench/routing.py [--duration 10] [--concurrency 32] [--workers 1]
        [--strategies weighted least_busy lowest_latency] [--skip-litellm]
        [--selection-only] [--calls 200000]

1. **The cost of a choice**, in process: ``routing.choose`` for each strategy over three
   deployments, and ``Route._pick`` (tiers, availability, the session, the strategy)
   over a snapshot of their state, each call timed on its own (``perf_counter_ns``):
   p50 and p99 in µs (the target: p99 at most 50 µs).
2. **Side by side**: three stubs (``bench/stub_upstream.py``): *fast*; *slow*, ten times
   the first token's delay (10 ms against 1 ms); *limited*, which answers 429
   ``Retry-After: 5`` to everything for 8 s from the start of each measured cell (then
   recovers). chatparity (uvicorn, ``--workers``; one worker: SQLite and local memory,
   more: PostgreSQL and Redis of the bench's own) serves an alias of the three, and
   LiteLLM's proxy (``bench/.venv-litellm``, the version ``bench/run.py`` pins, one
   worker, no database, its router's retries and cooldowns on) the same three, with
   the weights 1:2:1, for each strategy both have: weighted (LiteLLM's
   ``simple-shuffle`` honours ``weight``), least busy (``least-busy``), lowest latency
   (``latency-based-routing``). wrk, non-stream, ``--concurrency`` for ``--duration``
   seconds per cell after a warm-up of 2 s: req/s, p50, p99, failures (non-2xx,
   socket errors, bad bodies), the split the stubs saw, and the 429s the limited stub
   answered (the first, those already on their way, one trial per Retry-After: the
   rest did not wait it out).

Writes ``bench/ROUTING.md``. The figures need a quiet machine (the load average is
printed with them): run it alone.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path

import harness
import httpx
from harness import BENCH, log

STUBS = {  # name: (weight, stub options)
    "fast": (1.0, ("--first-token-delay", "0.001")),
    "slow": (2.0, ("--first-token-delay", "0.01")),
    "limited": (1.0, ("--first-token-delay", "0.001")),
}
LITELLM_STRATEGY = {
    "weighted": "simple-shuffle",
    "least_busy": "least-busy",
    "lowest_latency": "latency-based-routing",
}


# -- 1. the cost of a choice -------------------------------------------------------


@dataclass
class Timing:
    name: str
    p50_us: float
    p99_us: float


def timed(name: str, call: Callable[[], object], calls: int) -> Timing:
    """``call()`` ``calls`` times, each timed on its own (the timer's own cost, about
    0.1 µs, included)."""
    clock = time.perf_counter_ns
    samples = []
    for _ in range(calls):
        started = clock()
        call()
        samples.append(clock() - started)
    samples.sort()
    return Timing(name, samples[len(samples) // 2] / 1000, samples[int(len(samples) * 0.99)] / 1000)


def selection(calls: int) -> list[Timing]:
    """What choosing costs in process, for each strategy: ``choose`` alone, and the whole
    choice of ``Route._pick`` over a snapshot of three deployments' state."""
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "project.settings")
    sys.path.insert(0, str(harness.ROOT))
    import django

    django.setup()
    from chatparity.accounting.deployments import Health, Snapshot, scope
    from chatparity.gateway import routing
    from chatparity.models import Deployment, ModelAlias

    deployments = [
        Deployment(pk=index + 1, alias_id=1, name=name, weight=weight, requests_per_minute=600)
        for index, (name, (weight, _)) in enumerate(STUBS.items())
    ]
    healths = [
        Health(in_flight=3, used_requests=120, samples=(90.0, 100.0, 110.0) * 6),
        Health(in_flight=1, used_requests=80, samples=(900.0, 1000.0, 1100.0) * 6),
        Health(in_flight=2, used_requests=200, samples=()),
    ]
    candidates = [routing.Candidate(d, h) for d, h in zip(deployments, healths, strict=True)]
    snapshot = Snapshot(
        time.time(), {scope(d): h for d, h in zip(deployments, healths, strict=True)}, 12345
    )
    timings = []
    for strategy in LITELLM_STRATEGY:
        sequence = iter(range(10**9))
        timings.append(
            timed(
                f"choose, {strategy}",
                lambda s=strategy, n=sequence: routing.choose(
                    s, candidates, routing.position(next(n))
                ),
                calls,
            )
        )
        route = object.__new__(routing.Route)
        route.alias = ModelAlias(pk=1, public_id="bench", routing=strategy)
        route.accounting = type("Accounting", (), {"estimate": None})()
        route.group = routing.Group((tuple(deployments),), sticky=False)
        route.failures, route.skipped, route.waiting = set(), set(), set()
        timings.append(timed(f"Route._pick, {strategy}", lambda r=route: r._pick(snapshot), calls))
    timings.append(one_deployment(calls))
    return timings


def one_deployment(calls: int) -> Timing:
    """The whole routing stage of a request to an alias of one deployment (what every
    alias of one backend now goes through): the route made, its deployment asked, its
    first event told; nothing read or kept (bench/run.py's one-deployment alias)."""
    from chatparity.accounting.ledger import Accounting
    from chatparity.accounting.record import UsageRecord
    from chatparity.backends import serves_chat
    from chatparity.gateway import routing
    from chatparity.models import Backend, ModelAlias

    backend = Backend(pk=1, name="stub", kind="openai", base_url="http://127.0.0.1:9/v1")
    alias = ModelAlias(pk=2, public_id="stub", backend=backend, model="stub-model")

    async def measure() -> Timing:
        clock = time.perf_counter_ns
        samples = []
        for _ in range(calls):
            accounting = Accounting(UsageRecord(request_id="req_bench"))
            started = clock()
            route = routing.Route(alias, accounting, serves_chat)
            await route.next()
            route.answered()
            samples.append(clock() - started)
        samples.sort()
        return Timing(
            "the stage, one deployment",
            samples[len(samples) // 2] / 1000,
            samples[int(len(samples) * 0.99)] / 1000,
        )

    return asyncio.run(measure())


# -- 2. side by side -------------------------------------------------------------------


@dataclass
class Cell:
    gateway: str
    strategy: str
    rps: float
    p50_ms: float
    p99_ms: float
    failures: int
    split: dict[str, float] = field(default_factory=dict)
    limited: int = 0  # 429s the limited stub answered during the cell


def stub_stats(ports: dict[str, int]) -> dict[str, dict]:
    return {
        name: httpx.get(f"http://127.0.0.1:{port}/bench/stats").json()
        for name, port in ports.items()
    }


def cell(gateway: str, strategy: str, url: str, key: str, ports: dict[str, int],
         args: argparse.Namespace, work: Path) -> Cell:  # fmt: skip
    """One measured wrk run on ``url``, the limited stub refusing from its start."""
    common = {"stream": False, "concurrency": args.concurrency, "work": work}
    agent = f"bench/routing/{gateway}/{strategy}"
    harness.wrk(url, key, "stub", seconds=2, agent=agent + "/warm-up", **common)  # type: ignore[arg-type]
    limit = {"seconds": 8, "retry_after": 5}
    httpx.post(f"http://127.0.0.1:{ports['limited']}/bench/limit", json=limit)
    before = stub_stats(ports)
    summary = harness.wrk(url, key, "stub", seconds=args.duration, agent=agent, **common)  # type: ignore[arg-type]
    after = stub_stats(ports)
    measured = harness.cell_of(gateway, False, args.concurrency, summary)
    served = {name: after[name]["served"] - before[name]["served"] for name in ports}
    total = sum(served.values()) or 1
    return Cell(
        gateway,
        strategy,
        measured.rps,
        measured.p50_ms,
        measured.p99_ms,
        measured.failures,
        {name: count / total for name, count in served.items()},
        after["limited"]["limited"] - before["limited"]["limited"],
    )


ALIAS_CODE = """
from chatparity.models import Backend, Deployment, ModelAlias
stubs = {stubs!r}
backends = {{name: Backend.objects.create(name=name, kind="openai", base_url=url,
             secret="sk-stub", options={{"retries": 0}}) for name, (url, _) in stubs.items()}}
(first, (_, weight)), *others = stubs.items()
alias = ModelAlias.objects.create(public_id="stub", backend=backends[first], model="stub-model")
Deployment.objects.filter(alias=alias).update(weight=weight)
for name, (_, weight) in others:
    Deployment.objects.create(alias=alias, backend=backends[name], model="stub-model",
                              weight=weight)
"""


def chatparity_cells(args: argparse.Namespace, ports: dict[str, int], work: Path,
                     stack: ExitStack) -> list[Cell]:  # fmt: skip
    services = stack.enter_context(harness.services(work)) if args.workers > 1 else None
    (work / "site").mkdir()
    site = harness.make_chatparity(work / "site", services=services)
    stubs = {name: (f"http://127.0.0.1:{port}/v1", STUBS[name][0]) for name, port in ports.items()}
    site.manage("shell", "--no-imports", "-c", ALIAS_CODE.format(stubs=stubs))
    port = harness.free_port()
    url = f"http://127.0.0.1:{port}/v1"
    command = harness.chatparity_command("uvicorn", port, args.workers)
    auth = {"Authorization": f"Bearer {site.key}"}
    cells = []
    with harness.serve(command, f"{url}/models", auth, site.env, work / "chatparity.log"):
        for strategy in args.strategies:
            site.manage(
                "shell", "--no-imports", "-c",
                "from chatparity.models import ModelAlias\n"
                f"ModelAlias.objects.update(routing={strategy!r})\n",
            )  # fmt: skip
            time.sleep(2)  # every worker reads the alias again (CACHE_SECONDS)
            name = f"chatparity uvicorn x{args.workers}"
            cells.append(cell(name, strategy, url, site.key, ports, args, work))
            log(f"  {cells[-1]}")
    return cells


def litellm_cells(args: argparse.Namespace, ports: dict[str, int], work: Path) -> list[Cell]:
    cells = []
    for strategy in args.strategies:
        config = work / f"litellm-{strategy}.yaml"
        lines = ["model_list:"]
        for name, port in ports.items():
            lines += [
                "  - model_name: stub",
                "    litellm_params:",
                f"      model: openai/{harness.STUB_MODEL}",
                f"      api_base: http://127.0.0.1:{port}/v1",
                "      api_key: sk-stub",
                f"      weight: {STUBS[name][0]}",
            ]
        lines += [
            "router_settings:",
            f"  routing_strategy: {LITELLM_STRATEGY[strategy]}",
            "  num_retries: 2",
            "  allowed_fails: 3",
            "  cooldown_time: 5",
        ]
        config.write_text("\n".join(lines) + "\n")
        port = harness.free_port()
        url = f"http://127.0.0.1:{port}/v1"
        master = "sk-bench-" + os.urandom(16).hex()
        env = {**os.environ, "LITELLM_MASTER_KEY": master, "LITELLM_LOCAL_MODEL_COST_MAP": "True",
               "LITELLM_TELEMETRY": "False", "LITELLM_LOG": "ERROR"}  # fmt: skip
        command = [str(harness.LITELLM_VENV / "bin" / "litellm"), "--config", str(config),
                   "--host", "127.0.0.1", "--port", str(port), "--num_workers", "1"]  # fmt: skip
        auth = {"Authorization": f"Bearer {master}"}
        with harness.serve(command, f"{url}/models", auth, env, work / f"litellm-{strategy}.log"):
            cells.append(cell("LiteLLM proxy x1", strategy, url, master, ports, args, work))
            log(f"  {cells[-1]}")
    return cells


# -- the report --------------------------------------------------------------------------


def report(timings: list[Timing], cells: list[Cell], args: argparse.Namespace) -> str:
    load = " ".join(f"{value:.2f}" for value in os.getloadavg())
    lines = [
        "# Routing beside LiteLLM's router",
        "",
        f"Produced by `bench/routing.py` on {datetime.datetime.now(datetime.UTC):%Y-%m-%d %H:%M}"
        f" UTC, {os.cpu_count()} cores, load average {load} at the end (quote the figures only"
        " from a run on a quiet machine).",
        "",
        "## The cost of a choice (in process)",
        "",
        "| what | p50 µs | p99 µs |",
        "|---|---:|---:|",
        *(f"| {t.name} | {t.p50_us:.2f} | {t.p99_us:.2f} |" for t in timings),
    ]
    if cells:
        weights = ", ".join(f"{name} {weight:g}" for name, (weight, _) in STUBS.items())
        lines += [
            "",
            "## Three upstreams, the same load",
            "",
            f"Weights {weights}; wrk non-stream, {args.concurrency} at a time,"
            f" {args.duration} s a cell; the limited stub answers 429 `Retry-After: 5` for the"
            " cell's first 8 s.",
            "",
            "| gateway | strategy | req/s | p50 ms | p99 ms | failures | split fast / slow /"
            " limited | 429s the limited stub answered |",
            "|---|---|---:|---:|---:|---:|---|---:|",
        ]
        for c in cells:
            split = " / ".join(f"{c.split.get(name, 0):.1%}" for name in STUBS)
            lines.append(
                f"| {c.gateway} | {c.strategy} | {c.rps:,.0f} | {c.p50_ms:.2f} |"
                f" {c.p99_ms:.2f} | {c.failures} | {split} | {c.limited} |"
            )
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--duration", type=int, default=10)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--strategies", nargs="+", default=list(LITELLM_STRATEGY))
    parser.add_argument("--calls", type=int, default=200_000)
    parser.add_argument("--skip-litellm", action="store_true")
    parser.add_argument("--selection-only", action="store_true")
    parser.add_argument("--out", type=Path, default=BENCH / "ROUTING.md")
    args = parser.parse_args()

    log("== The cost of a choice")
    timings = selection(args.calls)
    for timing in timings:
        log(f"  {timing.name}: p50 {timing.p50_us:.2f} µs, p99 {timing.p99_us:.2f} µs")
    cells: list[Cell] = []
    if not args.selection_only:
        harness.ensure_wrk()
        if not args.skip_litellm:
            harness.ensure_litellm()
        harness.raise_file_limit()
        work = Path(tempfile.mkdtemp(prefix="chatparity-routing-"))
        log(f"Work directory (databases, server logs): {work}")
        with ExitStack() as stack:
            ports = {name: harness.free_port() for name in STUBS}
            for name, port in ports.items():
                command = harness.stub_command(port, *STUBS[name][1])
                stack.enter_context(harness.serve(command, f"http://127.0.0.1:{port}/v1/models"))
            log("== chatparity")
            cells += chatparity_cells(args, ports, work, stack)
            if not args.skip_litellm:
                log("== LiteLLM")
                cells += litellm_cells(args, ports, work)
    text = report(timings, cells, args)
    args.out.write_text(text)
    print(text)
    log(f"Wrote {args.out}")
    if cells:
        log(f"median req/s: {statistics.median(c.rps for c in cells):,.0f}")


if __name__ == "__main__":
    main()
