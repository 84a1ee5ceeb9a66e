"""aliases/: CRUD, the backend named by its name, public ids unique case-insensitively;
bad defaults, fallbacks, forwarded parameters or max_n are a 400 on their field."""

import sys

import pytest

from chatparity.models import ApiKey, Backend, ModelAlias
from tests.configs import BAD_ALIASES, GOOD_ALIAS

from .helpers import url

pytestmark = pytest.mark.django_db
JSON = "application/json"


def test_create_names_the_backend(admin_client, backend):
    response = admin_client.post(
        url("alias-list"),
        {"public_id": "gpt-4o", "backend": "local", "default_params": {"max_tokens": 5}},
        content_type=JSON,
    )
    assert response.status_code == 201, response.content
    alias = ModelAlias.objects.get(public_id="gpt-4o")
    assert (alias.backend, alias.default_params) == (backend, {"max_tokens": 5})
    assert response.json()["backend"] == "local"


def test_unknown_backend_is_a_400(admin_client, backend):
    response = admin_client.post(
        url("alias-list"), {"public_id": "x", "backend": "nope"}, content_type=JSON
    )
    assert response.status_code == 400
    assert "backend" in response.json()


def test_public_id_taken_in_another_case_is_a_400_not_an_integrity_error(admin_client, alias):
    response = admin_client.post(
        url("alias-list"), {"public_id": "SmolLM2", "backend": "local"}, content_type=JSON
    )
    assert response.status_code == 400
    assert "already exists" in response.json()["public_id"][0]
    assert ModelAlias.objects.count() == 1


def test_renaming_onto_another_alias_is_a_400_but_recasing_itself_is_fine(
    admin_client, alias, backend
):
    other = ModelAlias.objects.create(public_id="other", backend=backend)
    clash = admin_client.patch(
        url("alias-detail", other.pk), {"public_id": "SMOLLM2"}, content_type=JSON
    )
    assert clash.status_code == 400
    recased = admin_client.patch(
        url("alias-detail", alias.pk), {"public_id": "SmolLM2"}, content_type=JSON
    )
    assert recased.status_code == 200
    alias.refresh_from_db()
    assert alias.public_id == "SmolLM2"


def test_list_retrieve_update_delete(admin_client, alias):
    assert [row["public_id"] for row in admin_client.get(url("alias-list")).json()] == ["smollm2"]
    detail = admin_client.get(url("alias-detail", alias.pk)).json()
    assert (detail["model"], detail["backend"]) == ("SmolLM2", "local")
    body = {**detail, "model": "SmolLM2-135M", "listed": False}
    updated = admin_client.put(url("alias-detail", alias.pk), body, content_type=JSON)
    assert updated.status_code == 200
    alias.refresh_from_db()
    assert (alias.model, alias.listed) == ("SmolLM2-135M", False)
    assert admin_client.delete(url("alias-detail", alias.pk)).status_code == 204
    assert not ModelAlias.objects.exists()


def v1_chat(client, plaintext, model):
    response = client.post(
        "/v1/chat/completions",
        {"model": model, "messages": [{"role": "user", "content": "Hi"}]},
        content_type=JSON,
        headers={"Authorization": f"Bearer {plaintext}"},
    )
    return response.status_code, response.json()


def test_deleting_an_alias_narrows_the_keys_limited_to_it_never_widens_them(
    admin_client, alias, backend, settings
):
    settings.CHATPARITY = {"CACHE_SECONDS": 3600}
    ModelAlias.objects.create(public_id="other", backend=backend)
    key, plaintext = ApiKey.objects.create_key("scoped", all_aliases=False)
    key.allowed_aliases.add(alias)
    models = admin_client.get("/v1/models", headers={"Authorization": f"Bearer {plaintext}"})
    assert [model["id"] for model in models.json()["data"]] == ["smollm2"]  # now cached

    assert admin_client.delete(url("alias-detail", alias.pk)).status_code == 204
    key.refresh_from_db()
    assert (key.all_aliases, list(key.allowed_aliases.all())) == (False, [])
    for model in ("smollm2", "other"):
        status, answer = v1_chat(admin_client, plaintext, model)
        assert (status, answer["error"]["code"]) == (404, "model_not_found")


@pytest.fixture
def spare(backend):
    return ModelAlias.objects.create(public_id="spare", backend=backend)


@pytest.mark.parametrize(("fields", "field", "words"), BAD_ALIASES)
def test_a_bad_alias_is_a_400_on_its_field(admin_client, spare, fields, field, words):
    body = {"public_id": "new", "backend": "local", **fields}
    response = admin_client.post(url("alias-list"), body, content_type=JSON)
    assert response.status_code == 400
    assert list(response.json()) == [field]
    assert words in response.json()[field][0]
    assert not ModelAlias.objects.filter(public_id="new").exists()


def test_a_good_alias_is_saved_with_what_it_forwards_and_its_max_n(admin_client, spare):
    body = {"public_id": "new", "backend": "local", **GOOD_ALIAS}
    response = admin_client.post(url("alias-list"), body, content_type=JSON)
    assert response.status_code == 201, response.content
    assert {name: response.json()[name] for name in GOOD_ALIAS} == GOOD_ALIAS
    saved = ModelAlias.objects.get(public_id="new")
    assert {name: getattr(saved, name) for name in GOOD_ALIAS} == GOOD_ALIAS


def test_an_update_is_checked_as_the_row_it_makes(admin_client, alias, spare):
    change = admin_client.patch(
        url("alias-detail", alias.pk), {"public_id": "spare-2"}, content_type=JSON
    )
    assert change.status_code == 200
    itself = admin_client.patch(
        url("alias-detail", alias.pk), {"fallbacks": ["Spare-2"]}, content_type=JSON
    )
    assert itself.status_code == 400
    assert "cannot fall back to itself" in itself.json()["fallbacks"][0]
    alias.refresh_from_db()
    assert alias.fallbacks == []


def test_fill_prices_sets_the_catalogs_for_the_upstream_model(admin_client, backend):
    anthropic = Backend.objects.create(name="anthropic", kind="openai",
                                       base_url="https://api.anthropic.com/v1",
                                       options={"wire_api": "messages"})  # fmt: skip
    opus = ModelAlias.objects.create(public_id="opus", model="claude-opus-4-1", backend=anthropic)
    response = admin_client.post(url("alias-fill-prices", opus.pk))
    assert response.status_code == 200, response.content
    prices = ("input_price", "output_price", "cached_input_price", "cache_write_5m_price",
              "cache_write_1h_price")  # fmt: skip
    filled = ["15.000000", "75.000000", "1.500000", "18.750000", "30.000000"]
    assert [response.json()[name] for name in prices] == filled
    opus.refresh_from_db()
    assert [str(getattr(opus, name)) for name in prices] == filled


def test_fill_prices_of_a_model_the_catalog_does_not_know_is_a_400(admin_client, alias):
    response = admin_client.post(url("alias-fill-prices", alias.pk))
    assert response.status_code == 400
    assert response.json() == {"model": ["The catalog does not know 'SmolLM2'."]}


def test_fill_prices_without_the_catalog_is_a_501(admin_client, alias, monkeypatch):
    monkeypatch.setitem(sys.modules, "genai_prices", None)
    response = admin_client.post(url("alias-fill-prices", alias.pk))
    assert response.status_code == 501
    assert "django-chatparity[prices]" in response.json()["detail"]


def test_cache_prices_are_read_and_written_blank_by_default(admin_client, alias):
    detail = admin_client.get(url("alias-detail", alias.pk)).json()
    assert (detail["cached_input_price"], detail["cache_write_1h_price"]) == (None, None)
    body = {"cache_write_5m_price": "3.75"}
    assert (
        admin_client.patch(url("alias-detail", alias.pk), body, content_type=JSON).json()[
            "cache_write_5m_price"
        ]
        == "3.750000"
    )
