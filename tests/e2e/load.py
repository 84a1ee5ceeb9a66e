"""Load with faults, and the proof that nothing is lost.

Several uvicorn workers on one PostgreSQL and one Redis serve mixed stream and
non-stream requests through a fast loopback upstream; a fifth of the streaming
clients hang up at a random chunk, and some requests go to an alias whose
upstream always fails (injected 502s). Afterwards it checks, straight in the
database: exactly one RequestLog row per request, the tokens in each row equal
to what its client received (at least that many for a hang-up), no 5xx that
was not injected, no upstream request still open, no worker growing threads
from one round to the next; and that a per-minute rate limit shared by the
workers never admits more than 1% over it.

The suite runs a short form (``tests/e2e/test_load.py``); the long form is

    .venv/bin/python -m tests.e2e.load --requests 3000 [--workers 2] [--concurrency 64]

on the PostgreSQL and Redis of ``DATABASE_URL`` / ``REDIS_URL``, or on servers it
starts itself.
"""

import argparse
import asyncio
import json
import os
import random
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from tests import services
from tests.backends import faulty_upstream

ROOT = Path(__file__).resolve().parents[2]
RATE_LIMIT = 50  # requests per minute of the rate-limited key


@dataclass
class Outcome:
    """One request as its client saw it."""

    kind: str  # "plain", "stream", "hang-up" or "failing"
    status: int
    request_id: str
    chunks: int = 0  # content deltas received
    completion_tokens: int | None = None  # from the usage the client received


@dataclass
class Report:
    requests: int = 0
    hang_ups: int = 0
    cancelled: int = 0  # rows the server logged as cancelled
    injected: int = 0
    rows: int = 0
    statuses: Counter = field(default_factory=Counter)
    admitted: int = 0
    limited_requests: int = 0
    over_admission: float = 0.0
    threads: list[tuple[int, ...]] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)

    def table(self) -> str:
        return "\n".join(
            [
                "| requests | hang-ups | logged cancelled | injected failures | log rows |"
                " statuses | rate-limited burst | admitted | over-admission |"
                " worker threads by round |",
                "|---:|---:|---:|---:|---:|---|---:|---:|---:|---|",
                f"| {self.requests} | {self.hang_ups} | {self.cancelled} | {self.injected} |"
                f" {self.rows} |"
                f" {dict(sorted(self.statuses.items()))} | {self.limited_requests} |"
                f" {self.admitted} (limit {RATE_LIMIT}) | {self.over_admission:.1%} |"
                f" {self.threads} |",
            ]
        )


def _manage(env: dict[str, str], *args: str) -> str:
    command = [sys.executable, "manage.py", *args]
    return subprocess.run(
        command, cwd=ROOT, env=env, check=True, capture_output=True, text=True
    ).stdout


def _setup(env: dict[str, str], upstream_url: str) -> tuple[str, str]:
    """Migrate; create the aliases; return a key without limits and a rate-limited one."""
    _manage(env, "migrate", "--verbosity", "0")
    _manage(
        env,
        "shell",
        "-c",
        "from chatparity.models import Backend, ModelAlias\n"
        f"fast = Backend.objects.create(name='fast', kind='openai', base_url='{upstream_url}',"
        " options={'retries': 0})\n"
        "ModelAlias.objects.create(public_id='load', backend=fast, model='long')\n"
        "ModelAlias.objects.create(public_id='failing', backend=fast, model='server-error')\n",
    )
    key = _manage(env, "createapikey", "load").strip()
    limited = _manage(env, "createapikey", "limited").strip()
    _manage(
        env,
        "shell",
        "-c",
        "from chatparity.models import ApiKey\n"
        f"ApiKey.objects.filter(name='limited').update(requests_per_minute={RATE_LIMIT})\n",
    )
    return key, limited


@contextmanager
def _workers(env: dict[str, str], count: int, log: Path) -> Iterator[list[tuple[str, int]]]:
    """``count`` uvicorn workers (one process each); their URLs and process ids. Stopped
    with SIGTERM, uvicorn finishes what is in flight, log rows included."""
    with ExitStack() as stack:
        workers = []
        for _ in range(count):
            port = services.free_port()
            output = stack.enter_context(log.with_suffix(f".{port}.log").open("wb"))
            process = subprocess.Popen(
                [sys.executable, "-m", "uvicorn", "--host", "127.0.0.1", "--port", str(port),
                 "--lifespan", "off", "--no-access-log", "project.asgi:application"],
                cwd=ROOT, env=env, stdout=output, stderr=output,
            )  # fmt: skip
            stack.callback(process.wait, 30)
            stack.callback(process.terminate)
            services._wait_for_port(port, process)
            workers.append((f"http://127.0.0.1:{port}", process.pid))
        yield workers


def _threads(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("Threads:"):
            return int(line.split()[1])
    raise RuntimeError(f"no thread count for {pid}")


async def _one(client: httpx.AsyncClient, url: str, key: str, kind: str, rng: random.Random):
    body = {"model": "failing" if kind == "failing" else "load", "messages": [
        {"role": "user", "content": "Hi"}]}  # fmt: skip
    if kind in ("stream", "hang-up"):
        body |= {"stream": True, "stream_options": {"include_usage": True}}
    headers = {"Authorization": f"Bearer {key}"}
    hang_up_after = rng.randint(1, faulty_upstream.LONG_CHUNKS - 1)
    async with client.stream(
        "POST", f"{url}/v1/chat/completions", json=body, headers=headers
    ) as response:
        outcome = Outcome(kind, response.status_code, response.headers["x-request-id"])
        if not body.get("stream") or response.status_code != 200:
            payload = json.loads(await response.aread())
            if response.status_code == 200:
                outcome.completion_tokens = payload["usage"]["completion_tokens"]
            return outcome
        async for line in response.aiter_lines():
            if not line.startswith("data: {"):
                continue
            chunk = json.loads(line[6:])
            if chunk.get("usage"):
                outcome.completion_tokens = chunk["usage"]["completion_tokens"]
            elif chunk.get("choices") and chunk["choices"][0]["delta"].get("content"):
                outcome.chunks += 1
                if kind == "hang-up" and outcome.chunks == hang_up_after:
                    return outcome  # leaving the block closes the connection mid-stream
        return outcome


async def _drive(urls: list[str], key: str, requests: int, concurrency: int, seed: int):
    """``requests`` mixed requests, ``concurrency`` at a time, spread over the workers."""
    rng = random.Random(seed)
    kinds = rng.choices(["plain", "stream", "failing"], weights=[40, 55, 5], k=requests)
    kinds = [
        "hang-up" if kind == "stream" and rng.random() < 0.2 / 0.55 else kind for kind in kinds
    ]
    queue = list(enumerate(kinds))
    outcomes: list[Outcome] = []
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)

    async def client_task(client: httpx.AsyncClient) -> None:
        while queue:
            index, kind = queue.pop()
            outcomes.append(await _one(client, urls[index % len(urls)], key, kind, rng))

    async with httpx.AsyncClient(timeout=60, limits=limits) as client:
        await asyncio.gather(*(client_task(client) for _ in range(concurrency)))
    return outcomes


async def _burst(urls: list[str], key: str, requests: int) -> int:
    """``requests`` at once on a rate-limited key; how many were admitted."""
    # One minute window: start early in a minute.
    if time.time() % 60 > 40:
        await asyncio.sleep(60 - time.time() % 60 + 0.5)
    async with httpx.AsyncClient(timeout=60) as client:
        body = {"model": "load", "messages": [{"role": "user", "content": "Hi"}]}
        responses = await asyncio.gather(
            *(
                client.post(
                    f"{urls[i % len(urls)]}/v1/chat/completions",
                    json=body,
                    headers={"Authorization": f"Bearer {key}"},
                )
                for i in range(requests)
            )
        )
    statuses = Counter(response.status_code for response in responses)
    assert set(statuses) <= {200, 429}, statuses
    return statuses[200]


def _rows(database_url: str) -> dict[str, dict]:
    import psycopg
    from psycopg.rows import dict_row

    with psycopg.connect(database_url, row_factory=dict_row) as connection:
        rows = connection.execute("SELECT * FROM chatparity_requestlog").fetchall()
    found: dict[str, dict] = {}
    for row in rows:
        if row["request_id"] in found:
            found[row["request_id"]]["duplicates"] = True
        found[row["request_id"]] = row
    return found


def check(outcomes: list[Outcome], rows: dict[str, dict]) -> list[str]:
    """What is wrong between what the clients saw and what the log holds."""
    problems = []
    for outcome in outcomes:
        row = rows.get(outcome.request_id)
        if row is None:
            problems.append(f"{outcome.request_id} ({outcome.kind}): no log row")
            continue
        if row.get("duplicates"):
            problems.append(f"{outcome.request_id}: more than one log row")
        expected_status = 502 if outcome.kind == "failing" else 200
        if outcome.status != expected_status or row["status_code"] != expected_status:
            problems.append(
                f"{outcome.request_id} ({outcome.kind}): status {outcome.status}, logged"
                f" {row['status_code']}, expected {expected_status}"
            )
        if outcome.kind == "hang-up":
            # The server may have sent it all before it saw the hang-up: then it is
            # a whole answer, not a cancelled one.
            whole = row["completion_tokens"] == faulty_upstream.LONG_CHUNKS
            if row["completion_tokens"] < outcome.chunks or not (row["cancelled"] or whole):
                problems.append(
                    f"{outcome.request_id}: hang-up logged cancelled={row['cancelled']} with"
                    f" {row['completion_tokens']} tokens, client received {outcome.chunks}"
                )
        elif outcome.kind != "failing" and row["completion_tokens"] != outcome.completion_tokens:
            problems.append(
                f"{outcome.request_id} ({outcome.kind}): logged {row['completion_tokens']}"
                f" tokens, client received {outcome.completion_tokens}"
            )
        if outcome.kind == "stream" and outcome.chunks != outcome.completion_tokens:
            problems.append(f"{outcome.request_id}: {outcome.chunks} chunks, usage disagrees")
    return problems


def run(
    server_url: str, redis_url: str, *, requests: int, workers: int = 2, concurrency: int = 64
) -> Report:
    """The whole proof, in two rounds of ``requests // 2``; a report of it."""
    report = Report()
    database_url = services.create_database(server_url, f"chatparity_load_{os.getpid()}")
    env = {**os.environ, "DATABASE_URL": database_url, "REDIS_URL": redis_url, "DEBUG": "0"}
    env["DJANGO_SETTINGS_MODULE"] = "project.settings"
    upstream, stop_upstream = faulty_upstream.start("sk-load")
    work = Path(os.environ.get("TMPDIR", "/tmp")) / f"chatparity-load-{os.getpid()}"
    try:
        key, limited = _setup(env, upstream.base_url)
        with _workers(env, workers, work) as running:
            urls = [url for url, _ in running]
            outcomes: list[Outcome] = []
            for round_ in range(2):
                outcomes += asyncio.run(_drive(urls, key, requests // 2, concurrency, round_))
                report.threads.append(tuple(_threads(pid) for _, pid in running))
            report.limited_requests = RATE_LIMIT * 4
            report.admitted = asyncio.run(_burst(urls, limited, report.limited_requests))
        rows = _rows(database_url)
    finally:
        stop_upstream()
    report.requests = len(outcomes)
    report.hang_ups = sum(outcome.kind == "hang-up" for outcome in outcomes)
    report.cancelled = sum(bool(row["cancelled"]) for row in rows.values())
    report.injected = sum(outcome.kind == "failing" for outcome in outcomes)
    report.statuses = Counter(outcome.status for outcome in outcomes)
    report.rows = len(rows) - report.limited_requests
    report.over_admission = max(0.0, report.admitted / RATE_LIMIT - 1)
    report.problems = check(outcomes, rows)
    if report.rows != report.requests:
        report.problems.append(f"{report.rows} log rows for {report.requests} requests")
    if upstream.in_flight:
        report.problems.append(f"{upstream.in_flight} upstream requests still open")
    if any(after > before + 2 for before, after in zip(*report.threads, strict=True)):
        report.problems.append(f"worker threads grew from round to round: {report.threads}")
    if report.over_admission > 0.01:
        report.problems.append(f"rate limit over-admitted {report.over_admission:.1%}")
    return report


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=3000)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--concurrency", type=int, default=64)
    args = parser.parse_args()
    with services.postgres() as server_url, services.redis() as redis_url:
        started = time.monotonic()
        report = run(
            server_url, redis_url, requests=args.requests, workers=args.workers,
            concurrency=args.concurrency,
        )  # fmt: skip
    print(report.table())
    print(f"\n{time.monotonic() - started:.0f} s; {len(report.problems)} problems")
    for problem in report.problems[:50]:
        print(" -", problem)
    sys.exit(1 if report.problems else 0)


if __name__ == "__main__":
    main()
