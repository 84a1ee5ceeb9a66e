"""The one rule a request's usage is settled by: charged at least what was sent upstream on
its behalf, reserved at least what it can be charged. Through HTTP, against an upstream
that bills a token for each byte it reads (:mod:`tests.support.metered`), on every wire
and every ``wire_api``; then the rule itself, and a killed worker's requests."""

import asyncio
from decimal import Decimal

import orjson
from asgiref.sync import sync_to_async
from asgiref.testing import ApplicationCommunicator
from django.contrib.auth.models import User
from django.core.asgi import get_asgi_application
from django.core.cache import cache
from django.db.models import Sum
from django.test import TestCase, TransactionTestCase

from chatparity.accounting import journal, limits
from chatparity.accounting.record import UsageRecord
from chatparity.accounting.settlement import settled_usage
from chatparity.models import ApiKey, Backend, ModelAlias, Plan, RequestLog
from chatparity.protocol.events import Usage
from chatparity.transport.fastpath import FastPath
from tests.asgi import http_scope, keep_test_connection
from tests.support.metered import MeteredUpstream
from tests.support.waiting import until

WIRE_APIS = ("chat", "responses", "messages")
PROMPT = "Count the commas: " + ",;" * 2000  # 4,018 bytes: 4,018 tokens at the worst

# How a client of each endpoint asks for a completion of ``model``, and the bytes of a
# stream that tell its first token arrived.
ENDPOINTS = {
    "chat": (
        "/v1/chat/completions",
        lambda model: {"model": model, "messages": [{"role": "user", "content": PROMPT}]},
        b'"content":"Hello"',
    ),
    "responses": (
        "/v1/responses",
        lambda model: {"model": model, "input": PROMPT},
        b"response.output_text.delta",
    ),
    "messages": (
        "/v1/messages",
        lambda model: {
            "model": model, "max_tokens": 16, "messages": [{"role": "user", "content": PROMPT}]
        },
        b"text_delta",
    ),
}  # fmt: skip


class MeteredTestCase:
    """For each ``wire_api`` an upstream backend of the metered upstream: its aliases are
    ``<wire_api>-<behaviour>``, each giving up to 8 choices."""

    @classmethod
    def setUpClass(cls):
        cls.upstream = MeteredUpstream()
        cls.addClassCleanup(cls.upstream.stop)
        super().setUpClass()

    @classmethod
    def make_aliases(cls):
        for wire_api in WIRE_APIS:
            backend = Backend.objects.create(
                name=f"metered-{wire_api}", kind="openai", base_url=cls.upstream.base_url,
                secret="sk-metered", timeout=30, options={"wire_api": wire_api, "retries": 0},
            )  # fmt: skip
            for behaviour in ("answers", "silent", "hangs", "cached-hangs"):
                ModelAlias.objects.create(
                    public_id=f"{wire_api}-{behaviour}", backend=backend, model=behaviour, max_n=8
                )

    async def tokens_spent(self, key):
        """What ``key``'s token budget counts as spent this month."""
        key = await ApiKey.objects.aget(pk=key.pk)
        standing = {name: used for name, used, _ in await limits.standing(key)}
        return standing["tokens this month"]


class MeteredChatTestCase(MeteredTestCase, TestCase):
    """Chat completions through the metered aliases."""

    @classmethod
    def setUpTestData(cls):
        cls.make_aliases()

    def setUp(self):
        cache.clear()

    def chat(self, plaintext, **body):
        return self.async_client.post(
            "/v1/chat/completions",
            data=orjson.dumps(body),
            content_type="application/json",
            headers={"Authorization": f"Bearer {plaintext}"},
        )


class HangUpTests(MeteredTestCase, TransactionTestCase):
    """Security round 4 (HIGH): a client that hung up before the end of its answer was
    charged no prompt (usage comes at the end), so a budget paid for nothing the upstream
    read. It is charged the prompt of each call its upstream was sent: the one the
    upstream announced (a Messages upstream's ``message_start``), else the one reserved."""

    def setUp(self):
        keep_test_connection(self)
        cache.clear()
        self.make_aliases()
        self.upstream.calls.clear()

    async def hang_up(self, endpoint, wire_api, *, stream, owner=None):
        """Ask ``endpoint`` for a completion the upstream (speaking ``wire_api``) starts and
        never ends, with a new key (of ``owner``), and leave: after the first token of a
        stream, or while a whole answer is awaited. The row, and the upstream's count of
        the prompt it was sent."""
        budget = None if owner else 10**7
        key, plaintext = await sync_to_async(ApiKey.objects.create_key)(
            "leaves", owner=owner, token_budget=budget
        )
        path, body, first_token = ENDPOINTS[endpoint]
        headers = [("authorization", f"Bearer {plaintext}"), ("content-type", "application/json")]
        communicator = ApplicationCommunicator(
            FastPath(get_asgi_application()), http_scope("POST", path, headers)
        )
        request = {**body(f"{wire_api}-hangs"), "stream": stream}
        await communicator.send_input({"type": "http.request", "body": orjson.dumps(request)})
        if stream:
            assert (await communicator.receive_output(timeout=30))["status"] == 200
            received = b""
            while first_token not in received:
                received += (await communicator.receive_output(timeout=30))["body"]
        else:
            await until(lambda: self.upstream.holding, timeout=30)
        await communicator.send_input({"type": "http.disconnect"})
        await communicator.wait(timeout=10)
        await until(lambda: not self.upstream.holding)
        row = await RequestLog.objects.aget(api_key=key)
        (sent,) = self.upstream.sent("hangs")
        self.upstream.calls.clear()
        assert row.cancelled
        assert row.prompt_tokens >= sent.prompt_tokens > 4000
        if wire_api == "messages":  # the prompt it announced before its first token
            assert row.prompt_tokens == sent.prompt_tokens
        if budget is not None:
            assert await self.tokens_spent(key) == row.total_tokens
        return row

    async def test_a_chat_stream_left_after_its_first_token(self):
        for wire_api in WIRE_APIS:
            with self.subTest(wire_api=wire_api):
                await self.hang_up("chat", wire_api, stream=True)

    async def test_a_whole_chat_completion_left_while_awaited(self):
        for wire_api in WIRE_APIS:
            with self.subTest(wire_api=wire_api):
                await self.hang_up("chat", wire_api, stream=False)

    async def test_a_response_stream_left_after_its_first_token(self):
        await self.hang_up("responses", "responses", stream=True)

    async def test_a_whole_response_left_while_awaited(self):
        await self.hang_up("responses", "chat", stream=False)

    async def test_a_message_stream_left_after_its_first_token(self):
        await self.hang_up("messages", "messages", stream=True)

    async def test_a_whole_message_left_while_awaited(self):
        await self.hang_up("messages", "messages", stream=False)

    async def test_a_message_stream_left_keeps_the_cache_reads_announced_and_their_price(self):
        # Anthropic's message_start says half the prompt was read from its cache: a client
        # that leaves is charged those tokens as reads, at a tenth of the input price.
        await ModelAlias.objects.filter(public_id="messages-cached-hangs").aupdate(
            input_price=3, output_price=15
        )
        key, plaintext = await sync_to_async(ApiKey.objects.create_key)("leaves")
        path, body, first_token = ENDPOINTS["messages"]
        headers = [("authorization", f"Bearer {plaintext}"), ("content-type", "application/json")]
        communicator = ApplicationCommunicator(
            FastPath(get_asgi_application()), http_scope("POST", path, headers)
        )
        request = {**body("messages-cached-hangs"), "stream": True}
        await communicator.send_input({"type": "http.request", "body": orjson.dumps(request)})
        assert (await communicator.receive_output(timeout=30))["status"] == 200
        received = b""
        while first_token not in received:
            received += (await communicator.receive_output(timeout=30))["body"]
        await communicator.send_input({"type": "http.disconnect"})
        await communicator.wait(timeout=10)
        row = await RequestLog.objects.aget(api_key=key)
        (sent,) = self.upstream.sent("cached-hangs")
        read = sent.prompt_tokens // 2
        assert (row.cancelled, row.prompt_tokens, row.cached_tokens) == (
            True, sent.prompt_tokens, read,
        )  # fmt: skip
        assert row.cost == (
            (sent.prompt_tokens - read) * 3 + read * Decimal("0.3") + row.completion_tokens * 15
        ) / Decimal(10**6)

    async def test_under_a_plans_owner_budget(self):
        owner = await User.objects.acreate(username="owner")
        plan = await Plan.objects.acreate(name="owners", owner_token_budget=10**7)
        await plan.users.aadd(owner)
        row = await self.hang_up("messages", "messages", stream=True, owner=owner)
        standing = await limits.owner_standing(owner.pk, plan)
        assert standing == [("tokens this month (all your keys)", row.total_tokens, 10**7)]


class ChoicesTests(MeteredChatTestCase):
    """Security round 4: a request for n choices sends its prompt n times to an upstream
    that answers one choice a call (the Responses and Messages APIs; a chat server that
    ignores n), and is charged it n times: it is reserved n times too."""

    def ask(self, plaintext, model, n):
        messages = [{"role": "user", "content": PROMPT}]
        return self.chat(plaintext, model=model, n=n, max_tokens=1, messages=messages)

    async def test_n_choices_never_pass_a_budget_on_any_wire_api(self):
        for wire_api in WIRE_APIS:
            with self.subTest(wire_api=wire_api):
                # Less than 8 prompts: the request is refused, not admitted and overspent.
                key, plaintext = await sync_to_async(ApiKey.objects.create_key)(
                    f"short-{wire_api}", token_budget=20_000
                )
                answer = await self.ask(plaintext, f"{wire_api}-answers", 8)
                assert answer.status_code == 429
                assert await self.tokens_spent(key) <= 20_000
                # Room for 8 prompts: each call's prompt is charged.
                key, plaintext = await sync_to_async(ApiKey.objects.create_key)(
                    f"room-{wire_api}", token_budget=40_000
                )
                self.upstream.calls.clear()
                answer = await self.ask(plaintext, f"{wire_api}-answers", 8)
                assert answer.status_code == 200
                assert len(answer.json()["choices"]) == 8
                sent = self.upstream.sent("answers")
                assert len(sent) == 8  # one choice a call
                charged = sum(call.prompt_tokens for call in sent) + 8
                assert answer.json()["usage"]["total_tokens"] == charged
                assert await self.tokens_spent(key) == charged <= 40_000


class NoUsageTests(MeteredChatTestCase):
    """Security round 4: an upstream that reports no usage had its request charged the
    text of its messages alone, never its tools (~120,000 tokens of tools charged as 4).
    It is charged the prompt it reserved: all it sent, at its bound."""

    async def test_tools_and_schemas_are_charged_when_the_upstream_says_nothing(self):
        tool = {
            "type": "function",
            "function": {
                "name": "lookup",
                "description": "Look it up. " * 4000,
                "parameters": {"type": "object", "properties": {"q": {"type": "string"}}},
            },
        }
        key, plaintext = await sync_to_async(ApiKey.objects.create_key)("tools", token_budget=10**7)
        for wire_api in WIRE_APIS:
            with self.subTest(wire_api=wire_api):
                self.upstream.calls.clear()
                answer = await self.chat(
                    plaintext,
                    model=f"{wire_api}-silent",
                    tools=[tool],
                    messages=[{"role": "user", "content": "Hi"}],
                )
                assert answer.status_code == 200
                (sent,) = self.upstream.sent("silent")
                assert sent.prompt_tokens > 48_000  # the tool's description
                usage = answer.json()["usage"]
                assert usage["prompt_tokens"] >= sent.prompt_tokens
                row = await RequestLog.objects.alatest("pk")
                assert (row.prompt_tokens, row.usage_counted) == (usage["prompt_tokens"], True)
        spent = await RequestLog.objects.aaggregate(total=Sum("total_tokens"))
        assert await self.tokens_spent(key) == spent["total"]


class LocalTemplateTests(TestCase):
    """Security round 3, still open: the local model's chat template adds its own tokens
    (a default system prompt: about 30 a request), which admission did not count, so
    concurrent requests passed an owner budget (1,025 used of 400). The prompt is counted
    by the model's tokenizer, template and all, before admission."""

    @classmethod
    def setUpTestData(cls):
        backend = Backend.objects.create(name="local", kind="local")
        ModelAlias.objects.create(public_id="smollm2", backend=backend)
        cls.owner = User.objects.create_user("owner")
        cls.plan = Plan.objects.create(name="owners", owner_token_budget=400)
        cls.plan.users.add(cls.owner)

    def setUp(self):
        cache.clear()

    async def test_concurrent_requests_never_pass_an_owner_budget(self):
        _, plaintext = await sync_to_async(ApiKey.objects.create_key)("laptop", owner=self.owner)
        body = {
            "model": "smollm2",
            "max_tokens": 1,
            "messages": [{"role": "user", "content": "Hi"}],
        }

        async def ask():
            return await self.async_client.post(
                "/v1/chat/completions",
                data=orjson.dumps(body),
                content_type="application/json",
                headers={"Authorization": f"Bearer {plaintext}"},
            )

        answers = await asyncio.gather(*(ask() for _ in range(30)))
        admitted = [answer for answer in answers if answer.status_code == 200]
        assert 0 < len(admitted) < 30
        prompt = admitted[0].json()["usage"]["prompt_tokens"]
        assert prompt > 20  # the template's own tokens: "Hi" is one
        (standing,) = await limits.owner_standing(self.owner.pk, self.plan)
        spent = sum(answer.json()["usage"]["total_tokens"] for answer in admitted)
        assert standing == ("tokens this month (all your keys)", spent, 400)
        assert spent <= 400


class TestSettledUsage:
    """:func:`settled_usage`, case by case."""

    def test_a_reported_usage_is_what_is_charged(self):
        reported = Usage(120, 7)
        assert settled_usage(900, [None, Usage(80, 1)], reported, 3, answered=True) == reported

    def test_a_request_left_midway_is_charged_each_calls_prompt(self):
        usage = settled_usage(900, [None, None, None], None, 5, answered=True)
        assert (usage.prompt_tokens, usage.completion_tokens, usage.counted) == (2700, 5, True)

    def test_the_prompt_an_upstream_announced_stands_for_its_call(self):
        usage = settled_usage(900, [Usage(300, 1), None], None, 0, answered=True)
        assert usage.prompt_tokens == 1200

    def test_a_backend_that_notes_no_call_made_one_once_it_answered(self):
        assert settled_usage(900, [], None, 2, answered=True).prompt_tokens == 900
        assert settled_usage(900, [], None, 0, answered=False).prompt_tokens == 0

    def test_a_request_left_midway_keeps_the_cache_reads_and_writes_announced(self):
        # Anthropic's message_start: 300 input tokens, 200 of them read from the cache and
        # 50 written for an hour; the second call announced nothing.
        announced = Usage(300, 1, cached_tokens=200, cache_write_1h_tokens=50)
        usage = settled_usage(900, [announced, None], None, 4, answered=True)
        assert usage == Usage(1200, 4, cached_tokens=200, cache_write_1h_tokens=50, counted=True)

    def test_a_usage_the_backend_counted_keeps_the_cache_announced(self):
        announced = Usage(300, 1, cached_tokens=100, cache_write_5m_tokens=20)
        counted = Usage(400, 5, reasoning_tokens=3, counted=True)
        assert settled_usage(900, [announced], counted, 5, answered=True) == Usage(
            400, 5, cached_tokens=100, reasoning_tokens=3, cache_write_5m_tokens=20, counted=True
        )

    def test_a_usage_the_backend_counted_is_never_below_what_was_sent(self):
        counted = Usage(4, 2, counted=True)
        assert settled_usage(900, [None], counted, 2, answered=True) == Usage(900, 2, counted=True)
        generous = Usage(1000, 2, counted=True)
        assert settled_usage(900, [None], generous, 2, answered=True) == generous


def test_a_killed_workers_request_is_settled_on_its_prompt():
    alias = ModelAlias(public_id="priced", input_price=1000, output_price=2000)
    record = UsageRecord(request_id="req-killed", key_prefix="sk-cp-abcd", model_alias=alias)
    record.alias, record.reserved_prompt = "priced", 4_000
    record.upstream.sent()
    record.upstream.sent()  # a second choice asked for on its own
    record.completion_tokens_sent = 7
    lines = journal._begin_line(record) + journal._progress_line(record)
    (row,) = journal.interrupted_rows(lines)
    assert (row.prompt_tokens, row.completion_tokens, row.total_tokens) == (8_000, 7, 8_007)
    assert row.cost == alias.cost_of(Usage(8_000, 7))
    begun_only = journal.interrupted_rows(journal._begin_line(record))
    assert (begun_only[0].prompt_tokens, begun_only[0].completion_tokens) == (4_000, 0)


def test_a_killed_workers_request_keeps_the_cache_its_upstream_announced():
    messages = Backend(pk=1, name="anthropic", kind="openai", options={"wire_api": "messages"})
    alias = ModelAlias(public_id="claude", backend=messages, input_price=3, output_price=15)
    record = UsageRecord(request_id="req-killed", key_prefix="sk-cp-abcd", model_alias=alias)
    record.alias, record.reserved_prompt = "claude", 20_000
    record.upstream.sent()
    record.upstream.announced(Usage(12_345, 1, cached_tokens=10_000, cache_write_5m_tokens=1_500,
                                    cache_write_1h_tokens=500))  # fmt: skip
    record.completion_tokens_sent = 678
    lines = journal._begin_line(record) + journal._progress_line(record)
    (row,) = journal.interrupted_rows(lines)
    assert (row.prompt_tokens, row.cached_tokens) == (12_345, 10_000)
    assert (row.cache_write_5m_tokens, row.cache_write_1h_tokens) == (1_500, 500)
    # At Anthropic's ratios of the blank cache prices, as the request would have been.
    assert row.cost == Decimal("0.02283")


def test_an_older_journals_rows_are_still_recovered():
    # Before cache prices: two prices, and each call's prompt as a number.
    begin = {"begin": "req-old", "at": 1.0, "endpoint": "chat.completions", "api_key_id": None,
             "key_prefix": "sk-cp-abcd", "alias": "priced", "backend": "up",
             "upstream_model": "m", "stream": True, "n": 1, "client_ip": None,
             "user_agent": "", "prompt_tokens": 900, "prices": ["1000", "2000"]}  # fmt: skip
    progress = {"progress": "req-old", "seen": 2.0, "completion_id": "", "completion_tokens": 3,
                "prompts": [300, None]}  # fmt: skip
    (row,) = journal.interrupted_rows(orjson.dumps(begin) + b"\n" + orjson.dumps(progress))
    assert (row.prompt_tokens, row.completion_tokens) == (1_200, 3)
    assert row.cost == Decimal("1.206")
