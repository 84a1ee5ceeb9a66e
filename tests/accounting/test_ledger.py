"""A request's accounting: its limits settled, then its row written, then announced, once."""

import threading
from unittest import mock

import orjson
import pytest
from asgiref.sync import sync_to_async
from asgiref.testing import ApplicationCommunicator
from django.core.asgi import get_asgi_application
from django.test import TestCase, override_settings

from chatparity import signals
from chatparity.accounting import inserts, limits
from chatparity.accounting.ledger import Accounting
from chatparity.accounting.record import UsageRecord
from chatparity.models import ApiKey, Backend, Deployment, ModelAlias, RequestLog
from chatparity.protocol.errors import APIError
from chatparity.protocol.events import ReasoningDelta, TextDelta
from chatparity.protocol.request import parse_chat_request
from chatparity.signals import request_logged
from chatparity.transport.fastpath import FastPath
from tests.asgi import http_scope
from tests.scripted import SCRIPTED
from tests.support.counters import OnRedis
from tests.support.upstream import UpstreamTestCase

CHAT = parse_chat_request(
    {"model": "echo", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 5}
)


@override_settings(CHATPARITY=SCRIPTED)
class CloseTests(TestCase):
    @classmethod
    def setUpTestData(cls):
        cls.key, cls.plaintext = ApiKey.objects.create_key("accounted", max_concurrent=1)
        backend = Backend.objects.create(
            name="scripted", kind="scripted", options={"script": ["Hello"]}
        )
        cls.alias = ModelAlias.objects.create(public_id="echo", backend=backend)

    def setUp(self):
        from django.core.cache import cache

        cache.clear()

    async def in_flight(self):
        key = await ApiKey.objects.aget(pk=self.key.pk)
        standing = {name: used for name, used, _ in await limits.standing(key)}
        return standing["requests in flight"]

    async def answered(self, application):
        """A completion through ``application``, answered in full; its communicator."""
        headers = [("authorization", f"Bearer {self.plaintext}")]
        scope = http_scope("POST", "/v1/chat/completions", headers)
        communicator = ApplicationCommunicator(application, scope)
        body = {"model": "echo", "messages": [{"role": "user", "content": "Hi"}]}
        await communicator.send_input({"type": "http.request", "body": orjson.dumps(body)})
        start = await communicator.receive_output(timeout=10)
        assert start["status"] == 200, await communicator.receive_output(timeout=10)
        completion = orjson.loads((await communicator.receive_output(timeout=10))["body"])
        assert completion["choices"][0]["message"]["content"] == "Hello"
        return communicator

    async def test_the_slot_in_flight_is_free_before_the_row_is_written(self):
        # A slow database must not hold a key's slots: with one allowed in flight, the
        # next request is admitted while the previous one's row still waits.
        release = threading.Event()
        original = inserts.insert_rows
        written = []

        def slow_insert(rows):
            assert release.wait(timeout=10)
            original(rows)
            written.extend(rows)

        application = FastPath(get_asgi_application())
        with mock.patch.object(inserts, "insert_rows", slow_insert):
            first = await self.answered(application)
            second = await self.answered(application)
            # Not counted in the database: the held insert may sit on this test's thread.
            assert written == []
            await sync_to_async(release.set, thread_sensitive=False)()
            await first.wait(timeout=10)
            await second.wait(timeout=10)
        assert await RequestLog.objects.acount() == 2

    async def test_the_slot_is_given_back_before_the_last_byte(self):
        # The client's next request may reach another worker the moment it has [DONE]:
        # its slot must be free by then, whatever the rest of the request's closing does.
        closing = mock.patch.object(Accounting, "close", mock.AsyncMock())
        for stream in (True, False):
            with self.subTest(stream=stream), closing:
                headers = [("authorization", f"Bearer {self.plaintext}")]
                scope = http_scope("POST", "/v1/chat/completions", headers)
                communicator = ApplicationCommunicator(FastPath(get_asgi_application()), scope)
                body = {"model": "echo", "messages": [{"role": "user", "content": "Hi"}]}
                body["stream"] = stream
                await communicator.send_input({"type": "http.request", "body": orjson.dumps(body)})
                assert (await communicator.receive_output(timeout=10))["status"] == 200
                last = b""
                while not last.endswith(b"data: [DONE]\n\n" if stream else b"}"):
                    last = (await communicator.receive_output(timeout=10))["body"]
                assert await self.in_flight() == 0
                await communicator.wait(timeout=10)

    async def test_the_row_is_announced_once_written_with_the_limits_settled(self):
        announced = []

        async def receiver(sender, row, **kwargs):
            logged = await RequestLog.objects.filter(request_id=row.request_id).aexists()
            announced.append((row.request_id, logged, await self.in_flight()))

        request_logged.connect(receiver)
        self.addCleanup(request_logged.disconnect, receiver)
        accounting = Accounting(UsageRecord(request_id="req-once", api_key=self.key))
        await accounting.admit(self.alias, CHAT, 1)
        assert await self.in_flight() == 1
        row = await accounting.close()
        assert await accounting.close() is row  # a second close does nothing
        assert announced == [("req-once", True, 0)]
        assert await RequestLog.objects.acount() == 1

    async def test_limits_that_cannot_be_settled_do_not_lose_the_row(self):
        accounting = Accounting(UsageRecord(request_id="req-kept", api_key=self.key))
        await accounting.admit(self.alias, CHAT, 1)
        refused = ConnectionError("the counters' Redis is down")
        with (
            mock.patch.object(accounting.admission, "settle", side_effect=refused),
            self.assertLogs("chatparity.accounting.ledger", "ERROR") as logs,
        ):
            await accounting.close()
        assert "the limits of req-kept were not settled" in logs.output[0]
        assert await RequestLog.objects.filter(request_id="req-kept").aexists()

    async def test_a_request_with_no_key_counts_against_the_alias_alone(self):
        # An admin's trial: the alias's limits, as for one more key, and no key's.
        self.alias.requests_per_minute = 1
        await self.alias.asave()
        trial = Accounting(UsageRecord(request_id="req-trial", key_prefix="admin"))
        await trial.admit(self.alias, CHAT, 1)
        assert trial.headers["x-ratelimit-remaining-requests"] == "0"
        with pytest.raises(APIError) as refused:
            await Accounting(UsageRecord(request_id="req-again", key_prefix="admin")).admit(
                self.alias, CHAT, 1
            )
        assert refused.value.status == 429
        keyed = Accounting(UsageRecord(request_id="req-key", api_key=self.key))
        await keyed.admit(self.alias, CHAT, 1)  # the key's own count on the alias is untouched
        assert await self.in_flight() == 1  # only the key's request holds its slot
        await trial.close()
        await keyed.close()
        row = await RequestLog.objects.aget(request_id="req-trial")
        assert (row.api_key_id, row.key_prefix) == (None, "admin")


class RedisCloseTests(OnRedis, CloseTests):
    pass


class Heard(signals.Observer):
    """What an observer was told, in order."""

    def __init__(self):
        self.told = []

    def admitting(self, record):
        self.told.append(("admitting", record.request_id))

    def admitted(self, record, refusal):
        self.told.append(("admitted", record.request_id, type(refusal).__name__))

    def backend_done(self, record):
        self.told.append(("backend_done", record.request_id))


@override_settings(CHATPARITY=SCRIPTED)
class AccountingTests(TestCase):
    """What the accounting of one request notes, and what it tells observers."""

    @classmethod
    def setUpTestData(cls):
        cls.key, _ = ApiKey.objects.create_key("noted", token_budget=1_000)
        cls.backend = Backend.objects.create(
            name="scripted", kind="scripted", options={"script": ["Hello"]}
        )
        cls.alias = ModelAlias.objects.create(public_id="echo", backend=cls.backend)

    def setUp(self):
        from django.core.cache import cache

        cache.clear()
        self.heard = Heard()
        signals.observe(self.heard)
        self.addCleanup(signals.unobserve, self.heard)

    def test_the_caller_is_the_key_else_who_made_the_trial(self):
        # Who takes turns on a shared backend and whose sessions stick: one name a key.
        keyed = Accounting(UsageRecord(request_id="req-1", api_key=self.key, key_prefix="x"))
        assert keyed.caller == f"key {self.key.pk}"
        assert Accounting(UsageRecord(request_id="req-2", key_prefix="admin")).caller == "admin"

    def test_each_deployment_asked_is_counted_and_the_last_names_the_row(self):
        other = Backend.objects.create(name="other", kind="scripted", options={"script": ["x"]})
        first = Deployment.objects.get(alias=self.alias, primary=True)
        second = Deployment.objects.create(alias=self.alias, backend=other, model="m2")
        accounting = Accounting(UsageRecord(request_id="req-3"))
        accounting.served_by(self.alias)
        accounting.deployed(first, None)
        assert accounting.record.deployments_tried == 1
        accounting.deployed(second, None)
        record = accounting.record
        assert record.deployments_tried == 2
        assert (record.deployment, record.backend, record.upstream_model) == (
            second.label, "other", "m2",
        )  # fmt: skip

    async def test_a_request_without_max_tokens_is_held_to_what_its_budget_left(self):
        unbounded = parse_chat_request(
            {"model": "echo", "messages": [{"role": "user", "content": "Hi"}]}
        )
        accounting = Accounting(UsageRecord(request_id="req-4", api_key=self.key))
        served = await accounting.admit(self.alias, unbounded, 10)
        assert served.completion_limit == 1_000 - 10  # what the budget leaves after the prompt
        await accounting.close()
        bounded = Accounting(UsageRecord(request_id="req-5", api_key=self.key))
        assert await bounded.admit(self.alias, CHAT, 10) is CHAT  # its own limit, unchanged
        await bounded.close()

    async def test_observers_hear_the_admission_and_the_backends_end(self):
        accounting = Accounting(UsageRecord(request_id="req-6", api_key=self.key))
        await accounting.admit(self.alias, CHAT, 1)
        accounting.backend_done()
        await accounting.close()
        refused = Accounting(UsageRecord(request_id="req-7", api_key=self.key))
        with pytest.raises(APIError):
            await refused.admit(self.alias, CHAT, 5_000)  # past the budget
        await refused.close()
        assert self.heard.told == [
            ("admitting", "req-6"),
            ("admitted", "req-6", "NoneType"),
            ("backend_done", "req-6"),
            ("admitting", "req-7"),
            ("admitted", "req-7", "APIError"),
        ]

    def test_a_failure_before_the_reply_sets_its_status_and_during_it_keeps_200(self):
        before = Accounting(UsageRecord(request_id="req-8"))
        before.fail(APIError("gone", status=502, type="upstream_error"))
        assert before.record.status_code == 502
        during = Accounting(UsageRecord(request_id="req-9"))
        during.fail(APIError("gone", status=502, type="upstream_error"), streaming=True)
        assert during.record.status_code == 200
        assert during.record.error.status == 502

    def test_only_a_failure_that_is_no_api_error_is_logged_as_a_bug(self):
        bug = KeyError("bug")
        with self.assertLogs("chatparity", "ERROR") as logged:
            error = Accounting(UsageRecord(request_id="req-10")).fail(bug)
            Accounting(UsageRecord(request_id="req-11")).fail(APIError("refused", param="x"))
        assert error.status == 500
        assert len(logged.records) == 1
        assert logged.records[0].getMessage() == "chatparity: unexpected failure"
        assert logged.records[0].exc_info[1] is bug  # the bug, not the refusal


class OverheadHeaderTests(UpstreamTestCase):
    """``x-chatparity-overhead-ms``: of ``openai-processing-ms``, what the gateway spent
    itself, not waiting on a backend (for a stream, up to its headers)."""

    @staticmethod
    def times(response):
        return int(response["openai-processing-ms"]), float(response["x-chatparity-overhead-ms"])

    async def test_a_whole_reply_counts_the_backends_time_out_of_its_overhead(self):
        # Twenty chunks 10 ms apart: at least 0.2 s waiting on the upstream.
        processing, overhead = self.times(await self.ask("long"))
        assert processing >= 200
        assert 0 < overhead < processing - 150

    async def test_a_streams_headers_count_up_to_the_first_event(self):
        response = await self.ask("long", stream=True)
        await self.stream_of(response)
        processing, overhead = self.times(response)
        assert 0 < overhead <= processing + 0.5

    async def test_a_reply_without_a_backend_is_all_overhead(self):
        response = await self.async_client.get(
            "/v1/models", headers={"Authorization": f"Bearer {self.plaintext}"}
        )
        processing, overhead = self.times(response)
        assert abs(processing - overhead) <= 0.5


def test_thinking_is_output_the_first_token_and_the_tokens_sent():
    accounting = Accounting(UsageRecord(request_id="req-thinking"))
    accounting.observe(ReasoningDelta(0, "Let me see", tokens=3))
    assert accounting.record.first_token_at is not None
    accounting.observe(TextDelta(0, "Hi"))
    assert accounting.record.completion_tokens_sent == 4
