"""logs/: read-only, newest first, in pages that follow a cursor, filtered by query parameters."""

import datetime

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from chatparity.models import RequestLog
from tests.support.logs import logged

from .helpers import url

pytestmark = pytest.mark.django_db

DAY1, DAY2, DAY3 = datetime.date(2025, 3, 1), datetime.date(2025, 3, 2), datetime.date(2025, 3, 3)


def ids(client, **params):
    response = client.get(url("log-list"), params)
    assert response.status_code == 200, response.content
    return [row["request_id"] for row in response.json()["results"]]


@pytest.fixture
def rows():
    return [
        logged(DAY1, request_id="a", key_prefix="sk-cp-AAAA", alias="smollm2"),
        logged(DAY2, request_id="b", key_prefix="sk-cp-BBBB", alias="gpt", stream=True),
        logged(DAY3, request_id="c", key_prefix="sk-cp-AAAA", alias="smollm2",
                 status_code=499, cancelled=True, stream=True),
        logged(DAY3, request_id="d", key_prefix="sk-cp-BBBB", alias="gpt", status_code=500,
                 endpoint="responses"),
    ]  # fmt: skip


@pytest.mark.parametrize("endpoint", ["messages", "embeddings"])
def test_messages_and_embeddings_rows_are_their_own_endpoint(admin_client, rows, endpoint):
    logged(DAY3, request_id="m", alias="other", endpoint=endpoint)
    assert ids(admin_client, endpoint=endpoint) == ["m"]
    assert "m" not in ids(admin_client, endpoint="chat.completions")


def test_newest_first(admin_client, rows):
    assert ids(admin_client) == ["d", "c", "b", "a"]


def test_pages_follow_a_cursor_newest_first(admin_client, rows):
    first = admin_client.get(url("log-list"), {"limit": 2}).json()
    assert [row["request_id"] for row in first["results"]] == ["d", "c"]
    assert first["previous"] is None
    second = admin_client.get(first["next"]).json()
    assert [row["request_id"] for row in second["results"]] == ["b", "a"]
    assert second["next"] is None
    back = admin_client.get(second["previous"]).json()
    assert [row["request_id"] for row in back["results"]] == ["d", "c"]


def test_a_page_is_not_shifted_by_rows_logged_meanwhile(admin_client, rows):
    first = admin_client.get(url("log-list"), {"limit": 2}).json()
    logged(request_id="e")
    second = admin_client.get(first["next"]).json()
    assert [row["request_id"] for row in second["results"]] == ["b", "a"]


def test_a_page_reads_from_its_cursor_not_past_every_row_before_it(admin_client, rows):
    first = admin_client.get(url("log-list"), {"limit": 1, "until": "2025-03-02"}).json()
    with CaptureQueriesContext(connection) as queries:
        admin_client.get(first["next"])
    (select,) = [q["sql"] for q in queries if "chatparity_requestlog" in q["sql"]]
    assert '"created_at" <' in select  # where the last page ended: the index's range
    assert "OFFSET" not in select.upper()
    assert "COUNT(" not in select.upper()


def test_default_page_is_50_rows(admin_client):
    RequestLog.objects.bulk_create(
        RequestLog(request_id=str(i), key_prefix="k", status_code=200, duration_ms=1)
        for i in range(51)
    )
    page = admin_client.get(url("log-list")).json()
    assert len(page["results"]) == 50
    assert len(admin_client.get(page["next"]).json()["results"]) == 1


@pytest.mark.parametrize(
    ("params", "expected"),
    [
        ({"key": "sk-cp-AAAA"}, ["c", "a"]),
        ({"alias": "GPT"}, ["d", "b"]),
        ({"status": "500"}, ["d"]),
        ({"stream": "true"}, ["c", "b"]),
        ({"stream": "false"}, ["d", "a"]),
        ({"cancelled": "true"}, ["c"]),
        ({"cancelled": "false"}, ["d", "b", "a"]),
        ({"since": "2025-03-02"}, ["d", "c", "b"]),
        ({"until": "2025-03-02"}, ["b", "a"]),
        ({"since": "2025-03-02", "until": "2025-03-02"}, ["b"]),
        ({"key": "sk-cp-AAAA", "stream": "true", "since": "2025-03-03"}, ["c"]),
        ({"alias": "", "key": ""}, ["d", "c", "b", "a"]),
        ({"endpoint": "responses"}, ["d"]),
        ({"endpoint": "chat.completions"}, ["c", "b", "a"]),
        ({"endpoint": "responses", "status": "200"}, []),
    ],
)
def test_filters(admin_client, rows, params, expected):
    assert ids(admin_client, **params) == expected


@pytest.mark.parametrize(
    ("params", "field"),
    [
        ({"since": "2025-13-01"}, "since"),
        ({"until": "yesterday"}, "until"),
        ({"since": "2025-03-02T10:00:00"}, "since"),
        ({"status": "ok"}, "status"),
        ({"status": "42"}, "status"),
        ({"stream": "maybe"}, "stream"),
        ({"cancelled": "2"}, "cancelled"),
        ({"since": "2025-03-03", "until": "2025-03-01"}, "until"),
        ({"endpoint": "completions"}, "endpoint"),
    ],
)
def test_bad_filter_values_are_a_400_naming_the_parameter(admin_client, rows, params, field):
    response = admin_client.get(url("log-list"), params)
    assert response.status_code == 400
    assert list(response.json()) == [field]


def test_retrieve_shows_the_row(admin_client, rows):
    row = admin_client.get(url("log-detail", rows[2].pk)).json()
    assert (row["request_id"], row["status_code"], row["cancelled"]) == ("c", 499, True)
    assert row["endpoint"] == "chat.completions"
    assert admin_client.get(url("log-detail", rows[3].pk)).json()["endpoint"] == "responses"
    assert row["created_at"].startswith("2025-03-03T12:00:00")


def test_read_only(admin_client, rows):
    detail = url("log-detail", rows[0].pk)
    assert admin_client.post(url("log-list"), {}).status_code == 405
    assert admin_client.delete(detail).status_code == 405
    assert admin_client.patch(detail, {}, content_type="application/json").status_code == 405
    assert RequestLog.objects.count() == 4
