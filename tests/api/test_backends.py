"""backends/: the secret is write-only, kept when omitted, and reported only as has_secret;
a bad kind, base URL, option or timeout is a 400 on its field; the kinds are those
configured, a site's own too."""

import pytest
from django.db import connection

from chatparity.kinds import kinds
from chatparity.models import Backend
from tests.configs import BAD_BACKENDS, GOOD_BACKENDS
from tests.scripted import SCRIPTED

from .helpers import url

pytestmark = pytest.mark.django_db
JSON = "application/json"
SECRET = "sk-upstream-very-secret-value"


def assert_no_secret(response):
    assert SECRET not in response.content.decode()
    body = response.json()
    for row in body if isinstance(body, list) else [body]:
        assert "secret" not in row


@pytest.fixture
def upstream(admin_client):
    response = admin_client.post(
        url("backend-list"),
        {"name": "openai", "kind": "openai", "base_url": "https://api.example.com/v1",
         "secret": SECRET},
        content_type=JSON,
    )  # fmt: skip
    assert response.status_code == 201, response.content
    assert_no_secret(response)
    assert response.json()["has_secret"] is True
    return Backend.objects.get(name="openai")


def test_the_secret_is_stored_but_never_returned(admin_client, upstream):
    assert upstream.secret == SECRET
    with connection.cursor() as cursor:
        cursor.execute("SELECT secret FROM chatparity_backend WHERE id = %s", [upstream.pk])
        (stored,) = cursor.fetchone()
    assert SECRET not in stored  # encrypted at rest
    responses = [
        admin_client.get(url("backend-list")),
        admin_client.get(url("backend-detail", upstream.pk)),
        admin_client.patch(url("backend-detail", upstream.pk), {"timeout": 30}, content_type=JSON),
        admin_client.put(
            url("backend-detail", upstream.pk),
            {"name": "openai", "kind": "openai", "secret": SECRET + "-2"},
            content_type=JSON,
        ),
    ]
    for response in responses:
        assert response.status_code == 200
        assert_no_secret(response)
        assert SECRET + "-2" not in response.content.decode()
        assert stored not in response.content.decode()
    assert responses[1].json()["has_secret"] is True


@pytest.mark.parametrize("method", ["put", "patch"])
def test_omitting_the_secret_on_update_keeps_it(admin_client, upstream, method):
    body = {"name": "openai", "kind": "openai", "enabled": False}
    response = getattr(admin_client, method)(
        url("backend-detail", upstream.pk), body, content_type=JSON
    )
    assert response.status_code == 200
    assert response.json()["has_secret"] is True
    upstream.refresh_from_db()
    assert (upstream.secret, upstream.enabled) == (SECRET, False)


def test_an_empty_secret_clears_it(admin_client, upstream):
    response = admin_client.patch(
        url("backend-detail", upstream.pk), {"secret": ""}, content_type=JSON
    )
    assert response.json()["has_secret"] is False
    upstream.refresh_from_db()
    assert upstream.secret == ""


def test_a_backend_without_secret_says_so(admin_client, backend):
    assert admin_client.get(url("backend-detail", backend.pk)).json()["has_secret"] is False


def test_a_backend_aliases_use_cannot_be_deleted(admin_client, alias, backend):
    response = admin_client.delete(url("backend-detail", backend.pk))
    assert response.status_code == 409
    assert "still used" in response.json()["detail"]
    assert Backend.objects.filter(pk=backend.pk).exists()


def test_an_unused_backend_can_be_deleted(admin_client, backend):
    assert admin_client.delete(url("backend-detail", backend.pk)).status_code == 204
    assert not Backend.objects.exists()


@pytest.mark.parametrize(
    "change", [{"base_url": "https://attacker.example/v1"}, {"kind": "command"}]
)
def test_the_stored_secret_does_not_follow_a_new_kind_or_url_unless_sent_again(
    admin_client, upstream, change
):
    moved = admin_client.patch(url("backend-detail", upstream.pk), change, content_type=JSON)
    assert moved.status_code == 400
    assert "Send the secret again" in moved.json()["secret"][0]
    upstream.refresh_from_db()
    assert (upstream.base_url, upstream.kind) == ("https://api.example.com/v1", "openai")


@pytest.mark.parametrize("secret", ["sk-theirs", ""])
def test_a_new_url_comes_with_a_secret_or_clears_it(admin_client, upstream, secret):
    body = {"base_url": "https://elsewhere.example/v1", "secret": secret}
    response = admin_client.patch(url("backend-detail", upstream.pk), body, content_type=JSON)
    assert response.status_code == 200
    upstream.refresh_from_db()
    assert (upstream.base_url, upstream.secret) == ("https://elsewhere.example/v1", secret)


@pytest.mark.parametrize(("fields", "field", "words"), BAD_BACKENDS)
def test_a_bad_backend_is_a_400_on_its_field(admin_client, fields, field, words):
    body = {"name": "new", "kind": "local", "timeout": 30, **fields}
    response = admin_client.post(url("backend-list"), body, content_type=JSON)
    assert response.status_code == 400
    assert list(response.json()) == [field]
    assert words in response.json()[field][0]
    assert not Backend.objects.exists()


def test_the_kinds_are_those_configured_a_sites_own_too(admin_client, settings):
    settings.CHATPARITY = SCRIPTED  # the site's own kind "scripted"
    body = {"name": "mine", "kind": "scripted", "options": {"script": ["Hi"]}}
    created = admin_client.post(url("backend-list"), body, content_type=JSON)
    assert created.status_code == 201, created.content
    assert Backend.objects.get().kind == "scripted"
    schema = admin_client.get(url("schema"), {"format": "json"}).json()
    assert schema["components"]["schemas"]["KindEnum"]["enum"] == kinds()
    body = {"name": "other", "kind": "mine"}
    refused = admin_client.post(url("backend-list"), body, content_type=JSON)
    assert (refused.status_code, list(refused.json())) == (400, ["kind"])


@pytest.mark.parametrize("fields", GOOD_BACKENDS)
def test_a_good_backend_is_saved(admin_client, fields):
    body = {"name": "new", "timeout": 30, **fields}
    response = admin_client.post(url("backend-list"), body, content_type=JSON)
    assert response.status_code == 201, response.content
    saved = Backend.objects.get()
    assert (saved.kind, saved.options) == (fields["kind"], fields.get("options", {}))


def test_an_update_is_checked_as_the_row_it_makes(admin_client, upstream):
    response = admin_client.patch(
        url("backend-detail", upstream.pk), {"options": {"retries": 11}}, content_type=JSON
    )
    assert response.status_code == 400
    assert "'retries' must be an integer from 0 to 10" in response.json()["options"][0]
    upstream.refresh_from_db()
    assert upstream.options == {}
