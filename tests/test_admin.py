"""The admin for keys, backends, aliases and the request log, with Django's test client."""

import csv
import datetime
import io
import json
import re
import sys
from decimal import Decimal

import orjson
import pytest
from asgiref.sync import async_to_sync
from django.contrib.admin.models import LogEntry
from django.contrib.auth.models import Permission
from django.contrib.sessions.models import Session
from django.db import connection
from django.test import AsyncClient, override_settings
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils import timezone

from chatparity import admin as chatparity_admin
from chatparity.accounting import catalog
from chatparity.accounting import deployments as shared
from chatparity.accounting.deployments import Outcome
from chatparity.accounting.inserts import insert_rows
from chatparity.admin import RequestLogAdmin
from chatparity.kinds import kinds
from chatparity.models import (
    ApiKey,
    Backend,
    Deployment,
    ModelAlias,
    RequestLog,
    StoredResponse,
    hash_key,
)
from tests.configs import BAD_ALIASES, BAD_BACKENDS, GOOD_ALIAS, GOOD_BACKENDS
from tests.scripted import SCRIPTED
from tests.support.logs import logged, noon

ACTION = "_selected_action"
SECRET = "sk-upstream-secret-4242"
# Long enough that only a change this worker hears of can end a cached grant.
CACHED = {**SCRIPTED, "CACHE_SECONDS": 3600}


def run_action(client, model, action, objects, **extra):
    url = reverse(f"admin:chatparity_{model}_changelist")
    return client.post(url, {"action": action, ACTION: [o.pk for o in objects], **extra})


def page(response) -> str:
    return response.content.decode()


def messages_of(response) -> list[str]:
    return [str(message) for message in response.wsgi_request._messages]


def v1_chat(client, plaintext, model):
    """A chat completion request to /v1 presenting ``plaintext``; its JSON answer."""
    response = client.post(
        "/v1/chat/completions",
        orjson.dumps({"model": model, "messages": [{"role": "user", "content": "Hi"}]}),
        content_type="application/json",
        headers={"Authorization": f"Bearer {plaintext}"},
    )
    return response.status_code, response.json()


@pytest.fixture
def scripted_alias(db, settings):
    settings.CHATPARITY = CACHED

    def make(*script, name="scripted"):
        backend = Backend.objects.create(name=name, kind="scripted", options={"script": script})
        return ModelAlias.objects.create(public_id=name, backend=backend, model="echo")

    return make


@pytest.fixture
def staff_client(client, django_user_model):
    """A client logged in as staff holding only the chatparity permissions given
    (codenames such as "view_backend"), not a superuser."""

    def login(*codenames):
        user = django_user_model.objects.create_user("editor", password="pw", is_staff=True)
        user.user_permissions.set(
            Permission.objects.filter(content_type__app_label="chatparity", codename__in=codenames)
        )
        client.force_login(user)
        return client

    return login


class TestApiKeyAdmin:
    def test_creating_a_key_shows_its_plaintext_once_and_stores_only_the_hash(self, admin_client):
        response = admin_client.post(
            reverse("admin:chatparity_apikey_add"),
            {"name": "ci", "is_active": "on", "budget_period": "month"},
        )
        assert response.status_code == 200
        assert "no-store" in response["Cache-Control"]
        plaintext = response.context["plaintext"]
        assert plaintext.startswith("sk-cp-")
        assert f'value="{plaintext}"' in page(response)
        key = ApiKey.objects.get()
        assert key.hashed_key == hash_key(plaintext)
        for where in (
            reverse("admin:chatparity_apikey_changelist"),
            reverse("admin:chatparity_apikey_change", args=[key.pk]),
        ):
            shown = page(admin_client.get(where))
            assert plaintext not in shown
            assert f"{key.prefix}…" in shown
        assert all(plaintext not in s.session_data for s in Session.objects.all())

    def test_revoke_and_reactivate(self, admin_client, db):
        key, _ = ApiKey.objects.create_key("k")
        run_action(admin_client, "apikey", "revoke", [key])
        key.refresh_from_db()
        assert not key.is_active
        listing = page(admin_client.get(reverse("admin:chatparity_apikey_changelist")))
        assert "revoked" in listing
        run_action(admin_client, "apikey", "reactivate", [key])
        key.refresh_from_db()
        assert key.is_active

    def test_a_revoked_key_is_refused_on_the_next_request_to_this_worker(
        self, admin_client, scripted_alias
    ):
        scripted_alias("Hi")
        key, plaintext = ApiKey.objects.create_key("k")
        assert v1_chat(admin_client, plaintext, "scripted")[0] == 200  # its grant is cached now
        run_action(admin_client, "apikey", "revoke", [key])
        status, answer = v1_chat(admin_client, plaintext, "scripted")
        assert (status, answer["error"]["code"]) == (401, "invalid_api_key")
        run_action(admin_client, "apikey", "reactivate", [key])
        assert v1_chat(admin_client, plaintext, "scripted")[0] == 200

    @pytest.mark.parametrize(
        ("permissions", "revoked"),
        [(["view_apikey"], False), (["view_apikey", "change_apikey"], True)],
    )
    def test_revoking_needs_the_change_permission(self, staff_client, db, permissions, revoked):
        key, _ = ApiKey.objects.create_key("k")
        run_action(staff_client(*permissions), "apikey", "revoke", [key])
        key.refresh_from_db()
        assert key.is_active is not revoked

    def test_a_key_is_for_every_alias_or_only_those_selected(self, admin_client, scripted_alias):
        alias = scripted_alias("Hi")
        add = reverse("admin:chatparity_apikey_add")
        form = {"name": "k", "is_active": "on", "budget_period": "month"}
        assert admin_client.get(add).context["adminform"].form["all_aliases"].value() is True
        admin_client.post(add, {**form, "all_aliases": "on"})
        admin_client.post(add, {**form, "allowed_aliases": [alias.pk]})  # all_aliases unticked
        everything, scoped = ApiKey.objects.order_by("pk")
        assert (everything.all_aliases, list(everything.allowed_aliases.all())) == (True, [])
        assert (scoped.all_aliases, list(scoped.allowed_aliases.all())) == (False, [alias])
        listing = admin_client.get(reverse("admin:chatparity_apikey_changelist"))
        assert "all_aliases" in listing.context["cl"].list_display
        assert (page(listing).count('alt="True"'), page(listing).count('alt="False"')) == (1, 1)

    def test_every_alias_and_aliases_selected_at_once_is_refused(
        self, admin_client, scripted_alias
    ):
        alias = scripted_alias("Hi")
        form = {"name": "k", "is_active": "on", "budget_period": "month", "all_aliases": "on"}
        response = admin_client.post(
            reverse("admin:chatparity_apikey_add"), {**form, "allowed_aliases": [alias.pk]}
        )
        (error,) = response.context["adminform"].form.errors["allowed_aliases"]
        assert error.startswith("Untick 'all aliases'")
        assert not ApiKey.objects.exists()

    def test_a_scoped_key_opened_to_every_alias_keeps_no_selection(
        self, admin_client, scripted_alias
    ):
        key, _ = ApiKey.objects.create_key("k", all_aliases=False)
        key.allowed_aliases.add(scripted_alias("Hi"))
        form = {"name": "k", "is_active": "on", "budget_period": "month", "all_aliases": "on"}
        change = reverse("admin:chatparity_apikey_change", args=[key.pk])
        assert admin_client.post(change, form).status_code == 302
        key.refresh_from_db()
        assert (key.all_aliases, list(key.allowed_aliases.all())) == (True, [])

    def test_limits_are_edited_on_the_key_and_its_usage_shown(self, admin_client, db):
        key, _ = ApiKey.objects.create_key("k")
        url = reverse("admin:chatparity_apikey_change", args=[key.pk])
        assert "No limits or budgets." in page(admin_client.get(url))
        form = {
            "name": "k",
            "is_active": "on",
            "requests_per_minute": "30",
            "budget_period": "month",
        }
        form |= {"token_budget": "1000", "budget_period": "day"}
        assert admin_client.post(url, form).status_code == 302
        key.refresh_from_db()
        assert (key.requests_per_minute, key.token_budget) == (30, 1000)
        shown = page(admin_client.get(url))
        assert "requests this minute: <strong>0</strong> of 30" in shown
        assert "tokens this day: <strong>0</strong> of 1,000" in shown

    def test_usage_the_counters_cannot_tell_is_unknown(self, admin_client, db, settings):
        key, _ = ApiKey.objects.create_key("k", token_budget=1000)
        url = reverse("admin:chatparity_apikey_change", args=[key.pk])
        # Counters in a cache that keeps nothing (also on CI's Redis pass): a budget's
        # counter is gone as soon as it is seeded.
        settings.CACHES = {"default": {"BACKEND": "django.core.cache.backends.dummy.DummyCache"}}
        settings.CHATPARITY = {**settings.CHATPARITY, "REDIS_URL": None}
        shown = page(admin_client.get(url))
        assert "usage (the counters are unavailable): unknown</div>" in shown

    def test_search_by_prefix_and_name(self, admin_client, db):
        alpha, _ = ApiKey.objects.create_key("alpha-team")
        beta, _ = ApiKey.objects.create_key("beta-team")
        url = reverse("admin:chatparity_apikey_changelist")
        by_name = admin_client.get(url, {"q": "alpha"}).context["cl"].queryset
        by_prefix = admin_client.get(url, {"q": beta.prefix}).context["cl"].queryset
        assert list(by_name) == [alpha]
        assert list(by_prefix) == [beta]


class TestBackendAdmin:
    def change(self, client, backend, **fields):
        data = {
            "name": backend.name,
            "kind": backend.kind,
            "base_url": backend.base_url,
            "options": "{}",
            "timeout": "30",
            "enabled": "on",
            **fields,
        }
        return client.post(reverse("admin:chatparity_backend_change", args=[backend.pk]), data)

    def test_secret_is_write_only(self, admin_client, db):
        backend = Backend.objects.create(
            name="up", kind="openai", base_url="http://127.0.0.1:9/v1", secret=SECRET
        )
        with connection.cursor() as cursor:
            cursor.execute("SELECT secret FROM chatparity_backend WHERE id = %s", [backend.pk])
            (stored,) = cursor.fetchone()
        assert SECRET not in stored  # encrypted at rest
        form = page(admin_client.get(reverse("admin:chatparity_backend_change", args=[backend.pk])))
        listing = admin_client.get(reverse("admin:chatparity_backend_changelist"))
        for shown in (form, page(listing)):
            assert SECRET not in shown
            assert stored not in shown
        assert 'alt="True"' in page(listing)  # the "secret" column says one is set

        assert self.change(admin_client, backend, secret="").status_code == 302
        backend.refresh_from_db()
        assert backend.secret == SECRET
        self.change(admin_client, backend, secret="new-secret")
        backend.refresh_from_db()
        assert backend.secret == "new-secret"
        self.change(admin_client, backend, clear_secret="on")
        backend.refresh_from_db()
        assert backend.secret == ""

    @pytest.mark.parametrize(
        "change", [{"base_url": "https://attacker.example/v1"}, {"kind": "local", "base_url": ""}]
    )
    def test_the_stored_secret_does_not_follow_a_new_kind_or_url_unless_entered_again(
        self, admin_client, db, change
    ):
        backend = Backend.objects.create(
            name="up", kind="openai", base_url="https://api.example.com/v1", secret=SECRET
        )
        moved = self.change(admin_client, backend, **change)
        assert moved.status_code == 200
        (error,) = moved.context["adminform"].form.errors["secret"]
        assert error.startswith("Enter the secret again")
        backend.refresh_from_db()
        assert (backend.kind, backend.base_url) == ("openai", "https://api.example.com/v1")
        assert self.change(admin_client, backend, **change, secret="sk-new").status_code == 302
        backend.refresh_from_db()
        assert backend.secret == "sk-new"

    def test_a_new_url_may_clear_the_secret_instead(self, admin_client, db):
        backend = Backend.objects.create(
            name="up", kind="openai", base_url="https://api.example.com/v1", secret=SECRET
        )
        other = "https://elsewhere.example/v1"
        cleared = self.change(admin_client, backend, base_url=other, clear_secret="on")
        assert cleared.status_code == 302
        backend.refresh_from_db()
        assert (backend.base_url, backend.secret) == (other, "")

    def test_test_connection_reports_success_and_failure(self, admin_client, scripted_alias):
        good = scripted_alias("pong", name="good").backend
        bad = scripted_alias("<error>", name="bad").backend
        response = run_action(admin_client, "backend", "test_connection", [good, bad])
        shown = messages_of(response)
        assert any(m.startswith("good: connected, answered in") for m in shown)
        assert "bad: upstream refused" in shown

    def test_test_connection_leaves_a_log_row_naming_the_admin_user(
        self, admin_client, admin_user, scripted_alias
    ):
        backend = scripted_alias("pong", name="good").backend
        run_action(admin_client, "backend", "test_connection", [backend])
        row = RequestLog.objects.get()
        assert (row.api_key, row.key_prefix, row.status_code) == (None, "admin", 200)
        assert (row.backend, row.alias, row.upstream_model) == ("good", "good", "echo")
        assert (row.prompt_tokens, row.completion_tokens, row.finish_reasons) == (1, 1, ["stop"])
        assert row.duration_ms > 0
        assert admin_user.username in row.user_agent

    def test_test_connection_tries_the_backend_itself_not_its_aliases_fallbacks(
        self, admin_client, scripted_alias
    ):
        scripted_alias("pong", name="good")
        bad = scripted_alias("<error>", name="bad")
        bad.fallbacks = ["good"]
        bad.save()
        response = run_action(admin_client, "backend", "test_connection", [bad.backend])
        assert "bad: upstream refused" in messages_of(response)
        row = RequestLog.objects.get()
        assert (row.backend, row.status_code, row.error_type) == ("bad", 502, "server_error")

    def test_test_connection_on_a_backend_without_aliases(self, admin_client, scripted_alias):
        backend = scripted_alias("pong", name="lonely").backend
        ModelAlias.objects.all().delete()
        response = run_action(admin_client, "backend", "test_connection", [backend])
        assert any(m.startswith("lonely: connected") for m in messages_of(response))
        row = RequestLog.objects.get()
        assert (row.backend, row.alias, row.status_code) == ("lonely", "", 200)

    @pytest.mark.parametrize(
        ("permissions", "runs"), [(["view_backend"], 0), (["change_backend"], 1)]
    )
    def test_test_connection_needs_the_change_permission(
        self, staff_client, scripted_alias, permissions, runs
    ):
        backend = scripted_alias("pong").backend
        response = run_action(staff_client(*permissions), "backend", "test_connection", [backend])
        assert sum(m.endswith("ms.") for m in messages_of(response)) == runs
        assert RequestLog.objects.count() == runs

    def add(self, client, **fields):
        """The add form posted with ``fields`` over a local backend's."""
        data = {"name": "new", "kind": "local", "base_url": "", "timeout": "30", **fields}
        data["options"] = json.dumps(data.get("options", {}))
        return client.post(reverse("admin:chatparity_backend_add"), data)

    @pytest.mark.parametrize(("fields", "field", "words"), BAD_BACKENDS)
    def test_a_bad_backend_is_refused_on_its_field(self, admin_client, db, fields, field, words):
        response = self.add(admin_client, **fields)
        assert response.status_code == 200
        errors = response.context["adminform"].form.errors
        assert list(errors) == [field]
        assert words in errors[field][0]
        assert not Backend.objects.exists()

    @pytest.mark.parametrize("fields", GOOD_BACKENDS)
    def test_a_good_backend_is_saved(self, admin_client, db, fields):
        assert self.add(admin_client, **fields).status_code == 302
        saved = Backend.objects.get()
        assert (saved.kind, saved.options) == (fields["kind"], fields.get("options", {}))

    def test_the_kinds_offered_are_those_configured_a_sites_own_too(
        self, admin_client, db, settings
    ):
        settings.CHATPARITY = SCRIPTED  # the site's own kind "scripted"
        form = admin_client.get(reverse("admin:chatparity_backend_add")).context["adminform"]
        offered = [kind for kind, _ in form.form.fields["kind"].choices]
        assert offered == kinds()
        assert {"local", "openai", "command", "scripted"} <= set(offered)
        response = self.add(admin_client, kind="scripted", options={"script": ["Hi"]})
        assert response.status_code == 302
        saved = Backend.objects.get()
        saved.full_clean()
        assert (saved.kind, saved.options) == ("scripted", {"script": ["Hi"]})

    def test_a_kind_not_configured_is_refused_on_its_field(self, admin_client, db):
        errors = self.add(admin_client, kind="mine").context["adminform"].form.errors
        assert list(errors) == ["kind"]
        assert not Backend.objects.exists()

    def test_a_row_of_a_kind_no_longer_configured_shows_it_and_is_refused(self, admin_client, db):
        retired = Backend.objects.create(name="retired", kind="retired")
        url = reverse("admin:chatparity_backend_change", args=[retired.pk])
        form = admin_client.get(url).context["adminform"].form
        assert form["kind"].value() == "retired"
        assert "retired" in [kind for kind, _ in form.fields["kind"].choices]
        (error,) = self.change(admin_client, retired).context["adminform"].form.errors["kind"]
        assert "'retired' is not a kind" in error


class TestModelAliasAdmin:
    def test_try_it_asks_for_a_prompt_then_shows_reply_and_timing(
        self, admin_client, scripted_alias
    ):
        alias = scripted_alias("Hel", "lo!")
        form = run_action(admin_client, "modelalias", "try_it", [alias])
        assert form.status_code == 200
        assert form.context["trials"] == []
        answered = run_action(
            admin_client, "modelalias", "try_it", [alias], prompt="Hi", max_tokens="8"
        )
        (trial,) = answered.context["trials"]
        assert (trial.ok, trial.reply, trial.finish_reason) == (True, "Hello!", "stop")
        assert trial.completion_tokens == 2
        assert trial.time_to_first_token_ms is not None
        assert trial.duration_ms >= trial.time_to_first_token_ms
        assert "Hello!" in page(answered)

    def test_try_it_shows_a_backend_failure(self, admin_client, scripted_alias):
        alias = scripted_alias("<error>")
        response = run_action(
            admin_client, "modelalias", "try_it", [alias], prompt="Hi", max_tokens="8"
        )
        (trial,) = response.context["trials"]
        assert (trial.ok, trial.error) == (False, "upstream refused")
        assert 'class="error"' in page(response)
        row = RequestLog.objects.get()
        assert (row.status_code, row.error_type, row.error_code) == (502, "server_error", "bad")

    def test_try_it_leaves_a_log_row_like_any_request(
        self, admin_client, admin_user, scripted_alias
    ):
        alias = scripted_alias("Hel", "lo!")
        answered = run_action(
            admin_client, "modelalias", "try_it", [alias], prompt="Hi", max_tokens="8"
        )
        (trial,) = answered.context["trials"]
        row = RequestLog.objects.get()
        assert (row.api_key, row.key_prefix, row.status_code) == (None, "admin", 200)
        assert (row.alias, row.backend, row.upstream_model) == ("scripted", "scripted", "echo")
        assert (row.prompt_tokens, row.completion_tokens) == (1, 2)
        assert row.completion_id.startswith("chatcmpl-")
        assert (row.duration_ms, row.time_to_first_token_ms) == (
            trial.duration_ms,
            trial.time_to_first_token_ms,
        )
        assert row.user_agent == f"chatparity admin ({admin_user.username})"

    def test_try_it_logs_its_request_as_any_request_is_logged(
        self, admin_client, scripted_alias, settings
    ):
        alias = scripted_alias("Hel", "lo!")
        settings.CHATPARITY = {**CACHED, "LOG_BODIES": True}
        run_action(admin_client, "modelalias", "try_it", [alias], prompt="Hi", max_tokens="8")
        row = RequestLog.objects.get()
        assert row.request_body == {
            "model": "scripted",
            "messages": [{"role": "user", "content": "Hi"}],
            "max_completion_tokens": 8,
        }
        assert json.loads(row.response_body)["choices"][0]["message"]["content"] == "Hello!"

    def test_try_it_passes_the_aliases_limits_as_one_more_key_and_no_keys(
        self, admin_client, scripted_alias
    ):
        alias = scripted_alias("Hi")
        alias.requests_per_minute = 1  # for each key using it
        alias.save()
        _, plaintext = ApiKey.objects.create_key("limited", requests_per_minute=1)
        trials = [
            run_action(admin_client, "modelalias", "try_it", [alias], prompt="Hi", max_tokens="8")
            for _ in range(2)
        ]
        (first,), (second,) = (trial.context["trials"] for trial in trials)
        assert first.ok
        assert not second.ok
        assert second.error.startswith("Rate limit reached for requests per minute: limit 1")
        assert v1_chat(admin_client, plaintext, "scripted")[0] == 200  # the key's one request

    def test_try_it_goes_on_to_a_fallback_as_requests_do(self, admin_client, scripted_alias):
        scripted_alias("Hello", name="spare")
        alias = scripted_alias("<error>", name="broken")
        alias.fallbacks = ["spare"]
        alias.save()
        response = run_action(
            admin_client, "modelalias", "try_it", [alias], prompt="Hi", max_tokens="8"
        )
        (trial,) = response.context["trials"]
        assert (trial.ok, trial.reply) == (True, "Hello")
        assert RequestLog.objects.get().backend == "spare"

    @pytest.mark.parametrize(
        ("permissions", "runs"), [(["view_modelalias"], 0), (["change_modelalias"], 1)]
    )
    def test_try_it_needs_the_change_permission(
        self, staff_client, scripted_alias, permissions, runs
    ):
        alias = scripted_alias("Hi")
        response = run_action(
            staff_client(*permissions), "modelalias", "try_it", [alias], prompt="Hi", max_tokens="8"
        )
        assert len(response.context.get("trials", [])) == runs
        assert RequestLog.objects.count() == runs

    def test_deleting_an_alias_narrows_the_keys_limited_to_it(self, admin_client, scripted_alias):
        only = scripted_alias("Hi", name="only")
        scripted_alias("Hi", name="other")
        key, plaintext = ApiKey.objects.create_key("scoped", all_aliases=False)
        key.allowed_aliases.add(only)
        assert v1_chat(admin_client, plaintext, "only")[0] == 200
        delete = reverse("admin:chatparity_modelalias_delete", args=[only.pk])
        assert admin_client.post(delete, {"post": "yes"}).status_code == 302
        for model in ("only", "other"):
            status, answer = v1_chat(admin_client, plaintext, model)
            assert (status, answer["error"]["code"]) == (404, "model_not_found")

    def test_try_it_on_the_local_model(self, admin_client, db):
        local = Backend.objects.create(name="local", kind="local")
        alias = ModelAlias.objects.create(public_id="smollm2", backend=local, model="SmolLM2")
        response = run_action(
            admin_client, "modelalias", "try_it", [alias], prompt="Say hi", max_tokens="4"
        )
        (trial,) = response.context["trials"]
        assert trial.ok
        assert trial.reply.strip()
        assert (trial.finish_reason, trial.completion_tokens) == ("length", 4)
        row = RequestLog.objects.get()
        assert (row.backend, row.completion_tokens, row.finish_reasons) == ("local", 4, ["length"])

    @pytest.fixture
    def anthropic_aliases(self, db):
        anthropic = Backend.objects.create(name="anthropic", kind="openai",
                                           base_url="https://api.anthropic.com/v1",
                                           options={"wire_api": "messages"})  # fmt: skip
        return [
            ModelAlias.objects.create(
                public_id=public_id, model=model, backend=anthropic, cached_input_price=9
            )
            for public_id, model in (("opus", "claude-opus-4-1"), ("mine", "my-finetune"))
        ]

    def test_fill_prices_sets_the_catalogs_and_says_so(self, admin_client, anthropic_aliases):
        response = run_action(admin_client, "modelalias", "fill_prices", anthropic_aliases)
        assert response.status_code == 302
        opus, mine = (ModelAlias.objects.get(pk=alias.pk) for alias in anthropic_aliases)
        assert [opus.input_price, opus.output_price, opus.cached_input_price,
                opus.cache_write_5m_price, opus.cache_write_1h_price] == [
            Decimal(15), Decimal(75), Decimal("1.5"), Decimal("18.75"), Decimal(30),
        ]  # fmt: skip
        assert (mine.input_price, mine.cached_input_price) == (0, 9)  # not in the catalog
        version = catalog.version()
        assert messages_of(response) == [
            "mine: the catalog does not know 'my-finetune'; prices unchanged.",
            f"opus: Prices from genai-prices {version} (anthropic/claude-opus-4-1).",
        ]
        (entry,) = LogEntry.objects.filter(object_id=str(opus.pk))
        assert (
            entry.get_change_message()
            == f"Prices from genai-prices {version} (anthropic/claude-opus-4-1)."
        )

    def test_fill_prices_says_when_a_long_context_costs_more(self, admin_client, anthropic_aliases):
        sonnet = anthropic_aliases[0]
        ModelAlias.objects.filter(pk=sonnet.pk).update(model="claude-sonnet-4-5")
        response = run_action(admin_client, "modelalias", "fill_prices", [sonnet])
        (message,) = messages_of(response)
        assert message.endswith("rise past a prompt length: the alias keeps the base ones.")
        assert ModelAlias.objects.get(pk=sonnet.pk).cache_write_1h_price == 6

    def test_fill_prices_needs_the_change_permission(self, staff_client, anthropic_aliases):
        run_action(staff_client("view_modelalias"), "modelalias", "fill_prices", anthropic_aliases)
        assert ModelAlias.objects.get(public_id="opus").input_price == 0

    def test_fill_prices_without_the_catalog_says_how_to_install_it(
        self, admin_client, anthropic_aliases, monkeypatch
    ):
        monkeypatch.setitem(sys.modules, "genai_prices", None)
        response = run_action(admin_client, "modelalias", "fill_prices", anthropic_aliases)
        (message,) = messages_of(response)
        assert "pip install 'django-chatparity[prices]'" in message
        assert ModelAlias.objects.get(public_id="opus").input_price == 0


def deployment_forms(*deployments, initial=0):
    """The deployments inline's fields: the management form's, then each deployment's
    (a dict of its fields, given ``id`` for one saved), as the admin's page posts them."""
    data = {
        "deployments-TOTAL_FORMS": str(len(deployments)),
        "deployments-INITIAL_FORMS": str(initial),
        "deployments-MIN_NUM_FORMS": "0",
        "deployments-MAX_NUM_FORMS": "1000",
    }
    for index, fields in enumerate(deployments):
        defaults = {"weight": "1", "tier": "1", "enabled": "on"}
        for name, value in {**defaults, **fields}.items():
            data[f"deployments-{index}-{name}"] = value
    return data


class TestModelAliasForm:
    """The alias form refuses what a request would refuse, on the field at fault."""

    @pytest.fixture
    def spare(self, db):
        local = Backend.objects.create(name="local", kind="local")
        return ModelAlias.objects.create(public_id="spare", backend=local)

    def add(self, client, spare, **fields):
        data = {
            "public_id": "new", "backend": spare.backend.pk, "model": "", "max_n": "",
            "enabled": "on", "listed": "on", "owned_by": "chatparity", "input_price": "0",
            "output_price": "0", "routing": "weighted", "sticky_sessions": "auto",
            **deployment_forms(),
        }  # fmt: skip
        for name in ("default_params", "fallbacks", "forwarded_params", "response_cache"):
            empty = {} if name in ("default_params", "response_cache") else []
            data[name] = json.dumps(fields.pop(name, empty))
        data.update(fields)
        return client.post(reverse("admin:chatparity_modelalias_add"), data)

    @pytest.mark.parametrize(("fields", "field", "words"), BAD_ALIASES)
    def test_a_bad_alias_is_refused_on_its_field(self, admin_client, spare, fields, field, words):
        response = self.add(admin_client, spare, **fields)
        assert response.status_code == 200
        errors = response.context["adminform"].form.errors
        assert list(errors) == [field]
        assert words in errors[field][0]
        assert not ModelAlias.objects.filter(public_id="new").exists()

    def test_a_good_alias_is_saved(self, admin_client, spare):
        assert self.add(admin_client, spare, **GOOD_ALIAS).status_code == 302
        saved = ModelAlias.objects.get(public_id="new")
        assert {name: getattr(saved, name) for name in GOOD_ALIAS} == GOOD_ALIAS

    def test_cache_prices_left_blank_are_saved_blank_and_given_ones_kept(self, admin_client, spare):
        assert self.add(admin_client, spare, cache_write_1h_price="7.5").status_code == 302
        saved = ModelAlias.objects.get(public_id="new")
        assert (saved.cached_input_price, saved.cache_write_5m_price) == (None, None)
        assert saved.cache_write_1h_price == Decimal("7.5")


class TestDeploymentInline:
    """An alias's deployments are edited on its page, each shown with its state now."""

    @pytest.fixture
    def alias(self, db, settings):
        settings.CHATPARITY = SCRIPTED
        own, other = (
            Backend.objects.create(name=name, kind="scripted") for name in ("own", "other")
        )
        alias = ModelAlias.objects.create(public_id="group", backend=own, model="m")
        Deployment.objects.create(alias=alias, backend=other, model="m2", weight=2)
        return alias

    def change(self, client, alias, *deployments, **fields):
        """Post the alias's page with its fields and ``deployments`` (the saved ones
        first, in their order, changed as given)."""
        saved = list(alias.deployments.order_by("tier", "-primary", "pk"))
        forms = []
        for index, changes in enumerate(deployments):
            row = saved[index] if index < len(saved) else None
            base = {} if row is None else {
                "id": str(row.pk), "alias": str(alias.pk), "backend": str(row.backend_id),
                "model": row.model, "weight": str(row.weight), "tier": str(row.tier),
                "enabled": "on" if row.enabled else "",
            }  # fmt: skip
            forms.append({**base, **changes})
        data = {
            "public_id": alias.public_id, "backend": str(alias.backend_id), "model": alias.model,
            "max_n": "", "enabled": "on", "listed": "on", "owned_by": "chatparity",
            "input_price": "0", "output_price": "0", "routing": "weighted",
            "sticky_sessions": "auto", "default_params": "{}", "fallbacks": "[]",
            "forwarded_params": "[]", **fields,
            **deployment_forms(*forms, initial=len(saved)),
        }  # fmt: skip
        return client.post(reverse("admin:chatparity_modelalias_change", args=[alias.pk]), data)

    def test_the_page_lists_each_deployment_with_its_state(self, admin_client, alias):
        other = alias.deployments.get(primary=False)
        async_to_sync(shared.told)(other, Outcome(failed=True, retry_after=120))
        response = admin_client.get(reverse("admin:chatparity_modelalias_change", args=[alias.pk]))
        text = page(response)
        assert "healthy; 0 in flight; first token: not measured; no errors" in text
        assert re.search(r"cooling until \d\d:\d\d:\d\d UTC \((119|120) s\)", text)
        assert "errors 100% of 1" in text

    def test_a_deployment_added_on_the_page_serves_the_alias(self, admin_client, alias):
        third = Backend.objects.create(name="third", kind="scripted")
        response = self.change(
            admin_client, alias, {}, {}, {"backend": str(third.pk), "model": "m3", "weight": "0.5",
                                          "tier": "2", "requests_per_minute": "60"},
        )  # fmt: skip
        assert response.status_code == 302, response.context["inline_admin_formsets"]
        added = alias.deployments.get(backend=third)
        assert (added.weight, added.tier, added.requests_per_minute) == (0.5, 2, 60)

    def test_its_own_deployment_follows_the_aliass_backend(self, admin_client, alias):
        other = Backend.objects.get(name="other")
        response = self.change(
            admin_client, alias, {"weight": "3"}, {}, backend=str(other.pk), model="moved"
        )
        assert response.status_code == 302
        own = alias.deployments.get(primary=True)
        assert (own.backend, own.model, own.weight) == (other, "moved", 3.0)

    @pytest.mark.parametrize(
        ("changes", "words"),
        [
            ([{"enabled": ""}, {"enabled": ""}], "No deployment is enabled with a weight above 0"),
            ([{"weight": "0"}, {"weight": "0"}], "No deployment is enabled with a weight above 0"),
            ([{}, {"tier": "3"}], "Tier 2 has no deployment"),
            ([{"DELETE": "on"}, {}], "The alias's own backend cannot be deleted here"),
        ],
    )
    def test_a_group_that_could_not_serve_is_refused_saying_what_to_change(
        self, admin_client, alias, changes, words
    ):
        response = self.change(admin_client, alias, *changes)
        assert response.status_code == 200
        (formset,) = response.context["inline_admin_formsets"]
        assert words in " ".join(formset.formset.non_form_errors())
        assert list(alias.deployments.values_list("enabled", "weight", "tier")) == [
            (True, 1.0, 1),
            (True, 2.0, 1),
        ]

    def test_a_negative_weight_is_refused_on_its_field(self, admin_client, alias):
        response = self.change(admin_client, alias, {}, {"weight": "-1"})
        (formset,) = response.context["inline_admin_formsets"]
        assert "cannot be negative" in formset.formset.forms[1].errors["weight"][0]


def exported(response) -> list[dict[str, str]]:
    """The rows of a streamed CSV export."""
    body = b"".join(response.streaming_content).decode()
    return list(csv.DictReader(io.StringIO(body, newline="")))


class TestRequestLogAdmin:
    @pytest.fixture
    def rows(self, db):
        backend = Backend.objects.create(name="scripted", kind="scripted")
        for public_id in ("a", "b"):
            ModelAlias.objects.create(public_id=public_id, backend=backend)
        return [
            logged(alias="a", stream=True, finish_reasons=["stop"], total_tokens=7,
                   at=timezone.now() - datetime.timedelta(minutes=1)),
            logged(alias="b", status_code=404, error_type="invalid_request_error",
                   endpoint="responses"),
        ]  # fmt: skip

    def test_is_read_only(self, admin_client, rows):
        assert admin_client.get(reverse("admin:chatparity_requestlog_add")).status_code == 403
        change = admin_client.get(reverse("admin:chatparity_requestlog_change", args=[rows[0].pk]))
        assert change.status_code == 200
        assert 'name="_save"' not in page(change)
        delete = reverse("admin:chatparity_requestlog_delete", args=[rows[0].pk])
        assert admin_client.post(delete, {"post": "yes"}).status_code == 403
        assert RequestLog.objects.count() == 2

    @pytest.mark.parametrize(
        ("query", "aliases"),
        [
            ({"alias": "b"}, ["b"]),
            ({"stream__exact": "1"}, ["a"]),
            ({"status": "404"}, ["b"]),
            ({"status": "200"}, ["a"]),
            ({"status": "failed"}, ["b"]),
            ({"endpoint__exact": "responses"}, ["b"]),
            ({"endpoint__exact": "chat.completions"}, ["a"]),
            ({"q": "chatcmpl-a"}, ["a"]),
            ({"q": "chatcmpl-"}, []),  # ids are looked up whole
            ({"q": "req-b"}, ["b"]),
        ],
    )
    def test_filters_and_searches(self, admin_client, rows, query, aliases):
        RequestLog.objects.filter(alias="a").update(completion_id="chatcmpl-a")
        RequestLog.objects.filter(alias="b").update(request_id="req-b")
        response = admin_client.get(reverse("admin:chatparity_requestlog_changelist"), query)
        assert [row.alias for row in response.context["cl"].queryset] == aliases

    def test_the_key_filter_lists_the_keys_and_finds_rows_of_deleted_ones(self, admin_client, db):
        kept, _ = ApiKey.objects.create_key("kept")
        gone, _ = ApiKey.objects.create_key("gone")
        logged(api_key=kept, key_prefix=kept.prefix, alias="kept")
        logged(api_key=gone, key_prefix=gone.prefix, alias="gone")
        gone.delete()
        changelist = reverse("admin:chatparity_requestlog_changelist")
        response = admin_client.get(changelist)
        assert f"kept ({kept.prefix}…)" in page(response)
        by_key = admin_client.get(changelist, {"api_key__id__exact": kept.pk})
        assert [row.alias for row in by_key.context["cl"].queryset] == ["kept"]
        keyless = admin_client.get(changelist, {"api_key__isnull": "True"})
        assert [row.alias for row in keyless.context["cl"].queryset] == ["gone"]

    def test_an_unknown_status_is_refused_as_django_refuses_a_bad_filter(self, admin_client, rows):
        changelist = reverse("admin:chatparity_requestlog_changelist")
        response = admin_client.get(changelist, {"status": "4O4"})
        assert response.status_code == 302
        assert response["Location"].endswith("?e=1")

    def test_a_page_counts_a_few_pages_ahead_and_says_there_are_more(
        self, admin_client, db, monkeypatch
    ):
        monkeypatch.setattr(RequestLogAdmin, "list_per_page", 2)
        monkeypatch.setattr(chatparity_admin, "COUNTED_PAGES_AHEAD", 1)
        for _ in range(7):
            logged()
        changelist = reverse("admin:chatparity_requestlog_changelist")
        first = admin_client.get(changelist)
        assert "More than 4 request logs" in page(first)
        assert first.context["cl"].paginator.num_pages == 2
        third = admin_client.get(changelist, {"p": "3"})
        assert "7 request logs" in page(third)  # counted to the end from here
        assert len(third.context["cl"].result_list) == 2

    def test_the_date_drilldown_offers_the_days_with_requests(self, admin_client, db):
        for day in (
            datetime.date(2025, 3, 1),
            datetime.date(2025, 3, 9),
            datetime.date(2025, 5, 2),
        ):
            logged(day, alias=day.isoformat())
        changelist = reverse("admin:chatparity_requestlog_changelist")
        year = admin_client.get(changelist)  # one year: its months, as Django opens it
        assert [c["title"] for c in year.context["cl"].date_drilldown["choices"]] == [
            "March 2025",
            "May 2025",
        ]
        march = admin_client.get(changelist, {"created_at__year": 2025, "created_at__month": 3})
        assert [c["title"] for c in march.context["cl"].date_drilldown["choices"]] == [
            "March 1",
            "March 9",
        ]
        assert "created_at__day=9" in page(march)
        ninth = {"created_at__year": 2025, "created_at__month": 3, "created_at__day": 9}
        day = admin_client.get(changelist, ninth)
        assert [row.alias for row in day.context["cl"].queryset] == ["2025-03-09"]
        assert day.context["cl"].date_drilldown["choices"] == [{"title": "March 9"}]

    @pytest.mark.parametrize(
        "query",
        [
            {},
            {"api_key__id__exact": "KEY"},
            {"alias": "gpt"},
            {"status": "failed"},
            {"status": "503"},
            {"q": "chatcmpl-7"},
            {"created_at__year": "2025", "created_at__month": "3"},
            {"created_at__year": "2025", "created_at__month": "3", "created_at__day": "9"},
            {"p": "2"},
        ],
    )
    def test_no_page_counts_or_lists_distinct_values_over_the_whole_log(
        self, admin_client, db, monkeypatch, query
    ):
        """The shape of each query a page makes of the log: a page of rows (all of them
        only when they fit one page), a count of a few pages at most, the first and last
        rows (the ends of an index); never DISTINCT; as many queries whatever it holds."""
        monkeypatch.setattr(RequestLogAdmin, "list_per_page", 5)
        backend = Backend.objects.create(name="scripted", kind="scripted")
        ModelAlias.objects.create(public_id="gpt", backend=backend)
        key, _ = ApiKey.objects.create_key("one")
        query = {name: str(key.pk) if value == "KEY" else value for name, value in query.items()}
        changelist = reverse("admin:chatparity_requestlog_changelist")

        def log(count, start=0):
            insert_rows([
                RequestLog(key_prefix=key.prefix, api_key=key if i % 2 else None,
                           alias=("gpt", "llama")[i % 2], status_code=(200, 503, 200)[i % 3],
                           completion_id=f"chatcmpl-{i}", duration_ms=1,
                           created_at=noon(datetime.date(2025, 3, 1 + i % 28)))
                for i in range(start, start + count)
            ])  # fmt: skip

        def page_of_the_log():
            with CaptureQueriesContext(connection) as queries:
                response = admin_client.get(changelist, query)
            assert response.status_code == 200
            on_log = [q["sql"].upper() for q in queries if '"CHATPARITY_REQUESTLOG"' in q["sql"]]
            return response.context["cl"], on_log

        log(12)
        _, few = page_of_the_log()
        log(600, start=12)
        cl, many = page_of_the_log()
        assert len(many) == len(few)
        assert cl.result_list  # the page shows rows
        for sql in many:
            assert "DISTINCT" not in sql
            if "COUNT(" in sql:
                assert re.search(r"LIMIT \d+\)", sql), sql  # a few pages at most
            elif "MIN(" in sql or "MAX(" in sql:
                assert "WHERE" not in sql, sql  # the two ends of the created_at index
            elif cl.multi_page:
                assert re.search(r"LIMIT \d+", sql), sql  # one page of rows

    def test_csv_export_streams_every_row_oldest_first(self, admin_client, rows, monkeypatch):
        monkeypatch.setattr(chatparity_admin, "CSV_CHUNK_ROWS", 2)
        more = [logged(alias=f"c{i}", at=rows[0].created_at - datetime.timedelta(hours=i))
                for i in range(1, 4)]  # fmt: skip
        everything = [*rows, *more]
        response = run_action(admin_client, "requestlog", "export_csv", everything)
        assert response.streaming
        assert response["Content-Type"] == "text/csv; charset=utf-8"
        chunks = list(response.streaming_content)
        assert len(chunks) == 1 + 3  # the header, then two rows a chunk
        table = list(csv.DictReader(io.StringIO(b"".join(chunks).decode(), newline="")))
        assert [r["alias"] for r in table] == ["c3", "c2", "c1", "a", "b"]
        assert [
            (r["endpoint"], r["alias"], r["status_code"], r["finish_reasons"]) for r in table[3:]
        ] == [
            ("chat.completions", "a", "200", "stop"),
            ("responses", "b", "404", ""),
        ]
        assert table[3]["total_tokens"] == "7"

    def test_csv_export_has_the_cache_reads_writes_and_cost_of_each_row(self, admin_client, db):
        row = logged(prompt_tokens=1000, cached_tokens=600, cache_write_5m_tokens=100,
                     cache_write_1h_tokens=200, cost=Decimal("0.00412345"))  # fmt: skip
        (exported_row,) = exported(run_action(admin_client, "requestlog", "export_csv", [row]))
        assert [exported_row[name] for name in ("prompt_tokens", "cached_tokens",
                "cache_write_5m_tokens", "cache_write_1h_tokens", "cost")] == [
            "1000", "600", "100", "200", "0.00412345",
        ]  # fmt: skip

    @pytest.mark.parametrize("endpoint", ["messages", "embeddings"])
    def test_messages_and_embeddings_rows_are_filtered_and_exported_by_their_endpoint(
        self, admin_client, rows, endpoint
    ):
        other = logged(alias="other", endpoint=endpoint)
        url = reverse("admin:chatparity_requestlog_changelist")
        listed = admin_client.get(url, {"endpoint__exact": endpoint})
        assert [row.pk for row in listed.context["cl"].result_list] == [other.pk]
        response = run_action(admin_client, "requestlog", "export_csv", [*rows, other])
        assert [(r["alias"], r["endpoint"]) for r in exported(response)][-1] == (
            "other",
            endpoint,
        )

    def test_csv_export_under_asgi_sends_each_chunk_as_it_is_read(
        self, admin_user, rows, monkeypatch
    ):
        monkeypatch.setattr(chatparity_admin, "CSV_CHUNK_ROWS", 1)
        url = reverse("admin:chatparity_requestlog_changelist")

        async def export():
            client = AsyncClient()
            await client.aforce_login(admin_user)
            response = await client.post(
                url, {"action": "export_csv", ACTION: [row.pk for row in rows]}
            )
            return response.is_async, [chunk async for chunk in response.streaming_content]

        is_async, chunks = async_to_sync(export)()
        assert is_async
        assert len(chunks) == 1 + 2
        assert b"invalid_request_error" in chunks[-1]

    @pytest.mark.parametrize(
        "user_agent",
        ['=HYPERLINK("http://x","y")', "+1+1", "-2+3", "@SUM(A1)", "\t=1", "\r=1"],
    )
    def test_csv_cells_a_spreadsheet_would_run_as_formulas_are_escaped(
        self, admin_client, db, user_agent
    ):
        row = logged(request_id="req", alias="=1+1", user_agent=user_agent)
        (row_exported,) = exported(run_action(admin_client, "requestlog", "export_csv", [row]))
        assert (row_exported["user_agent"], row_exported["alias"]) == ("'" + user_agent, "'=1+1")
        assert row_exported["request_id"] == "req"

    @pytest.mark.parametrize(
        ("first_token", "duration", "shown"),
        [
            (0.4321, 8.2449, ["0.4 ms", "8.2 ms"]),
            (245.3333, 1681.2, ["245 ms", "1.68 s"]),
            (None, 99.95, ["—", "100 ms"]),
            (9.96, 999.6, ["10 ms", "1.00 s"]),  # no "10.0 ms", no "1000 ms"
            (9_999.4, 12_034.5678, ["10.0 s", "12.0 s"]),
            (99_960.0, 1_234_567.0, ["100 s", "1,235 s"]),
        ],
    )
    def test_latencies_are_shown_to_a_sensible_precision(
        self, admin_client, db, first_token, duration, shown
    ):
        row = logged(time_to_first_token_ms=first_token, duration_ms=duration)
        listed = page(admin_client.get(reverse("admin:chatparity_requestlog_changelist")))
        detail = admin_client.get(reverse("admin:chatparity_requestlog_change", args=[row.pk]))
        for text in (listed, page(detail)):
            assert all(f">{latency}<" in text for latency in shown), shown
            assert str(duration) not in text

    def test_the_list_is_seven_columns_and_the_rows_page_every_field(self, admin_client, rows):
        response = admin_client.get(reverse("admin:chatparity_requestlog_changelist"))
        assert response.context["cl"].list_display == [
            "action_checkbox", "time", "key", "served", "outcome", "tokens", "first_token",
            "duration",
        ]  # fmt: skip
        detail = page(
            admin_client.get(reverse("admin:chatparity_requestlog_change", args=[rows[1].pk]))
        )
        for field in ("request_id", "backend", "upstream_model", "cached_tokens", "user_agent"):
            assert f"field-{field}" in detail, field

    def test_each_row_says_when_who_what_how_it_ended_its_tokens_and_latencies(
        self, admin_client, db
    ):
        earlier = timezone.now() - datetime.timedelta(days=2)
        rows = [
            logged(alias="gpt-4o-mini", endpoint="responses", stream=True, key_prefix="sk-cp-AbCd",
                   prompt_tokens=12_345, completion_tokens=678, finish_reasons=["stop", "length"],
                   time_to_first_token_ms=245.3, duration_ms=1681.2),
            logged(alias="smollm2", status_code=429, error_type="rate_limit_exceeded",
                   error_code="rate_limit_exceeded", at=earlier),
            logged(alias="smollm2", endpoint="messages", cancelled=True),
        ]  # fmt: skip
        html = page(admin_client.get(reverse("admin:chatparity_requestlog_changelist")))
        cells = [
            '<td class="field-key">sk-cp-AbCd</td>',
            '<td class="field-served">gpt-4o-mini<div class="chatparity-muted">responses · stream'
            "</div></td>",
            '<td class="field-outcome">200 stop, length</td>',
            '<td class="field-tokens">12,345 → 678</td>',
            '<td class="field-first_token">245 ms</td><td class="field-duration">1.68 s</td>',
            '<td class="field-outcome">429 <span title="rate_limit_exceeded">rate_<wbr>limit_<wbr>'
            "exceeded</span></td>",
            f'<div class="chatparity-muted">{timezone.localtime(earlier):%m-%d}</div></a></th>',
            '<td class="field-served">smollm2<div class="chatparity-muted">messages</div></td>',
            '<td class="field-outcome">200 cancelled</td>',
            f'<input type="checkbox" name="{ACTION}" value="{rows[0].pk}" class="action-select"',
        ]
        for cell in cells:
            assert cell in html, cell

    def test_the_status_says_what_the_response_cache_did(self, admin_client, db):
        logged(alias="hit", cache="semantic", finish_reasons=["stop"])
        logged(alias="none", finish_reasons=["stop"])
        html = page(admin_client.get(reverse("admin:chatparity_requestlog_changelist")))
        assert (
            '<td class="field-outcome">200 stop<div class="chatparity-muted">cache semantic hit'
            "</div></td>" in html
        )
        assert '<td class="field-outcome">200 stop</td>' in html

    def test_a_rows_link_keeps_the_lists_filters(self, admin_client, rows):
        changelist = reverse("admin:chatparity_requestlog_changelist")
        html = page(admin_client.get(changelist, {"alias": "b"}))
        change = reverse("admin:chatparity_requestlog_change", args=[rows[1].pk])
        assert f'<a href="{change}?_changelist_filters=alias%3Db">' in html

    def test_what_clients_and_upstreams_wrote_is_escaped(self, admin_client, db):
        evil = '<script>alert("x")</script>'
        logged(alias=evil, request_id=evil, key_prefix=evil, error_type=evil, error_code=evil,
               status_code=502, endpoint=evil)  # fmt: skip
        logged(alias="a", finish_reasons=[evil])
        html = page(admin_client.get(reverse("admin:chatparity_requestlog_changelist")))
        assert "<script>" not in html
        assert html.count("&lt;script&gt;alert(&quot;x&quot;)&lt;/script&gt;") >= 6

    def test_a_page_of_rows_reads_no_bodies(self, admin_client, db):
        logged(request_body={"messages": ["x" * 1000]}, response_body="y" * 1000)
        with CaptureQueriesContext(connection) as queries:
            response = admin_client.get(reverse("admin:chatparity_requestlog_changelist"))
        assert len(response.context["cl"].result_list) == 1
        assert not [q["sql"] for q in queries if "body" in q["sql"]]

    def test_the_list_says_which_endpoint_each_row_served(self, admin_client, rows):
        response = admin_client.get(reverse("admin:chatparity_requestlog_changelist"))
        assert '<div class="chatparity-muted">responses</div>' in page(response)
        assert '<div class="chatparity-muted">chat · stream</div>' in page(response)


class TestStoredResponseAdmin:
    """Stored responses of /v1/responses: read-only for staff, deleted only with the
    delete permission."""

    @pytest.fixture
    def stored(self, db, django_user_model):
        key, _ = ApiKey.objects.create_key("codex")
        owner = django_user_model.objects.create_user("ada")
        answer = {
            "id": "resp_abc123", "object": "response", "status": "completed",
            "output": [{"type": "message", "content": [
                {"type": "output_text", "text": "<script>alert(1)</script>", "annotations": []},
            ]}],
        }  # fmt: skip
        return [
            StoredResponse.objects.create(
                id="resp_abc123", api_key=key, owner=owner, model="smollm2", status="completed",
                input_items=[{"type": "message", "role": "user", "content": "<b>hi</b>"}],
                response=answer,
            ),
            StoredResponse.objects.create(
                id="resp_def456", model="gpt-x", status="incomplete", response={},
                previous_response_id="resp_abc123",
            ),
        ]  # fmt: skip

    def test_the_list_shows_id_key_owner_model_status_and_time(self, admin_client, stored):
        response = admin_client.get(reverse("admin:chatparity_storedresponse_changelist"))
        assert response.context["cl"].list_display == [
            "action_checkbox", "id", "key", "owner", "model", "status", "created_at",
        ]  # fmt: skip
        shown = page(response)
        assert f"codex ({stored[0].api_key.prefix}…)" in shown
        assert "(deleted key)" in shown
        for text in ("resp_abc123", "resp_def456", "ada", "smollm2", "incomplete"):
            assert text in shown

    @pytest.mark.parametrize(
        ("query", "found"),
        [("resp_def456", ["resp_def456"]), ("resp_abc123", ["resp_abc123", "resp_def456"]),
         ("resp_abc", [])],
    )  # fmt: skip
    def test_search_by_id_or_the_previous_response_id(self, admin_client, stored, query, found):
        url = reverse("admin:chatparity_storedresponse_changelist")
        listed = admin_client.get(url, {"q": query}).context["cl"].queryset
        assert sorted(row.id for row in listed) == found

    def test_the_response_and_its_input_are_shown_escaped_and_indented(self, admin_client, stored):
        url = reverse("admin:chatparity_storedresponse_change", args=[stored[0].pk])
        shown = page(admin_client.get(url))
        assert "<script>alert(1)</script>" not in shown
        assert "&lt;script&gt;alert(1)&lt;/script&gt;" in shown
        assert "&lt;b&gt;hi&lt;/b&gt;" in shown
        assert "\n  &quot;object&quot;: &quot;response&quot;" in shown
        assert "<textarea" not in shown
        assert 'name="_save"' not in shown

    def test_nobody_adds_or_changes_one(self, admin_client, stored):
        assert admin_client.get(reverse("admin:chatparity_storedresponse_add")).status_code == 403
        change = reverse("admin:chatparity_storedresponse_change", args=[stored[0].pk])
        admin_client.post(change, {"model": "other", "status": "failed", "response": "{}"})
        stored[0].refresh_from_db()
        assert (stored[0].model, stored[0].status) == ("smollm2", "completed")

    @pytest.mark.parametrize(
        ("permissions", "kept"),
        [
            (["view_storedresponse"], True),
            (["view_storedresponse", "delete_storedresponse"], False),
        ],
    )
    def test_deleting_needs_the_delete_permission(self, staff_client, stored, permissions, kept):
        staff = staff_client(*permissions)
        url = reverse("admin:chatparity_storedresponse_changelist")
        assert staff.get(url).status_code == 200
        delete = reverse("admin:chatparity_storedresponse_delete", args=[stored[0].pk])
        staff.post(delete, {"post": "yes"})
        run_action(staff, "storedresponse", "delete_selected", [stored[1]], post="yes")
        assert StoredResponse.objects.filter(pk__in=[s.pk for s in stored]).count() == (
            2 if kept else 0
        )

    def test_without_the_view_permission_staff_see_none(self, staff_client, stored):
        staff = staff_client("view_requestlog")
        for url in (
            reverse("admin:chatparity_storedresponse_changelist"),
            reverse("admin:chatparity_storedresponse_change", args=[stored[0].pk]),
        ):
            assert staff.get(url).status_code == 403


@override_settings(CHATPARITY=SCRIPTED)
def test_non_staff_cannot_open_the_admin(client, django_user_model):
    user = django_user_model.objects.create_user("u", password="p")
    client.force_login(user)
    response = client.get(reverse("admin:chatparity_apikey_changelist"))
    assert response.status_code == 302
    assert "/login/" in response["Location"]


class TestNarrowStaff:
    """Staff see and do in the admin only what their model permissions allow."""

    def test_without_permissions_nothing_of_chatparity_opens(self, staff_client, db):
        editor = staff_client()
        for model in ("apikey", "backend", "modelalias", "requestlog"):
            assert editor.get(reverse(f"admin:chatparity_{model}_changelist")).status_code == 403

    def test_view_permission_alone_shows_but_does_not_change(self, staff_client, db):
        backend = Backend.objects.create(name="up", kind="openai", secret=SECRET)
        viewer = staff_client("view_backend")
        assert viewer.get(reverse("admin:chatparity_backend_changelist")).status_code == 200
        assert viewer.get(reverse("admin:chatparity_backend_add")).status_code == 403
        change = reverse("admin:chatparity_backend_change", args=[backend.pk])
        assert viewer.post(change, {"name": "renamed", "kind": "command"}).status_code == 403
        backend.refresh_from_db()
        assert (backend.name, backend.kind) == ("up", "openai")
        assert viewer.get(reverse("admin:chatparity_apikey_changelist")).status_code == 403

    def test_a_key_for_another_user_needs_the_permission_to_issue_keys_for_others(
        self, staff_client, django_user_model
    ):
        # Security round 3: `add` on keys minted a key for any owner, whose key reads
        # that owner's stored responses.
        victim = django_user_model.objects.create_user("victim")
        editor = staff_client("add_apikey", "change_apikey", "view_apikey")
        form = {"name": "x", "is_active": "on", "all_aliases": "on", "budget_period": "month"}
        add = reverse("admin:chatparity_apikey_add")
        refused = editor.post(add, {**form, "owner": victim.pk})
        assert refused.status_code == 200  # the form again, with the error on the owner
        assert "issue keys for other users" in str(refused.context["adminform"].form.errors)
        assert not ApiKey.objects.exists()
        editor_user = refused.wsgi_request.user
        assert "plaintext" in editor.post(add, {**form, "owner": editor_user.pk}).context
        key = ApiKey.objects.get()
        change = reverse("admin:chatparity_apikey_change", args=[key.pk])
        assert editor.post(change, {**form, "owner": victim.pk}).status_code == 200
        key.refresh_from_db()
        assert key.owner_id == editor_user.pk
        editor_user.user_permissions.add(Permission.objects.get(codename="issue_key_for_others"))
        assert editor.post(change, {**form, "owner": victim.pk}).status_code == 302
        key.refresh_from_db()
        assert key.owner_id == victim.pk
