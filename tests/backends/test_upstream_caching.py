"""Prompt caching kept through an upstream backend: a coding agent's session costs through
chatparity what it costs direct. Each session is played twice, straight to a stub that
caches prompts as its provider does (:mod:`tests.support.prompt_cache`) and through
chatparity to another, and the two stubs' records compared: what was forwarded, what was
read from the cache, what each wire reported."""

import datetime
import re
from decimal import Decimal

from asgiref.sync import sync_to_async
from django.contrib.auth.models import User
from django.test import TestCase
from django.urls import reverse

from chatparity.models import ApiKey, Backend, ModelAlias, RequestLog
from tests.support.prompt_cache import CachingUpstream, markers
from tests.support.sessions import (
    ChatSession,
    ClaudeCodeSession,
    CodexSession,
    direct,
    read_share,
    run,
    through,
)
from tests.support.users import portal_user

TURNS = 30
UPSTREAM_MODEL = "agent-model"
MESSAGES = [{"role": "system", "content": "Rules of the house."}, {"role": "user", "content": "Hi"}]
CHAT_TOOL = {"type": "function", "function": {"name": "read", "parameters": {"type": "object"}}}


def normalized(body):
    """A Messages body's conversation as Anthropic reads it: a string is one text block."""
    system = body.get("system")
    return {
        "system": [{"type": "text", "text": system}] if isinstance(system, str) else system,
        "tools": body.get("tools"),
        "messages": [
            {**turn, "content": [{"type": "text", "text": turn["content"]}]}
            if isinstance(turn["content"], str)
            else turn
            for turn in body["messages"]
        ],
    }


class CachingSessionTestCase(TestCase):
    """A stub for direct calls, another behind aliases (``<wire_api>``: the backend
    speaking that API to it)."""

    @classmethod
    def setUpTestData(cls):
        cls.key, cls.plaintext = ApiKey.objects.create_key("agent")

    def setUp(self):
        self.direct_stub = CachingUpstream()
        self.stub = CachingUpstream()
        for stub in (self.direct_stub, self.stub):
            self.addCleanup(stub.close)

    async def alias(self, wire_api, **fields):
        backend = await Backend.objects.acreate(
            name=wire_api,
            kind="openai",
            base_url=self.stub.base_url,
            secret="sk-stub",
            timeout=10,
            options={"wire_api": wire_api, "retries": 0},
        )
        return await ModelAlias.objects.acreate(
            public_id=wire_api, backend=backend, model=UPSTREAM_MODEL, **fields
        )

    def assert_read_as_direct(self, session):
        """The warm turns (all but the first) read most of their prompt from the cache,
        within a point of the share read direct."""
        warm = slice(1, None)
        share = read_share(self.stub.reported[warm])
        direct_share = read_share(self.direct_stub.reported[warm])
        print(f"\n{session}: cache-read share {share:.2%} through, {direct_share:.2%} direct")
        assert share > 0.8, "the session's prefix is read from the cache"
        assert abs(share - direct_share) <= 0.01

    async def both(self, session_of, wire_api, turns=TURNS, **prices):
        """The session played direct and through an alias speaking ``wire_api`` (at
        ``prices``)."""
        await self.alias(wire_api, **prices)
        played_direct = await run(
            session_of(UPSTREAM_MODEL), direct(self.direct_stub.base_url.removesuffix("/v1")), turns
        )
        played = await run(session_of(wire_api), through(self.async_client, self.plaintext), turns)
        return played_direct, played


class ClaudeCodeSessionTests(CachingSessionTestCase):
    async def test_a_claude_code_session_caches_through_chatparity_as_direct(self):
        played_direct, played = await self.both(ClaudeCodeSession, "messages")

        # What reached the upstream is what the client sent, markers and all, turn by turn.
        for sent, received in zip(self.direct_stub.requests, self.stub.requests, strict=True):
            assert list(markers(received)) == list(markers(sent))
            assert normalized(received) == normalized(sent)
        assert {"ttl": "1h", "type": "ephemeral"} in [m for _, m in markers(self.stub.requests[0])]

        # The cache works as well: the same reads and writes every turn.
        assert self.stub.reported == self.direct_stub.reported
        self.assert_read_as_direct("Claude Code session")
        first = self.stub.reported[0]["cache_creation"]
        assert first["ephemeral_1h_input_tokens"] > 0, "the system prompt, for an hour"
        assert first["ephemeral_5m_input_tokens"] > 0, "the conversation, for five minutes"

        # Each turn's usage as the client read it (streamed or not) is the upstream's.
        for exchange, reported in zip(played, self.stub.reported, strict=True):
            usage = {key: exchange.usage[key] for key in reported}
            assert usage == reported
        rows = [row async for row in RequestLog.objects.order_by("id")]
        assert [(row.prompt_tokens, row.cached_tokens) for row in rows] == [
            (
                r["input_tokens"] + r["cache_read_input_tokens"] + r["cache_creation_input_tokens"],
                r["cache_read_input_tokens"],
            )
            for r in self.stub.reported
        ]
        assert len(played_direct) == len(played) == TURNS

    async def test_without_ttl_for_upstreams_that_refuse_it(self):
        alias = await self.alias("messages")
        alias.backend.options = {**alias.backend.options, "cache_ttl": False}
        await alias.backend.asave()
        await run(ClaudeCodeSession("messages"), through(self.async_client, self.plaintext), 2)
        sent = [marker for body in self.stub.requests for _, marker in markers(body)]
        assert len(sent) == 6
        assert all(marker == {"type": "ephemeral"} for marker in sent)

    async def test_a_claude_code_sessions_rows_cost_anthropics_formula_and_the_reports_total_them(
        self,
    ):
        # claude-sonnet-4-5's prices, its cache's left blank: Anthropic's ratios.
        await self.alias("messages", input_price=3, output_price=15)
        owner = await sync_to_async(portal_user)("agent-user")
        _, plaintext = await sync_to_async(ApiKey.objects.create_key)("claude", owner=owner)
        await run(ClaudeCodeSession("messages"), through(self.async_client, plaintext), TURNS)
        rows = [row async for row in RequestLog.objects.order_by("id")]
        assert len(rows) == TURNS
        billed = Decimal(0)
        for row, reported in zip(rows, self.stub.reported, strict=True):
            written = reported["cache_creation"]
            assert (row.cache_write_5m_tokens, row.cache_write_1h_tokens) == (
                written["ephemeral_5m_input_tokens"], written["ephemeral_1h_input_tokens"],
            )  # fmt: skip
            bill = (
                reported["input_tokens"] * 3
                + reported["cache_read_input_tokens"] * Decimal("0.3")
                + written["ephemeral_5m_input_tokens"] * Decimal("3.75")
                + written["ephemeral_1h_input_tokens"] * 6
                + reported["output_tokens"] * 15
            ) / Decimal(10**6)
            assert row.cost == bill.quantize(Decimal("1e-8"))
            billed += bill
        uncached = sum(row.prompt_tokens * 3 + row.completion_tokens * 15 for row in rows)
        print(
            f"\nClaude Code session, {TURNS} turns: ${sum(row.cost for row in rows)} through"
            f" chatparity, ${billed:.8f} billed by the provider's formula, ${uncached / 10**6}"
            " with every input token at the input price"
        )
        await reports_total_the_rows(self.async_client, owner, rows)


async def reports_total_the_rows(client, owner, rows):
    """The dashboard's total cost, and the portal's for ``owner`` (whose key made every
    row), are the sum of ``rows``' costs; so is the management API's."""
    total = sum(row.cost for row in rows)
    assert total > 0
    staff = await User.objects.acreate(username="staff", is_staff=True, is_superuser=True)
    await client.aforce_login(staff)
    dashboard = (await client.get("/admin/chatparity_dashboard/usagedashboard/")).content
    shown = re.search(rb'data-cost="([^"]+)" data-total="cost"', dashboard)
    assert Decimal(shown[1].decode()) == total
    usage = await client.get(reverse("chatparity-api:usage"), {"group_by": "alias"})
    assert sum(Decimal(group["cost"]) for group in usage.json()["results"]) == total
    await client.aforce_login(owner)
    month = datetime.datetime.now(datetime.UTC).strftime("%Y-%m")
    portal = (await client.get("/portal/usage/", {"month": month})).content
    in_total = re.search(rb'<table id="total">.*?data-cost="([^"]+)"', portal, re.S)
    assert Decimal(in_total[1].decode()) == total


class ChatSessionTests(CachingSessionTestCase):
    """A chat client's markers (OpenRouter's form) reach a Messages upstream, and its usage
    is reported in OpenAI's names: ``prompt_tokens`` with the cache's, ``cached_tokens``
    the reads."""

    async def test_a_chat_clients_markers_reach_a_messages_upstream(self):
        await self.alias("messages")
        played = await run(ChatSession("messages"), through(self.async_client, self.plaintext), 10)
        for received in self.stub.requests:
            found = list(markers(received))
            assert found[0] == ("system.0", {"type": "ephemeral", "ttl": "1h"})
            last = len(received["messages"]) - 1
            assert found[-1][0].startswith(f"messages.{last}.content.")
        assert read_share(self.stub.reported[1:]) > 0.8
        for exchange, reported in zip(played, self.stub.reported, strict=True):
            prompt = sum(
                reported[k]
                for k in ("input_tokens", "cache_read_input_tokens", "cache_creation_input_tokens")
            )
            assert exchange.usage["prompt_tokens"] == prompt
            assert (
                exchange.usage["prompt_tokens_details"]["cached_tokens"]
                == (reported["cache_read_input_tokens"])
            )

    async def test_markers_the_gateway_wrote_do_not_reach_a_chat_upstream(self):
        """Anthropic's markers in a Messages request are no chat client's: a strict
        OpenAI-compatible server refuses them."""
        await self.alias("chat")
        await run(ClaudeCodeSession("chat"), through(self.async_client, self.plaintext), 4)
        assert "cache_control" not in str(self.stub.requests)
        assert len(self.stub.requests) == 4

    async def test_a_chat_clients_own_markers_reach_a_chat_upstream_as_sent(self):
        await self.alias("chat")
        await run(ChatSession("chat"), through(self.async_client, self.plaintext), 2)
        system = self.stub.requests[-1]["messages"][0]
        assert system["content"][0]["cache_control"] == {"type": "ephemeral", "ttl": "1h"}


class CodexSessionTests(CachingSessionTestCase):
    async def _session(self, wire_api):
        played_direct, played = await self.both(
            CodexSession, wire_api, input_price=Decimal("2.5"), output_price=10
        )
        for received in self.stub.requests:
            assert received["prompt_cache_key"] == "codex-session-0"
        self.assert_read_as_direct(f"Codex session ({wire_api})")
        for exchange, reported in zip(played, self.stub.reported, strict=True):
            if wire_api == "responses":
                assert exchange.usage["input_tokens"] == reported["input_tokens"]
                cached = reported["input_tokens_details"]["cached_tokens"]
            else:
                assert exchange.usage["input_tokens"] == reported["prompt_tokens"]
                cached = reported["prompt_tokens_details"]["cached_tokens"]
            assert exchange.usage["input_tokens_details"]["cached_tokens"] == cached
        rows = [row async for row in RequestLog.objects.order_by("id")]
        assert [row.cached_tokens for row in rows] == [
            e.usage["input_tokens_details"]["cached_tokens"] for e in played
        ]
        assert len(played_direct) == TURNS
        # gpt-4o's prices, its cached input left blank: half the input price, OpenAI's.
        for row, exchange in zip(rows, played, strict=True):
            usage = exchange.usage
            cached = usage["input_tokens_details"]["cached_tokens"]
            bill = (
                (usage["input_tokens"] - cached) * Decimal("2.5")
                + cached * Decimal("1.25")
                + usage["output_tokens"] * 10
            ) / Decimal(10**6)
            assert row.cost == bill.quantize(Decimal("1e-8"))

    async def test_a_codex_session_to_a_responses_upstream(self):
        await self._session("responses")

    async def test_a_codex_session_to_a_chat_upstream(self):
        await self._session("chat")


class BreakpointsTests(CachingSessionTestCase):
    """An alias's ``cache_breakpoints``: a client that marks nothing (most chat clients)
    has its tools, system prompt and last user turn cached on a Messages upstream."""

    async def ask(self, **body):
        post = through(self.async_client, self.plaintext)
        body = {"model": "messages", "messages": MESSAGES, "tools": [CHAT_TOOL], **body}
        status, _, raw = await post("/v1/chat/completions", body)
        assert status == 200, raw
        return self.stub.requests[-1]

    async def test_an_alias_marks_what_a_request_left_unmarked(self):
        await self.alias("messages", cache_breakpoints=True)
        first = await self.ask()
        assert list(markers(first)) == [
            ("tools.0", {"type": "ephemeral"}),
            ("system.0", {"type": "ephemeral"}),
            ("messages.0.content.0", {"type": "ephemeral"}),
        ]
        await self.ask()
        assert self.stub.reported[1]["cache_read_input_tokens"] > 0, "the second reads the first"

    async def test_a_requests_own_markers_are_left_as_they_are(self):
        await self.alias("messages", cache_breakpoints=True)
        own = [
            {
                "role": "system",
                "content": [
                    {
                        "type": "text",
                        "text": "Rules.",
                        "cache_control": {"type": "ephemeral", "ttl": "1h"},
                    }
                ],
            },
            {"role": "user", "content": "Hi"},
        ]
        assert list(markers(await self.ask(messages=own))) == [
            ("system.0", {"type": "ephemeral", "ttl": "1h"})
        ]

    async def test_off_by_default(self):
        await self.alias("messages")
        assert list(markers(await self.ask())) == []
