"""usage/ and usage/latency/: the reports of chatparity.accounting.reports over the
daily rollups of filtered log rows."""

import datetime
from decimal import Decimal

import pytest

from chatparity.models import ApiKey
from tests.support.logs import logged

from .helpers import url

pytestmark = pytest.mark.django_db

DAY1, DAY2 = datetime.date(2025, 3, 1), datetime.date(2025, 3, 2)
COUNTS = ("requests", "errors", "cancelled", "prompt_tokens", "completion_tokens", "total_tokens")
CACHING = ("cached_tokens", "cache_write_5m_tokens", "cache_write_1h_tokens", "cache_read_share")


def tokens(prompt, completion):
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
    }


@pytest.fixture
def rows():
    key, _ = ApiKey.objects.create_key("laptop")
    logged(DAY1, api_key=key, key_prefix=key.prefix, alias="smollm2", **tokens(10, 5))
    logged(DAY1, api_key=key, key_prefix=key.prefix, alias="gpt", status_code=500)
    logged(DAY1, key_prefix="sk-cp-gone", alias="smollm2", cancelled=True, **tokens(3, 1))
    logged(DAY2, api_key=key, key_prefix=key.prefix, alias="smollm2", **tokens(7, 2))
    logged(DAY2, key_prefix="sk-cp-gone", alias="gpt", error_type="server_error",
             endpoint="responses")  # fmt: skip
    return key


def page(client, **params):
    response = client.get(url("usage"), params)
    assert response.status_code == 200, response.content
    return response.json()


def usage(client, **params):
    """The groups of a report that fits one page."""
    answer = page(client, **params)
    assert answer["next"] is None
    return answer["results"]


def counts(row):
    return tuple(row[name] for name in COUNTS)


def test_by_day_is_the_default(admin_client, rows):
    days = usage(admin_client)
    assert [set(row) for row in days] == [{"day", *COUNTS, *CACHING, "cost"}] * 2
    assert [(row["day"], counts(row)) for row in days] == [
        ("2025-03-01", (3, 1, 1, 13, 6, 19)),
        ("2025-03-02", (2, 1, 0, 7, 2, 9)),
    ]


def test_by_key_names_live_keys_and_keeps_the_prefix_of_deleted_ones(admin_client, rows):
    by_key = {row["key_prefix"]: row for row in usage(admin_client, group_by="key")}
    assert set(by_key) == {rows.prefix, "sk-cp-gone"}
    assert (by_key[rows.prefix]["key_name"], counts(by_key[rows.prefix])) == (
        "laptop", (3, 1, 0, 17, 7, 24),
    )  # fmt: skip
    assert (by_key["sk-cp-gone"]["key_name"], counts(by_key["sk-cp-gone"])) == (
        "sk-cp-gone", (2, 1, 1, 3, 1, 4),
    )  # fmt: skip


def test_by_alias_and_day(admin_client, rows):
    groups = usage(admin_client, group_by="alias,day")
    assert [(row["day"], row["alias"], counts(row)) for row in groups] == [
        ("2025-03-01", "gpt", (1, 1, 0, 0, 0, 0)),
        ("2025-03-01", "smollm2", (2, 0, 1, 13, 6, 19)),
        ("2025-03-02", "gpt", (1, 1, 0, 0, 0, 0)),
        ("2025-03-02", "smollm2", (1, 0, 0, 7, 2, 9)),
    ]


def test_by_endpoint_and_day(admin_client, rows):
    groups = usage(admin_client, group_by="endpoint,day")
    assert [(row["day"], row["endpoint"], counts(row)) for row in groups] == [
        ("2025-03-01", "chat.completions", (3, 1, 1, 13, 6, 19)),
        ("2025-03-02", "chat.completions", (1, 0, 0, 7, 2, 9)),
        ("2025-03-02", "responses", (1, 1, 0, 0, 0, 0)),
    ]


def test_an_endpoint_filter_narrows_the_usage_and_the_latency(admin_client, rows):
    [only] = usage(admin_client, group_by="alias", endpoint="responses")
    assert (only["alias"], counts(only)) == ("gpt", (1, 1, 0, 0, 0, 0))
    latency = admin_client.get(url("usage-latency"), {"endpoint": "chat.completions"}).json()
    assert [(row["alias"], row["requests"]) for row in latency] == [("gpt", 1), ("smollm2", 3)]


def test_filters_narrow_the_rows(admin_client, rows):
    [only] = usage(admin_client, group_by="key", since="2025-03-02", alias="SMOLLM2")
    assert (only["key_prefix"], counts(only)) == (rows.prefix, (1, 0, 0, 7, 2, 9))
    [day1] = usage(admin_client, until="2025-03-01", key="sk-cp-gone")
    assert (day1["day"], counts(day1)) == ("2025-03-01", (1, 0, 1, 3, 1, 4))


def test_cache_reads_writes_their_share_and_the_cost_per_group(admin_client, db):
    cache = {"cached_tokens": 600, "cache_write_5m_tokens": 100, "cache_write_1h_tokens": 200}
    logged(DAY1, alias="claude", **tokens(1000, 10), **cache, cost=Decimal("0.00412345"))
    logged(DAY1, alias="claude", **tokens(200, 10), cost=Decimal("0.00000001"))
    logged(DAY1, alias="smollm2", **tokens(0, 0))
    claude, smollm2 = usage(admin_client, group_by="alias")
    assert {name: claude[name] for name in (*CACHING, "cost")} == {
        "cached_tokens": 600, "cache_write_5m_tokens": 100, "cache_write_1h_tokens": 200,
        "cache_read_share": 0.5, "cost": "0.00412346",
    }  # fmt: skip
    assert (smollm2["cache_read_share"], smollm2["cost"]) == (None, "0.00000000")


def test_no_rows_no_groups(admin_client, rows):
    assert usage(admin_client, since="2030-01-01") == []


@pytest.mark.parametrize("group_by", ["week", "day,model", ",", "day;key"])
def test_unknown_dimensions_are_a_400(admin_client, group_by):
    response = admin_client.get(url("usage"), {"group_by": group_by})
    assert response.status_code == 400
    assert "day, key, alias, endpoint" in response.json()["group_by"][0]


def test_bad_dates_are_a_400(admin_client):
    response = admin_client.get(url("usage"), {"since": "01/03/2025"})
    assert response.status_code == 400
    assert "since" in response.json()
    assert admin_client.get(url("usage-latency"), {"until": "x"}).status_code == 400


def test_latency_percentiles_per_alias_from_the_histograms(admin_client, db):
    """Each percentile is placed within its histogram bucket, within 10% of the true
    value (docs/history.md): 400 ms is in (360, 430], so a p95 that falls on it reads
    395."""
    for duration in (400, 100, 300, 200):
        logged(DAY1, alias="smollm2", duration_ms=duration, time_to_first_token_ms=duration / 10)
    logged(DAY1, alias="gpt", duration_ms=50, status_code=502)
    logged(DAY2, alias="gpt", duration_ms=70)
    response = admin_client.get(url("usage-latency"))
    assert response.status_code == 200
    gpt, smollm2 = response.json()
    assert smollm2 == {
        "alias": "smollm2",
        "requests": 4,
        "error_rate": 0.0,
        "p50_ms": 190.0,
        "p95_ms": 395.0,
        "ttft_p50_ms": 19.0,
        "ttft_p95_ms": 39.5,
    }
    assert (gpt["requests"], gpt["error_rate"], gpt["p50_ms"], gpt["p95_ms"]) == (2, 0.5, 46.5, 66)
    assert (gpt["ttft_p50_ms"], gpt["ttft_p95_ms"]) == (None, None)


def test_latency_takes_the_same_filters(admin_client, db):
    logged(DAY1, alias="gpt", duration_ms=50, key_prefix="sk-cp-AAAA")
    logged(DAY2, alias="gpt", duration_ms=70, key_prefix="sk-cp-AAAA")
    logged(DAY2, alias="gpt", duration_ms=90, key_prefix="sk-cp-BBBB")
    [gpt] = admin_client.get(
        url("usage-latency"), {"since": "2025-03-02", "key": "sk-cp-AAAA"}
    ).json()
    assert (gpt["requests"], gpt["p50_ms"]) == (1, 66)  # 70 ms


def test_latency_per_deployment_of_each_alias(admin_client, db):
    for ms in (10.0, 20.0):
        logged(DAY1, alias="group", deployment="a/m", duration_ms=ms, time_to_first_token_ms=ms)
    logged(DAY1, alias="group", deployment="b/m", duration_ms=500.0, status_code=502)
    logged(DAY2, alias="other", deployment="c")
    response = admin_client.get(url("usage-deployments"), {"alias": "GROUP"})
    assert response.status_code == 200
    assert [(row["deployment"], row["requests"], row["error_rate"]) for row in response.json()] == [
        ("a/m", 2, 0.0),
        ("b/m", 1, 1.0),
    ]
    assert response.json()[0]["ttft_p50_ms"] == 9.5  # 10 ms, read within its bucket
