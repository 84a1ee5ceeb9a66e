"""keys/: the plaintext is returned once, at creation, and never again."""

import hashlib

import pytest

from chatparity.models import ApiKey

from .helpers import url

pytestmark = pytest.mark.django_db

FIELDS = {
    "id", "name", "prefix", "owner", "is_active", "expires_at", "needs_plan", "all_aliases",
    "allowed_aliases",
    "requests_per_minute", "tokens_per_minute", "max_concurrent", "token_budget",
    "cost_budget", "budget_period", "created_at", "last_used_at",
}  # fmt: skip


def create(client, **body):
    response = client.post(url("key-list"), body, content_type="application/json")
    assert response.status_code == 201, response.content
    return response.json()


def test_create_returns_the_plaintext_whose_sha256_is_stored(admin_client):
    created = create(admin_client, name="ci")
    assert set(created) == FIELDS | {"key"}
    key = ApiKey.objects.get(pk=created["id"])
    assert hashlib.sha256(created["key"].encode()).hexdigest() == key.hashed_key
    assert created["key"].startswith(created["prefix"])
    assert (created["name"], created["is_active"], key.prefix) == ("ci", True, created["prefix"])
    assert (created["all_aliases"], created["allowed_aliases"], key.all_aliases) == (True, [], True)


def test_limits_and_budgets_are_set_through_the_api(admin_client):
    created = create(admin_client, name="ci", requests_per_minute=60, cost_budget="12.5")
    response = admin_client.patch(
        url("key-detail", created["id"]),
        {"tokens_per_minute": 1000, "budget_period": "day"},
        content_type="application/json",
    )
    assert response.status_code == 200
    key = ApiKey.objects.get(pk=created["id"])
    assert (key.requests_per_minute, key.tokens_per_minute, key.budget_period) == (60, 1000, "day")
    assert str(key.cost_budget) == "12.5000"


def test_no_later_response_shows_the_plaintext_or_its_hash(admin_client):
    created = create(admin_client, name="ci")
    plaintext, pk = created["key"], created["id"]
    hashed = ApiKey.objects.get(pk=pk).hashed_key
    json = "application/json"
    responses = [
        admin_client.get(url("key-list")),
        admin_client.get(url("key-detail", pk)),
        admin_client.put(url("key-detail", pk), {"name": "renamed"}, content_type=json),
        admin_client.patch(url("key-detail", pk), {"is_active": False}, content_type=json),
        admin_client.post(url("key-revoke", pk)),
        admin_client.post(url("key-reactivate", pk)),
    ]
    for response in responses:
        assert response.status_code == 200
        body = response.content.decode()
        assert plaintext not in body
        assert hashed not in body
        assert "hashed_key" not in body
    assert set(responses[1].json()) == FIELDS


def test_update_changes_writable_fields_and_ignores_read_only_ones(admin_client, admin_user):
    pk = create(admin_client, name="ci")["id"]
    before = ApiKey.objects.get(pk=pk)
    response = admin_client.patch(
        url("key-detail", pk),
        {
            "name": "renamed",
            "owner": admin_user.pk,
            "expires_at": "2030-01-01T00:00:00Z",
            "prefix": "sk-cp-XXXX",
            "last_used_at": "2030-01-01T00:00:00Z",
        },
        content_type="application/json",
    )
    assert response.status_code == 200
    key = ApiKey.objects.get(pk=pk)
    assert (key.name, key.owner, key.expires_at.year) == ("renamed", admin_user, 2030)
    assert (key.prefix, key.hashed_key) == (before.prefix, before.hashed_key)
    assert key.last_used_at is None
    assert response.json()["owner"] == admin_user.pk


def test_revoke_and_reactivate_toggle_is_active(admin_client):
    pk = create(admin_client, name="ci")["id"]
    revoked = admin_client.post(url("key-revoke", pk))
    assert revoked.json()["is_active"] is False
    assert ApiKey.objects.get(pk=pk).is_active is False
    reactivated = admin_client.post(url("key-reactivate", pk))
    assert reactivated.json()["is_active"] is True
    assert ApiKey.objects.get(pk=pk).is_active is True


def test_a_key_revoked_through_the_api_is_refused_on_the_next_request(admin_client, settings):
    settings.CHATPARITY = {"CACHE_SECONDS": 3600}
    created = create(admin_client, name="ci")
    bearer = {"Authorization": f"Bearer {created['key']}"}
    assert admin_client.get("/v1/models", headers=bearer).status_code == 200  # cached now
    admin_client.post(url("key-revoke", created["id"]))
    assert admin_client.get("/v1/models", headers=bearer).status_code == 401


def test_revoking_an_unknown_key_is_404(admin_client):
    assert admin_client.post(url("key-revoke", 999)).status_code == 404


def test_a_key_scoped_to_aliases_round_trips(admin_client, alias, backend):
    other = alias.__class__.objects.create(public_id="other", backend=backend)
    created = create(
        admin_client, name="scoped", all_aliases=False, allowed_aliases=["SmolLM2", "other"]
    )
    assert sorted(created["allowed_aliases"]) == ["other", "smollm2"]
    key = ApiKey.objects.get(pk=created["id"])
    assert (key.all_aliases, set(key.allowed_aliases.all())) == (False, {alias, other})
    assert sorted(admin_client.get(url("key-detail", key.pk)).json()["allowed_aliases"]) == [
        "other", "smollm2",
    ]  # fmt: skip
    cleared = admin_client.patch(
        url("key-detail", key.pk), {"allowed_aliases": []}, content_type="application/json"
    )
    assert (cleared.json()["all_aliases"], cleared.json()["allowed_aliases"]) == (False, [])
    assert not key.allowed_aliases.exists()  # a key for no alias, not for all of them


@pytest.mark.parametrize(
    "body",
    [
        {"allowed_aliases": ["smollm2"]},  # how a key was limited before all_aliases
        {"all_aliases": True, "allowed_aliases": ["smollm2"]},
    ],
)
def test_aliases_named_for_a_key_for_every_alias_are_a_400(admin_client, alias, body):
    response = admin_client.post(
        url("key-list"), {"name": "x", **body}, content_type="application/json"
    )
    assert response.status_code == 400
    assert "all_aliases" in response.json()["allowed_aliases"][0]
    assert not ApiKey.objects.exists()


def test_a_scoped_key_can_be_opened_to_every_alias(admin_client, alias):
    key, _ = ApiKey.objects.create_key("scoped", all_aliases=False)
    key.allowed_aliases.add(alias)
    json = "application/json"
    named = admin_client.patch(
        url("key-detail", key.pk), {"all_aliases": True, "allowed_aliases": ["smollm2"]},
        content_type=json,
    )  # fmt: skip
    assert named.status_code == 400
    opened = admin_client.patch(
        url("key-detail", key.pk), {"all_aliases": True, "allowed_aliases": []}, content_type=json
    )
    assert opened.status_code == 200
    key.refresh_from_db()
    assert (key.all_aliases, list(key.allowed_aliases.all())) == (True, [])


def test_a_scoped_key_opened_to_every_alias_keeps_no_selection(admin_client, alias):
    key, _ = ApiKey.objects.create_key("scoped", all_aliases=False)
    key.allowed_aliases.add(alias)
    opened = admin_client.patch(
        url("key-detail", key.pk), {"all_aliases": True}, content_type="application/json"
    )
    assert (opened.json()["all_aliases"], opened.json()["allowed_aliases"]) == (True, [])
    assert not key.allowed_aliases.exists()


def test_an_unknown_alias_is_a_400(admin_client, alias):
    response = admin_client.post(
        url("key-list"), {"name": "x", "allowed_aliases": ["nope"]}, content_type="application/json"
    )
    assert response.status_code == 400
    assert "allowed_aliases" in response.json()
    assert not ApiKey.objects.exists()


def test_search_matches_name_and_prefix(admin_client):
    ci = create(admin_client, name="ci-runner")
    create(admin_client, name="laptop")
    by_name = admin_client.get(url("key-list"), {"search": "runner"}).json()
    by_prefix = admin_client.get(url("key-list"), {"search": ci["prefix"]}).json()
    assert [key["id"] for key in by_name] == [ci["id"]]
    assert ci["id"] in [key["id"] for key in by_prefix]


def test_delete(admin_client):
    pk = create(admin_client, name="ci")["id"]
    assert admin_client.delete(url("key-detail", pk)).status_code == 204
    assert not ApiKey.objects.filter(pk=pk).exists()
