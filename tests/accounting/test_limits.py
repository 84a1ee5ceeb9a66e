"""Rate limits and budgets: OpenAI's 429s and headers, counted across requests."""

import asyncio
import datetime
import io
import json
import random
import signal
import time
from decimal import Decimal
from unittest import mock

import orjson
import pytest
from asgiref.sync import sync_to_async
from django.core.cache import cache
from django.core.management import call_command
from django.test import TestCase, override_settings
from django.utils import timezone

from chatparity.accounting import limits
from chatparity.accounting.batching import OncePerInterval
from chatparity.accounting.limits import Change, Lease, RedisCounters
from chatparity.models import ApiKey, Backend, ModelAlias, RequestLog
from chatparity.protocol.errors import APIError
from chatparity.protocol.events import Usage
from chatparity.protocol.request import parse_chat_request
from chatparity.protocol.tokens import prompt_bound
from tests import services
from tests.scripted import SCRIPTED
from tests.support.counters import OnRedis
from tests.support.logs import logged
from tests.support.processes import in_a_process


async def save(instance, **fields):
    """Change and save ``instance`` as the admin does (which the lookup cache hears of)."""
    for name, value in fields.items():
        setattr(instance, name, value)
    await instance.asave(update_fields=list(fields))


HI = 50
"""The bound of a prompt ``Hi`` (:func:`prompt_bound`): its 2 bytes, 16 tokens for its
message, 32 for the request."""


@override_settings(CHATPARITY=SCRIPTED)
class LimitTestCase(TestCase):
    """A key and an alias on a scripted backend that answers ``Hello there``: 1 prompt
    and 2 completion tokens. The backend counts no tokens: chatparity reserves the prompt
    ``Hi`` at its bound, :data:`HI` tokens."""

    @classmethod
    def setUpTestData(cls):
        cls.key, cls.plaintext = ApiKey.objects.create_key("limited")
        backend = Backend.objects.create(
            name="scripted", kind="scripted", options={"script": ["Hello", " there"]}
        )
        cls.alias = ModelAlias.objects.create(public_id="echo", backend=backend)
        cls.other = ModelAlias.objects.create(public_id="other", backend=backend)

    def setUp(self):
        cache.clear()

    async def limit(self, **fields):
        await save(self.key, **fields)

    async def admit(self):
        """Admit, as the gateway would, ``Hi`` with ``max_tokens`` 1: HI + 1 tokens."""
        key = await ApiKey.objects.aget(pk=self.key.pk)
        messages = [{"role": "user", "content": "Hi"}]
        chat = parse_chat_request({"model": "echo", "messages": messages, "max_tokens": 1})
        estimate = limits.Estimate.of(chat, self.alias, prompt_bound(chat))
        return await limits.admit(key, self.alias, estimate)

    async def standing(self):
        """What the key has used of each of its limits, by name."""
        key = await ApiKey.objects.aget(pk=self.key.pk)
        return {name: used for name, used, _ in await limits.standing(key)}

    def ask(self, model="echo", **body):
        messages = [{"role": "user", "content": "Hi"}]
        return self.async_client.post(
            "/v1/chat/completions",
            data=orjson.dumps({"model": model, "messages": messages, **body}),
            content_type="application/json",
            headers={"Authorization": f"Bearer {self.plaintext}"},
        )


class RequestsPerMinuteTests(LimitTestCase):
    async def test_the_request_over_the_limit_gets_openais_429_and_a_log_row(self):
        await self.limit(requests_per_minute=2)
        first, second, third = [await self.ask() for _ in range(3)]
        assert (first.status_code, second.status_code, third.status_code) == (200, 200, 429)
        assert [r["x-ratelimit-remaining-requests"] for r in (first, second, third)] == [
            "1", "0", "0",
        ]  # fmt: skip
        assert first["x-ratelimit-limit-requests"] == "2"
        assert first["x-ratelimit-reset-requests"].endswith("s")
        error = third.json()["error"]
        assert (error["type"], error["code"], error["param"]) == (
            "requests", "rate_limit_exceeded", None,
        )  # fmt: skip
        assert error["message"].startswith("Rate limit reached for requests per minute: limit 2")
        assert 1 <= int(third["retry-after"]) <= 60
        statuses = [row.status_code async for row in RequestLog.objects.order_by("id")]
        assert statuses == [200, 200, 429]

    async def test_a_limit_on_the_alias_counts_each_key_on_that_alias(self):
        await save(self.alias, requests_per_minute=1)
        assert (await self.ask()).status_code == 200
        assert (await self.ask()).status_code == 429
        assert (await self.ask(model="other")).status_code == 200

    async def test_no_limits_no_rate_limit_headers(self):
        response = await self.ask()
        assert response.status_code == 200
        assert "x-ratelimit-limit-requests" not in response


class TokensPerMinuteTests(LimitTestCase):
    async def test_prompt_plus_max_tokens_is_reserved_up_front(self):
        await self.limit(tokens_per_minute=100)
        response = await self.ask(max_tokens=500)
        assert response.status_code == 429
        error = response.json()["error"]
        assert (error["type"], error["code"]) == ("tokens", "rate_limit_exceeded")

    async def test_what_was_really_used_counts_after_the_request(self):
        await self.limit(tokens_per_minute=200)
        first = await self.ask(max_tokens=50)
        assert first["x-ratelimit-remaining-tokens"] == str(200 - (HI + 50))
        assert first.json()["usage"]["total_tokens"] == 3
        second = await self.ask(max_tokens=1)
        # The first's reservation became the 3 tokens it used; the second reserved HI + 1.
        assert second["x-ratelimit-remaining-tokens"] == str(200 - 3 - (HI + 1))


class ConcurrencyTests(LimitTestCase):
    async def test_requests_in_flight_are_limited_and_given_back(self):
        await self.limit(max_concurrent=1)
        open_stream = await self.ask(stream=True)
        assert open_stream.status_code == 200
        refused = await self.ask()
        assert refused.status_code == 429
        assert "in flight" in refused.json()["error"]["message"]
        b"".join([part async for part in open_stream.streaming_content])  # the stream ends
        assert (await self.ask()).status_code == 200

    async def test_each_choice_takes_a_slot_in_flight(self):
        # Security round 3: n=4 on a key limited to 1 in flight took every context of
        # the local model.
        await save(self.alias, max_n=4)
        await self.limit(max_concurrent=3)
        refused = await self.ask(n=4)
        assert refused.status_code == 429
        assert refused.json()["error"]["message"] == (
            "Too many requests in flight for this key: limit 3; this request's 4 choices"
            " count as 4."
        )
        open_stream = await self.ask(stream=True, n=2)
        assert open_stream.status_code == 200
        assert (await self.ask(n=2)).status_code == 429  # 2 + 2 in flight would pass 3
        assert (await self.ask(n=1)).status_code == 200
        key = await ApiKey.objects.aget(pk=self.key.pk)
        assert ("requests in flight", 2, 3) in await limits.standing(key)
        b"".join([part async for part in open_stream.streaming_content])
        assert (await self.ask(n=3)).status_code == 200


class BudgetTests(LimitTestCase):
    async def test_a_budget_the_next_reservation_would_pass_is_insufficient_quota(self):
        await self.limit(token_budget=HI + 7, budget_period="day")
        assert (await self.ask(max_tokens=2)).status_code == 200  # HI + 2 reserved, 3 used
        assert (await self.ask(max_tokens=2)).status_code == 200  # 3 + HI + 2, 3 used
        refused = await self.ask(max_tokens=2)  # 6 + HI + 2 would pass HI + 7
        assert refused.status_code == 429
        assert refused.json()["error"] == {
            "message": "You exceeded your current quota, please check your plan and billing"
            f" details. Budget: tokens this day, limit {HI + 7}, used 6, requested {HI + 2}.",
            "type": "insufficient_quota",
            "param": None,
            "code": "insufficient_quota",
        }
        assert int(refused["retry-after"]) <= 24 * 3600

    async def test_a_budget_counts_what_the_log_already_holds(self):
        # As after a cache flush: the counter is seeded from this month's rollups.
        await sync_to_async(logged)(api_key=self.key, key_prefix=self.key.prefix,
                                    total_tokens=1000)  # fmt: skip
        long_ago = datetime.datetime(2000, 1, 1, 12, tzinfo=datetime.UTC)
        await sync_to_async(logged)(at=long_ago, api_key=self.key, key_prefix=self.key.prefix,
                                    total_tokens=1000)  # fmt: skip
        await self.limit(token_budget=1000 + HI + 1)  # 1000 spent, HI + 2 to reserve
        assert (await self.ask(max_tokens=2)).status_code == 429
        await self.limit(token_budget=1000 + HI + 2)
        assert (await self.ask(max_tokens=2)).status_code == 200

    async def test_pruning_the_log_gives_no_budget_back(self):
        # Security round 4: a key's budget was seeded from its log rows, so pruning them
        # and restarting without Redis (counters in a cache that starts empty) gave back
        # what the key had spent.
        await self.limit(token_budget=1000)
        await sync_to_async(logged)(api_key=self.key, key_prefix=self.key.prefix,
                                    total_tokens=990)  # fmt: skip
        tomorrow = timezone.now() + datetime.timedelta(days=1)
        with mock.patch("django.utils.timezone.now", return_value=tomorrow):
            await sync_to_async(call_command)("chatparity_prune_logs", "--older-than", "1",
                                              stdout=io.StringIO())  # fmt: skip
        assert not await RequestLog.objects.aexists()
        cache.clear()  # the worker restarted: the counters start again from the rollups
        refused = await self.ask(max_tokens=2)
        assert refused.status_code == 429
        assert f"limit 1000, used 990, requested {HI + 2}" in refused.json()["error"]["message"]

    async def test_cost_budget_uses_the_aliases_prices(self):
        await save(self.alias, input_price=Decimal("1000"), output_price=Decimal("2000"))
        await self.limit(cost_budget=Decimal("0.060"))
        first = await self.ask(max_tokens=2)  # HI * $0.001 + 2 * $0.002 reserved: $0.054
        row = await RequestLog.objects.aget()
        usage = first.json()["usage"]
        expected = (usage["prompt_tokens"] * 1000 + usage["completion_tokens"] * 2000) / 1e6
        assert row.cost == pytest.approx(Decimal(str(expected)))
        assert (await self.ask(max_tokens=2)).status_code == 200  # $0.005 spent, $0.054 fits
        assert (await self.ask(max_tokens=2)).status_code == 429  # $0.010 spent, $0.054 not

    async def test_tools_calls_and_schemas_are_reserved_as_the_prompt_they_are(self):
        # A "Hi" carrying 40,000 characters of tool schema, of a call's arguments, or of a
        # format's schema: a backend is given all of it (an upstream bills it), so it is
        # reserved as the 40,000 prompt tokens it may be, not as "Hi".
        await self.limit(token_budget=5000)
        big = {"type": "object", "description": "x" * 40_000}
        tool = {"type": "function", "function": {"name": "f", "parameters": big}}
        call = {
            "id": "c1",
            "type": "function",
            "function": {"name": "f", "arguments": "1" * 40_000},
        }
        history = [
            {"role": "user", "content": "Hi"},
            {"role": "assistant", "content": None, "tool_calls": [call]},
            {"role": "tool", "tool_call_id": "c1", "content": "ok"},
        ]
        schema = {"type": "json_schema", "json_schema": {"name": "s", "schema": big}}
        for body in ({"tools": [tool]}, {"messages": history}, {"response_format": schema}):
            refused = await self.ask(max_tokens=2, **body)
            assert refused.status_code == 429, body
            assert refused.json()["error"]["code"] == "insufficient_quota"
        assert (await self.ask(max_tokens=2)).status_code == 200


class StandingTests(LimitTestCase):
    async def test_the_key_admin_shows_usage_against_each_limit(self):
        await self.limit(requests_per_minute=5, max_concurrent=3, token_budget=100)
        await self.ask(max_tokens=2)
        key = await ApiKey.objects.aget(pk=self.key.pk)
        standing = await limits.standing(key)
        assert standing == [
            ("requests this minute", 1, 5),
            ("requests in flight", 0, 3),
            ("tokens this month", 3, 100),
        ]


@pytest.mark.parametrize(
    ("row", "used", "allowed"),
    [
        (limits.Standing("tokens this month", 12_345, 1_000_000), "12,345", "1,000,000"),
        (
            limits.Standing("cost this day", Decimal("1234.5"), Decimal("2000000")),
            "$1,234.5000",
            "$2,000,000.0000",
        ),
        (limits.Standing("usage (the counters are unavailable)", None, None), "unknown", "unknown"),
    ],
)
def test_what_is_used_is_shown_with_thousands_separators(row, used, allowed):
    assert (row.used_text, row.allowed_text) == (used, allowed)


class FallbackTests(LimitTestCase):
    """A request its alias cannot serve moves to a fallback alias, under that alias's
    own limits and at its prices."""

    @classmethod
    def setUpTestData(cls):
        super().setUpTestData()
        down = Backend.objects.create(
            name="down", kind="scripted", options={"script": ["<error>"]}
        )  # a 502 before the first byte: unreachable
        cls.primary = ModelAlias.objects.create(
            public_id="primary", backend=down, fallbacks=["echo"]
        )

    async def test_the_fallbacks_own_limit_refuses_what_passes_it(self):
        await save(self.alias, requests_per_minute=1)
        first, second = await self.ask(model="primary"), await self.ask(model="primary")
        assert (first.status_code, second.status_code) == (200, 429)
        assert second.json()["error"]["code"] == "rate_limit_exceeded"
        assert second["x-ratelimit-limit-requests"] == "1"

    async def test_a_request_that_falls_back_counts_once_against_its_key(self):
        await self.limit(requests_per_minute=2, max_concurrent=1)
        assert (await self.ask(model="primary")).status_code == 200
        assert (await self.ask(model="primary")).status_code == 200
        assert (await self.ask(model="primary")).status_code == 429

    async def test_the_first_alias_gives_back_the_tokens_it_reserved(self):
        await save(self.primary, tokens_per_minute=HI + 10)
        for _ in range(3):  # HI + 5 reserved on primary, given back: the echo's 3 are not its
            assert (await self.ask(model="primary", max_tokens=5)).status_code == 200

    async def test_the_row_names_the_alias_that_answered_and_costs_its_prices(self):
        await save(self.primary, input_price=Decimal("1"), output_price=Decimal("1"))
        await save(self.alias, input_price=Decimal("1000"), output_price=Decimal("2000"))
        response = await self.ask(model="primary")
        assert response.json()["model"] == "primary"  # as the client asked
        row = await RequestLog.objects.aget()
        assert (row.alias, row.backend) == ("echo", "scripted")
        assert row.cost == Decimal(1 * 1000 + 2 * 2000) / 1_000_000

    async def test_its_cost_counts_against_the_budget_at_the_fallbacks_prices(self):
        await save(self.alias, input_price=Decimal("1000"), output_price=Decimal("2000"))
        await self.limit(cost_budget=Decimal("0.056"))  # $0.054 reserved at the fallback's
        assert (await self.ask(model="primary", max_tokens=2)).status_code == 200  # $0.005
        assert (await self.ask(model="primary", max_tokens=2)).status_code == 429


class CompletionCapTests(LimitTestCase):
    """With max_tokens omitted a request is reserved at its completion cap (the model's
    own max_output_tokens, else its context), or at what a limit has left of it, down to
    one token a choice: a budget is spent to its last tokens and never past them, and an
    answer cut where the budget ends finishes with length."""

    async def test_the_aliases_context_window_is_reserved_per_choice(self):
        await save(self.alias, context_window=40, max_n=2)
        await self.limit(tokens_per_minute=1000)
        response = await self.ask(n=2)
        assert response["x-ratelimit-remaining-tokens"] == str(1000 - 2 * (HI + 40))

    async def test_the_models_max_output_tokens_comes_before_its_context(self):
        await save(self.alias, context_window=4000, max_output_tokens=30)
        await self.limit(tokens_per_minute=1000)
        response = await self.ask()
        assert response["x-ratelimit-remaining-tokens"] == str(1000 - (HI + 30))

    async def test_the_aliases_default_max_tokens_comes_first(self):
        await save(self.alias, context_window=40, default_params={"max_tokens": 10})
        await self.limit(tokens_per_minute=1000)
        response = await self.ask()
        assert response["x-ratelimit-remaining-tokens"] == str(1000 - (HI + 10))

    async def test_an_unknown_context_reserves_the_default_cap_or_what_is_left(self):
        await self.limit(tokens_per_minute=limits.DEFAULT_COMPLETION_CAP)
        response = await self.ask()  # HI + the default cap would pass the limit
        assert response.status_code == 200
        assert response["x-ratelimit-remaining-tokens"] == "0"  # all that was left

    def test_a_local_backend_is_capped_at_its_n_ctx(self):
        local = Backend(name="local", kind="local", options={"n_ctx": 1024})
        assert limits.completion_cap(ModelAlias(public_id="l", backend=local)) == 1024
        default = Backend(name="local", kind="local", options={})
        assert limits.completion_cap(ModelAlias(public_id="l", backend=default)) == 2048

    async def spend(self):
        """Four requests without max_tokens, against a limit of HI + 7 tokens: each
        answer is 2 tokens and 1 of prompt; its prompt is reserved at HI."""
        answers = [await self.ask() for _ in range(4)]
        assert [answer.status_code for answer in answers] == [200, 200, 200, 429]
        # HI + 7 reserved, 3 used; HI + 4, 3 used; HI + 1, cut at its one token: 2 used.
        finishes = [answer.json()["choices"][0]["finish_reason"] for answer in answers[:3]]
        assert finishes == ["stop", "stop", "length"]
        rows = [row async for row in RequestLog.objects.order_by("id")]
        assert [row.total_tokens for row in rows] == [3, 3, 2, 0]
        return answers[3].json()["error"]

    async def test_a_token_budget_admits_what_fits_down_to_its_last_tokens(self):
        await self.limit(token_budget=HI + 7, budget_period="day")
        assert (await self.spend())["message"] == (
            "You exceeded your current quota, please check your plan and billing details."
            f" Budget: tokens this day, limit {HI + 7}, used 8, requested {HI + 4096}. This"
            " request sets no max_tokens: it was offered what was left, less than its prompt"
            f" ({HI} tokens) and one completion token a choice."
        )

    async def test_tokens_per_minute_admit_what_fits_down_to_the_last_tokens(self):
        await self.limit(tokens_per_minute=HI + 7)
        assert (await self.spend())["message"] == (
            f"Rate limit reached for tokens per minute: limit {HI + 7}, used 8, requested"
            f" {HI + 4096}. This request sets no max_tokens: it was offered what was left,"
            f" less than its prompt ({HI} tokens) and one completion token a choice."
        )

    async def test_a_cost_budget_admits_the_completion_tokens_it_still_pays_for(self):
        # 10 cents a token: $5.70 pays for what HI + 7 tokens do.
        price = Decimal(100_000)  # dollars per million tokens
        await save(self.alias, input_price=price, output_price=price)
        await self.limit(cost_budget=Decimal("5.70"), budget_period="day")
        error = await self.spend()
        assert error["type"] == "insufficient_quota"
        assert "Budget: cost this day, limit $5.7, used $0.8, requested $414.6." in error["message"]

    async def test_a_request_that_sets_max_tokens_is_never_cut(self):
        await self.limit(token_budget=HI + 7, budget_period="day")
        assert (await self.ask(max_tokens=8)).status_code == 429  # HI + 8 would pass HI + 7
        assert (await self.ask(max_tokens=7)).status_code == 200


class CacheCostTests(LimitTestCase):
    """A cost budget reserves what a request can be charged at most, every prompt token
    written to the provider's cache for an hour, and is charged the provider's formula:
    reads at a tenth, writes at 1.25 and 2 times the input price (Anthropic's)."""

    # The backend reports Anthropic's usage: 5 input tokens, 20 read from the cache, 5
    # written for 5 minutes and 10 for an hour (40 in OpenAI's prompt_tokens).
    CACHED = {"prompt_tokens": 40, "cached_tokens": 20, "cache_write_5m_tokens": 5,
              "cache_write_1h_tokens": 10}  # fmt: skip

    @classmethod
    def setUpTestData(cls):
        super().setUpTestData()
        backend = Backend.objects.create(
            name="caching", kind="scripted",
            options={"script": ["Hello", " there"], "provider": "anthropic", "usage": cls.CACHED},
        )  # fmt: skip
        cls.caching = ModelAlias.objects.create(
            public_id="caching", backend=backend, input_price=1000, output_price=2000
        )

    async def spent(self):
        key = await ApiKey.objects.aget(pk=self.key.pk)
        (standing,) = await limits.standing(key)
        return standing.used

    async def test_a_cost_budget_reserves_every_prompt_token_at_the_one_hour_write_price(self):
        # HI tokens at $0.002 (twice $0.001) and 2 completion tokens at $0.002: $0.104.
        await self.limit(cost_budget=Decimal("0.1039"), budget_period="day")
        refused = await self.ask(model="caching", max_tokens=2)
        assert refused.status_code == 429
        assert "requested $0.104." in refused.json()["error"]["message"]
        await self.limit(cost_budget=Decimal("0.104"))
        assert (await self.ask(model="caching", max_tokens=2)).status_code == 200

    async def test_the_request_is_charged_the_providers_formula(self):
        await self.limit(cost_budget=Decimal(1))
        answer = await self.ask(model="caching", max_tokens=2)
        assert answer.status_code == 200
        # 5 x $0.001 + 20 x $0.0001 + 5 x $0.00125 + 10 x $0.002 + 2 x $0.002
        cost = Decimal("0.03725")
        row = await RequestLog.objects.aget()
        assert (row.prompt_tokens, row.cached_tokens) == (40, 20)
        assert (row.cache_write_5m_tokens, row.cache_write_1h_tokens) == (5, 10)
        assert row.cost == cost
        assert await self.spent() == cost

    async def test_a_request_too_cheap_for_a_micro_dollar_is_counted_as_its_row_says(self):
        # text-embedding-3-small's price: 3 tokens cost $0.00000006; counted in micro-dollars
        # (as before) nothing was spent, however many were made.
        await save(self.alias, input_price=Decimal("0.02"), output_price=Decimal("0.02"))
        await self.limit(cost_budget=Decimal(1))
        for _ in range(3):
            assert (await self.ask(max_tokens=2)).status_code == 200
        rows = [row.cost async for row in RequestLog.objects.all()]
        assert rows == [Decimal("0.00000006")] * 3
        assert await self.spent() == Decimal("0.00000018")

    async def test_without_a_provider_the_bound_is_the_input_price(self):
        await save(self.alias, input_price=1000, output_price=2000)
        await self.limit(cost_budget=Decimal("0.054"))  # HI x $0.001 + 2 x $0.002
        assert (await self.ask(max_tokens=2)).status_code == 200


class RedisRequestsPerMinuteTests(OnRedis, RequestsPerMinuteTests):
    pass


class RedisTokensPerMinuteTests(OnRedis, TokensPerMinuteTests):
    pass


class RedisConcurrencyTests(OnRedis, ConcurrencyTests):
    pass


class RedisCompletionCapTests(OnRedis, CompletionCapTests):
    pass


class RedisBudgetTests(OnRedis, BudgetTests):
    pass


class RedisCacheCostTests(OnRedis, CacheCostTests):
    pass


class RedisFallbackTests(OnRedis, FallbackTests):
    pass


class RedisStandingTests(OnRedis, StandingTests):
    pass


async def clear_of_a_new_minute():
    """Wait, if need be, so that a short race does not straddle two minute windows."""
    into = time.time() % 60
    if into > 56:
        await asyncio.sleep(60.2 - into)


class AdmissionRaceTests(LimitTestCase):
    """64 clients at once, each asking again as soon as it is answered, 4 times: what
    the admitted requests really used never passes a limit, and the counters end at
    exactly what was used."""

    CLIENTS, ROUNDS = 64, 4

    async def race(self, max_tokens=20, hold=0.01):
        """What the admitted requests used, each held up to ``hold`` seconds; the most
        held at once."""
        await clear_of_a_new_minute()
        key = await ApiKey.objects.aget(pk=self.key.pk)
        alias = await ModelAlias.objects.select_related("backend").aget(pk=self.alias.pk)
        chat = parse_chat_request(
            {"model": "echo", "messages": [{"role": "user", "content": "Hi"}],
             "max_tokens": max_tokens}
        )  # fmt: skip
        estimate = limits.Estimate.of(chat, alias, prompt_bound(chat))
        used, refusals, held, peak = [], set(), 0, 0

        async def client(rng):
            nonlocal held, peak
            for _ in range(self.ROUNDS):
                try:
                    admission = await limits.admit(key, alias, estimate)
                except APIError as refusal:
                    refusals.add(refusal.status)
                    continue
                held += 1
                peak = max(peak, held)
                await asyncio.sleep(hold * rng.random())
                completion = rng.randint(0, estimate.completion_tokens)
                used.append((estimate.prompt_tokens, completion))
                held -= 1
                await admission.settle(Usage(estimate.prompt_tokens, completion))

        await asyncio.gather(*(client(random.Random(i)) for i in range(self.CLIENTS)))
        assert refusals == {429}
        return used, peak

    async def test_requests_per_minute_is_exact(self):
        await self.limit(requests_per_minute=50)
        used, _ = await self.race()
        assert len(used) == 50

    async def test_tokens_per_minute_is_never_passed(self):
        await self.limit(tokens_per_minute=1000)
        used, _ = await self.race()
        total = sum(p + c for p, c in used)
        assert 0 < total <= 1000
        assert (await self.standing())["tokens this minute"] == total

    async def test_tokens_per_minute_on_the_alias_is_never_passed(self):
        await save(self.alias, tokens_per_minute=500)
        used, _ = await self.race()
        assert 0 < sum(p + c for p, c in used) <= 500

    async def test_a_token_budget_is_never_passed(self):
        await self.limit(token_budget=1000)
        used, _ = await self.race()
        total = sum(p + c for p, c in used)
        assert 0 < total <= 1000
        assert (await self.standing())["tokens this month"] == total

    async def test_a_cost_budget_is_never_passed(self):
        await save(self.alias, input_price=Decimal("1000"), output_price=Decimal("2000"))
        await self.limit(cost_budget=Decimal("0.5"))
        used, _ = await self.race()
        cost = sum(self.alias.cost_of(Usage(p, c)) for p, c in used)
        assert 0 < cost <= Decimal("0.5")

    async def test_requests_in_flight_never_pass_the_limit(self):
        await self.limit(max_concurrent=8)
        _, peak = await self.race(hold=0.2)  # long enough for 8 to be held at once
        assert peak == 8
        assert (await self.standing())["requests in flight"] == 0


class RedisAdmissionRaceTests(OnRedis, AdmissionRaceTests):
    pass


ROUNDS = 8


def hammer(url: str, counter: str, limit: int, seed: int) -> list[int]:
    """32 clients of one process racing for ``limit`` tokens in ``counter``, each
    reserving 30 and using some: what the admitted ones used."""
    store = RedisCounters(url)

    async def client(rng):
        used = []
        for _ in range(ROUNDS):
            refusal, _ = await store.reserve([Change(counter, 30, limit, 60)], None)
            if refusal is None:
                used.append(rng.randint(0, 30))
                await asyncio.sleep(rng.random() / 100)
                await store.settle([(counter, used[-1] - 30)], None)
        return used

    async def clients():
        return await asyncio.gather(*(client(random.Random(seed * 100 + i)) for i in range(32)))

    return [amount for used in asyncio.run(clients()) for amount in used]


def hold_a_slot(url: str, slots: str) -> None:
    """Take one of ``slots`` as a worker with a stream does: a lease of 2 s, renewed
    every half second until the process is killed."""

    async def hold():
        store = RedisCounters(url)
        lease = Lease(slots, 1)
        refusal, _ = await store.reserve([], lease)
        assert refusal is None
        limits._renewers.get().add(store, lease)
        print("held", flush=True)
        await asyncio.Event().wait()

    with (
        mock.patch.object(limits, "LEASE_SECONDS", 2.0),
        mock.patch.object(limits, "RENEW_SECONDS", 0.5),
    ):
        asyncio.run(hold())


def test_two_processes_never_pass_a_limit_together(redis_url):
    counter = f"test:race:{time.time()}"
    workers = [
        in_a_process(__name__, f"hammer({redis_url!r}, {counter!r}, 600, {seed})")
        for seed in (1, 2)
    ]
    used = [amount for worker in workers for amount in json.loads(worker.communicate()[0])]
    assert 0 < sum(used) <= 600
    (left,) = asyncio.run(RedisCounters(redis_url).values([counter]))
    assert left == sum(used)  # every reservation settled to what was used


@pytest.mark.parametrize("store", ["cache", "redis"])
def test_a_slot_nobody_renews_expires(store, redis_url, settings):
    # A worker that dies (kill -9) stops renewing its slots: the key is whole again
    # once they expire.
    settings.CHATPARITY = {"REDIS_URL": redis_url if store == "redis" else None}
    slots = f"test:slots:{time.time()}"

    async def take():
        refusal, _ = await limits.counters().reserve([], Lease(slots, 1))
        return refusal is None

    with mock.patch.object(limits, "LEASE_SECONDS", 1.0):
        assert asyncio.run(take())
        assert not asyncio.run(take())
        time.sleep(1.2)
        assert asyncio.run(take())


def test_a_killed_workers_slot_is_free_within_its_lease(redis_url):
    slots = f"test:slots:{time.time()}"
    worker = in_a_process(__name__, f"hold_a_slot({redis_url!r}, {slots!r})")
    assert worker.stdout.readline() == b"held\n"
    store = RedisCounters(redis_url)
    time.sleep(3)
    assert asyncio.run(store.in_flight(slots, 1)) == 1  # renewed past its first lease
    worker.send_signal(signal.SIGKILL)
    worker.wait()
    deadline = time.monotonic() + 4
    while asyncio.run(store.in_flight(slots, 1)) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert asyncio.run(store.in_flight(slots, 1)) == 0


class LeaseTests(LimitTestCase):
    """A request's slot is renewed while it lives, and given back when it ends."""

    async def test_a_live_request_keeps_its_slot_past_its_first_lease(self):
        await self.limit(max_concurrent=1)
        with (
            mock.patch.object(limits, "LEASE_SECONDS", 1.0),
            mock.patch.object(limits, "RENEW_SECONDS", 0.2),
        ):
            admission = await self.admit()
            await asyncio.sleep(2)
            with pytest.raises(APIError):
                await self.admit()
            await admission.settle(Usage(1, 1))
            await (await self.admit()).settle(Usage(1, 1))


class RedisLeaseTests(OnRedis, LeaseTests):
    pass


class SettleOnceTests(LimitTestCase):
    """An admission settles once: the ledger guards its own settlement, and the
    admission's promise holds for any other caller too."""

    async def test_settling_twice_corrects_the_tokens_once_and_frees_only_its_own_slot(self):
        await clear_of_a_new_minute()
        await self.limit(tokens_per_minute=1000, max_concurrent=1)
        first = await self.admit()  # HI + 1 tokens reserved
        await first.settle(Usage(1, 1))  # 2 used
        second = await self.admit()  # the slot the first gave back
        await first.settle(Usage(1, 1))
        assert await self.standing() == {"tokens this minute": 2 + HI + 1, "requests in flight": 1}
        with pytest.raises(APIError) as refused:  # the second still holds the key's one slot
            await self.admit()
        assert "in flight" in refused.value.message
        await second.settle(Usage(1, 1))
        await second.settle(Usage(1, 1))
        assert await self.standing() == {"tokens this minute": 4, "requests in flight": 0}


class RedisSettleOnceTests(OnRedis, SettleOnceTests):
    pass


class RedisAwayTests(LimitTestCase):
    """Redis frozen or stopped: limited keys are served unchecked (open) or refused
    with a 503 (closed), within about a second, never a 500; keys without limits are
    served; nothing raises after the response; the connections come back by themselves."""

    @pytest.fixture(autouse=True)
    def _server(self):
        outage_log = OncePerInterval(limits.logger, interval=limits._LOG_INTERVAL)
        # Each test sees its outage logged afresh.
        with services.redis(own=True) as url, mock.patch.object(limits, "_outage_log", outage_log):
            self.url, self.server = url, services.control(url)
            yield

    def when_unavailable(self, policy):
        return override_settings(
            CHATPARITY={**SCRIPTED, "REDIS_URL": self.url,
                        "LIMITS_WHEN_UNAVAILABLE": policy}
        )  # fmt: skip

    async def timed(self, **body):
        started = time.monotonic()
        response = await self.ask(**body)
        return response, time.monotonic() - started

    async def test_a_frozen_redis_fails_open_quickly_and_says_so_once(self):
        await self.limit(requests_per_minute=100)
        with self.when_unavailable("open"), self.assertLogs("chatparity.accounting.limits") as logs:
            assert (await self.ask()).status_code == 200
            self.server.freeze()
            try:
                for _ in range(5):
                    response, took = await self.timed()
                    assert response.status_code == 200
                    assert took < 2.5
            finally:
                self.server.thaw()
        unchecked = [line for line in logs.output if "served unchecked" in line]
        assert len(unchecked) == 1

    async def test_a_frozen_redis_fails_closed_with_a_503(self):
        await self.limit(requests_per_minute=100)
        with self.when_unavailable("closed"):
            assert (await self.ask()).status_code == 200
            self.server.freeze()
            try:
                response, took = await self.timed()
            finally:
                self.server.thaw()
        assert took < 2.5
        assert response.status_code == 503
        error = response.json()["error"]
        assert (error["type"], error["code"]) == ("server_error", "service_unavailable")

    async def test_keys_without_limits_do_not_need_redis(self):
        with self.when_unavailable("closed"):
            self.server.stop()
            assert (await self.ask()).status_code == 200

    async def test_a_stopped_redis_fails_closed_then_reconnects(self):
        await self.limit(requests_per_minute=2)
        with self.when_unavailable("closed"):
            assert (await self.ask()).status_code == 200  # a pooled connection, soon dead
            self.server.stop()
            assert (await self.ask()).status_code == 503
            self.server.start()  # empty: the minute's count starts again
            await asyncio.sleep(1.1)  # the store rests a second after a failure
            statuses = [(await self.ask()).status_code for _ in range(3)]
            assert statuses == [200, 200, 429]

    async def test_settling_without_redis_never_raises_and_is_logged_once(self):
        await self.limit(max_concurrent=10)
        with self.when_unavailable("open"):
            admissions = [await LeaseTests.admit(self) for _ in range(3)]
            self.server.stop()
            with self.assertLogs("chatparity.accounting.limits") as logs:
                for admission in admissions:
                    await admission.settle(Usage(1, 1))
        assert len([line for line in logs.output if "not settled" in line]) == 1

    async def test_the_admin_says_when_usage_is_unknown(self):
        await self.limit(requests_per_minute=2)
        with self.when_unavailable("open"):
            self.server.stop()
            key = await ApiKey.objects.aget(pk=self.key.pk)
            assert await limits.standing(key) == [
                ("usage (the counters are unavailable)", None, None)
            ]


class NothingKeptTests(LimitTestCase):
    """A default cache that keeps nothing (Django's dummy cache) and no Redis: a budget's
    counter, seeded from the log, is gone at once. A request is served unchecked (open) or
    refused (closed), as when the counters are away; before, it seeded the counter from
    the database again and again, for ever."""

    def nothing_kept(self, policy):
        dummy = {"default": {"BACKEND": "django.core.cache.backends.dummy.DummyCache"}}
        chatparity = {**SCRIPTED, "LIMITS_WHEN_UNAVAILABLE": policy}
        return override_settings(CACHES=dummy, CHATPARITY=chatparity)

    async def test_a_budgeted_key_is_answered_as_the_policy_says(self):
        await self.limit(token_budget=100)
        for policy, status in (("open", 200), ("closed", 503)):
            with self.nothing_kept(policy):
                response = await asyncio.wait_for(self.ask(), 10)
            assert response.status_code == status, policy

    async def test_what_is_left_is_unknown_not_waited_for(self):
        await self.limit(token_budget=100)
        with self.nothing_kept("open"):
            key = await ApiKey.objects.aget(pk=self.key.pk)
            rows = await asyncio.wait_for(limits.standing(key), 10)
        assert rows == [("usage (the counters are unavailable)", None, None)]

    async def test_the_bytes_a_key_stores_are_not_checked(self):
        with self.nothing_kept("open"), self.assertLogs("chatparity.accounting.limits") as logs:
            counted = await asyncio.wait_for(limits.stored_bytes(self.key.pk, self.count), 10)
        assert counted is None
        assert "stored bytes not checked" in logs.output[0]

    async def count(self):
        return 0


def test_a_reserved_counter_expires_with_its_window(redis_url):
    from redis import Redis

    store, counter = RedisCounters(redis_url), f"cp:test:ttl:{random.random()}"
    refusal, _ = asyncio.run(store.reserve([Change(counter, 3, 10, ttl=60)], None))
    assert refusal is None
    with Redis.from_url(redis_url) as client:
        assert 0 < client.ttl(counter) <= 60  # never a counter that lives forever
        client.expire(counter, 5)
    asyncio.run(store.reserve([Change(counter, 3, 10, ttl=60)], None))
    with Redis.from_url(redis_url) as client:
        assert client.ttl(counter) <= 5  # a later reservation keeps the window's end


def test_settling_a_counter_that_expired_creates_none(redis_url):
    from redis import Redis

    store, counter = RedisCounters(redis_url), f"cp:test:gone:{random.random()}"
    asyncio.run(store.settle([(counter, -2)], None))
    with Redis.from_url(redis_url) as client:
        assert not client.exists(counter)  # it would have no time to live


def test_releasing_a_slot_that_expired_leaves_its_new_holders(settings):
    from django.core.cache import cache

    settings.CHATPARITY = {"REDIS_URL": None}
    store = limits.CacheCounters()
    first, second = Lease("cp:test:slots", 1), Lease("cp:test:slots", 1)
    assert asyncio.run(store.reserve([], first)) == (None, [])
    cache.delete_many(first.held)  # its lease ran out (its worker stalled)
    assert asyncio.run(store.reserve([], second)) == (None, [])
    asyncio.run(store.settle([], first))  # the stalled request ends at last
    assert [cache.get(slot) for slot in second.held] == [second.member]
    assert asyncio.run(store.in_flight("cp:test:slots", 1)) == 1


class RemainingHeaderTests(LimitTestCase):
    async def test_the_remaining_header_is_the_window_with_the_least_left(self):
        await self.limit(requests_per_minute=10)
        await save(self.alias, requests_per_minute=3)
        response = await self.ask()
        assert response.status_code == 200
        assert response["x-ratelimit-limit-requests"] == "3"
        assert response["x-ratelimit-remaining-requests"] == "2"  # the alias's, not the key's 9

    async def test_the_key_window_reports_when_it_has_less_left(self):
        await self.limit(requests_per_minute=2)
        await save(self.alias, requests_per_minute=30)
        response = await self.ask()
        assert response["x-ratelimit-limit-requests"] == "2"
        assert response["x-ratelimit-remaining-requests"] == "1"


class RedisRemainingHeaderTests(OnRedis, RemainingHeaderTests):
    pass
