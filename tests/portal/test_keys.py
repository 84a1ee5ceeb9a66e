"""The portal's keys through Django's test client: a user lists, creates, uses and revokes
their own keys under their plan, and never sees or touches another user's."""

import datetime
import re
from decimal import Decimal
from html import unescape

import orjson
from asgiref.sync import async_to_sync
from django.contrib.auth.models import Group
from django.db.models import Sum
from django.test import Client, TestCase, override_settings
from django.utils import timezone

from chatparity.accounting import limits
from chatparity.models import ApiKey, Backend, ModelAlias, Plan, RequestLog, hash_key
from tests.accounting.test_limits import HI
from tests.scripted import SCRIPTED
from tests.support.logs import logged
from tests.support.users import portal_user

KEYS, NEW_KEY = "/portal/", "/portal/keys/new/"


def revoke_url(key):
    return f"/portal/keys/{key.pk}/revoke/"


def plaintext_of(response):
    """The plaintext key on the page shown after creating one."""
    return re.search(r'id="plaintext-key"[^>]*value="([^"]+)"', response.content.decode())[1]


class PortalTestCase(TestCase):
    @classmethod
    def setUpTestData(cls):
        cls.local = Backend.objects.create(name="local", kind="local")
        cls.smollm2 = ModelAlias.objects.create(
            public_id="smollm2", backend=cls.local, model="SmolLM2"
        )
        cls.other_alias = ModelAlias.objects.create(public_id="other", backend=cls.local)
        cls.plan = Plan.objects.create(
            name="starter",
            requests_per_minute=30,
            token_budget=50_000,
            cost_budget=Decimal("2.5"),
            budget_period="day",
        )
        cls.alice = portal_user("alice", cls.plan)
        cls.bob = portal_user("bob", cls.plan)

    def setUp(self):
        self.client.force_login(self.alice)

    def create(self, client=None, secure=False, **fields):
        return (client or self.client).post(NEW_KEY, {"name": "laptop", **fields}, secure=secure)

    def ask(self, plaintext, model="smollm2"):
        """A real completion from the local model with ``plaintext``."""
        body = {"model": model, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2}
        return Client().post(
            "/v1/chat/completions",
            orjson.dumps(body),
            content_type="application/json",
            headers={"Authorization": f"Bearer {plaintext}"},
        )


class KeyLifeTests(PortalTestCase):
    def test_a_new_key_is_shown_once_then_only_by_its_prefix(self):
        created = self.create()
        assert created.status_code == 201
        plaintext = plaintext_of(created)
        key = ApiKey.objects.get(hashed_key=hash_key(plaintext))
        assert key.owner == self.alice
        assert "no-store" in created["Cache-Control"]
        listing = self.client.get(KEYS).content.decode()
        assert plaintext not in listing
        assert f"{key.prefix}…" in listing
        assert "laptop" in listing

    def test_a_new_key_gets_the_plans_limits_and_budgets(self):
        key = ApiKey.objects.get(hashed_key=hash_key(plaintext_of(self.create())))
        assert (key.requests_per_minute, key.token_budget, key.cost_budget, key.budget_period) == (
            30, 50_000, Decimal("2.5"), "day",
        )  # fmt: skip
        assert key.tokens_per_minute is None
        assert key.max_concurrent is None

    def test_the_new_key_answers_on_v1_and_is_refused_once_revoked(self):
        plaintext = plaintext_of(self.create())
        answered = self.ask(plaintext)
        assert answered.status_code == 200, answered.content
        assert answered.json()["model"] == "smollm2"
        key = ApiKey.objects.get(hashed_key=hash_key(plaintext))

        revoked = self.client.post(revoke_url(key), follow=True)
        assert revoked.status_code == 200
        assert "revoked" in revoked.content.decode()
        key.refresh_from_db()
        assert not key.is_active
        refused = self.ask(plaintext)  # at once: the save emptied this worker's key cache
        assert refused.status_code == 401
        assert refused.json()["error"]["code"] == "invalid_api_key"

    def test_a_key_limited_to_chosen_aliases_serves_only_them(self):
        plaintext = plaintext_of(self.create(aliases=[self.other_alias.pk]))
        key = ApiKey.objects.get(hashed_key=hash_key(plaintext))
        assert not key.all_aliases
        assert list(key.allowed_aliases.all()) == [self.other_alias]
        assert self.ask(plaintext, "smollm2").status_code == 404

    def test_an_expiry_in_the_past_is_refused_and_one_ahead_is_kept(self):
        past = self.create(expires_at="2001-01-01T00:00")
        assert past.status_code == 400
        assert "in the future" in past.content.decode()
        ahead = (timezone.now() + datetime.timedelta(days=3)).replace(second=0, microsecond=0)
        created = self.create(expires_at=ahead.strftime("%Y-%m-%dT%H:%M"))
        key = ApiKey.objects.get(hashed_key=hash_key(plaintext_of(created)))
        assert key.expires_at == ahead

    def test_an_expiry_is_read_in_utc_and_at_most_a_century_ahead(self):
        # West of UTC, 9999-12-31T23:59 in the site's zone is past the last time there is.
        with override_settings(TIME_ZONE="America/New_York"):
            for absurd in ("9999-12-31T23:59", "9999-12-31T20:00", "2200-01-01T00:00"):
                refused = self.create(expires_at=absurd)
                assert refused.status_code == 400, absurd
                assert "within 100 years" in refused.content.decode()
            created = self.create(expires_at="2100-06-01T12:00")
        key = ApiKey.objects.get(hashed_key=hash_key(plaintext_of(created)))
        assert key.expires_at == datetime.datetime(2100, 6, 1, 12, tzinfo=datetime.UTC)
        assert not ApiKey.objects.exclude(pk=key.pk).exists()

    def test_the_listing_shows_status_scope_and_limits(self):
        ApiKey.objects.create_key("old", owner=self.alice, is_active=False)
        scoped, _ = ApiKey.objects.create_key("scoped", owner=self.alice, all_aliases=False)
        scoped.allowed_aliases.set([self.smollm2])
        listing = self.client.get(KEYS).content.decode()
        assert re.search(r"old</td>.*?class=\"status\">revoked", listing, re.S)
        assert re.search(r"scoped</td>.*?class=\"status\">active.*?<td>smollm2</td>", listing, re.S)

    def test_changes_need_a_post_with_a_csrf_token(self):
        key, _ = ApiKey.objects.create_key("mine", owner=self.alice)
        strict = Client(enforce_csrf_checks=True)
        strict.force_login(self.alice)
        assert strict.post(NEW_KEY, {"name": "forged"}).status_code == 403
        assert strict.post(revoke_url(key)).status_code == 403
        assert self.client.get(revoke_url(key)).status_code == 405
        assert not ApiKey.objects.filter(name="forged").exists()
        key.refresh_from_db()
        assert key.is_active

        page = strict.get(KEYS)
        token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page.content.decode())[1]
        assert strict.post(revoke_url(key), {"csrfmiddlewaretoken": token}).status_code == 302
        key.refresh_from_db()
        assert not key.is_active


class IsolationTests(PortalTestCase):
    @classmethod
    def setUpTestData(cls):
        super().setUpTestData()
        cls.bobs_key, cls.bobs_plaintext = ApiKey.objects.create_key("bobs", owner=cls.bob)
        cls.staff_key, _ = ApiKey.objects.create_key("nobodys")

    def test_the_listing_holds_only_the_users_own_keys(self):
        ApiKey.objects.create_key("alices", owner=self.alice)
        listing = self.client.get(KEYS).content.decode()
        assert "alices" in listing
        assert "bobs" not in listing
        assert self.bobs_key.prefix not in listing
        assert "nobodys" not in listing

    def test_another_users_key_cannot_be_revoked_by_guessing_its_id(self):
        for key in (self.bobs_key, self.staff_key):
            assert self.client.post(revoke_url(key)).status_code == 404
            key.refresh_from_db()
            assert key.is_active
        missing = ApiKey.objects.order_by("-pk").first().pk + 1
        assert self.client.post(f"/portal/keys/{missing}/revoke/").status_code == 404
        assert self.ask(self.bobs_plaintext).status_code == 200

    def test_each_user_sees_the_key_they_made_and_not_the_others(self):
        alices = plaintext_of(self.create(name="alice-made"))
        bobs_client = Client()
        bobs_client.force_login(self.bob)
        bobs = plaintext_of(self.create(bobs_client, name="bob-made"))
        assert "bob-made" not in self.client.get(KEYS).content.decode()
        assert "alice-made" not in bobs_client.get(KEYS).content.decode()
        assert ApiKey.objects.get(hashed_key=hash_key(alices)).owner == self.alice
        assert ApiKey.objects.get(hashed_key=hash_key(bobs)).owner == self.bob

    def test_aliases_outside_the_plan_cannot_be_chosen(self):
        self.plan.all_aliases = False
        self.plan.save()
        self.plan.allowed_aliases.set([self.other_alias])
        # Another alias's id, or ids no database integer holds (a 500 on SQLite before).
        for guessed in ([self.smollm2.pk], [2**63], [self.other_alias.pk, -(2**70)]):
            refused = self.create(aliases=guessed)
            assert refused.status_code == 400, guessed
            assert "not one of the available choices" in refused.content.decode()
        assert not ApiKey.objects.filter(name="laptop").exists()
        listing = self.client.get(KEYS).content.decode()
        assert f'value="{self.other_alias.pk}"' in listing
        assert f'value="{self.smollm2.pk}"' not in listing


class PlanLossTests(PortalTestCase):
    """A key made in the portal is bounded by its owner's plan while they have it, and
    refused once they lose it: never the wider key that bounds nothing."""

    def setUp(self):
        super().setUp()
        self.plan.all_aliases = False
        self.plan.save()
        self.plan.allowed_aliases.set([self.smollm2])
        self.plaintext = plaintext_of(self.create())  # none ticked: all the plan allows
        self.key = ApiKey.objects.get(hashed_key=hash_key(self.plaintext))

    def assert_refused(self):
        for model in ("smollm2", "other"):
            refused = self.ask(self.plaintext, model)
            assert refused.status_code == 401, refused.content
            assert refused.json()["error"]["code"] == "invalid_api_key"

    def test_the_key_needs_the_plan_and_serves_within_it(self):
        assert self.key.needs_plan
        assert self.ask(self.plaintext, "other").status_code == 404
        assert self.ask(self.plaintext, "smollm2").status_code == 200

    def test_a_user_whose_plan_is_taken_away_loses_the_key_at_once(self):
        self.plan.users.remove(self.alice)
        self.assert_refused()
        listing = self.client.get(KEYS).content.decode()
        assert re.search(r'laptop</td>.*?class="status">no plan', listing, re.S)
        self.plan.users.add(self.alice)
        assert self.ask(self.plaintext, "smollm2").status_code == 200

    def test_a_user_removed_from_the_group_giving_the_plan_loses_the_key(self):
        group = Group.objects.create(name="team")
        self.plan.groups.add(group)
        self.plan.users.remove(self.alice)
        self.alice.groups.add(group)
        assert self.ask(self.plaintext, "smollm2").status_code == 200
        group.user_set.remove(self.alice)
        self.assert_refused()

    def test_a_deleted_plan_or_owner_leaves_the_key_refused(self):
        self.plan.delete()
        self.assert_refused()
        Plan.objects.create(name="again").users.add(self.alice)
        assert self.ask(self.plaintext, "other").status_code == 200
        self.alice.delete()  # the key is no one's now: still no plan
        self.assert_refused()

    def test_a_key_staff_issued_without_needing_a_plan_keeps_serving(self):
        _, staffs = ApiKey.objects.create_key("staff-issued", owner=self.alice)
        self.plan.users.remove(self.alice)
        assert self.ask(staffs, "other").status_code == 200


class PermissionTests(PortalTestCase):
    def test_anonymous_visitors_are_sent_to_the_login_page(self):
        anonymous = Client()
        for page in (KEYS, "/portal/usage/", "/portal/requests/"):
            response = anonymous.get(page)
            assert response.status_code == 302
            assert response["Location"].startswith("/accounts/login/?next=")
        assert anonymous.post(NEW_KEY, {"name": "x"}).status_code == 302
        assert not ApiKey.objects.exists()

    def test_a_user_without_the_permission_is_refused_everywhere(self):
        carol = portal_user("carol", self.plan, permitted=False)
        key, _ = ApiKey.objects.create_key("carols", owner=carol)
        self.client.force_login(carol)
        for page in (KEYS, "/portal/usage/", "/portal/requests/"):
            assert self.client.get(page).status_code == 403
        assert self.create().status_code == 403
        assert self.client.post(revoke_url(key)).status_code == 403
        key.refresh_from_db()
        assert key.is_active
        assert ApiKey.objects.filter(owner=carol).count() == 1

    def test_a_user_without_a_plan_sees_their_keys_but_cannot_create_one(self):
        dave = portal_user("dave")
        self.client.force_login(dave)
        page = self.client.get(KEYS)
        assert page.status_code == 200
        assert "no plan" in page.content.decode()
        assert 'id="new-key"' not in page.content.decode()
        assert self.create().status_code == 403
        assert not ApiKey.objects.filter(owner=dave).exists()

    def test_a_plan_given_to_a_group_applies_to_its_members(self):
        erin = portal_user("erin")
        group = erin.groups.get()
        group_plan = Plan.objects.create(name="group plan", tokens_per_minute=1234)
        group_plan.groups.add(group)
        self.client.force_login(erin)
        key = ApiKey.objects.get(hashed_key=hash_key(plaintext_of(self.create())))
        assert key.tokens_per_minute == 1234


@override_settings(CHATPARITY={"PORTAL": {"MAX_KEYS": 2}})
class KeyCapTests(PortalTestCase):
    def test_a_user_holds_at_most_max_keys_active_keys(self):
        assert self.create(name="one").status_code == 201
        assert self.create(name="two").status_code == 201
        refused = self.create(name="three")
        assert refused.status_code == 400
        assert "the most allowed" in refused.content.decode()
        assert ApiKey.objects.filter(owner=self.alice).count() == 2

    def test_revoked_and_expired_keys_do_not_count(self):
        ApiKey.objects.create_key("revoked", owner=self.alice, is_active=False)
        past = timezone.now() - datetime.timedelta(days=1)
        ApiKey.objects.create_key("expired", owner=self.alice, expires_at=past)
        assert self.create(name="one").status_code == 201
        assert self.create(name="two").status_code == 201
        assert self.create(name="three").status_code == 400

    def test_the_cap_is_each_users_own(self):
        ApiKey.objects.create_key("one", owner=self.bob)
        ApiKey.objects.create_key("two", owner=self.bob)
        assert self.create(name="alices").status_code == 201


@override_settings(CHATPARITY={**SCRIPTED, "PORTAL": {"MAX_KEYS": 2}})
class KeyCyclingTests(TestCase):
    """Security round 4: revoking a spent key and making another gave the plan's budget of
    each key again, without end. The keys a user makes under a plan may spend together
    at most what the most keys they may hold at once could (``MAX_KEYS`` times a key's
    budget), whichever of them were revoked."""

    KEY_BUDGET = HI + 11  # a key spends 4 requests of 3 tokens, each reserving HI + 2

    @classmethod
    def setUpTestData(cls):
        backend = Backend.objects.create(
            name="scripted", kind="scripted", options={"script": ["Hello", " there"]}
        )
        ModelAlias.objects.create(public_id="echo", backend=backend)
        plan = Plan.objects.create(name="starter", token_budget=cls.KEY_BUDGET, budget_period="day")
        cls.alice = portal_user("alice", plan)

    def test_revoking_and_making_keys_never_spends_past_max_keys_budgets(self):
        self.client.force_login(self.alice)
        for _ in range(12):  # spent without the bound: 12 keys of 12 tokens
            created = self.client.post(NEW_KEY, {"name": "cycled"})
            assert created.status_code == 201
            plaintext = plaintext_of(created)
            while (answer := ask_echo(plaintext)).status_code == 200:
                pass
            assert answer.json()["error"]["code"] == "insufficient_quota"
            key = ApiKey.objects.get(hashed_key=hash_key(plaintext))
            assert self.client.post(revoke_url(key)).status_code == 302
        spent = RequestLog.objects.aggregate(total=Sum("total_tokens"))["total"]
        assert 2 * self.KEY_BUDGET - HI - 2 <= spent <= 2 * self.KEY_BUDGET
        plan = Plan.objects.get(name="starter")
        assert async_to_sync(limits.owner_standing)(self.alice.pk, plan) == [
            ("tokens this day (all your keys made under your plan)", spent, 2 * self.KEY_BUDGET),
        ]


def ask_echo(plaintext):
    """A completion of the scripted alias ``echo`` (1 prompt and 2 completion tokens)."""
    body = {"model": "echo", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2}
    return Client().post(
        "/v1/chat/completions",
        orjson.dumps(body),
        content_type="application/json",
        headers={"Authorization": f"Bearer {plaintext}"},
    )


def shown(page, element_id):
    """The text of the element ``element_id`` on ``page``, its tags dropped."""
    html = page.content.decode()
    return html_text(re.search(rf'<(\w+) [^>]*id="{element_id}"[^>]*>(.*?)</\1>', html, re.S)[2])


def html_text(html):
    return unescape(re.sub(r"<[^>]+>", "", html)).strip()


class KeyCreatedTests(PortalTestCase):
    """The page after a new key tells how to use it: the API's real base URLs, the
    user's own models, and snippets for curl, the SDKs, Claude Code and Codex."""

    def test_the_base_urls_are_where_the_site_mounts_the_api(self):
        created = self.create()
        assert shown(created, "openai-base-url") == "http://testserver/v1"
        assert shown(created, "anthropic-base-url") == "http://testserver"

    @override_settings(ROOT_URLCONF="tests.support.bare_site_urls")
    def test_a_site_mounting_the_api_under_llm_is_told_llm(self):
        created = self.create(secure=True)
        assert shown(created, "openai-base-url") == "https://testserver/llm/v1"
        assert shown(created, "anthropic-base-url") == "https://testserver/llm"
        curl = shown(created, "code-curl")
        assert "https://testserver/llm/v1/chat/completions" in curl
        assert "testserver/v1" not in created.content.decode()

    def test_the_snippets_name_the_models_the_key_may_use(self):
        embedder = Backend.objects.create(name="embedder", kind="embedder")
        ModelAlias.objects.create(public_id="embed-small", backend=embedder)
        created = self.create()
        assert shown(created, "models") == "other, smollm2"  # not embed-small: it does not chat
        plaintext = plaintext_of(created)
        for slug in ("curl", "openai-python", "anthropic-python", "claude-code", "codex"):
            section = shown(created, f"snippet-{slug}")
            assert plaintext in section, slug  # Codex's in the line after its config.toml
            assert "other" in shown(created, f"code-{slug}"), slug  # the first of the models
        scoped = self.create(name="scoped", aliases=[self.smollm2.pk])
        assert shown(scoped, "models") == "smollm2"
        assert "ANTHROPIC_MODEL=smollm2" in shown(scoped, "code-claude-code")
        assert 'id="snippet-model"' not in scoped.content.decode()  # nothing to choose

    def test_a_chooser_holds_each_models_own_snippets(self):
        created = self.create()
        html = created.content.decode()
        options = re.search(r'<select id="snippet-model">(.*?)</select>', html, re.S)[1]
        assert re.findall(r"<option>(.*?)</option>", options) == ["other", "smollm2"]
        data = re.search(r'<script id="snippets-by-model"[^>]*>(.*?)</script>', html, re.S)[1]
        by_model = orjson.loads(unescape(data))
        assert sorted(by_model) == ["other", "smollm2"]
        assert by_model["other"]["curl"].strip() == shown(created, "code-curl")  # shown first
        for model, texts in by_model.items():
            assert f"ANTHROPIC_MODEL={model}\n" in texts["claude-code"]
            assert f'"model": "{model}"' in texts["curl"]
            assert plaintext_of(created) in texts["openai-python"]

    @override_settings(ROOT_URLCONF="tests.support.portal_only_urls")
    def test_a_site_without_the_api_mounted_is_told_so(self):
        created = self.create()
        assert created.status_code == 201
        assert "does not mount chatparity's API" in created.content.decode()
        assert 'id="code-curl"' not in created.content.decode()


class UsedOfAllowedTests(PortalTestCase):
    """Each key that serves shows what it used of every limit, the plan's budget shared
    by all the user's keys included, with thousands separators."""

    def test_each_limit_and_the_shared_budget_used_of_allowed(self):
        self.plan.owner_token_budget = 1_000_000
        self.plan.owner_cost_budget = Decimal("1500")
        self.plan.save()
        created = self.create()
        key = ApiKey.objects.get(hashed_key=hash_key(plaintext_of(created)))
        logged(at=timezone.now(), api_key=key, key_prefix=key.prefix, prompt_tokens=12_000,
               completion_tokens=345, total_tokens=12_345, cost=Decimal("1234.5"))  # fmt: skip
        page = self.client.get(KEYS).content.decode()
        cell = html_text(re.search(r'<td class="limits">(.*?)</td>', page, re.S)[1])
        lines = [" ".join(line.split()) for line in cell.splitlines() if line.strip()]
        assert lines == [
            "requests this minute: 0 of 30",
            "tokens this day: 12,345 of 50,000",
            "cost this day: $1,234.5000 of $2.5000",
            "tokens this month (all your keys): 12,345 of 1,000,000",
            "cost this month (all your keys): $1,234.5000 of $1,500.0000",
            # MAX_KEYS (10) times the plan's budget of each key, revoked keys included.
            "tokens this day (all your keys made under your plan): 12,345 of 500,000",
            "cost this day (all your keys made under your plan): $1,234.5000 of $25.0000",
        ]

    def test_a_key_that_no_longer_serves_shows_its_limits(self):
        ApiKey.objects.create_key("old", owner=self.alice, is_active=False, token_budget=123_456)
        page = self.client.get(KEYS).content.decode()
        cell = html_text(re.search(r'<td class="limits">(.*?)</td>', page, re.S)[1])
        assert " ".join(cell.split()) == "123,456 tokens per month."
