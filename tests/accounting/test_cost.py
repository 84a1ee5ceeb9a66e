"""What a request costs, through HTTP on every wire: each row's cost is its provider's
formula at the alias's prices (cache reads, 5-minute and 1-hour writes apart) to 1e-8
USD, and the dashboard's, the portal's and the management API's totals are the sum of
the rows, as the key's budget is.

Backends here report the usage a caching upstream would (``tests.scripted``, its
``usage`` option); reading it from each upstream's wire is ``tests/backends``'s."""

import datetime
import re
from decimal import Decimal

import orjson
from django.contrib.auth.models import User
from django.core.cache import cache
from django.db.models import Sum
from django.test import TestCase, override_settings
from django.urls import reverse

from chatparity.accounting import limits
from chatparity.models import ApiKey, Backend, ModelAlias, RequestLog
from tests.scripted import SCRIPTED
from tests.support.users import portal_user

MILLION = Decimal(10**6)
# Anthropic's and OpenAI's prices (USD per million tokens): claude-sonnet-4-5, gpt-4o.
SONNET = {"input": Decimal(3), "read": Decimal("0.3"), "5m": Decimal("3.75"), "1h": Decimal(6),
          "output": Decimal(15)}  # fmt: skip
GPT_4O = {"input": Decimal("2.5"), "read": Decimal("1.25"), "5m": Decimal("2.5"),
          "1h": Decimal("2.5"), "output": Decimal(10)}  # fmt: skip

# A coding agent's turns as a caching upstream reports them (prompt: every input token):
# its first writes the prefix for an hour, the next read it and write what is new.
TURNS = {
    "claude-cold": ("anthropic", {"prompt_tokens": 12_000, "cache_write_1h_tokens": 11_800}),
    "claude-warm": ("anthropic", {"prompt_tokens": 12_900, "cached_tokens": 11_800,
                                  "cache_write_5m_tokens": 900}),
    "claude-both": ("anthropic", {"prompt_tokens": 14_000, "cached_tokens": 12_700,
                                  "cache_write_5m_tokens": 700, "cache_write_1h_tokens": 500}),
    "claude-plain": ("anthropic", {"prompt_tokens": 321}),
    "gpt-warm": ("openai", {"prompt_tokens": 12_345, "cached_tokens": 12_288,
                            "reasoning_tokens": 1}),
}  # fmt: skip
PRICES = {"anthropic": SONNET, "openai": GPT_4O}
COMPLETION = 2  # "Hello", " there"


def formula(provider, usage):
    """The provider's bill for ``usage``, written out: what each row must cost."""
    price = PRICES[provider]
    reads = usage.get("cached_tokens", 0)
    writes_5m = usage.get("cache_write_5m_tokens", 0)
    writes_1h = usage.get("cache_write_1h_tokens", 0)
    uncached = usage["prompt_tokens"] - reads - writes_5m - writes_1h
    return (uncached * price["input"] + reads * price["read"] + writes_5m * price["5m"]
            + writes_1h * price["1h"] + COMPLETION * price["output"]) / MILLION  # fmt: skip


def ask(client, plaintext, endpoint, model):
    messages = [{"role": "user", "content": "Hi"}]
    body = {
        "chat": ("/v1/chat/completions", {"model": model, "messages": messages}),
        "responses": ("/v1/responses", {"model": model, "input": "Hi"}),
        "messages": ("/v1/messages", {"model": model, "max_tokens": 8, "messages": messages}),
    }[endpoint]
    return client.post(body[0], data=orjson.dumps(body[1]), content_type="application/json",
                       headers={"Authorization": f"Bearer {plaintext}"})  # fmt: skip


@override_settings(CHATPARITY=SCRIPTED)
class CostTests(TestCase):
    @classmethod
    def setUpTestData(cls):
        cls.owner = portal_user("agent-user")
        cls.key, cls.plaintext = ApiKey.objects.create_key(
            "agent", owner=cls.owner, cost_budget=Decimal(100)
        )
        for name, (provider, usage) in TURNS.items():
            backend = Backend.objects.create(
                name=name, kind="scripted",
                options={"script": ["Hello", " there"], "provider": provider, "usage": usage},
            )  # fmt: skip
            price = PRICES[provider]
            ModelAlias.objects.create(
                public_id=name, backend=backend, input_price=price["input"],
                output_price=price["output"],
            )  # fmt: skip
        cls.staff = User.objects.create_superuser("staff")

    def setUp(self):
        cache.clear()

    async def session(self):
        """Each turn through each wire; the rows it left."""
        for endpoint in ("chat", "responses", "messages"):
            for model in TURNS:
                answer = await ask(self.async_client, self.plaintext, endpoint, model)
                assert answer.status_code == 200, (endpoint, model, answer.content)
        return [row async for row in RequestLog.objects.order_by("pk")]

    async def test_each_row_costs_its_providers_formula_to_the_hundred_millionth(self):
        rows = await self.session()
        assert len(rows) == 3 * len(TURNS)
        for row in rows:
            provider, usage = TURNS[row.alias]
            assert row.cost == formula(provider, usage).quantize(Decimal("1e-8")), row.alias
            assert (row.cached_tokens, row.cache_write_5m_tokens, row.cache_write_1h_tokens) == (
                usage.get("cached_tokens", 0), usage.get("cache_write_5m_tokens", 0),
                usage.get("cache_write_1h_tokens", 0),
            )  # fmt: skip

    async def test_the_reports_and_the_budget_total_the_rows(self):
        await self.session()
        total = (await RequestLog.objects.aaggregate(cost=Sum("cost")))["cost"]
        assert total == sum(formula(*turn) for turn in TURNS.values()) * 3
        (spent,) = await limits.standing(await ApiKey.objects.aget(pk=self.key.pk))
        assert spent.used == total

        await self.async_client.aforce_login(self.staff)
        dashboard = await self.async_client.get("/admin/chatparity_dashboard/usagedashboard/")
        shown = re.search(r'data-cost="([^"]+)" data-total="cost"', dashboard.content.decode())
        assert Decimal(shown[1]) == total
        reads = sum(usage.get("cached_tokens", 0) for _, usage in TURNS.values())
        prompt = sum(usage["prompt_tokens"] for _, usage in TURNS.values())
        share = re.search(r'data-total="cache-read-share">([\d.]+)%', dashboard.content.decode())
        assert share[1] == f"{reads / prompt * 100:.1f}"

        usage = await self.async_client.get(reverse("chatparity-api:usage"), {"group_by": "alias"})
        assert sum(Decimal(group["cost"]) for group in usage.json()["results"]) == total

        await self.async_client.aforce_login(self.owner)
        month = datetime.datetime.now(datetime.UTC).strftime("%Y-%m")
        portal = await self.async_client.get("/portal/usage/", {"month": month})
        in_total = re.search(r'<table id="total">.*?data-cost="([^"]+)"', portal.content.decode(),
                             re.S)  # fmt: skip
        assert Decimal(in_total[1]) == total
