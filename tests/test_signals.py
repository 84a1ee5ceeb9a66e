"""``request_logged``: sent once a request's row is written, whatever its receivers do."""

from django.test import TestCase

from chatparity.models import ApiKey, RequestLog
from chatparity.signals import request_logged
from chatparity.usage import UsageRecord, record_usage


class RequestLoggedTests(TestCase):
    @classmethod
    def setUpTestData(cls):
        cls.key, _ = ApiKey.objects.create_key("signals")

    async def test_receivers_get_the_saved_row_once(self):
        received = []

        async def receiver(sender, row, **kwargs):
            received.append((sender, row))

        request_logged.connect(receiver)
        self.addCleanup(request_logged.disconnect, receiver)
        row = await record_usage(UsageRecord(request_id="req-signal", api_key=self.key))
        assert received == [(RequestLog, row)]
        assert row.request_id == "req-signal"

    async def test_a_failing_receiver_is_logged_not_the_requests_failure(self):
        def broken(sender, row, **kwargs):
            raise RuntimeError("a site's receiver is broken")

        request_logged.connect(broken)
        self.addCleanup(request_logged.disconnect, broken)
        with self.assertLogs("chatparity.usage", "ERROR") as logs:
            row = await record_usage(UsageRecord(request_id="req-broken", api_key=self.key))
        assert row.request_id == "req-broken"
        assert "request_logged" in logs.output[0]
