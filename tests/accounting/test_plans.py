"""Plans: what staff give a user or a group. A plan bounds the aliases of every key its
users own, and its owner budget is shared by all of them, reserved at admission like a
key's budget: never passed under concurrency, on the cache or on Redis, in one process
or several."""

import asyncio
import contextlib
import datetime
import json
import random
import time
from decimal import Decimal
from types import SimpleNamespace
from unittest import mock

import orjson
import pytest
from asgiref.sync import sync_to_async
from django.contrib.auth.models import Group, User
from django.test import TestCase, override_settings
from django.utils import timezone

from chatparity.accounting import keys, limits
from chatparity.models import ApiKey, Backend, ModelAlias, Plan, hash_key
from chatparity.protocol.errors import APIError
from chatparity.protocol.events import Usage
from chatparity.protocol.request import parse_chat_request
from chatparity.protocol.tokens import prompt_bound
from tests.accounting.test_limits import HI
from tests.scripted import SCRIPTED
from tests.support.counters import OnRedis
from tests.support.logs import logged
from tests.support.processes import in_a_process


class PlanOfOwnerTests(TestCase):
    @classmethod
    def setUpTestData(cls):
        cls.user = User.objects.create_user("alice")
        cls.team, cls.staff = Group.objects.create(name="team"), Group.objects.create(name="staff")
        cls.user.groups.add(cls.team, cls.staff)

    def test_none_without_a_plan(self):
        assert Plan.objects.for_owner(self.user.pk) is None
        assert Plan.objects.for_owner(None) is None

    def test_a_groups_plan_of_highest_priority_then_by_name(self):
        Plan.objects.create(name="b-team", priority=1).groups.add(self.team)
        Plan.objects.create(name="a-staff", priority=1).groups.add(self.staff)
        Plan.objects.create(name="low", priority=0).groups.add(self.staff)
        Plan.objects.create(name="elsewhere", priority=9).groups.add(Group.objects.create(name="x"))
        assert Plan.objects.for_owner(self.user.pk).name == "a-staff"

    def test_a_plan_given_to_the_user_comes_first(self):
        Plan.objects.create(name="group's", priority=9).groups.add(self.team)
        Plan.objects.create(name="own").users.add(self.user)
        assert Plan.objects.for_owner(self.user.pk).name == "own"


@override_settings(CHATPARITY=SCRIPTED)
class PlanTestCase(TestCase):
    """Alice owns two keys under a plan; Bob one key under none. The scripted backend
    answers ``Hello there``: 1 prompt and 2 completion tokens, 3 in all."""

    @classmethod
    def setUpTestData(cls):
        backend = Backend.objects.create(
            name="scripted", kind="scripted", options={"script": ["Hello", " there"]}
        )
        cls.echo = ModelAlias.objects.create(public_id="echo", backend=backend)
        cls.other = ModelAlias.objects.create(public_id="other", backend=backend)
        cls.alice = User.objects.create_user("alice")
        cls.bob = User.objects.create_user("bob")
        cls.plan = Plan.objects.create(name="starter")
        cls.plan.users.add(cls.alice)
        cls.laptop, cls.laptop_plaintext = ApiKey.objects.create_key("laptop", owner=cls.alice)
        cls.server, cls.server_plaintext = ApiKey.objects.create_key("server", owner=cls.alice)
        cls.bobs, cls.bobs_plaintext = ApiKey.objects.create_key("bobs", owner=cls.bob)

    def setUp(self):
        from django.core.cache import cache

        cache.clear()

    async def set_plan(self, **fields):
        for name, value in fields.items():
            setattr(self.plan, name, value)
        await self.plan.asave()

    def ask(self, plaintext, model="echo", **body):
        messages = [{"role": "user", "content": "Hi"}]
        return self.async_client.post(
            "/v1/chat/completions",
            data=orjson.dumps({"model": model, "messages": messages, "max_tokens": 2, **body}),
            content_type="application/json",
            headers={"Authorization": f"Bearer {plaintext}"},
        )


class PlanAliasTests(PlanTestCase):
    async def test_every_key_of_its_users_is_bound_to_the_plans_aliases(self):
        await self.set_plan(all_aliases=False)
        await self.plan.allowed_aliases.aset([self.other])
        for plaintext in (self.laptop_plaintext, self.server_plaintext):
            refused = await self.ask(plaintext, "echo")
            assert refused.status_code == 404
            assert refused.json()["error"]["code"] == "model_not_found"
            assert (await self.ask(plaintext, "other")).status_code == 200
        listed = await self.async_client.get(
            "/v1/models", headers={"Authorization": f"Bearer {self.laptop_plaintext}"}
        )
        assert [model["id"] for model in listed.json()["data"]] == ["other"]
        assert (await self.ask(self.bobs_plaintext, "echo")).status_code == 200

    async def test_a_key_limited_further_keeps_only_what_both_allow(self):
        await self.set_plan(all_aliases=False)
        await self.plan.allowed_aliases.aset([self.other, self.echo])
        self.laptop.all_aliases = False
        await self.laptop.asave()
        await self.laptop.allowed_aliases.aset([self.echo])
        assert (await self.ask(self.laptop_plaintext, "echo")).status_code == 200
        assert (await self.ask(self.laptop_plaintext, "other")).status_code == 404

    async def test_a_change_of_plan_or_of_groups_applies_to_the_next_request(self):
        assert (await self.ask(self.laptop_plaintext, "echo")).status_code == 200
        await self.set_plan(all_aliases=False)
        assert (await self.ask(self.laptop_plaintext, "echo")).status_code == 404
        await self.plan.users.aremove(self.alice)
        assert (await self.ask(self.laptop_plaintext, "echo")).status_code == 200
        group = await Group.objects.acreate(name="team")
        await self.plan.groups.aadd(group)
        await self.alice.groups.aadd(group)
        assert (await self.ask(self.laptop_plaintext, "echo")).status_code == 404


class OwnerBudgetTests(PlanTestCase):
    async def test_all_of_an_owners_keys_share_the_budget(self):
        # Each request reserves HI + 2 (its prompt at its bound, and 2) and uses 3.
        await self.set_plan(owner_token_budget=HI + 10)
        for plaintext in (self.laptop_plaintext, self.server_plaintext, self.server_plaintext):
            assert (await self.ask(plaintext)).status_code == 200
        for plaintext in (self.laptop_plaintext, self.server_plaintext):  # 9 used, HI + 1 left
            refused = await self.ask(plaintext)
            assert refused.status_code == 429
            assert refused.json()["error"]["code"] == "insufficient_quota"
        assert (await self.ask(self.bobs_plaintext)).status_code == 200

    async def test_the_budget_counts_what_the_log_holds_for_any_of_the_keys(self):
        await sync_to_async(logged)(api_key=self.server, total_tokens=98)
        await self.set_plan(owner_token_budget=100)
        refused = await self.ask(self.laptop_plaintext)
        assert refused.status_code == 429
        assert refused.json()["error"]["code"] == "insufficient_quota"

    async def test_last_months_rows_do_not_count_against_a_monthly_budget(self):
        last_month = timezone.now().replace(day=1) - datetime.timedelta(days=1)
        await sync_to_async(logged)(at=last_month, api_key=self.server, total_tokens=98)
        await self.set_plan(owner_token_budget=100)
        assert (await self.ask(self.laptop_plaintext)).status_code == 200

    async def test_a_cost_budget_at_the_aliases_prices(self):
        self.echo.input_price, self.echo.output_price = Decimal("100000"), Decimal("100000")
        await self.echo.asave()
        # HI + 2 tokens reserved at $0.10 each: $5.20; 3 used: $0.30, and $5.10 left.
        await self.set_plan(owner_cost_budget=Decimal("5.40"))
        assert (await self.ask(self.laptop_plaintext)).status_code == 200
        assert (await self.ask(self.server_plaintext)).status_code == 429

    async def test_a_deleted_keys_spending_still_counts(self):
        doomed, _ = await sync_to_async(ApiKey.objects.create_key)("doomed", owner=self.alice)
        await sync_to_async(logged)(api_key=doomed, total_tokens=98)
        await doomed.adelete()
        await self.set_plan(owner_token_budget=100)
        assert (await self.ask(self.laptop_plaintext)).status_code == 429

    async def test_the_keys_own_budget_still_applies_within_the_owners(self):
        await self.set_plan(owner_token_budget=1000)
        self.laptop.token_budget = 3
        await self.laptop.asave()
        assert (await self.ask(self.laptop_plaintext)).status_code == 429
        assert (await self.ask(self.server_plaintext)).status_code == 200

    async def test_what_is_left_shown_to_the_owner(self):
        await self.set_plan(owner_token_budget=100, owner_cost_budget=Decimal("2"))
        await self.ask(self.laptop_plaintext)
        await self.ask(self.server_plaintext)
        plan = await Plan.objects.aget(pk=self.plan.pk)
        assert await limits.owner_standing(self.alice.pk, plan) == [
            ("tokens this month (all your keys)", 6, 100),
            ("cost this month (all your keys)", 0, 2),
        ]


class RedisOwnerBudgetTests(OnRedis, OwnerBudgetTests):
    pass


MID_MONTH = datetime.datetime(2031, 5, 15, 12, tzinfo=datetime.UTC)


@contextlib.contextmanager
def budgets_reckoned_at(moment):
    """Budget periods as they stand at ``moment``: whatever today's date, the day
    before is in the same month."""

    class Clock(datetime.datetime):
        @classmethod
        def now(cls, tz=None):
            return moment.astimezone(tz)

    clock = SimpleNamespace(datetime=Clock, timedelta=datetime.timedelta, UTC=datetime.UTC)
    with mock.patch.object(limits, "datetime", clock):
        yield


class OwnerBudgetPeriodTests(PlanTestCase):
    """The owners' budgets have a period of their own, apart from the budget of each key
    made under the plan: a daily allowance per user beside monthly keys, or the reverse."""

    async def spent_yesterday(self, tokens):
        yesterday = MID_MONTH - datetime.timedelta(days=1)
        await sync_to_async(logged)(at=yesterday, api_key=self.server, total_tokens=tokens)

    async def test_a_daily_owner_allowance_starts_afresh_each_day(self):
        await self.set_plan(owner_token_budget=100, owner_budget_period="day",
                            budget_period="month")  # fmt: skip
        await self.spent_yesterday(98)
        with budgets_reckoned_at(MID_MONTH):
            assert (await self.ask(self.laptop_plaintext)).status_code == 200
            plan = await Plan.objects.aget(pk=self.plan.pk)
            standing = await limits.owner_standing(self.alice.pk, plan)
        assert standing == [("tokens this day (all your keys)", 3, 100)]

    async def test_a_monthly_owner_cap_does_not_start_afresh_each_day(self):
        await self.set_plan(owner_token_budget=100, owner_budget_period="month",
                            budget_period="day")  # fmt: skip
        await self.spent_yesterday(98)
        with budgets_reckoned_at(MID_MONTH):
            refused = await self.ask(self.laptop_plaintext)
        assert refused.status_code == 429
        error = refused.json()["error"]
        assert error["code"] == "insufficient_quota"
        assert "Budget: tokens this month (all your keys), limit 100, used 98" in error["message"]


class RedisOwnerBudgetPeriodTests(OnRedis, OwnerBudgetPeriodTests):
    pass


async def clear_of_a_new_month():
    """Wait, if need be, so that a short race does not straddle two budget periods."""
    now = datetime.datetime.now(datetime.UTC)
    following = (now.replace(day=1) + datetime.timedelta(days=32)).replace(day=1, hour=0)
    left = (following.replace(minute=0, second=0, microsecond=0) - now).total_seconds()
    if left < 5:
        await asyncio.sleep(left + 0.2)


class OwnerBudgetRaceTests(PlanTestCase):
    """64 clients at once on three keys of one owner, each asking again as soon as it is
    answered: what the admitted requests used never passes the owner's budget, and the
    counter ends at exactly what was used."""

    CLIENTS, ROUNDS = 64, 4

    async def race(self):
        await clear_of_a_new_month()
        _, plaintext = await sync_to_async(ApiKey.objects.create_key)("third", owner=self.alice)
        grants = [
            await keys.grant(hash_key(p))
            for p in (self.laptop_plaintext, self.server_plaintext, plaintext)
        ]
        alias = await ModelAlias.objects.select_related("backend").aget(pk=self.echo.pk)
        chat = parse_chat_request(
            {"model": "echo", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 20}
        )
        estimate = limits.Estimate.of(chat, alias, prompt_bound(chat))
        used, refusals = [], set()

        async def client(rng, grant):
            for _ in range(self.ROUNDS):
                try:
                    admission = await limits.admit(grant.key, alias, estimate)
                except APIError as refusal:
                    refusals.add(refusal.code)
                    continue
                await asyncio.sleep(0.01 * rng.random())
                completion = rng.randint(0, estimate.completion_tokens)
                used.append(estimate.prompt_tokens + completion)
                await admission.settle(Usage(estimate.prompt_tokens, completion))

        await asyncio.gather(
            *(client(random.Random(i), grants[i % 3]) for i in range(self.CLIENTS))
        )
        assert refusals == {"insufficient_quota"}
        return sum(used)

    async def test_the_owners_token_budget_is_never_passed(self):
        await self.set_plan(owner_token_budget=1000)
        total = await self.race()
        assert 0 < total <= 1000
        plan = await Plan.objects.aget(pk=self.plan.pk)
        standing = await limits.owner_standing(self.alice.pk, plan)
        assert standing == [("tokens this month (all your keys)", total, 1000)]


class RedisOwnerBudgetRaceTests(OnRedis, OwnerBudgetRaceTests):
    pass


def owned_key(pk: int, owner_id: int, plan: Plan) -> ApiKey:
    """A key of ``owner_id`` under ``plan``, as the gateway reads it."""
    key = ApiKey(pk=pk, owner_id=owner_id)
    key.owner_plan = plan
    return key


def hammer_owner(url: str, owner_id: int, key_ids: list[int], budget: int, seed: int) -> int:
    """32 clients of one process spending an owner budget of ``budget`` tokens through
    the owner's keys ``key_ids``, each reserving 30 and using some: the tokens used."""
    plan = Plan(name="shared", owner_token_budget=budget)
    backend = Backend(name="scripted", kind="scripted")
    alias = ModelAlias(pk=1, public_id="echo", backend=backend)
    estimate = limits.Estimate(prompt_tokens=10, completion_tokens=20)

    async def client(rng, key):
        used = 0
        for _ in range(8):
            try:
                admission = await limits.admit(key, alias, estimate)
            except APIError:
                continue
            completion = rng.randint(0, 20)
            await asyncio.sleep(rng.random() / 100)
            await admission.settle(Usage(10, completion))
            used += 10 + completion
        return used

    async def clients():
        owned = [owned_key(pk, owner_id, plan) for pk in key_ids]
        racing = (client(random.Random(seed * 100 + i), owned[i % 2]) for i in range(32))
        return sum(await asyncio.gather(*racing))

    with override_settings(CHATPARITY={"REDIS_URL": url}):
        return asyncio.run(clients())


def test_two_processes_never_pass_an_owner_budget_together(redis_url):
    owner_id = int(time.time() * 1000)  # a counter of its own on a shared Redis
    plan = Plan(name="shared", owner_token_budget=600)
    (budget,) = limits._budgets(owned_key(1, owner_id, plan))
    store = limits.RedisCounters(redis_url)
    asyncio.run(store.seed(budget.counter, 0, budget.ttl))  # as the log says: nothing yet
    workers = [
        in_a_process(
            "tests.accounting.test_plans",
            f"hammer_owner({redis_url!r}, {owner_id}, {[seed * 10, seed * 10 + 1]}, 600, {seed})",
        )
        for seed in (1, 2)
    ]
    used = sum(json.loads(worker.communicate()[0]) for worker in workers)
    assert 0 < used <= 600
    (left,) = asyncio.run(limits.RedisCounters(redis_url).values([budget.counter]))
    assert left == used  # every reservation settled to what was used


@pytest.mark.parametrize("field", ["owner_token_budget", "owner_cost_budget"])
def test_a_plan_without_owner_budgets_limits_no_key(field):
    assert not Plan(name="p").has_owner_budget
    assert Plan(name="p", **{field: 1}).has_owner_budget
