"""Side-by-side gateway benchmark: direct stub vs chatparity vs LiteLLM, on loopback.

    .venv/bin/python bench/run.py [--duration 10] [--streams 1000] [--skip-litellm]

One command. It installs what it lacks (wrk from apt when root; LiteLLM
pinned in ``bench/.venv-litellm``; matplotlib and py-spy in
``bench/.venv-tools``), starts a fast canonical stub upstream, then measures,
with the same wrk load (non-stream and stream of 20 chunks, at concurrency 1
and 32): the stub directly; chatparity through its ``openai`` backend under
daphne (one worker) and uvicorn (one and two workers), request logging on,
SQLite in a temporary file; the one uvicorn worker again through
``/v1/responses`` (not stored, as chat completions are not) and through
Anthropic's ``/v1/messages``; the LiteLLM
proxy (one worker, no database). Then the memory per open stream with many
concurrent slow streams on one worker, and the local model's tokens/s through
the HTTP stream against raw llama-cpp-python. It writes ``bench/RESULTS.md``,
``bench/results.json`` and ``bench/results.png``.

Quote the ratios, which come from one run on one machine; the absolute numbers
move with whatever else the machine is doing.
"""

from __future__ import annotations

import argparse
import datetime
import importlib.util
import itertools
import json
import os
import platform
import re
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
# (label, ASGI server, workers): every chatparity configuration measured.
CHATPARITY = (
    ("chatparity daphne x1", "daphne", 1),
    ("chatparity uvicorn x1", "uvicorn", 1),
    ("chatparity uvicorn x2", "uvicorn", 2),
    ("chatparity uvicorn x2, NODELAY fix", "uvicorn-nodelay", 2),
)
ONE_WORKER = ("chatparity daphne x1", "chatparity uvicorn x1")
# The same uvicorn worker, loaded through the Responses API and the Messages API instead.
RESPONSES = "chatparity uvicorn x1, /v1/responses"
MESSAGES = "chatparity uvicorn x1, /v1/messages"
OTHER_WIRES = ((RESPONSES, "/v1/responses"), (MESSAGES, "/v1/messages"))
WORKLOADS = ((False, 1), (False, 32), (True, 1), (True, 32))  # (stream, concurrency)


@dataclass
class Target:
    """Something wrk can load: its base URL, key and model name."""

    name: str
    url: str
    key: str
    model: str
    api: harness.Api = harness.CHAT


@dataclass
class Results:
    """Everything one run measured, as written to results.json."""

    title: str
    environment: dict[str, str]
    cells: list[Cell] = field(default_factory=list)
    request_log: dict[str, dict[str, int]] = field(default_factory=dict)
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

    def as_json(self) -> dict[str, object]:
        return {
            "title": self.title,
            "environment": self.environment,
            "cells": [cell.as_dict() for cell in self.cells],
            "request_log": self.request_log,
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


def start_gateways(
    stack: ExitStack, site: Chatparity, stub_url: str, work: Path, litellm: bool
) -> list[Target]:
    """Start every target (stub already up); they idle while another is measured."""
    targets = [Target(DIRECT, stub_url, "sk-stub", harness.STUB_MODEL)]
    auth = {"Authorization": f"Bearer {site.key}"}
    for name, server, workers in CHATPARITY:
        port = harness.free_port()
        url = f"http://127.0.0.1:{port}/v1"
        command = harness.chatparity_command(server, port, workers)
        stack.enter_context(
            harness.serve(command, f"{url}/models", auth, site.env, work / f"{slug(name)}.log")
        )
        targets.append(Target(name, url, site.key, "stub"))
        if name == "chatparity uvicorn x1":
            targets.append(Target(RESPONSES, url, site.key, "stub", harness.RESPONSES))
            targets.append(Target(MESSAGES, url, site.key, "stub", harness.MESSAGES))
    if litellm:
        port = harness.free_port()
        url = f"http://127.0.0.1:{port}/v1"
        config = work / "litellm.yaml"
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
            harness.serve(command, f"{url}/models", auth, env, work / "litellm.log")
        )
        targets.append(Target(LITELLM, url, master, "stub"))
    return targets


def slug(name: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")


def gateways(
    results: Results, targets: list[Target], seconds: int, work: Path, stub_stats: str
) -> None:
    """Every workload, each target in turn, so drift hits them alike."""
    for stream, concurrency in WORKLOADS:
        for target in targets:
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
            results.cells.append(cell)
            log(
                f"  {target.name:24} {cell.workload:18} c={concurrency:<3} {cell.rps:9.1f} req/s"
                f"  p50 {cell.p50_ms:8.2f} ms  p99 {cell.p99_ms:8.2f} ms  failures"
                f" {cell.failures}"
            )


def memory(results: Results, site: Chatparity, count: int, slow_url: str, work: Path) -> None:
    """``count`` concurrent slow streams on one fresh worker of each ASGI server."""
    auth = {"Authorization": f"Bearer {site.key}"}
    control = slow_url.removesuffix("/v1") + "/bench"
    for server in ("daphne", "uvicorn"):
        name = f"chatparity {server} x1"
        port = harness.free_port()
        url = f"http://127.0.0.1:{port}/v1"
        command = harness.chatparity_command(server, port)
        log_file = work / f"memory-{server}.log"
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
        "| target | workload | conc. | req/s | p50 ms | p99 ms | p50 added over direct, ms"
        " | req/s vs LiteLLM | failures | upstream connections per request |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for stream, concurrency in WORKLOADS:
        direct = results.cell(DIRECT, stream, concurrency)
        litellm = results.cell(LITELLM, stream, concurrency)
        for cell in (
            c for c in results.cells if (c.stream, c.concurrency) == (stream, concurrency)
        ):
            added = f"{cell.p50_ms - direct.p50_ms:+.2f}" if direct and cell is not direct else ""
            versus = (
                _ratio(cell.rps / litellm.rps)
                if litellm and cell.target.startswith("chatparity")
                else ""
            )
            reuse = (
                f"{cell.upstream_connections / cell.upstream_requests:.2f}"
                if cell is not direct and cell.upstream_requests
                else ""
            )
            lines.append(
                f"| {cell.target} | {cell.workload} | {concurrency} | {cell.rps:,.0f} |"
                f" {cell.p50_ms:.2f} | {cell.p99_ms:.2f} | {added} | {versus} | {cell.failures} |"
                f" {reuse} |"
            )
    return lines


def targets_table(results: Results) -> list[str]:
    """The issue's targets, each against every one-worker configuration."""
    lines = ["| target | configuration | measured | met |", "|---|---|---|:---:|"]

    def row(goal: str, name: str, measured: str, met: bool) -> None:
        lines.append(f"| {goal} | {name} | {measured} | {'yes' if met else '**no**'} |")

    for name in ONE_WORKER:
        direct, cell = results.cell(DIRECT, False, 1), results.cell(name, False, 1)
        if direct and cell:
            added = cell.p50_ms - direct.p50_ms
            row(
                "added p50 over direct, c=1, non-stream, logging on: <= 1 ms",
                name,
                f"{added:.2f} ms",
                added <= 1.0,
            )
    for name in ONE_WORKER:
        for stream in (False, True):
            cell, litellm = results.cell(name, stream, 32), results.cell(LITELLM, stream, 32)
            if cell and litellm:
                ratio = cell.rps / litellm.rps
                row(
                    f"req/s at c=32, {cell.workload}: >= 10x LiteLLM",
                    name,
                    f"{ratio:.2f}x ({cell.rps:.0f} vs {litellm.rps:.0f})",
                    ratio >= 10,
                )
    for (wire, path), (stream, concurrency) in itertools.product(OTHER_WIRES, WORKLOADS):
        chat = results.cell("chatparity uvicorn x1", stream, concurrency)
        other = results.cell(wire, stream, concurrency)
        direct = results.cell(DIRECT, stream, concurrency)
        if chat and other and direct:
            ratio = other.rps / chat.rps
            added = [cell.p50_ms - direct.p50_ms for cell in (chat, other)]
            row(
                f"{path} within 10% of chat completions, {chat.workload}, c={concurrency}",
                wire,
                f"{ratio:.2f}x req/s, added p50 {added[1]:+.2f} vs {added[0]:+.2f} ms",
                ratio >= 0.9 and added[1] <= added[0] * 1.1 + 0.05,
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


def report(results: Results, seconds: int, chart: bool) -> str:
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
        " uvicorn: `--workers 1|2 --lifespan off --no-access-log`.",
        "- `chatparity uvicorn x2, NODELAY fix`: the same two workers through"
        " `bench/uvicorn_nodelay.py`, which works around uvicorn's multi-worker socket bug"
        " (https://github.com/Kludex/uvicorn/issues/3149: with `--workers N` accepted"
        " connections lack TCP_NODELAY, so a keep-alive response written in two parts waits"
        " for the client's delayed ACK, about 40 ms on Linux).",
        "- Upstream connections per request: connections the stub accepted / completions it"
        " served during the cell; 1.00 means no upstream connection was reused.",
        "- LiteLLM: `litellm[proxy]` from PyPI in `bench/.venv-litellm`, `--num_workers 1`,"
        " no database, a master key (keys are checked on both sides), pointed at the same stub"
        " (its own venv brings uvloop).",
        "",
        "## Requests",
        "",
        *main_table(results),
        "",
    ]
    if chart:
        out += ["![requests/s and p50 latency per target and workload](results.png)", ""]
    out += ["## Targets", "", *targets_table(results), ""]
    if results.memory:
        out += [
            "## Memory per open stream",
            "",
            "One fresh worker; a short warm-up; then concurrent slow streams through the"
            " `openai` backend to the stub, which trickles a chunk a second and holds every"
            " stream open until all are open and RSS was sampled. Per stream = (RSS with all"
            " open - RSS before) / streams. Dropped = not ending with HTTP 200, no error frame"
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
    parser.add_argument("--streams", type=int, default=1000, help="slow streams, memory test")
    parser.add_argument("--tokens", type=int, default=200, help="local model tokens per run")
    parser.add_argument("--skip-litellm", action="store_true")
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
    site = harness.make_chatparity(work)
    stub_port, slow_port = harness.free_port(), harness.free_port()
    stub_url = f"http://127.0.0.1:{stub_port}/v1"
    slow_url = f"http://127.0.0.1:{slow_port}/v1"
    site.add_upstream("stub", stub_url)
    site.add_upstream("slow", slow_url)
    results = Results(
        title=f"chatparity vs LiteLLM vs direct, {env['cpu']}, {env['date']}", environment=env
    )
    with ExitStack() as stubs:
        stubs.enter_context(harness.serve(harness.stub_command(stub_port), f"{stub_url}/models"))
        slow = harness.stub_command(slow_port, "--hold")
        stubs.enter_context(harness.serve(slow, f"{slow_url}/models"))
        with ExitStack() as servers:
            targets = start_gateways(servers, site, stub_url, work, litellm)
            stats = stub_url.removesuffix("/v1") + "/bench/stats"
            step("Gateways", lambda: gateways(results, targets, args.duration, work, stats))
        for name, *_ in CHATPARITY:
            results.request_log[name] = site.request_log(f"bench/{name}/")
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
    text = report(results, args.duration, drawn.returncode == 0)
    kept = harness.kept_section(args.out)  # the HTTP clients compared, bench/transports.py's
    args.out.write_text(text + ("\n" + kept if kept else ""))
    print(text)
    log(f"Wrote {args.out}, {data} and {chart}; server logs in {work}")


if __name__ == "__main__":
    main()
