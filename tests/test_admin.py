"""The admin for keys, backends, aliases and the request log, with Django's test client."""

import csv
import io

import pytest
from django.contrib.sessions.models import Session
from django.test import override_settings
from django.urls import reverse

from chatparity.models import ApiKey, Backend, ModelAlias, RequestLog, hash_key
from tests.scripted import SCRIPTED

ACTION = "_selected_action"
SECRET = "sk-upstream-secret-4242"


def run_action(client, model, action, objects, **extra):
    url = reverse(f"admin:chatparity_{model}_changelist")
    return client.post(url, {"action": action, ACTION: [o.pk for o in objects], **extra})


def page(response) -> str:
    return response.content.decode()


@pytest.fixture
def scripted_alias(db, settings):
    settings.CHATPARITY = SCRIPTED

    def make(*script, name="scripted"):
        backend = Backend.objects.create(name=name, kind="scripted", options={"script": script})
        return ModelAlias.objects.create(public_id=name, backend=backend, model="echo")

    return make


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
        assert "tokens this day: <strong>0</strong> of 1000" in shown

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
        form = page(admin_client.get(reverse("admin:chatparity_backend_change", args=[backend.pk])))
        assert SECRET not in form
        listing = admin_client.get(reverse("admin:chatparity_backend_changelist"))
        assert SECRET not in page(listing)
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

    def test_test_connection_reports_success_and_failure(self, admin_client, scripted_alias):
        good = scripted_alias("pong", name="good").backend
        bad = scripted_alias("<error>", name="bad").backend
        response = run_action(admin_client, "backend", "test_connection", [good, bad])
        shown = [str(m) for m in response.wsgi_request._messages]
        assert any(m.startswith("good: connected, answered in") for m in shown)
        assert "bad: upstream refused" in shown


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
        assert RequestLog.objects.count() == 0  # admin trials are not API requests


class TestRequestLogAdmin:
    @pytest.fixture
    def rows(self, db):
        def row(**fields):
            defaults = {"request_id": "req", "key_prefix": "sk-cp-abcd", "status_code": 200}
            return RequestLog.objects.create(**{**defaults, "duration_ms": 5.0, **fields})

        return [
            row(alias="a", stream=True, finish_reasons=["stop"], total_tokens=7),
            row(alias="b", status_code=404, error_type="invalid_request_error"),
        ]

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
        [({"alias": "b"}, ["b"]), ({"stream__exact": "1"}, ["a"]), ({"status_code": "404"}, ["b"])],
    )
    def test_filters(self, admin_client, rows, query, aliases):
        response = admin_client.get(reverse("admin:chatparity_requestlog_changelist"), query)
        assert [row.alias for row in response.context["cl"].queryset] == aliases

    def test_csv_export(self, admin_client, rows):
        response = run_action(admin_client, "requestlog", "export_csv", rows)
        assert response["Content-Type"] == "text/csv; charset=utf-8"
        table = list(csv.DictReader(io.StringIO(response.content.decode())))
        assert [(r["alias"], r["status_code"], r["finish_reasons"]) for r in table] == [
            ("a", "200", "stop"),
            ("b", "404", ""),
        ]
        assert table[0]["total_tokens"] == "7"


@override_settings(CHATPARITY=SCRIPTED)
def test_non_staff_cannot_open_the_admin(client, django_user_model):
    user = django_user_model.objects.create_user("u", password="p")
    client.force_login(user)
    response = client.get(reverse("admin:chatparity_apikey_changelist"))
    assert response.status_code == 302
    assert "/login/" in response["Location"]
