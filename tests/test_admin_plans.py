"""Plans in the admin: staff give a group or a user a plan, with its aliases, its keys'
limits and its owner budgets; a plan for every alias names none."""

from decimal import Decimal

from django.contrib.auth.models import Group, User
from django.test import TestCase

from chatparity.models import Backend, ModelAlias, Plan

ADD = "/admin/chatparity/plan/add/"


class PlanAdminTests(TestCase):
    @classmethod
    def setUpTestData(cls):
        cls.admin = User.objects.create_superuser("root")
        cls.team = Group.objects.create(name="team")
        cls.member = User.objects.create_user("member")
        cls.member.groups.add(cls.team)
        backend = Backend.objects.create(name="local", kind="local")
        cls.alias = ModelAlias.objects.create(public_id="smollm2", backend=backend)

    def setUp(self):
        self.client.force_login(self.admin)

    def form(self, **fields):
        return {
            "name": "team plan", "priority": "0", "all_aliases": "on", "budget_period": "month",
            "owner_budget_period": "day", **fields,
        }  # fmt: skip

    def test_a_group_given_a_plan_with_its_aliases_and_budgets(self):
        form = self.form(
            groups=[self.team.pk], all_aliases="", allowed_aliases=[self.alias.pk],
            requests_per_minute="20", owner_token_budget="100000",
        )  # fmt: skip
        assert self.client.post(ADD, form).status_code == 302
        plan = Plan.objects.for_owner(self.member.pk)
        assert plan.name == "team plan"
        assert list(plan.allowed_aliases.all()) == [self.alias]
        assert plan.key_limits()["requests_per_minute"] == 20
        assert (plan.owner_token_budget, plan.owner_budget_period) == (100_000, "day")

    def test_every_alias_and_a_selection_at_once_is_refused(self):
        response = self.client.post(ADD, self.form(allowed_aliases=[self.alias.pk]))
        assert response.status_code == 200
        assert "Untick" in response.content.decode()
        assert not Plan.objects.exists()

    def test_the_change_page_shows_each_part(self):
        plan = Plan.objects.create(name="starter")
        html = self.client.get(f"/admin/chatparity/plan/{plan.pk}/change/").content.decode()
        for heading in ("Aliases", "Each key made in the portal", "All of one user"):
            assert heading in html

    def test_the_list_sums_up_each_keys_limits_and_the_owner_budgets_in_a_column_each(self):
        pro = Plan.objects.create(
            name="pro", priority=5, all_aliases=False, requests_per_minute=600,
            tokens_per_minute=200_000, max_concurrent=4, token_budget=10_000_000,
            cost_budget=Decimal("1234.5000"), owner_token_budget=50_000_000,
            owner_cost_budget=Decimal("99.9900"), owner_budget_period="day",
        )  # fmt: skip
        pro.allowed_aliases.add(self.alias)
        Plan.objects.create(name="free")
        response = self.client.get("/admin/chatparity/plan/")
        assert response.context["cl"].list_display == [
            "action_checkbox", "name", "priority", "aliases", "each_key", "owner_budget",
        ]  # fmt: skip
        html = response.content.decode()
        for cell in (
            '<td class="field-aliases">1 selected</td>',
            '<td class="field-each_key">600 requests/min · 200,000 tokens/min · 4 at once ·'
            " 10,000,000 tokens + $1,234.5 per month (UTC)</td>",
            '<td class="field-owner_budget">50,000,000 tokens + $99.99 per day (UTC)</td>',
            '<td class="field-aliases">all</td>',
            '<td class="field-each_key">none</td><td class="field-owner_budget">none</td>',
        ):
            assert cell in html, cell
