"""Rate limits and budgets: OpenAI's 429s and headers, counted across requests."""

import asyncio
import datetime
from decimal import Decimal

import orjson
import pytest
from django.test import TestCase, override_settings

from chatparity import ratelimit
from chatparity.models import ApiKey, Backend, ModelAlias, RequestLog
from chatparity.ratelimit import CacheCounters, RedisCounters
from tests.scripted import SCRIPTED


async def save(instance, **fields):
    """Change and save ``instance`` as the admin does (which the lookup cache hears of)."""
    for name, value in fields.items():
        setattr(instance, name, value)
    await instance.asave(update_fields=list(fields))


@override_settings(CHATPARITY=SCRIPTED)
class LimitTestCase(TestCase):
    """A key and an alias on a scripted backend that answers ``Hello there``: 1 prompt
    and 2 completion tokens. chatparity estimates the prompt ``Hi`` at 4 tokens."""

    @classmethod
    def setUpTestData(cls):
        cls.key, cls.plaintext = ApiKey.objects.create_key("limited")
        backend = Backend.objects.create(
            name="scripted", kind="scripted", options={"script": ["Hello", " there"]}
        )
        cls.alias = ModelAlias.objects.create(public_id="echo", backend=backend)
        cls.other = ModelAlias.objects.create(public_id="other", backend=backend)

    def setUp(self):
        from django.core.cache import cache

        cache.clear()

    async def limit(self, **fields):
        await save(self.key, **fields)

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
        await self.limit(tokens_per_minute=100)
        first = await self.ask(max_tokens=50)
        assert first["x-ratelimit-remaining-tokens"] == str(100 - (4 + 50))
        assert first.json()["usage"]["total_tokens"] == 3
        second = await self.ask(max_tokens=1)
        # The first's reservation became the 3 tokens it used; the second reserved 4 + 1.
        assert second["x-ratelimit-remaining-tokens"] == str(100 - 3 - (4 + 1))


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


class BudgetTests(LimitTestCase):
    async def test_a_spent_token_budget_is_insufficient_quota(self):
        await self.limit(token_budget=6, budget_period="day")
        assert (await self.ask()).status_code == 200
        assert (await self.ask()).status_code == 200  # 3 + 3 tokens: the budget is spent
        refused = await self.ask()
        assert refused.status_code == 429
        assert refused.json()["error"] == {
            "message": "You exceeded your current quota, please check your plan and billing"
            " details.",
            "type": "insufficient_quota",
            "param": None,
            "code": "insufficient_quota",
        }
        assert int(refused["retry-after"]) <= 24 * 3600

    async def test_a_budget_counts_what_the_log_already_holds(self):
        # As after a cache flush: the counter is seeded from this month's rows.
        await RequestLog.objects.acreate(
            request_id="old", api_key=self.key, key_prefix=self.key.prefix, status_code=200,
            duration_ms=1, total_tokens=1000,
        )  # fmt: skip
        last_month = await RequestLog.objects.acreate(
            request_id="older", api_key=self.key, key_prefix=self.key.prefix, status_code=200,
            duration_ms=1, total_tokens=1000,
        )  # fmt: skip
        long_ago = datetime.datetime(2000, 1, 1, tzinfo=datetime.UTC)
        await RequestLog.objects.filter(pk=last_month.pk).aupdate(created_at=long_ago)
        await self.limit(token_budget=1000)
        assert (await self.ask()).status_code == 429
        await self.limit(token_budget=1001)
        assert (await self.ask()).status_code == 200

    async def test_cost_budget_uses_the_aliases_prices(self):
        await save(self.alias, input_price=Decimal("1000"), output_price=Decimal("2000"))
        await self.limit(cost_budget=Decimal("0.01"))
        first = await self.ask()
        row = await RequestLog.objects.aget()
        usage = first.json()["usage"]
        expected = (usage["prompt_tokens"] * 1000 + usage["completion_tokens"] * 2000) / 1e6
        assert row.cost == pytest.approx(Decimal(str(expected)))
        assert (await self.ask()).status_code == 200  # $0.005 spent: still under
        assert (await self.ask()).status_code == 429  # $0.010 spent


class StandingTests(LimitTestCase):
    async def test_the_key_admin_shows_usage_against_each_limit(self):
        await self.limit(requests_per_minute=5, max_concurrent=3, token_budget=100)
        await self.ask()
        key = await ApiKey.objects.aget(pk=self.key.pk)
        standing = await ratelimit.standing(key)
        assert standing == [
            ("requests this minute", "1", "5"),
            ("requests in flight", "0", "3"),
            ("tokens this month", "3", "100"),
        ]


@pytest.fixture(params=["cache", "redis"])
def store(request):
    if request.param == "cache":
        return CacheCounters()
    return RedisCounters(request.getfixturevalue("redis_url"))


def test_concurrent_reservations_never_pass_the_limit(store, settings):
    settings.CACHES = {"default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"}}

    async def race():
        key = f"test:race:{id(store)}"
        results = await asyncio.gather(*(store.reserve(key, 1, 10, 60) for _ in range(50)))
        return sum(admitted for admitted, _ in results), await store.get_or_seed(key, 0, 60)

    admitted, value = asyncio.run(race())
    assert (admitted, value) == (10, 10)


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
        await save(self.primary, tokens_per_minute=10)
        for _ in range(3):  # 4 + 5 reserved on primary, given back: the echo's 3 are not its
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
        await self.limit(cost_budget=Decimal("0.005"))
        assert (await self.ask(model="primary")).status_code == 200  # $0.005: spent
        assert (await self.ask(model="primary")).status_code == 429
