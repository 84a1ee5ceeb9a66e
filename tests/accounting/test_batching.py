"""Database work honours the site's routers: a request on a site that keeps chatparity's
tables in a database of their own reads and writes only there (nothing is written
to the default database)."""

import asyncio
import logging
import os
import sqlite3
import tempfile
from pathlib import Path

import pytest
from django.conf import settings
from django.db import DatabaseError, OperationalError, connections

from chatparity.accounting.batching import OncePerInterval, reconnecting
from chatparity.models import ApiKey, Backend, ModelAlias, RequestLog
from tests.asgi import ask_fast_path
from tests.scripted import SCRIPTED

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
    key, plaintext = ApiKey.objects.create_key("elsewhere", token_budget=1005)
    backend = Backend.objects.create(name="scripted", kind="scripted", options={"script": ["Hi"]})
    # Each request reserves its prompt (4) and a completion cap of 1: the budget takes one.
    ModelAlias.objects.create(public_id="echo", backend=backend, context_window=1)
    # This month's spending so far, which the budget counter is seeded from.
    RequestLog.objects.create(
        request_id="earlier", api_key=key, key_prefix=key.prefix, status_code=200,
        duration_ms=1, total_tokens=1000,
    )  # fmt: skip

    assert ask(plaintext) == 200  # its key and alias were read from "other"
    assert ask(plaintext) == 429  # its budget was seeded from the log in "other"

    logged = RequestLog.objects.using(OTHER).order_by("id")
    assert [(row.request_id == "earlier", row.status_code) for row in logged] == [
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
