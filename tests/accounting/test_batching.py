"""Database work outside the request cycle: the rows of concurrent callers written in
batches, one writer per event loop, an outage logged once per interval; and all of it
honours the site's routers: a request on a site that keeps chatparity's tables in a
database of their own reads and writes only there (nothing is written to the default
database)."""

import asyncio
import gc
import logging
import os
import sqlite3
import tempfile
import weakref
from pathlib import Path

import pytest
from asgiref.sync import sync_to_async
from django.conf import settings
from django.db import DatabaseError, IntegrityError, OperationalError, connections

from chatparity.accounting.batching import BatchWriter, OncePerInterval, PerLoop, reconnecting
from chatparity.models import ApiKey, Backend, ModelAlias, RequestLog
from tests.accounting.test_limits import HI
from tests.asgi import ask_fast_path
from tests.scripted import SCRIPTED
from tests.support import logs

OTHER = "other"
# A second database, declared before pytest-django sets up the test databases: it sets
# up only those the settings name.
# A file, not memory: closing a connection to an in-memory SQLite database keeps it open.
settings.DATABASES.setdefault(
    OTHER,
    {
        "ENGINE": "django.db.backends.sqlite3",
        "NAME": OTHER,
        "TEST": {"NAME": str(Path(tempfile.gettempdir()) / f"chatparity-{os.getpid()}.sqlite3")},
    },
)
connections.configure_settings(connections.settings)  # its defaults, as for the others
pytestmark = pytest.mark.django_db(transaction=True, databases=["default", OTHER])


class ChatparityElsewhere:
    """A site's router: chatparity's models in the database ``other``, the rest in ``default``."""

    def db_for_read(self, model, **hints):
        return OTHER if model._meta.app_label == "chatparity" else None

    db_for_write = db_for_read


@pytest.fixture(autouse=True)
def chatparity_elsewhere(settings):
    settings.DATABASE_ROUTERS = [ChatparityElsewhere()]
    settings.CHATPARITY = SCRIPTED


def ask(plaintext):
    """POST a completion through the ASGI fast path; the status."""
    status, _ = asyncio.run(ask_fast_path(plaintext))
    return status


def test_a_request_reads_and_writes_chatparitys_tables_where_the_routers_send_them():
    key, plaintext = ApiKey.objects.create_key("elsewhere", token_budget=1000 + HI + 1)
    backend = Backend.objects.create(name="scripted", kind="scripted", options={"script": ["Hi"]})
    # Each request reserves its prompt (HI) and a completion cap of 1: the budget takes one.
    ModelAlias.objects.create(public_id="echo", backend=backend, context_window=1)
    # This month's spending so far, which the budget counter is seeded from.
    logs.logged(request_id="earlier", api_key=key, key_prefix=key.prefix, total_tokens=1000)

    assert ask(plaintext) == 200  # its key and alias were read from "other"
    assert ask(plaintext) == 429  # its budget was seeded from the rollups in "other"

    rows = RequestLog.objects.using(OTHER).order_by("id")
    assert [(row.request_id == "earlier", row.status_code) for row in rows] == [
        (True, 200), (False, 200), (False, 429),
    ]  # fmt: skip
    assert RequestLog.objects.using("default").count() == 0
    key.refresh_from_db()
    assert key.last_used_at is not None


def test_a_broken_connection_to_a_routed_database_is_replaced():
    other = connections[OTHER]
    other.ensure_connection()

    def is_usable():  # PostgreSQL's check, which SQLite's wrapper leaves out
        try:
            other.connection.execute("SELECT 1")
        except sqlite3.ProgrammingError:
            return False
        return True

    other.is_usable = is_usable
    other.connection.close()  # as a restarted database server leaves it
    with pytest.raises(DatabaseError):
        ApiKey.objects.count()

    @reconnecting
    def count_keys():
        return ApiKey.objects.count()

    assert count_keys() == 0


def test_an_outage_is_logged_once_per_cause_per_interval(caplog):
    now = [100.0]
    logger = logging.getLogger("chatparity.tests")
    log = OncePerInterval(logger, interval=10.0, clock=lambda: now[0])
    refused, timed_out = OperationalError("refused"), TimeoutError("timed out")
    with caplog.at_level(logging.ERROR, "chatparity.tests"):
        for _ in range(100):  # every request of an outage fails the same way
            log.error("the database is unreachable (%s)", refused, exc_info=refused)
        log.error("the database is unreachable (%s)", timed_out, exc_info=timed_out)
        log.error("rows are spooled", exc_info=refused)
        assert len(caplog.records) == 3  # one per cause: the message and the exception's class
        now[0] += 10.0
        log.error("the database is unreachable (%s)", refused, exc_info=refused)
    assert len(caplog.records) == 4
    assert caplog.records[-1].getMessage() == (
        "the database is unreachable (refused) (99 more like it since the last report)"
    )


def test_an_outage_warning_is_logged_once_per_cause_per_interval_too(caplog):
    log = OncePerInterval(logging.getLogger("chatparity.tests"), interval=60.0)
    with caplog.at_level(logging.WARNING, "chatparity.tests"):
        for _ in range(3):
            log.warning("limits not settled: %s", "timed out")
    assert [(r.levelno, r.getMessage()) for r in caplog.records] == [
        (logging.WARNING, "limits not settled: timed out")
    ]


class LogRows(BatchWriter[RequestLog]):
    """A batch writer of the default policy: request log rows, inserted as they are. Each
    batch waits until ``open`` is set, and ``batches`` lists the request ids of each."""

    def __init__(self) -> None:
        super().__init__()
        self.open = asyncio.Event()
        self.open.set()
        self.batches: list[list[str]] = []

    async def save(self, rows: list[RequestLog]) -> None:
        self.batches.append([row.request_id for row in rows])
        await self.open.wait()
        await sync_to_async(RequestLog.objects.bulk_create)(rows)


def a_row(request_id: str, status_code: int = 200) -> RequestLog:
    return RequestLog(
        request_id=request_id, key_prefix="sk-cp-test", status_code=status_code, duration_ms=1
    )


def logged() -> list[str]:
    return sorted(RequestLog.objects.values_list("request_id", flat=True))


def test_concurrent_rows_are_one_batch_and_those_that_come_while_it_is_written_the_next():
    async def callers():
        writer = LogRows()
        writer.open.clear()  # the database is slow
        first = asyncio.gather(writer.write(a_row("a")), writer.write(a_row("b")))
        await asyncio.sleep(0.05)
        second = asyncio.gather(writer.write(a_row("c")), writer.write(a_row("d")))
        await asyncio.sleep(0.05)
        writer.open.set()
        return await first, await second, writer.batches

    first, second, batches = asyncio.run(callers())
    assert (first, second) == ([True, True], [True, True])
    assert batches == [["a", "b"], ["c", "d"]]
    assert logged() == ["a", "b", "c", "d"]


def test_a_row_the_database_refuses_fails_its_own_caller_only():
    async def callers():
        writer = LogRows()
        rows = [a_row("good"), a_row("refused", status_code=-1), a_row("good too")]
        outcomes = await asyncio.gather(*map(writer.write, rows), return_exceptions=True)
        return outcomes, writer.batches

    outcomes, batches = asyncio.run(callers())
    assert (outcomes[0], outcomes[2]) == (True, True)
    assert isinstance(outcomes[1], IntegrityError)
    assert batches == [["good", "refused", "good too"], ["good"], ["refused"], ["good too"]]
    assert logged() == ["good", "good too"]


def test_a_bug_fails_every_caller_of_its_batch_and_the_next_row_starts_a_new_one():
    class Buggy(LogRows):
        broken = True

        async def save(self, rows: list[RequestLog]) -> None:
            if self.broken:
                raise ValueError("a bug")
            await super().save(rows)

    async def callers():
        writer = Buggy()
        outcomes = await asyncio.gather(
            writer.write(a_row("a")), writer.write(a_row("b")), return_exceptions=True
        )
        writer.broken = False
        return outcomes, await writer.write(a_row("c"))

    outcomes, later = asyncio.run(callers())
    assert [repr(outcome) for outcome in outcomes] == ["ValueError('a bug')"] * 2
    assert later is True
    assert logged() == ["c"]


def test_a_row_whose_caller_was_cancelled_is_written_all_the_same():
    async def leaving():
        writer = LogRows()
        writer.open.clear()
        waiting = asyncio.ensure_future(writer.write(a_row("left")))
        await asyncio.sleep(0.05)
        waiting.cancel()  # the request's task, cancelled while its row waits
        writer.open.set()
        with pytest.raises(asyncio.CancelledError):
            await waiting
        await writer.write(a_row("next"))

    asyncio.run(leaving())
    assert logged() == ["left", "next"]


def test_each_event_loop_has_its_own_instance_which_goes_with_it():
    class State:
        pass

    per_loop = PerLoop(State)

    async def twice():
        return per_loop.get(), per_loop.get()

    first, again = asyncio.run(twice())
    other, _ = asyncio.run(twice())
    assert (first is again, first is other) == (True, False)
    gone = weakref.ref(first)
    del first, again, other
    gc.collect()
    assert gone() is None
