"""``request_logged``: sent once a request's row is written, whatever its receivers do."""

from django.test import TestCase

from chatparity.accounting.ledger import Accounting
from chatparity.accounting.record import UsageRecord
from chatparity.models import ApiKey, RequestLog
from chatparity.signals import request_logged


class RequestLoggedTests(TestCase):
    @classmethod
    def setUpTestData(cls):
        cls.key, _ = ApiKey.objects.create_key("signals")

    def accounting(self, request_id):
        return Accounting(UsageRecord(request_id=request_id, api_key=self.key))

    async def test_receivers_get_the_saved_row_once(self):
        received = []

        async def receiver(sender, row, **kwargs):
            received.append((sender, row))

        request_logged.connect(receiver)
        self.addCleanup(request_logged.disconnect, receiver)
        accounting = self.accounting("req-signal")
        row = await accounting.close()
        await accounting.close()
        assert received == [(RequestLog, row)]
        assert row.request_id == "req-signal"

    async def test_a_failing_receiver_is_logged_not_the_requests_failure(self):
        def broken(sender, row, **kwargs):
            raise RuntimeError("a site's receiver is broken")

        request_logged.connect(broken)
        self.addCleanup(request_logged.disconnect, broken)
        with self.assertLogs("chatparity.signals", "ERROR") as logs:
            row = await self.accounting("req-broken").close()
        assert await RequestLog.objects.filter(request_id=row.request_id).aexists()
        assert "request_logged" in logs.output[0]

    async def test_every_receiver_is_called_sync_and_async_after_one_fails(self):
        called = []

        async def failing(sender, row, **kwargs):
            raise RuntimeError("first")

        async def async_receiver(sender, row, **kwargs):
            called.append(("async", row.request_id))

        def sync_receiver(sender, row, **kwargs):
            called.append(("sync", row.request_id))

        for receiver in (failing, async_receiver, sync_receiver):
            request_logged.connect(receiver)
            self.addCleanup(request_logged.disconnect, receiver)
        with self.assertLogs("chatparity.signals", "ERROR"):
            await self.accounting("req-all").close()
        assert sorted(called) == [("async", "req-all"), ("sync", "req-all")]

    async def test_a_row_the_database_lost_is_not_announced(self):
        received = []

        def receiver(sender, row, **kwargs):
            received.append(row)

        request_logged.connect(receiver)
        self.addCleanup(request_logged.disconnect, receiver)
        accounting = self.accounting("req-lost")
        accounting.record.status_code = -1  # a row the database refuses
        with self.assertLogs("chatparity.accounting.writer", "ERROR") as logs:
            await accounting.close()
        assert "the log row of req-lost was lost" in logs.output[0]
        assert received == []
