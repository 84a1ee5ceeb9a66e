"""Chaos: the load proof's stack through worse faults, and one table of what held.

Two uvicorn workers on one PostgreSQL and one Redis (servers of its own, which it
stops, freezes and starts again) serve through a fault-injecting upstream
(``tests/backends/faulty_upstream.py``). Each scenario is a function that runs one
fault and returns one row of the table: the requests sent, their statuses, log rows
against requests, tokens logged against tokens received, over-admission, in-flight
slots left taken, the workers' memory; its target, and PASS or FAIL.

The suite runs a short form (``tests/e2e/test_chaos.py``); the long form is

    .venv/bin/python -m tests.e2e.chaos [--requests 2000] [--scenario NAME ...] [--short]

and exits non-zero when a row fails. Servers of the environment (``DATABASE_URL``,
``REDIS_URL``) cannot be stopped: then it starts its own anyway.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import socket
import sys
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Iterable
from contextlib import ExitStack, suppress
from dataclasses import dataclass, field
from decimal import Decimal
from functools import partial

import httpx

from tests import services
from tests.backends import faulty_upstream
from tests.e2e.load import Outcome, Worker, call, chat, log_rows, manage, project_env, scratch

LIMIT = 40  # requests a limited key may make: each limit is set to this many requests' worth
TOKENS = 25  # a request's tokens, as the upstream reports them (5 prompt, 20 completion)
PRICE = Decimal(1000)  # USD per million tokens, in and out: a request costs 0.025 USD
MAX_CONCURRENT = 8
OUTAGE_CONCURRENT = 32  # max_concurrent of the keys used through an outage
HANG_SECONDS = 5.0  # a request that takes longer than this through an outage hung
LEASE_SECONDS = 60.0  # after a crash, the key is whole again within this
INTERRUPTED = "interrupted"  # the error code of the row of a request its worker died in
STREAM_MEMORY_KIB = 64  # per stream a client stopped reading

LIMITS: dict[str, dict[str, object]] = {
    "requests-per-minute": {"requests_per_minute": LIMIT},
    "tokens-per-minute": {"tokens_per_minute": LIMIT * TOKENS},
    "token-budget": {"token_budget": LIMIT * TOKENS, "budget_period": "day"},
    "cost-budget": {"cost_budget": str(LIMIT * TOKENS * PRICE / 1_000_000), "budget_period": "day"},
}
OMITTED = ["tokens-per-minute", "token-budget", "cost-budget"]
KEYS: dict[str, dict[str, object]] = {
    "open": {},
    **LIMITS,
    # The same limits, on keys whose requests set no max_tokens (see over_admission).
    **{f"{kind}, max_tokens omitted": LIMITS[kind] for kind in OMITTED},
    "max-concurrent": {"max_concurrent": MAX_CONCURRENT},
    "sequential-clients": {"max_concurrent": MAX_CONCURRENT},
    "kill-worker": {"max_concurrent": MAX_CONCURRENT},
    "redis-frozen": {"requests_per_minute": 100_000, "max_concurrent": OUTAGE_CONCURRENT},
    "redis-stopped": {"requests_per_minute": 100_000, "max_concurrent": OUTAGE_CONCURRENT},
}
# Public alias -> upstream behaviour (see faulty_upstream.behaviours).
GARBAGE_BEHAVIOURS = ["negative-usage", "huge-usage", "html", "whole", "huge-line", "silent"]
ALIASES = {
    "load": "long",
    "slow": "long-slow",
    "priced": "long",
    "wide": "long-capped",
    "wide-priced": "long-capped",
    "huge-stream": "huge-stream",
    **{behaviour: behaviour for behaviour in GARBAGE_BEHAVIOURS},
}


# A completion cap (context window) more than a limited key's whole limit: the aliases
# for requests that set no max_tokens. The others' is less than one request's worth.
WIDE_CONTEXT = 2 * LIMIT * TOKENS
CONTEXTS = {"wide": WIDE_CONTEXT, "wide-priced": WIDE_CONTEXT}
PRICED = {"priced", "wide-priced"}


@dataclass(frozen=True)
class Scale:
    """How big the scenarios are."""

    requests: int  # per scenario that drives traffic
    outage: float  # seconds Redis or PostgreSQL is away
    readers: int  # clients that stop reading
    short: bool

    @classmethod
    def of(cls, requests: int, short: bool) -> Scale:
        return cls(requests, 2.0 if short else 10.0, min(500, max(10, requests // 4)), short)


@dataclass
class Row:
    """One scenario's line of the table."""

    scenario: str
    target: str
    requests: int = 0
    statuses: Counter = field(default_factory=Counter)
    rows: str = "-"
    tokens: str = "-"
    over_admission: str = "-"
    slots_left: str = "-"
    memory: str = "-"
    failures: list[str] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return not self.failures

    def require(self, holds: bool, failure: str) -> None:
        if not holds:
            self.failures.append(failure)

    def cells(self) -> list[str]:
        statuses = " ".join(f"{status}: {n}" for status, n in sorted(self.statuses.items()))
        return [
            self.scenario, str(self.requests), statuses, self.rows, self.tokens,
            self.over_admission, self.slots_left, self.memory, self.target,
            "PASS" if self.passed else "FAIL",
        ]  # fmt: skip


HEADINGS = [
    "scenario", "requests", "statuses", "rows / requests", "tokens logged / received",
    "over-admission", "slots left", "memory", "target", "result",
]  # fmt: skip


def table(rows: Iterable[Row]) -> str:
    lines = ["| " + " | ".join(HEADINGS) + " |", "|" + "---|" * len(HEADINGS)]
    return "\n".join([*lines, *("| " + " | ".join(row.cells()) + " |" for row in rows)])


def status_of(outcome: Outcome) -> str:
    """The status as the table counts it: the HTTP status, ``+error`` for an error frame
    or a connection broken after the headers, ``no answer`` for none."""
    if not outcome.status:
        return "no answer"
    if outcome.status == 200 and outcome.error:
        return "200+error"
    if outcome.status == 200 and not outcome.done:
        return "200+broken"
    return str(outcome.status)


@dataclass
class Lab:
    """The stack the scenarios run on: servers, the upstream, the workers, the keys."""

    server_url: str
    redis_url: str
    database_url: str
    workers: list[Worker]
    keys: dict[str, str]
    scale: Scale

    def urls(self) -> list[str]:
        """The URLs of the workers alive."""
        return [worker.url for worker in self.workers if worker.alive]

    def memory(self) -> str:
        return "RSS " + "/".join(
            f"{worker.status('VmRSS') // 1024}" for worker in self.workers if worker.alive
        ) + " MiB"  # fmt: skip

    def rows(self, outcomes: Iterable[Outcome], timeout: float = 10.0) -> dict[str, dict]:
        """The log rows of ``outcomes``' requests, once every answered request has one
        (or ``timeout`` passed): rows are written just after the answer."""
        wanted = {outcome.request_id for outcome in outcomes if answered(outcome)}
        deadline = time.monotonic() + timeout
        while True:
            rows = log_rows(self.database_url)
            if wanted <= rows.keys() or time.monotonic() > deadline:
                return rows
            time.sleep(0.5)


def answered(outcome: Outcome) -> bool:
    """The client got the whole of a response, other than a 503 (the gateway could not
    serve it, maybe not even know its key)."""
    return bool(outcome.request_id) and outcome.done and outcome.status != 503


def account(row: Row, outcomes: list[Outcome], rows: dict[str, dict]) -> None:
    """Fill ``row``'s requests, statuses, rows and tokens from what the clients saw and
    the log holds; every answered request needs one row, with the tokens received."""
    row.requests = len(outcomes)
    row.statuses = Counter(status_of(outcome) for outcome in outcomes)
    logged = [outcome for outcome in outcomes if outcome.request_id in rows]
    row.rows = f"{len(logged)} / {len(outcomes)}"
    lost = [outcome.request_id for outcome in outcomes if answered(outcome)]
    lost = [request_id for request_id in lost if request_id not in rows]
    row.require(not lost, f"{len(lost)} answered requests have no row, e.g. {lost[:3]}")
    twice = [outcome.request_id for outcome in logged if rows[outcome.request_id].get("duplicates")]
    row.require(not twice, f"{len(twice)} requests have two rows")
    whole = [o for o in logged if o.status == 200 and answered(o) and not o.error]
    received = sum(outcome.tokens for outcome in whole)
    counted = sum(rows[outcome.request_id]["completion_tokens"] for outcome in whole)
    row.tokens = f"{counted} / {received}"
    row.require(counted == received, f"{counted} completion tokens logged, {received} received")


async def clients(
    lab: Lab,
    key: str,
    *,
    seconds: float | None = None,
    requests: int | None = None,
    concurrency: int = 16,
    model: str = "load",
    body: Callable[[str, int], dict] | None = None,
    only: Callable[[], list[str]] | None = None,
    label: str = "",
) -> list[Outcome]:
    """``concurrency`` clients sending requests back to back (streams and not, by turns)
    over the live workers, for ``seconds`` or until ``requests`` were sent. Their kinds:
    ``label``, then stream or plain."""
    deadline = time.monotonic() + (seconds if seconds is not None else 3600)
    left = [requests if requests is not None else 10**9]
    outcomes: list[Outcome] = []
    make = body or (lambda model, n: chat(model, stream=n % 2 == 0))

    async def client(index: int, http: httpx.AsyncClient) -> None:
        n = index
        while time.monotonic() < deadline and left[0] > 0:
            left[0] -= 1
            urls = (only or lab.urls)()
            body = make(model, n)
            kind = f"{label} {'stream' if body.get('stream') else 'plain'}".strip()
            outcomes.append(await call(http, urls[n % len(urls)], key, body, kind))
            n += 1

    async with httpx.AsyncClient(timeout=60, limits=httpx.Limits(max_connections=256)) as http:
        await asyncio.gather(*(client(index, http) for index in range(concurrency)))
    return outcomes


async def during(traffic: Awaitable[list[Outcome]], fault: Callable[[], None], after: float):
    """Run ``fault`` (blocking, in a thread) ``after`` seconds into ``traffic``."""

    async def inject() -> None:
        await asyncio.sleep(after)
        await asyncio.to_thread(fault)

    outcomes, _ = await asyncio.gather(traffic, inject())
    return outcomes


async def admitted_at_once(lab: Lab, key: str, slots: int) -> int:
    """How many of ``slots`` slow streams sent at once on ``key`` were admitted."""
    outcomes = await clients(lab, key, requests=slots, concurrency=slots, model="slow")
    return sum(outcome.status == 200 for outcome in outcomes)


async def whole_again(lab: Lab, key: str, slots: int, row: Row, within: float) -> None:
    """Until ``key`` admits ``slots`` requests at once (every in-flight slot free again),
    or ``within`` seconds passed; the slots still taken go to ``row``."""
    started = time.monotonic()
    while True:
        admitted = await admitted_at_once(lab, key, slots)
        waited = time.monotonic() - started
        if admitted == slots or waited > within:
            break
        await asyncio.sleep(1)
    row.slots_left = f"{slots - admitted} of {slots} ({waited:.0f} s after)"
    row.require(admitted == slots, f"{slots - admitted} slots still taken after {waited:.0f} s")


# -- the scenarios ------------------------------------------------------------


def kill_worker(lab: Lab) -> Row:
    """``kill -9`` of a worker with streams in flight, then its restart."""
    row = Row(
        "kill -9 of a worker, streams in flight",
        "every answered request has a row; the in-flight ones rows marked interrupted after"
        f" the restart; the key (max_concurrent {MAX_CONCURRENT}) whole within"
        f" {LEASE_SECONDS:.0f} s",
    )
    victim = lab.workers[0]
    seconds = 4.0 if lab.scale.short else 10.0

    async def traffic() -> list[Outcome]:
        on_victim = clients(
            lab, lab.keys["kill-worker"], requests=MAX_CONCURRENT - 2,
            concurrency=MAX_CONCURRENT - 2, model="slow", only=lambda: [victim.url],
        )  # fmt: skip
        elsewhere = clients(lab, lab.keys["open"], seconds=seconds, model="slow")
        return [outcome for part in await asyncio.gather(on_victim, elsewhere) for outcome in part]

    outcomes = asyncio.run(during(traffic(), partial(victim.stop, signal.SIGKILL), 1.0))
    victim.start()
    in_flight = [o for o in outcomes if o.request_id and not o.done and o.status == 200]
    rows = lab.rows([*outcomes, *(_as_answered(outcome) for outcome in in_flight)], timeout=30)
    account(row, outcomes, rows)
    found = [rows[o.request_id] for o in in_flight if o.request_id in rows]
    interrupted = sum(found_row["error_code"] == INTERRUPTED for found_row in found)
    row.rows += f" (in flight {len(in_flight)}: {len(found)} rows, {interrupted} interrupted)"
    row.require(len(in_flight) > 0, "no stream was in flight when the worker died")
    row.require(
        interrupted == len(in_flight),
        f"{len(in_flight) - interrupted} of {len(in_flight)} requests in flight not logged"
        " as interrupted",
    )
    asyncio.run(whole_again(lab, lab.keys["kill-worker"], MAX_CONCURRENT, row, LEASE_SECONDS))
    row.memory = lab.memory()
    return row


def _as_answered(outcome: Outcome) -> Outcome:
    """``outcome`` as if answered: its row is awaited too."""
    return Outcome(outcome.kind, outcome.status, outcome.request_id, done=True)


def redis_outage(how: str, lab: Lab) -> Row:
    """Redis frozen (SIGSTOP) or stopped for the outage, under traffic on a limited and
    an unlimited key."""
    name = f"redis-{how}"
    row = Row(
        f"Redis {how} {lab.scale.outage:.0f} s",
        "limited key: 200, 429 or 503, no 500, none over"
        f" {HANG_SECONDS:.0f} s; unlimited key: 200; all 200 again 2 s after; slots free",
    )
    control = services.control(lab.redis_url)
    assert control is not None, "the lab's Redis is one of its own"
    stop, restart = (
        (control.freeze, control.thaw) if how == "frozen" else (control.stop, control.start)
    )
    window: list[float] = []

    def fault() -> None:
        window.append(time.monotonic())
        stop()
        time.sleep(lab.scale.outage)
        restart()
        window.append(time.monotonic())

    async def traffic() -> list[Outcome]:
        seconds = lab.scale.outage + 6  # 2 s before, 4 s after
        limited, open_ = await asyncio.gather(
            clients(lab, lab.keys[name], seconds=seconds, concurrency=8, label="limited"),
            clients(lab, lab.keys["open"], seconds=seconds, concurrency=8, label="open"),
        )
        return limited + open_

    outcomes = asyncio.run(during(traffic(), fault, 2.0))
    _outage_checks(row, outcomes, window, limited=lambda o: o.kind.startswith("limited"))
    account(row, outcomes, lab.rows(outcomes))
    asyncio.run(whole_again(lab, lab.keys[name], OUTAGE_CONCURRENT, row, LEASE_SECONDS))
    row.memory = lab.memory()
    return row


def postgres_outage(lab: Lab) -> Row:
    """PostgreSQL stopped for the outage, under traffic on a key the workers know."""
    row = Row(
        f"PostgreSQL stopped {lab.scale.outage:.0f} s",
        f"200 or 503, no 500, none over {HANG_SECONDS:.0f} s; all 200 again 2 s after;"
        " 0 rows lost once it is back",
    )
    control = services.control(lab.server_url)
    assert control is not None, "the lab's PostgreSQL is one of its own"
    window: list[float] = []

    def fault() -> None:
        window.append(time.monotonic())
        control.stop()
        time.sleep(lab.scale.outage)
        control.start()
        window.append(time.monotonic())

    traffic = clients(lab, lab.keys["open"], seconds=lab.scale.outage + 6)
    outcomes = asyncio.run(during(traffic, fault, 2.0))
    _outage_checks(row, outcomes, window, limited=lambda o: True, allowed={"200", "503"})
    account(row, outcomes, lab.rows(outcomes, timeout=30))
    row.memory = lab.memory()
    return row


def _outage_checks(
    row: Row,
    outcomes: list[Outcome],
    window: list[float],
    limited: Callable[[Outcome], bool],
    allowed: set[str] | None = None,
) -> None:
    """No 500, no hang, statuses ``allowed`` (limited requests) or 200 (the others),
    every request 200 again from 2 s after the outage."""
    allowed = allowed or {"200", "429", "503"}
    wrong = Counter(
        status_of(outcome)
        for outcome in outcomes
        if status_of(outcome) not in (allowed if limited(outcome) else {"200"})
    )
    row.require(not wrong, f"statuses outside the policy: {dict(wrong)}")
    hung = [outcome for outcome in outcomes if outcome.seconds > HANG_SECONDS]
    row.require(not hung, f"{len(hung)} requests took over {HANG_SECONDS:.0f} s")
    after = [o for o in outcomes if len(window) == 2 and o.ended - o.seconds > window[1] + 2]
    failed = Counter(status_of(o) for o in after if status_of(o) != "200")
    row.require(bool(after) and not failed, f"after the outage: {dict(failed)} of {len(after)}")


def over_admission(kind: str, lab: Lab, *, omitted: bool = False) -> Row:
    """Concurrency 64 across both workers on a key with one limit of ``kind``: what it
    admitted against the limit. ``omitted``: no request sets max_tokens, on an alias whose
    completion cap is more than the whole limit, so each is given what is left (its
    upstream honours max_tokens): some are admitted, and none past the limit."""
    name = f"{kind}, max_tokens omitted" if omitted else kind
    target = "admitted ≤ limit +1% + one request"
    if kind == "requests-per-minute":
        target += "; exact"
    row = Row(f"concurrency 64, {name}", target + ("; admitted > 0" if omitted else ""))
    if kind in ("requests-per-minute", "tokens-per-minute"):
        _early_in_minute(6)

    def body(model: str, n: int) -> dict:
        # Half give max_tokens, half leave it to the gateway's cap (all, when omitted).
        given = not omitted and n % 4 < 2
        return chat(model, stream=n % 2 == 0, **({"max_tokens": 20} if given else {}))

    if omitted:
        model = "wide-priced" if kind == "cost-budget" else "wide"
    else:
        model = "priced" if kind == "cost-budget" else "load"
    started = time.time()
    outcomes = asyncio.run(
        clients(lab, lab.keys[name], requests=4 * LIMIT, concurrency=64, model=model, body=body)
    )
    spent = time.time() - started
    # A burst across a minute's end meets a per-minute limit twice, the second time
    # maybe not in full.
    minutes = int(time.time() // 60) - int(started // 60) + 1 if "minute" in kind else 1
    rows = lab.rows(outcomes)
    account(row, outcomes, rows)
    wrong = set(row.statuses) - {"200", "429"}
    row.require(not wrong, f"statuses other than 200 and 429: {wrong}")
    served = [rows[o.request_id] for o in outcomes if o.status == 200 and o.request_id in rows]
    limit, used, one, unit = _limit_and_use(kind, served, outcomes)
    limit *= minutes
    over = used / limit - 1
    row.over_admission = f"{used}{unit} of {limit}{unit}: {over:+.1%} ({spent:.1f} s)"
    row.require(used <= limit * Decimal("1.01") + one, f"over-admitted {over:+.1%}")
    if omitted:
        row.require(used > 0, "admitted nothing")
    if kind == "requests-per-minute" and minutes == 1:
        row.require(used == limit, f"admitted {used} of {limit}")
    row.memory = lab.memory()
    return row


def _limit_and_use(
    kind: str, served: list[dict], outcomes: list[Outcome]
) -> tuple[Decimal, Decimal, Decimal, str]:
    """The limit of ``kind``, what was admitted under it, one request's worth, the unit."""
    if kind == "requests-per-minute":
        return Decimal(LIMIT), Decimal(len(served)), Decimal(1), ""
    if kind in ("tokens-per-minute", "token-budget"):
        tokens = [Decimal(served_row["total_tokens"]) for served_row in served]
        return Decimal(LIMIT * TOKENS), sum(tokens, Decimal(0)), max(tokens, default=0), " tok"
    if kind == "cost-budget":
        costs = [Decimal(served_row["cost"]) for served_row in served]
        limit = Decimal(str(LIMITS["cost-budget"]["cost_budget"]))
        return limit, sum(costs, Decimal(0)).normalize(), max(costs, default=0), " USD"
    return Decimal(MAX_CONCURRENT), Decimal(_peak(outcomes)), Decimal(1), " at once"


def _peak(outcomes: list[Outcome]) -> int:
    """The most admitted requests open at once, as their clients saw them."""
    edges = sorted(
        (time, step)
        for outcome in outcomes
        if outcome.status == 200
        for time, step in ((outcome.started, 1), (outcome.ended, -1))
    )
    peak = now = 0
    for _, step in edges:
        now += step
        peak = max(peak, now)
    return peak


def _early_in_minute(needed: float) -> None:
    """Wait, if need be, so that ``needed`` seconds fit in this minute of the UTC clock:
    per-minute limits count by fixed minutes."""
    if time.time() % 60 > 60 - needed:
        time.sleep(60 - time.time() % 60 + 0.2)


def sequential_clients(lab: Lab) -> Row:
    """As many clients as the key's max_concurrent, each one request at a time."""
    row = Row(
        f"{MAX_CONCURRENT} sequential clients, max_concurrent {MAX_CONCURRENT}",
        "no 429: a slot is free when its response ends",
    )
    outcomes = asyncio.run(
        clients(
            lab, lab.keys["sequential-clients"], requests=max(40, lab.scale.requests // 5),
            concurrency=MAX_CONCURRENT,
        )
    )  # fmt: skip
    account(row, outcomes, lab.rows(outcomes))
    refused = row.statuses["429"]
    row.over_admission = f"{refused} spurious 429"
    row.require(set(row.statuses) == {"200"}, f"statuses {dict(row.statuses)}")
    row.memory = lab.memory()
    return row


# Garbage from the upstream: (alias, stream) -> what the client must get.
GARBAGE: dict[tuple[str, bool], str] = {
    ("negative-usage", True): "200",
    ("negative-usage", False): "200",
    ("huge-usage", True): "200",
    ("huge-usage", False): "200",
    ("html", True): "502",
    ("html", False): "502",
    ("whole", True): "200",
    ("huge-line", True): "502",
    ("silent", True): "keepalive",
    ("silent", False): "504",
}
FIRST_BYTE_SECONDS = 60.0  # CHATPARITY["FIRST_BYTE_TIMEOUT"]'s default
KEEPALIVE_SECONDS = 20.0  # CHATPARITY["KEEPALIVE_SECONDS"]'s default (15 s), and slack


def garbage_upstream(lab: Lab) -> Row:
    """An upstream that lies about usage, answers in HTML or with a whole JSON
    completion to a stream, sends a 10 MiB SSE line, or never answers."""
    row = Row(
        "garbage upstream",
        "usage from what was received; html and a 10 MiB line 502 (or an error frame);"
        " a whole JSON re-emitted as a stream; "
        + ("" if lab.scale.short else f"a silent upstream: keepalive within"
           f" {KEEPALIVE_SECONDS:.0f} s, 504 within {FIRST_BYTE_SECONDS + 10:.0f} s; ")
        + "never an empty 200",
    )  # fmt: skip
    each = 2 if lab.scale.short else max(2, lab.scale.requests // 200)
    # The short form does not wait for a silent upstream.
    cases = [
        case
        for case in GARBAGE
        if not (lab.scale.short and case[0] == "silent")
        for _ in range(each)
    ]
    silent_read = FIRST_BYTE_SECONDS + 10

    async def send() -> list[Outcome]:
        async with httpx.AsyncClient(timeout=90) as http:
            return await asyncio.gather(
                *(
                    call(
                        http, lab.urls()[n % len(lab.urls())], lab.keys["open"],
                        chat(alias, stream=stream), f"{alias}{' stream' if stream else ''}",
                        read=silent_read if alias == "silent" else None,
                    )
                    for n, (alias, stream) in enumerate(cases)
                )
            )  # fmt: skip

    outcomes = asyncio.run(send())
    rows = lab.rows(outcomes)
    account(row, outcomes, rows)
    for (alias, stream), outcome in zip(cases, outcomes, strict=True):
        expected = GARBAGE[alias, stream]
        got = status_of(outcome)
        if expected == "keepalive":
            row.require(
                outcome.keepalives > 0 and (outcome.first_byte or 0) <= KEEPALIVE_SECONDS,
                f"{outcome.kind}: no keepalive in {KEEPALIVE_SECONDS:.0f} s (status {got},"
                f" headers after {outcome.first_byte or 0:.1f} s)",
            )
            if not lab.scale.short:
                row.require(got == "200+error", f"{outcome.kind}: {got}, not a 504 frame")
        elif expected == "504":
            row.require(got == "504", f"{outcome.kind}: {got}, not 504")
        elif expected == "502":
            row.require(got in ("502", "200+error"), f"{outcome.kind}: {got}, not 502")
        else:
            row.require(got == "200" and not outcome.empty, f"{outcome.kind}: {got}, empty")
        row.require(not outcome.empty, f"{outcome.kind}: an empty 200")
        if alias.endswith("-usage") and outcome.request_id in rows:
            logged = rows[outcome.request_id]["completion_tokens"]
            row.require(
                logged == faulty_upstream.LONG_CHUNKS,
                f"{outcome.kind}: {logged} tokens logged for"
                f" {faulty_upstream.LONG_CHUNKS} received",
            )
    row.memory = lab.memory()
    return row


def slow_readers(lab: Lab) -> Row:
    """Clients that ask for a 10 MiB stream and stop reading after its headers: what
    each costs one worker, beyond what as many requests that wait for a silent
    upstream cost the other (the request itself, no data)."""
    readers = lab.scale.readers
    row = Row(
        f"{readers} slow readers of a 10 MiB stream",
        f"≤ {STREAM_MEMORY_KIB} KiB of worker memory per stream beyond a request waiting"
        " for its first byte; a row for each",
    )
    reading, waiting = lab.workers

    async def stall(readers: int) -> tuple[list[tuple[socket.socket, str]], ...]:
        return await asyncio.gather(
            asyncio.gather(
                *(_open_and_stall(reading.port, lab.keys["open"]) for _ in range(readers))
            ),
            asyncio.gather(
                *(_open_and_stall(waiting.port, lab.keys["open"], "silent") for _ in range(readers))
            ),
        )

    # A few to warm the workers up (freed memory is reused, so no more), then all.
    for count in (max(5, readers // 10), readers):
        before = [worker.status("VmRSS") for worker in lab.workers]
        held, idle = asyncio.run(stall(count))
        grown = [
            _settled(lambda worker=worker: worker.status("VmRSS")) - kib
            for worker, kib in zip(lab.workers, before, strict=True)
        ]
        for sock, _ in [*held, *idle]:
            sock.close()
        time.sleep(2)  # the workers see the hang-ups and let go
    per_stream, per_request = (kib / readers for kib in grown)
    row.memory = (
        f"{per_stream - per_request:.0f} KiB per stream ({per_stream:.0f} KiB, a request"
        f" waiting {per_request:.0f} KiB)"
    )
    row.require(
        per_stream - per_request <= STREAM_MEMORY_KIB,
        f"{per_stream - per_request:.0f} KiB per stream held",
    )
    outcomes = [
        Outcome("huge-stream", int(head.split()[1]) if head else 0, _request_id(head))
        for _, head in held
    ]
    rows = lab.rows([_as_answered(outcome) for outcome in outcomes], timeout=30)
    row.requests = readers
    row.statuses = Counter(str(outcome.status) for outcome in outcomes)
    logged = sum(outcome.request_id in rows for outcome in outcomes)
    row.rows = f"{logged} / {readers}"
    row.require(logged == readers, f"{readers - logged} slow readers have no row")
    return row


async def _open_and_stall(
    port: int, key: str, model: str = "huge-stream"
) -> tuple[socket.socket, str]:
    """Send a stream request on a socket with a small receive buffer; read the headers
    (but from a ``silent`` upstream: none); then read nothing more. The socket and the
    headers."""
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.setblocking(False)
    loop = asyncio.get_running_loop()
    await loop.sock_connect(sock, ("127.0.0.1", port))
    body = json.dumps(chat(model, stream=True)).encode()
    await loop.sock_sendall(
        sock,
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        + f"Authorization: Bearer {key}\r\nContent-Type: application/json\r\n".encode()
        + f"Content-Length: {len(body)}\r\n\r\n".encode()
        + body,
    )
    head = b""
    while model != "silent" and b"\r\n\r\n" not in head:
        received = await loop.sock_recv(sock, 1)  # byte by byte: nothing past the headers
        if not received:
            break
        head += received
    return sock, head.decode(errors="replace")


def _request_id(head: str) -> str:
    for line in head.split("\r\n"):
        name, _, value = line.partition(":")
        if name.lower() == "x-request-id":
            return value.strip()
    return ""


def _settled(measure: Callable[[], int], seconds: float = 20.0) -> int:
    """``measure()`` once it stops growing (two readings a second apart within 1%)."""
    deadline = time.monotonic() + seconds
    last = measure()
    while time.monotonic() < deadline:
        time.sleep(1)
        now = measure()
        if now <= last * 1.01:
            return now
        last = now
    return last


# In this order: slow-readers first, on workers whose memory other scenarios have not
# grown yet (memory freed is reused, so later it would be measured as nothing).
SCENARIOS: dict[str, Callable[[Lab], Row]] = {
    "slow-readers": slow_readers,
    "requests-per-minute": partial(over_admission, "requests-per-minute"),
    "tokens-per-minute": partial(over_admission, "tokens-per-minute"),
    "token-budget": partial(over_admission, "token-budget"),
    "cost-budget": partial(over_admission, "cost-budget"),
    "max-concurrent": partial(over_admission, "max-concurrent"),
    **{f"{kind}-omitted": partial(over_admission, kind, omitted=True) for kind in OMITTED},
    "sequential-clients": sequential_clients,
    "garbage-upstream": garbage_upstream,
    "redis-frozen": partial(redis_outage, "frozen"),
    "redis-stopped": partial(redis_outage, "stopped"),
    "postgres-stopped": postgres_outage,
    "kill-worker": kill_worker,
}


def _setup(env: dict[str, str], upstream_url: str) -> dict[str, str]:
    """Migrate; create the aliases and the keys; the keys' plaintexts by name."""
    manage(env, "migrate", "--verbosity", "0")
    script = f"""
import json
from chatparity.models import ApiKey, Backend, ModelAlias
upstream = Backend.objects.create(
    name="faulty", kind="openai", base_url={upstream_url!r}, options={{"retries": 0}})
for public_id, behaviour in {ALIASES!r}.items():
    price = {str(PRICE)!r} if public_id in {sorted(PRICED)!r} else 0
    ModelAlias.objects.create(
        public_id=public_id, backend=upstream, model=behaviour,
        context_window={CONTEXTS!r}.get(public_id, 256), input_price=price, output_price=price)
keys = {{name: ApiKey.objects.create_key(name, **limits)[1] for name, limits in {KEYS!r}.items()}}
print(json.dumps(keys))
"""
    return json.loads(manage(env, "shell", "-c", script).strip().splitlines()[-1])


def run(server_url: str, redis_url: str, names: list[str], scale: Scale) -> list[Row]:
    """The scenarios ``names`` on a lab of their own; their rows."""
    database_url = services.create_database(server_url, f"chatparity_chaos_{os.getpid()}")
    env = project_env(database_url, redis_url)
    upstream, stop_upstream = faulty_upstream.start("sk-chaos")
    with ExitStack() as stack:
        stack.callback(stop_upstream)
        keys = _setup(env, upstream.base_url)
        workers = [Worker(env, scratch("chaos")) for _ in range(2)]
        for worker in workers:
            stack.callback(worker.stop)
            worker.start()
        lab = Lab(server_url, redis_url, database_url, workers, keys, scale)
        rows = []
        for name in names:
            try:
                rows.append(SCENARIOS[name](lab))
            except Exception as exc:  # one scenario's crash is its row, not the end
                rows.append(Row(name, "runs", failures=[f"{type(exc).__name__}: {exc}"]))
            for worker in workers:
                if not worker.alive:
                    worker.start()
        return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=2000, help="per traffic scenario")
    parser.add_argument(
        "--scenario", action="append", choices=list(SCENARIOS), help="repeat; default: all"
    )
    parser.add_argument(
        "--short", action="store_true", help="outages of 2 s, not 10 s; no silent upstream"
    )
    args = parser.parse_args()
    # Servers of our own: those of the environment cannot be stopped.
    for name in ("DATABASE_URL", "REDIS_URL"):
        os.environ.pop(name, None)
    started = time.monotonic()
    with services.postgres() as server_url, services.redis() as redis_url:
        rows = run(
            server_url, redis_url, args.scenario or list(SCENARIOS),
            Scale.of(args.requests, args.short),
        )  # fmt: skip
    print(table(rows))
    failed = [row for row in rows if not row.passed]
    print(f"\n{time.monotonic() - started:.0f} s; {len(failed)} of {len(rows)} rows failed")
    for row in failed:
        for failure in row.failures[:10]:
            print(f" - {row.scenario}: {failure}")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    with suppress(KeyboardInterrupt):
        main()
