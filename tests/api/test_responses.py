"""responses/: the stored responses of /v1/responses, read and deleted, never written."""

import datetime

import pytest
from django.utils import timezone

from chatparity.models import ApiKey, StoredResponse

from .helpers import url

pytestmark = pytest.mark.django_db

ANSWER = {
    "id": "resp_b", "object": "response", "status": "completed", "model": "smollm2",
    "output": [{"type": "message", "role": "assistant", "content": [
        {"type": "output_text", "text": "Hello.", "annotations": []},
    ]}],
}  # fmt: skip
INPUT = [{"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Hi"}]}]


@pytest.fixture
def key():
    return ApiKey.objects.create_key("codex")[0]


@pytest.fixture
def stored(key):
    now = timezone.now()

    def store(id, age_minutes, **fields):
        defaults = {"model": "smollm2", "status": "completed", "response": {"id": id}}
        created_at = now - datetime.timedelta(minutes=age_minutes)
        return StoredResponse.objects.create(id=id, created_at=created_at, **defaults | fields)

    return [
        store("resp_a", 3, api_key=key),
        store("resp_b", 2, api_key=key, previous_response_id="resp_a", input_items=INPUT,
              response=ANSWER),
        store("resp_c", 1, model="gpt", status="incomplete"),
    ]  # fmt: skip


def ids(client, **params):
    response = client.get(url("response-list"), params)
    assert response.status_code == 200, response.content
    return [row["id"] for row in response.json()["results"]]


def test_the_list_is_newest_first_without_bodies(admin_client, stored, key):
    page = admin_client.get(url("response-list")).json()
    assert page["count"] == 3
    first, second, _ = page["results"]
    assert first == {
        "id": "resp_c", "api_key": None, "key_prefix": None, "owner": None,
        "previous_response_id": "", "model": "gpt", "status": "incomplete",
        "created_at": first["created_at"],
    }  # fmt: skip
    assert (second["id"], second["api_key"], second["key_prefix"]) == ("resp_b", key.pk, key.prefix)
    assert [row["id"] for row in page["results"]] == ["resp_c", "resp_b", "resp_a"]


@pytest.mark.parametrize(
    ("params", "expected"),
    [
        ({"model": "gpt"}, ["resp_c"]),
        ({"status": "completed"}, ["resp_b", "resp_a"]),
        ({"previous_response_id": "resp_a"}, ["resp_b"]),
        ({"limit": "1", "offset": "1"}, ["resp_b"]),
        ({"model": ""}, ["resp_c", "resp_b", "resp_a"]),
    ],
)
def test_filters(admin_client, stored, params, expected):
    assert ids(admin_client, **params) == expected


def test_filter_by_key_prefix(admin_client, stored, key):
    assert ids(admin_client, key=key.prefix) == ["resp_b", "resp_a"]
    assert ids(admin_client, key="sk-cp-none") == []


def test_one_response_shows_its_input_and_the_object_the_client_received(admin_client, stored):
    row = admin_client.get(url("response-detail", "resp_b")).json()
    assert (row["input_items"], row["response"]) == (INPUT, ANSWER)
    assert row["previous_response_id"] == "resp_a"
    assert admin_client.get(url("response-detail", "resp_zzz")).status_code == 404


def test_delete_removes_it_and_nothing_writes_one(admin_client, stored):
    detail = url("response-detail", "resp_a")
    body = {"id": "resp_new", "model": "m", "status": "completed", "response": {}}
    assert admin_client.post(url("response-list"), body, "application/json").status_code == 405
    patched = admin_client.patch(detail, {"status": "failed"}, "application/json")
    assert patched.status_code == 405
    assert admin_client.delete(detail).status_code == 204
    assert sorted(StoredResponse.objects.values_list("id", flat=True)) == ["resp_b", "resp_c"]
