"""The response cache's cost, through HTTP on one uvicorn worker of the example project.

One request at a time, on one keep-alive connection, the kinds taking turns within
each round: ``GET /v1/models`` (a key checked, a row logged, no model asked), then chat
completions through an ``openai`` alias at the fast stub upstream
(``bench/stub_upstream.py``, 20 chunks): a **hit** (the same request again, answered
from the cache), a **miss** (a new request each time on an alias with the cache on:
looked up, asked upstream, kept) and **no cache** (the same new requests on an alias
without one). The targets (issue 36): a hit adds at most 1 ms p50 to ``/v1/models``; a
miss costs at most 5% more than no cache. The store is a Redis of the bench's own (the
production setup), or this process's memory with ``--store memory``.

    python bench/response_cache.py [--requests 1000] [--rounds 3] [--store redis]

Prints the table. The figures need a quiet machine: it says the load average it
started under (above 1.5, quote none of them).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import tempfile
import time
from collections.abc import Callable
from contextlib import ExitStack
from pathlib import Path

import harness
import httpx
from harness import log

KINDS = ("models", "hit", "miss", "no cache")
FILLED = "Say something."  # the request the hits repeat
QUIET_LOAD = 1.5


def _redis(stack: ExitStack, work: Path) -> str:
    port = harness.free_port()
    server = subprocess.Popen(
        ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "",
         "--appendonly", "no", "--dir", str(work)],
        stdout=subprocess.DEVNULL,
    )  # fmt: skip
    stack.callback(server.wait)
    stack.callback(server.terminate)
    deadline = time.monotonic() + 10
    while subprocess.run(["redis-cli", "-p", str(port), "ping"], capture_output=True).returncode:
        if time.monotonic() > deadline:
            raise RuntimeError("redis-server did not start")
        time.sleep(0.05)
    return f"redis://127.0.0.1:{port}/0"


def _site(work: Path, stub_url: str, store: str) -> harness.Chatparity:
    """The example project on SQLite, with aliases ``plain`` (no cache) and ``cached``."""
    site = harness.make_chatparity(work)
    if store:
        site.env["CHATPARITY_RESPONSE_CACHE_URL"] = store
    site.add_upstream("plain", stub_url)
    code = (
        "from chatparity.models import ModelAlias\n"
        "plain = ModelAlias.objects.get(public_id='plain')\n"
        "ModelAlias.objects.create(public_id='cached', backend=plain.backend,"
        " model=plain.model, response_cache={'enabled': True})\n"
    )
    site.manage("shell", "--no-imports", "-c", code)
    return site


def _requests(client: httpx.Client, serial: list[int]) -> dict[str, Callable[[], None]]:
    """Each kind as one request, checked."""

    def chat(model: str, text: str, expected: str) -> None:
        body = {"model": model, "messages": [{"role": "user", "content": text}], "temperature": 0}
        response = client.post("/chat/completions", json=body)
        assert response.status_code == 200, response.text
        state = response.headers.get("x-chatparity-cache")
        assert state == expected, (model, state)

    def fresh() -> str:
        serial[0] += 1
        return f"Say something about number {serial[0]}."

    def models() -> None:
        assert client.get("/models").status_code == 200

    return {
        "models": models,
        "hit": lambda: chat("cached", FILLED, "hit"),
        "miss": lambda: chat("cached", fresh(), "miss"),
        "no cache": lambda: chat("plain", fresh(), None),  # type: ignore[arg-type]
    }


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of ``pid`` (its threads included) so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def measure(
    base_url: str, key: str, count: int, rounds: int, server: int
) -> tuple[dict[str, list[float]], dict[str, float]]:
    """Milliseconds per request of each kind, ``count`` a kind a round; and the server's
    CPU milliseconds per request of each kind (less moved by a busy machine)."""
    times: dict[str, list[float]] = {kind: [] for kind in KINDS}
    cpu = dict.fromkeys(KINDS, 0.0)
    headers = {"Authorization": f"Bearer {key}"}
    with httpx.Client(base_url=base_url, headers=headers, timeout=30) as client:
        serial = [0]
        kinds = _requests(client, serial)
        client.post(
            "/chat/completions",
            json={"model": "cached", "messages": [{"role": "user", "content": FILLED}],
                  "temperature": 0},
        )  # fmt: skip
        time.sleep(0.5)  # the entry written
        for kind in KINDS:  # warm-up
            for _ in range(50):
                kinds[kind]()
        for _ in range(rounds):
            for kind in KINDS:
                used = cpu_seconds(server)
                for _ in range(count):
                    started = time.perf_counter()
                    kinds[kind]()
                    times[kind].append((time.perf_counter() - started) * 1000)
                cpu[kind] += cpu_seconds(server) - used
    return times, {kind: seconds * 1000 / (count * rounds) for kind, seconds in cpu.items()}


def table(times: dict[str, list[float]], cpu: dict[str, float]) -> str:
    p50 = {kind: statistics.median(values) for kind, values in times.items()}
    p90 = {kind: statistics.quantiles(values, n=10)[-1] for kind, values in times.items()}
    lines = [
        "| request | p50 ms | p90 ms | server CPU ms/req | |",
        "|---|---:|---:|---:|---|",
    ]
    notes = {
        "hit": f"p50 {p50['hit'] - p50['models']:+.3f} ms over /v1/models (target: at most"
        f" +1 ms); CPU {cpu['hit'] - cpu['models']:+.3f} ms",
        "miss": f"p50 {p50['miss'] / p50['no cache'] - 1:+.1%} over no cache (target: at most"
        f" +5%); CPU {cpu['miss'] / cpu['no cache'] - 1:+.1%}",
    }
    for kind in KINDS:
        lines.append(
            f"| {kind} | {p50[kind]:.3f} | {p90[kind]:.3f} | {cpu[kind]:.3f} |"
            f" {notes.get(kind, '')} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=1000, help="per kind and round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--store", choices=("redis", "memory"), default="redis")
    arguments = parser.parse_args()
    load = os.getloadavg()[0]
    log(
        f"load average {load:.2f}"
        + (" (not quiet: figures not quotable)" if load > QUIET_LOAD else "")
    )
    with ExitStack() as stack:
        work = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="chatparity-rc-")))
        stub_port, port = harness.free_port(), harness.free_port()
        stub_url = f"http://127.0.0.1:{stub_port}/v1"
        stack.enter_context(harness.serve(harness.stub_command(stub_port), f"{stub_url}/models"))
        store = _redis(stack, work) if arguments.store == "redis" else ""
        site = _site(work, stub_url, store)
        url = f"http://127.0.0.1:{port}/v1"
        server = stack.enter_context(
            harness.serve(
                harness.chatparity_command("uvicorn", port),
                f"{url}/models",
                headers={"Authorization": f"Bearer {site.key}"},
                env=site.env,
                log_file=work / "uvicorn.log",
            )
        )
        times, cpu = measure(url, site.key, arguments.requests, arguments.rounds, server.pid)
    end = os.getloadavg()[0]
    print(f"\nstore: {arguments.store}; {arguments.requests} x {arguments.rounds} a kind;"
          f" load average {load:.2f} at the start, {end:.2f} at the end\n")  # fmt: skip
    print(table(times, cpu))


if __name__ == "__main__":
    main()
