"""What one request's log row holds."""

import asyncio
import datetime
import threading
from decimal import Decimal
from unittest import mock

import pytest
from asgiref.sync import ThreadSensitiveContext, sync_to_async
from django.db import IntegrityError
from django.db.models import CharField
from django.test import TestCase
from django.utils import timezone

from chatparity.accounting import inserts, writer
from chatparity.accounting.record import UsageRecord
from chatparity.models import ApiKey, RequestLog
from chatparity.protocol.errors import APIError
from chatparity.protocol.events import Usage


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("address", "logged"),
    [("203.0.113.7", "203.0.113.7"), ("::1", "::1"), ("testclient", None), ("", None)],
)
def test_only_ip_addresses_are_logged_as_the_client_ip(address, logged):
    # Servers put other things in REMOTE_ADDR (a Unix socket's path, a test client's
    # name); PostgreSQL refuses them, which would lose the row.
    key, _ = ApiKey.objects.create_key("k")
    row = UsageRecord(request_id="r", api_key=key, client_ip=address).row()
    row.save()
    row.refresh_from_db()
    assert row.client_ip == logged


@pytest.mark.django_db
def test_nul_characters_a_client_sent_are_replaced_so_postgresql_can_store_the_row(settings):
    settings.CHATPARITY = {"LOG_BODIES": True}
    key, _ = ApiKey.objects.create_key("k")
    record = UsageRecord(request_id="r", api_key=key, user_agent="agent\x00")
    record.alias = "model\x00"
    record.request_body = {"model": "model\x00", "messages": [{"content": "a\x00b"}]}
    row = record.row()
    row.save()
    row.refresh_from_db()
    assert (row.alias, row.user_agent) == ("model\ufffd", "agent\ufffd")
    assert row.request_body == {"model": "model\ufffd", "messages": [{"content": "a\ufffdb"}]}


@pytest.mark.django_db
def test_long_strings_are_cut_to_their_columns_so_postgresql_can_store_the_row():
    # A 300-character unknown model name, a long user agent, an upstream's long code:
    # PostgreSQL refuses what is longer than its column (SQLite does not check).
    key, _ = ApiKey.objects.create_key("k")
    record = UsageRecord(request_id="r", api_key=key, user_agent="u" * 1000)
    record.alias, record.backend, record.upstream_model = "m" * 300, "b" * 300, "x" * 300
    record.error = APIError("refused", type="t" * 100, code="c\x00" * 50)
    row = record.row()
    columns = {
        field.name: field.max_length
        for field in RequestLog._meta.concrete_fields
        if isinstance(field, CharField)
    }
    for name in ("alias", "backend", "upstream_model", "user_agent", "error_type", "error_code"):
        assert len(getattr(row, name)) == columns[name], name
    assert row.alias == "m" * 200
    assert row.error_code == "c\ufffd" * 32
    row.save()
    row.refresh_from_db()
    assert (len(row.alias), len(row.user_agent)) == (200, 500)


@pytest.mark.django_db
def test_a_row_names_its_key_or_else_who_made_the_request():
    key, _ = ApiKey.objects.create_key("k")
    by_key = UsageRecord(request_id="r", api_key=key).row()
    by_admin = UsageRecord(request_id="r", key_prefix="admin").row()
    assert (by_key.api_key, by_key.key_prefix) == (key, key.prefix)
    assert (by_admin.api_key, by_admin.key_prefix) == (None, "admin")
    inserts.insert_rows([by_key, by_admin])
    assert [(row.api_key_id, row.key_prefix) for row in RequestLog.objects.order_by("id")] == [
        (key.pk, key.prefix),
        (None, "admin"),
    ]


class LogWriterTests(TestCase):
    """Rows of concurrent requests go to the database together; none is dropped."""

    @classmethod
    def setUpTestData(cls):
        cls.key, _ = ApiKey.objects.create_key("k")

    def row(self, request_id, **fields):
        return UsageRecord(request_id=request_id, api_key=self.key, **fields).row()

    async def test_rows_finishing_together_are_one_insert(self):
        batches = []
        original = writer.LogWriter.save

        async def save(log_writer, rows):
            batches.append(len(rows))
            await original(log_writer, rows)

        log_writer = writer.LogWriter()
        with mock.patch.object(writer.LogWriter, "save", save):
            await asyncio.gather(*(log_writer.write(self.row(f"r{i}")) for i in range(10)))
        assert batches == [10]
        assert await RequestLog.objects.acount() == 10
        key = await ApiKey.objects.aget(pk=self.key.pk)
        assert key.last_used_at is not None

    async def test_a_row_the_database_refuses_fails_alone(self):
        log_writer = writer.LogWriter()
        good, bad = self.row("good"), self.row("bad", status_code=-1)
        writes = (log_writer.write(good), log_writer.write(bad))
        results = await asyncio.gather(*writes, return_exceptions=True)
        assert results[0] is True  # written
        assert isinstance(results[1], IntegrityError)
        assert [row.request_id async for row in RequestLog.objects.all()] == ["good"]

    def test_every_field_reads_back_as_it_was_recorded(self):
        record = UsageRecord(
            request_id="req-1", api_key=self.key, client_ip="2001:db8::1", user_agent="sdk/1.0"
        )
        record.completion_id, record.alias, record.backend = "chatcmpl-1", "smollm2", "local"
        record.upstream_model, record.stream, record.n = "SmolLM2-135M", True, 2
        record.finish_reasons, record.cancelled = {1: "length", 0: "stop"}, True
        record.usage = Usage(prompt_tokens=7, completion_tokens=5, cached_tokens=3)
        record.first_token_at = record.started + 0.25
        record.request_body = {"model": "smollm2", "messages": [{"content": "é"}]}
        row = record.row()
        row.cost, row.response_body = Decimal("0.00001234"), '{"id": "chatcmpl-1"}'
        row.request_body = record.request_body  # logged with LOG_BODIES on
        inserts.insert_rows([row])
        stored = RequestLog.objects.get()
        fields = [field.attname for field in RequestLog._meta.concrete_fields if field.name != "id"]
        assert {name: getattr(stored, name) for name in fields} == {
            name: getattr(row, name) for name in fields
        }
        assert stored.finish_reasons == ["stop", "length"]
        assert stored.created_at is not None

    def test_the_rows_of_a_batch_are_created_at_its_insert_a_spooled_one_keeps_its_time(self):
        spooled = self.row("spooled")
        spooled.created_at = first_written = timezone.now() - datetime.timedelta(hours=1)
        before = timezone.now()
        inserts.insert_rows([self.row("a"), spooled, self.row("b")])
        after = timezone.now()
        stored = {row.request_id: row.created_at for row in RequestLog.objects.all()}
        assert stored["spooled"] == first_written
        assert before <= stored["a"] == stored["b"] <= after

    async def test_a_row_whose_writer_was_cancelled_is_still_written(self):
        log_writer = writer.LogWriter()
        waiting = asyncio.ensure_future(log_writer.write(self.row("left")))
        await asyncio.sleep(0)
        waiting.cancel()  # the request's task, cancelled while its row waits
        flushing = log_writer._flushing
        await flushing  # the batch it joined is written all the same
        assert await RequestLog.objects.filter(request_id="left").aexists()


def test_a_batch_outliving_the_request_that_started_it_stays_in_one_thread():
    # Django's ASGI handler runs each request's database calls in a thread of the
    # request's own, shut down when it ends. A batch still open then must go on in the
    # worker's shared database thread, not get a new thread (and connection) per write.
    threads = []

    def write(rows):
        threads.append(threading.get_ident())

    async def requests_under_djangos_handler():
        log_writer = writer.LogWriter()
        async with ThreadSensitiveContext():  # the first request
            started = asyncio.ensure_future(log_writer.write(RequestLog(request_id="started")))
            await asyncio.sleep(0)
        # It has ended; its batch still waits for rows to join.
        await asyncio.gather(started, log_writer.write(RequestLog(request_id="joined")))
        async with ThreadSensitiveContext():  # a later request, a new batch
            await log_writer.write(RequestLog(request_id="later"))
        return await sync_to_async(threading.get_ident)()

    # Not the spool's drain either, which would leave a connection open in a thread
    # of this test's own loop (and the test database not dropped on PostgreSQL).
    with (
        mock.patch.object(writer, "_write", write),
        mock.patch.object(writer.LogWriter, "_drain_soon"),
    ):
        shared = asyncio.run(requests_under_djangos_handler())
    assert threads == [shared, shared]
