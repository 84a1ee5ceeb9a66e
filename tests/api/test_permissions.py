"""Staff get only what their Django model permissions allow, as in the admin."""

import pytest
from django.contrib.auth.models import Permission
from rest_framework.authtoken.models import Token

from chatparity.models import ApiKey, Backend, ModelAlias, Plan, StoredResponse
from tests.support.logs import logged

from .helpers import url

pytestmark = pytest.mark.django_db
JSON = "application/json"

# (method, url name, on the row?, the permission codename it needs); deletes last.
NEEDS = [
    ("get", "key-list", False, "view_apikey"),
    ("post", "key-list", False, "add_apikey"),
    ("get", "key-detail", True, "view_apikey"),
    ("patch", "key-detail", True, "change_apikey"),
    ("post", "key-revoke", True, "change_apikey"),
    ("post", "key-reactivate", True, "change_apikey"),
    ("delete", "key-detail", True, "delete_apikey"),
    ("get", "alias-list", False, "view_modelalias"),
    ("post", "alias-list", False, "add_modelalias"),
    ("get", "alias-detail", True, "view_modelalias"),
    ("post", "alias-fill-prices", True, "change_modelalias"),
    ("patch", "alias-detail", True, "change_modelalias"),
    ("delete", "alias-detail", True, "delete_modelalias"),
    ("get", "backend-list", False, "view_backend"),
    ("post", "backend-list", False, "add_backend"),
    ("get", "backend-detail", True, "view_backend"),
    ("patch", "backend-detail", True, "change_backend"),
    ("delete", "backend-detail", True, "delete_backend"),
    ("get", "plan-list", False, "view_plan"),
    ("post", "plan-list", False, "add_plan"),
    ("get", "plan-detail", True, "view_plan"),
    ("patch", "plan-detail", True, "change_plan"),
    ("delete", "plan-detail", True, "delete_plan"),
    ("get", "log-list", False, "view_requestlog"),
    ("get", "log-detail", True, "view_requestlog"),
    ("get", "usage", False, "view_requestlog"),
    ("get", "usage-latency", False, "view_requestlog"),
    ("get", "response-list", False, "view_storedresponse"),
    ("get", "response-detail", True, "view_storedresponse"),
    ("delete", "response-detail", True, "delete_storedresponse"),
]
BODIES = {
    "key-list": {"name": "new"},
    "alias-list": {"public_id": "new", "backend": "spare"},
    "backend-list": {"name": "new", "kind": "openai", "base_url": "https://example.com/v1"},
    "key-detail": {"name": "renamed"},
    "alias-detail": {"model": "renamed"},
    "backend-detail": {"timeout": 5},
    "plan-list": {"name": "new"},
    "plan-detail": {"priority": 5},
}
ALL = sorted({codename for *_, codename in NEEDS})


@pytest.fixture
def rows():
    """One row of each model, by url name prefix; the backend "spare" is unused."""
    spare = Backend.objects.create(name="spare", kind="local")
    backend = Backend.objects.create(name="unused", kind="local")
    alias = ModelAlias.objects.create(public_id="unused", backend=spare, model="claude-opus-4-1")
    key, _ = ApiKey.objects.create_key("k")
    response = StoredResponse.objects.create(
        id="resp_1", api_key=key, model="m", status="completed", response={}
    )
    return {
        "key": key, "alias": alias, "backend": backend, "log": logged(), "response": response,
        "plan": Plan.objects.create(name="starter"),
    }  # fmt: skip


@pytest.fixture
def staff(django_user_model):
    """A staff user (not a superuser) holding the chatparity permissions named."""

    def make(*codenames):
        user = django_user_model.objects.create_user("editor", is_staff=True)
        user.user_permissions.set(
            Permission.objects.filter(content_type__app_label="chatparity", codename__in=codenames)
        )
        return user

    return make


def call(client, rows, method, name, detail):
    args = (rows[name.split("-")[0]].pk,) if detail else ()
    return getattr(client, method)(url(name, *args), BODIES.get(name, {}), content_type=JSON)


@pytest.mark.parametrize(("method", "name", "detail", "needed"), NEEDS)
def test_staff_without_the_permission_is_forbidden(
    client, rows, staff, method, name, detail, needed
):
    client.force_login(staff(*(codename for codename in ALL if codename != needed)))
    assert call(client, rows, method, name, detail).status_code == 403


@pytest.mark.parametrize(("method", "name", "detail", "needed"), NEEDS)
def test_staff_with_only_the_permission_gets_in(client, rows, staff, method, name, detail, needed):
    client.force_login(staff(needed))
    assert call(client, rows, method, name, detail).status_code < 300


def test_staff_without_permissions_may_read_only_the_schema(client, rows, staff):
    client.force_login(staff())
    assert client.get(url("schema")).status_code == 200
    for method, name, detail, _ in NEEDS:
        assert call(client, rows, method, name, detail).status_code == 403, (method, name)


def test_viewing_backends_does_not_allow_adding_one(client, staff):
    client.force_login(staff("view_backend"))
    assert client.get(url("backend-list")).status_code == 200
    body = {"name": "sh", "kind": "command", "options": {"argv": ["/bin/sh", "-c", "id"]}}
    assert client.post(url("backend-list"), body, content_type=JSON).status_code == 403
    assert not Backend.objects.exists()


def test_adding_a_key_does_not_allow_revoking_one(client, rows, staff):
    client.force_login(staff("view_apikey", "add_apikey"))
    assert client.post(url("key-list"), {"name": "new"}, content_type=JSON).status_code == 201
    assert client.post(url("key-revoke", rows["key"].pk)).status_code == 403
    rows["key"].refresh_from_db()
    assert rows["key"].is_active


def test_staff_with_every_permission_may_do_everything(client, rows, staff):
    client.force_login(staff(*ALL))
    for method, name, detail, _ in NEEDS:
        assert call(client, rows, method, name, detail).status_code < 300, (method, name)


def test_a_token_carries_its_users_permissions(client, rows, staff):
    token = Token.objects.create(user=staff("view_backend"))
    script = {"Authorization": f"Token {token.key}"}
    assert client.get(url("backend-list"), headers=script).status_code == 200
    assert client.get(url("key-list"), headers=script).status_code == 403


# Security round 3: a staff user who may add keys and view the log, and nothing on stored
# responses, took a response id from the log and minted a key for its owner to read it.


@pytest.fixture
def victims_response(django_user_model):
    """A user's stored response, as another staff user finds its id in the log."""
    victim = django_user_model.objects.create_user("victim")
    key, _ = ApiKey.objects.create_key("victim's", owner=victim)
    StoredResponse.objects.create(
        id="resp_victim", api_key=key, owner=victim, model="m", status="completed",
        response={"id": "resp_victim", "object": "response", "output": []},
    )  # fmt: skip
    return victim


def read_response(client, created):
    return client.get("/v1/responses/resp_victim", headers={"authorization": f"Bearer {created}"})


def test_a_key_for_another_user_needs_the_permission_to_issue_keys_for_others(
    client, staff, victims_response
):
    editor = staff("add_apikey", "view_requestlog")
    client.force_login(editor)
    refused = client.post(url("key-list"), {"name": "x", "owner": victims_response.pk}, JSON)
    assert refused.status_code == 403
    assert not ApiKey.objects.filter(name="x").exists()
    for owner in (editor.pk, None):
        created = client.post(url("key-list"), {"name": "mine", "owner": owner}, JSON)
        assert created.status_code == 201
        assert read_response(client, created.json()["key"]).status_code == 404


def test_changing_a_keys_owner_to_another_user_needs_it_too(client, staff, victims_response):
    editor = staff("add_apikey", "change_apikey")
    client.force_login(editor)
    mine = client.post(url("key-list"), {"name": "mine", "owner": editor.pk}, JSON).json()
    moved = client.patch(url("key-detail", mine["id"]), {"owner": victims_response.pk}, JSON)
    assert moved.status_code == 403
    assert ApiKey.objects.get(pk=mine["id"]).owner_id == editor.pk
    assert read_response(client, mine["key"]).status_code == 404


def test_whoever_may_issue_keys_for_others_may_read_their_stored_responses(
    client, staff, victims_response
):
    # What the permission gives, as SECURITY.md says.
    client.force_login(staff("add_apikey", "issue_key_for_others"))
    created = client.post(url("key-list"), {"name": "x", "owner": victims_response.pk}, JSON)
    assert created.status_code == 201
    assert read_response(client, created.json()["key"]).status_code == 200
