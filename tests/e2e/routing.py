"""The routing proof: uvicorn workers of the example project on one PostgreSQL and one
Redis, an alias of several deployments, each an upstream of its own
(``bench/stub_upstream.py`` in a process: fast, slow to its first token, rate-limited
for a while, holding long streams, or killed with SIGKILL mid-run).

Each scenario starts its stubs and workers on a fresh database, drives requests as
clients send them (``tests/e2e/load.py``'s client) and reports what the clients saw and
what reached each upstream. The suite runs the short forms (``tests/e2e/test_routing.py``);
the long form of the split, as the issue states it, is

    .venv/bin/python -m tests.e2e.routing [--requests 10000] [--workers 1 2 4]

on the PostgreSQL and Redis of ``DATABASE_URL`` / ``REDIS_URL``, or on servers it
starts itself.
"""

import argparse
import asyncio
import contextlib
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
from tests.e2e.load import Outcome, call, chat, manage, project_env, running_workers, scratch
from tests.support.waiting import until

ROOT = Path(__file__).resolve().parents[2]
STUB = ROOT / "bench" / "stub_upstream.py"


@dataclass
class Stub:
    """One upstream: ``bench/stub_upstream.py`` in a process of its own."""

    name: str
    options: tuple[str, ...] = ()
    port: int = field(default_factory=services.free_port)
    process: subprocess.Popen | None = None

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def start(self) -> None:
        command = [sys.executable, str(STUB), "--port", str(self.port), "--chunks", "5",
                   *self.options]  # fmt: skip
        self.process = subprocess.Popen(command, stdout=subprocess.DEVNULL)
        services._wait_for_port(self.port, self.process)

    def stop(self, sig: int = signal.SIGTERM) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(sig)
            self.process.wait(10)

    def stats(self) -> dict:
        return httpx.get(self.base_url.removesuffix("/v1") + "/bench/stats").json()

    def limit(self, seconds: float, retry_after: float) -> None:
        """Answer 429 with ``Retry-After: retry_after`` for ``seconds`` from now."""
        body = {"seconds": seconds, "retry_after": retry_after}
        httpx.post(self.base_url.removesuffix("/v1") + "/bench/limit", json=body)


@contextmanager
def stubs(*specs: tuple[str, tuple[str, ...]]) -> Iterator[dict[str, Stub]]:
    """The stubs ``specs`` (name, options) names, running; stopped on exit."""
    with ExitStack() as stack:
        running = {}
        for name, options in specs:
            stub = Stub(name, options)
            stack.callback(stub.stop)
            stub.start()
            running[name] = stub
        yield running


@dataclass
class Site:
    """The example project on a fresh database: its key and its workers' URLs."""

    env: dict[str, str]
    database_url: str
    key: str
    urls: list[str]

    def shell(self, code: str) -> str:
        return manage(self.env, "shell", "-c", code)

    def rows(self, outcomes: list[Outcome], timeout: float = 15.0) -> dict[str, dict]:
        """The request log by request id, once it has the rows of ``outcomes`` (a worker
        writes a request's row just after its answer)."""
        import psycopg
        from psycopg.rows import dict_row

        wanted = {outcome.request_id for outcome in outcomes}
        deadline = time.monotonic() + timeout
        while True:
            with psycopg.connect(self.database_url, row_factory=dict_row) as connection:
                rows = connection.execute("SELECT * FROM chatparity_requestlog").fetchall()
            found = {row["request_id"]: row for row in rows}
            if wanted <= found.keys() or time.monotonic() > deadline:
                return found
            time.sleep(0.2)


def _deployments_code(alias: str, routing: str, deployments: list[tuple[str, str, float]],
                      sticky: str) -> str:  # fmt: skip
    """Code making ``alias`` of ``deployments`` (backend name, base URL, weight)."""
    lines = ["from chatparity.models import Backend, Deployment, ModelAlias"]
    for name, url, _ in deployments:
        lines.append(
            f"Backend.objects.create(name={name!r}, kind='openai', base_url={url!r},"
            " options={'retries': 0})"
        )
    (first, _, weight), *others = deployments
    lines.append(
        f"alias = ModelAlias.objects.create(public_id={alias!r}, model='stub-model',"
        f" backend=Backend.objects.get(name={first!r}), routing={routing!r},"
        f" sticky_sessions={sticky!r})"
    )
    lines.append(f"Deployment.objects.filter(alias=alias).update(weight={weight!r})")
    for name, _, weight in others:
        lines.append(
            f"Deployment.objects.create(alias=alias, backend=Backend.objects.get(name={name!r}),"
            f" model='stub-model', weight={weight!r})"
        )
    return "\n".join(lines) + "\n"


@contextmanager
def site(
    server_url: str,
    redis_url: str,
    running: dict[str, Stub],
    *,
    weights: dict[str, float],
    routing: str = "weighted",
    sticky: str = "off",
    workers: int = 2,
    then: str = "",
) -> Iterator[Site]:
    """Workers of the example project, the alias ``routed`` served by ``running``'s
    stubs with ``weights`` (by stub name), on a fresh database and an empty Redis;
    ``then``: code run once they are made."""
    from redis import Redis

    with Redis.from_url(redis_url) as client:
        client.flushdb()
    database_url = services.create_database(server_url, f"chatparity_routing_{os.getpid()}")
    env = project_env(database_url, redis_url)
    manage(env, "migrate", "--verbosity", "0")
    deployments = [(name, running[name].base_url, weight) for name, weight in weights.items()]
    manage(env, "shell", "-c", _deployments_code("routed", routing, deployments, sticky) + then)
    key = manage(env, "createapikey", "routing").strip()
    with running_workers(env, workers, scratch("routing")) as live:
        yield Site(env, database_url, key, [worker.url for worker in live])


async def drive(
    urls: list[str],
    key: str,
    requests: int,
    concurrency: int,
    *,
    stream: float = 0.5,
    sessions: list[str] | None = None,
    seed: int = 0,
) -> list[Outcome]:
    """``requests`` to ``routed`` (a ``stream`` share of them streamed), ``concurrency``
    at a time, spread over the workers; each of ``sessions`` (an ``x-session-id``) in
    turn when given."""
    rng = random.Random(seed)
    queue = list(range(requests))
    outcomes: list[Outcome] = []
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)

    async def client_task(client: httpx.AsyncClient) -> None:
        while queue:
            index = queue.pop(0)
            streamed = rng.random() < stream
            body = chat("routed", stream=streamed)
            headers = {"x-session-id": sessions[index % len(sessions)]} if sessions else None
            outcome = await send(client, urls[index % len(urls)], key, body, headers)
            if sessions:
                outcome.session = sessions[index % len(sessions)]
            outcomes.append(outcome)

    async with httpx.AsyncClient(timeout=60, limits=limits) as client:
        await asyncio.gather(*(client_task(client) for _ in range(concurrency)))
    return outcomes


async def send(
    client: httpx.AsyncClient, url: str, key: str, body: dict, headers: dict | None = None
) -> Outcome:
    """One request as :func:`tests.e2e.load.call` sends it, with ``headers`` too."""
    kind = "stream" if body.get("stream") else "plain"
    return await call(client, url, key, body, kind, headers=headers)


def failed(outcome: Outcome) -> bool:
    return outcome.status != 200 or bool(outcome.error) or bool(outcome.failure)


def began_streaming(outcome: Outcome) -> bool:
    """Whether the client had its answer's first bytes: a stream's headers (sent once its
    deployment sent its first event)."""
    return outcome.status == 200 and outcome.kind == "stream"


def served(stubs_: dict[str, Stub]) -> Counter:
    """The completions each stub answered (429s not counted)."""
    return Counter({name: stub.stats()["served"] for name, stub in stubs_.items()})


# -- the scenarios -------------------------------------------------------------------


def failures(outcomes: list[Outcome]) -> list[str]:
    """What each failed request's client saw."""
    return [
        f"{o.request_id or '-'}: {o.kind} {o.status} {o.error or o.failure}"
        for o in outcomes
        if failed(o)
    ]


@dataclass
class SplitReport:
    workers: int
    requests: int
    split: dict[str, float]
    errors: list[str]
    seconds: float

    def line(self) -> str:
        shares = ", ".join(f"{name} {share:.2%}" for name, share in self.split.items())
        return (
            f"| {self.workers} | {self.requests:,} | {shares} | {len(self.errors)} |"
            f" {self.requests / self.seconds:,.0f} |"
        )


def split(server_url: str, redis_url: str, *, workers: int, requests: int) -> SplitReport:
    """Weights 1:2:1 over three stubs (one ten times slower to its first token)."""
    weights = {"fast": 1.0, "slow": 2.0, "third": 1.0}
    specs = [("fast", ()), ("slow", ("--first-token-delay", "0.01")), ("third", ())]
    with stubs(*specs) as running, site(server_url, redis_url, running, weights=weights,
                                         workers=workers) as live:  # fmt: skip
        started = time.monotonic()
        outcomes = asyncio.run(drive(live.urls, live.key, requests, 32))
        seconds = time.monotonic() - started
        counts = served(running)
    total = sum(counts.values())
    return SplitReport(
        workers,
        requests,
        {name: counts[name] / total for name in weights},
        failures(outcomes),
        seconds,
    )


@dataclass
class RetryAfterReport:
    errors: int
    first_429: float
    limited: int
    arrivals_cooling: list[float]
    """Times (after the first 429) of requests that reached the limited stub while its
    deployment cooled down (an in-flight grace of 0.25 s left out)."""
    recovered: int
    """Completions it served once its window ended."""


def retry_after(server_url: str, redis_url: str, *, workers: int, seconds: float = 16.0):
    """A stub that answers 429 ``Retry-After: 5`` for 8 s (from its 100th completion):
    nothing reaches it while its deployment cools down but one trial at 5 s, it serves
    again once its window ended, and no client sees an error."""
    specs = [
        ("fast", ()),
        ("slow", ("--first-token-delay", "0.01")),
        ("limited", ("--limit-after", "100", "--limit-seconds", "8", "--retry-after", "5",
                     "--record")),
    ]  # fmt: skip
    weights = {"fast": 1.0, "slow": 2.0, "limited": 1.0}
    with stubs(*specs) as running, site(server_url, redis_url, running, weights=weights,
                                         workers=workers) as live:  # fmt: skip
        outcomes: list[Outcome] = []
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            outcomes += asyncio.run(drive(live.urls, live.key, 200, 16, seed=len(outcomes)))
        stats = running["limited"].stats()
    arrivals = stats["arrivals"]
    first = min(at for at, status in arrivals if status == 429)
    cooling = [at - first for at, _ in arrivals if first + 0.25 <= at < first + 10]
    window_end = first + 8
    recovered = sum(1 for at, status in arrivals if at >= window_end and status == 200)
    return RetryAfterReport(sum(map(failed, outcomes)), first, stats["limited"], cooling, recovered)


def least_busy(server_url: str, redis_url: str, *, workers: int = 4) -> Counter:
    """One deployment holding 16 long streams: where 200 short requests go."""
    specs = [("busy", ("--stream-seconds", "30")), ("idle", ())]
    weights = {"busy": 1.0, "idle": 0.0}  # the long streams go to the busy one first
    # Alone, a deployment is counted in flight only with a maximum of its own.
    counted = "Deployment.objects.filter(weight=1).update(max_in_flight=1000)\n"
    with stubs(*specs) as running, site(server_url, redis_url, running, weights=weights,
                                         routing="least_busy", workers=workers,
                                         then=counted) as live:  # fmt: skip

        async def scenario() -> Counter:
            limits = httpx.Limits(max_connections=64)
            async with httpx.AsyncClient(timeout=120, limits=limits) as client:
                streams = [
                    asyncio.ensure_future(
                        send(client, live.urls[i % len(live.urls)], live.key,
                             chat("routed", stream=True))
                    )
                    for i in range(16)
                ]  # fmt: skip
                await until(lambda: running["busy"].stats()["open_streams"] == 16, 30)
                live.shell(
                    "from chatparity.models import Deployment\n"
                    "Deployment.objects.filter(weight=0).update(weight=1)\n"
                )
                await asyncio.sleep(2.5)  # every worker reads the alias again (CACHE_SECONDS)
                before = served(running)
                outcomes = await drive(live.urls, live.key, 200, 4, stream=0.0)
                after = served(running)
                for stream in streams:
                    stream.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await asyncio.gather(*streams)
            counts = after - before
            counts["errors"] = sum(map(failed, outcomes))
            return counts

        return asyncio.run(scenario())


def lowest_latency(server_url: str, redis_url: str, *, workers: int = 2) -> dict[str, Counter]:
    """One deployment ten times slower to its first token: the split of 500 streamed
    requests after a warm-up of 100."""
    specs = [("fast", ("--first-token-delay", "0.01")), ("slow", ("--first-token-delay", "0.1"))]
    weights = {"fast": 1.0, "slow": 1.0}
    options = {"weights": weights, "routing": "lowest_latency", "workers": workers}
    with stubs(*specs) as running, site(server_url, redis_url, running, **options) as live:
        warm = asyncio.run(drive(live.urls, live.key, 100, 4, stream=1.0))
        before = served(running)
        measured = asyncio.run(drive(live.urls, live.key, 500, 4, stream=1.0, seed=1))
        after = served(running)
    counts = after - before
    counts["errors"] = sum(map(failed, [*warm, *measured]))
    return {"measured": counts}


@dataclass
class StickyReport:
    sessions: dict[str, Counter]
    """Each session's turns by deployment, while healthy."""
    moved: dict[str, Counter]
    """The turns of the sessions whose deployment was cooled down, after it was."""
    cooled: str
    errors: int


def sticky(server_url: str, redis_url: str, *, workers: int = 2) -> StickyReport:
    """20 sessions of 20 turns on three deployments; then one deployment rate-limits
    for 60 s: its sessions move, and stay where they moved."""
    specs = [("a", ()), ("b", ()), ("c", ())]
    weights = {"a": 1.0, "b": 1.0, "c": 1.0}
    names = [f"session-{index}" for index in range(20)]
    with stubs(*specs) as running, site(server_url, redis_url, running, weights=weights,
                                         sticky="on", workers=workers) as live:  # fmt: skip
        turns = asyncio.run(drive(live.urls, live.key, 400, 8, sessions=names))
        rows = live.rows(turns)
        sessions = {name: Counter() for name in names}
        for outcome in turns:
            sessions[outcome.session][rows[outcome.request_id]["deployment"]] += 1
        homes = Counter(seen.most_common(1)[0][0] for seen in sessions.values())
        cooled = homes.most_common(1)[0][0]  # the deployment of the most sessions
        running[cooled.split("/")[0]].limit(60, 60)  # its label: "<backend>/stub-model"
        mine = [name for name, seen in sessions.items() if seen.most_common(1)[0][0] == cooled]
        later = asyncio.run(drive(live.urls, live.key, 10 * len(mine), 4, sessions=mine, seed=2))
        rows = live.rows(later)
        moved = {name: Counter() for name in mine}
        for outcome in later:
            moved[outcome.session][rows[outcome.request_id]["deployment"]] += 1
    return StickyReport(sessions, moved, cooled, sum(map(failed, [*turns, *later])))


@dataclass
class KillReport:
    outcomes: list[Outcome]
    killed_at: float

    @property
    def failed_before_streaming(self) -> list[Outcome]:
        """Requests that failed before their answer began: none may."""
        return [o for o in self.outcomes if failed(o) and not began_streaming(o)]

    @property
    def cut_midway(self) -> int:
        """Streams the killed upstream was sending: their client has an error frame."""
        return sum(1 for o in self.outcomes if failed(o) and began_streaming(o))


def kill(server_url: str, redis_url: str, *, workers: int = 2) -> KillReport:
    """Streams of half a second and whole answers on three deployments; one stub is
    killed (SIGKILL) two seconds in."""
    specs = [("a", ("--stream-seconds", "0.5")), ("b", ("--stream-seconds", "0.5")),
             ("c", ("--stream-seconds", "0.5"))]  # fmt: skip
    weights = {"a": 1.0, "b": 1.0, "c": 1.0}
    with stubs(*specs) as running, site(server_url, redis_url, running, weights=weights,
                                         workers=workers) as live:  # fmt: skip

        async def scenario() -> tuple[list[Outcome], float]:
            async def killer() -> float:
                await asyncio.sleep(2)
                running["a"].stop(signal.SIGKILL)
                return time.monotonic()

            killing = asyncio.ensure_future(killer())
            outcomes = await drive(live.urls, live.key, 600, 32, stream=0.5)
            return outcomes, await killing

        outcomes, killed_at = asyncio.run(scenario())
    return KillReport(outcomes, killed_at)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--requests", type=int, default=10_000)
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2, 4])
    args = parser.parse_args()
    database, redis = os.environ.get("DATABASE_URL"), os.environ.get("REDIS_URL")
    with ExitStack() as stack:
        if not database:
            database = stack.enter_context(services.postgres())
        if not redis:
            redis = stack.enter_context(services.redis())
        print("| workers | requests | split (weights 1:2:1) | errors | req/s |")
        print("|---:|---:|---|---:|---:|")
        for workers in args.workers:
            print(split(database, redis, workers=workers, requests=args.requests).line())
        print(json.dumps({"retry_after": retry_after(database, redis, workers=2).__dict__}))


if __name__ == "__main__":
    main()
