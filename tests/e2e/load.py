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

The workers, the client and the log reader are shared with the chaos proof
(``tests/e2e/chaos.py``), which runs the same stack through worse faults.

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
import signal
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

    kind: str  # e.g. "plain", "stream", "hang-up", "failing": what the caller asked
    status: int  # 0: no response (connection refused or reset, timeout)
    request_id: str = ""
    chunks: int = 0  # content deltas received
    completion_tokens: int | None = None  # from the usage the client received
    content: int = 0  # characters of content received
    done: bool = False  # the whole answer arrived: a JSON body, or a stream to its [DONE]
    error: str = ""  # the error type of an error body or frame
    failure: str = ""  # the transport's: connection refused or broken, a timeout
    keepalives: int = 0  # SSE comments received
    first_byte: float | None = None  # seconds from sending to the headers
    seconds: float = 0.0  # from sending to the end (or the hang-up)
    started: float = 0.0  # time.monotonic() at the headers
    ended: float = 0.0  # time.monotonic() at the end
    session: str = ""  # the x-session-id it sent, if any

    @property
    def tokens(self) -> int:
        """Completion tokens received: as the usage said, else one per content delta."""
        return self.chunks if self.completion_tokens is None else self.completion_tokens

    @property
    def empty(self) -> bool:
        """A 200 that ended with neither content nor an error: an answer silently lost."""
        return self.status == 200 and self.done and not self.content and not self.error


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


def manage(env: dict[str, str], *args: str) -> str:
    command = [sys.executable, "manage.py", *args]
    return subprocess.run(
        command, cwd=ROOT, env=env, check=True, capture_output=True, text=True
    ).stdout


def _setup(env: dict[str, str], upstream_url: str) -> tuple[str, str]:
    """Migrate; create the aliases; return a key without limits and a rate-limited one."""
    manage(env, "migrate", "--verbosity", "0")
    manage(
        env,
        "shell",
        "-c",
        "from chatparity.models import Backend, ModelAlias\n"
        f"fast = Backend.objects.create(name='fast', kind='openai', base_url='{upstream_url}',"
        " options={'retries': 0})\n"
        "ModelAlias.objects.create(public_id='load', backend=fast, model='long')\n"
        "ModelAlias.objects.create(public_id='failing', backend=fast, model='server-error')\n",
    )
    key = manage(env, "createapikey", "load").strip()
    limited = manage(env, "createapikey", "limited").strip()
    manage(
        env,
        "shell",
        "-c",
        "from chatparity.models import ApiKey\n"
        f"ApiKey.objects.filter(name='limited').update(requests_per_minute={RATE_LIMIT})\n",
    )
    return key, limited


@dataclass
class Worker:
    """One uvicorn worker of the example project, on a port of its own; SIGTERM lets
    it finish what is in flight, log rows included."""

    env: dict[str, str]
    log: Path
    port: int = field(default_factory=services.free_port)
    process: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def start(self) -> None:
        """Start it (again, on the same port) and wait until it listens."""
        with self.log.with_suffix(f".{self.port}.log").open("ab") as output:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "uvicorn", "--host", "127.0.0.1", "--port",
                 str(self.port), "--lifespan", "off", "--no-access-log",
                 "project.asgi:application"],
                cwd=ROOT, env=self.env, stdout=output, stderr=output,
            )  # fmt: skip
        services._wait_for_port(self.port, self.process)

    def stop(self, sig: int = signal.SIGTERM) -> None:
        """Send ``sig`` (SIGKILL: a crash) and wait for the end."""
        if self.alive:
            assert self.process is not None
            self.process.send_signal(sig)
            self.process.wait(30)

    def status(self, field: str) -> int:
        """A number of /proc/PID/status, e.g. ``Threads``, ``VmRSS`` (KiB)."""
        assert self.process is not None
        for line in Path(f"/proc/{self.process.pid}/status").read_text().splitlines():
            if line.startswith(f"{field}:"):
                return int(line.split()[1])
        raise RuntimeError(f"no {field} for {self.process.pid}")


@contextmanager
def running_workers(env: dict[str, str], count: int, log: Path) -> Iterator[list[Worker]]:
    """``count`` uvicorn workers (one process each), stopped with SIGTERM afterwards."""
    with ExitStack() as stack:
        running = []
        for _ in range(count):
            worker = Worker(env, log)
            stack.callback(worker.stop)
            worker.start()
            running.append(worker)
        yield running


def chat(model: str, *, stream: bool = False, **params: object) -> dict:
    """A chat completion request body."""
    body: dict = {"model": model, "messages": [{"role": "user", "content": "Hi"}], **params}
    if stream:
        body |= {"stream": True, "stream_options": {"include_usage": True}}
    return body


async def call(
    client: httpx.AsyncClient,
    url: str,
    key: str,
    body: dict,
    kind: str,
    *,
    hang_up_after: int | None = None,
    read: float | None = None,
    headers: dict[str, str] | None = None,
) -> Outcome:
    """Send ``body`` (with ``headers`` too) and read the answer as a client does; what it
    saw. ``hang_up_after``: close the connection after that many content deltas;
    ``read``: after that many seconds without the end."""
    outcome = Outcome(kind, 0)
    sent = time.monotonic()
    headers = {**(headers or {}), "Authorization": f"Bearer {key}"}
    try:
        async with (
            asyncio.timeout(read),
            client.stream(
                "POST", f"{url}/v1/chat/completions", json=body, headers=headers
            ) as response,
        ):
            outcome.started = time.monotonic()
            outcome.first_byte = outcome.started - sent
            outcome.status = response.status_code
            outcome.request_id = response.headers.get("x-request-id", "")
            if not response.headers.get("content-type", "").startswith("text/event-stream"):
                _read_whole(outcome, await response.aread())
            else:
                await _read_stream(outcome, response, hang_up_after)
    except (httpx.HTTPError, TimeoutError) as exc:
        outcome.failure = type(exc).__name__
    outcome.ended = time.monotonic()
    outcome.seconds = outcome.ended - sent
    return outcome


def _read_whole(outcome: Outcome, body: bytes) -> None:
    try:
        payload = json.loads(body)
    except ValueError:
        outcome.error = "not JSON"
        return
    outcome.done = True
    if isinstance(payload, dict) and isinstance(payload.get("error"), dict):
        outcome.error = str(payload["error"].get("type"))
    elif isinstance(payload, dict) and payload.get("choices"):
        outcome.content = len(payload["choices"][0]["message"].get("content") or "")
        outcome.completion_tokens = (payload.get("usage") or {}).get("completion_tokens")


async def _read_stream(outcome: Outcome, response: httpx.Response, hang_up_after: int | None):
    async for line in response.aiter_lines():
        if line.startswith(":"):
            outcome.keepalives += 1
        elif line == "data: [DONE]":
            outcome.done = True
        elif line.startswith("data: {"):
            chunk = json.loads(line[6:])
            if isinstance(chunk.get("error"), dict):
                outcome.error = str(chunk["error"].get("type"))
            elif chunk.get("usage"):
                outcome.completion_tokens = chunk["usage"]["completion_tokens"]
            elif chunk.get("choices") and chunk["choices"][0]["delta"].get("content"):
                outcome.chunks += 1
                outcome.content += len(chunk["choices"][0]["delta"]["content"])
                if outcome.chunks == hang_up_after:
                    return  # leaving the block closes the connection mid-stream


async def _one(client: httpx.AsyncClient, url: str, key: str, kind: str, rng: random.Random):
    body = chat("failing" if kind == "failing" else "load", stream=kind in ("stream", "hang-up"))
    hang_up_after = rng.randint(1, faulty_upstream.LONG_CHUNKS - 1)
    return await call(
        client, url, key, body, kind, hang_up_after=hang_up_after if kind == "hang-up" else None
    )


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


def log_rows(database_url: str) -> dict[str, dict]:
    """The request log by request id (``duplicates`` set on a request logged twice)."""
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


def project_env(database_url: str, redis_url: str) -> dict[str, str]:
    """The environment of the example project on these servers."""
    env = {**os.environ, "DATABASE_URL": database_url, "REDIS_URL": redis_url, "DEBUG": "0"}
    return env | {"DJANGO_SETTINGS_MODULE": "project.settings"}


def scratch(name: str) -> Path:
    """A path prefix for this run's files (the workers' logs)."""
    return Path(os.environ.get("TMPDIR", "/tmp")) / f"chatparity-{name}-{os.getpid()}"


def run(
    server_url: str, redis_url: str, *, requests: int, workers: int = 2, concurrency: int = 64
) -> Report:
    """The whole proof, in two rounds of ``requests // 2``; a report of it."""
    report = Report()
    database_url = services.create_database(server_url, f"chatparity_load_{os.getpid()}")
    env = project_env(database_url, redis_url)
    upstream, stop_upstream = faulty_upstream.start("sk-load")
    try:
        key, limited = _setup(env, upstream.base_url)
        with running_workers(env, workers, scratch("load")) as running:
            urls = [worker.url for worker in running]
            outcomes: list[Outcome] = []
            for round_ in range(2):
                outcomes += asyncio.run(_drive(urls, key, requests // 2, concurrency, round_))
                report.threads.append(tuple(worker.status("Threads") for worker in running))
            report.limited_requests = RATE_LIMIT * 4
            report.admitted = asyncio.run(_burst(urls, limited, report.limited_requests))
        rows = log_rows(database_url)
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
