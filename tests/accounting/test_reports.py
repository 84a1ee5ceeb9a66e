"""Usage reports, read from the daily rollups of the rows logged."""

import datetime
from decimal import Decimal

import pytest
from django.contrib.auth import get_user_model

from chatparity.accounting import reports
from chatparity.models import LATENCY_BOUNDS_MS, ApiKey, RequestLog
from tests.support.logs import logged

DAY1, DAY2, DAY3 = datetime.date(2025, 3, 1), datetime.date(2025, 3, 2), datetime.date(2025, 3, 3)

pytestmark = pytest.mark.django_db


def test_usage_without_dimensions_is_one_row_of_totals():
    logged(alias="a", total_tokens=3)
    logged(alias="b", total_tokens=4, status_code=500, error_type="server_error")
    (totals,) = reports.usage(reports.LogFilter(), [])
    assert (totals["requests"], totals["errors"], totals["total_tokens"]) == (2, 1, 7)


def test_usage_of_nothing_is_zeros_not_nones():
    (totals,) = reports.usage(reports.LogFilter(), [])
    assert set(totals.values()) == {0}


def test_usage_per_alias_counts_each_alias_once():
    for alias in ("a", "a", "b"):
        logged(alias=alias, total_tokens=1)
    rows = reports.usage(reports.LogFilter(), ["alias"])
    assert [(r["alias"], r["requests"]) for r in rows] == [("a", 2), ("b", 1)]


def test_usage_per_endpoint_counts_chat_completions_and_responses_apart():
    logged(endpoint="chat.completions", total_tokens=3)
    logged(endpoint="responses", total_tokens=4)
    logged(endpoint="responses", total_tokens=5, status_code=400, error_type="invalid_request")
    rows = reports.usage(reports.LogFilter(), ["endpoint"])
    assert [(r["endpoint"], r["requests"], r["errors"], r["total_tokens"]) for r in rows] == [
        ("chat.completions", 1, 0, 3),
        ("responses", 2, 1, 9),
    ]


def test_usage_per_key_names_each_key_and_a_deleted_one_by_its_prefix():
    key, _ = ApiKey.objects.create_key("laptop")
    logged(api_key=key, key_prefix=key.prefix)
    logged(key_prefix="sk-cp-gone")
    rows = reports.usage(reports.LogFilter(), ["key"])
    assert sorted((r["key_prefix"], r["key_name"]) for r in rows) == sorted(
        [(key.prefix, "laptop"), ("sk-cp-gone", "sk-cp-gone")]
    )


def test_a_log_filter_on_an_endpoint_keeps_only_its_rows():
    logged(endpoint="chat.completions", alias="a")
    logged(endpoint="responses", alias="b")
    chosen = reports.LogFilter(endpoint="responses").apply(RequestLog.objects.all())
    assert [row.alias for row in chosen] == ["b"]
    everything = reports.LogFilter().apply(RequestLog.objects.all())
    assert sorted(row.alias for row in everything) == ["a", "b"]
    (usage,) = reports.usage(reports.LogFilter(endpoint="responses"), ["alias"])
    assert (usage["alias"], usage["requests"]) == ("b", 1)


def test_a_log_filter_takes_whole_utc_days_as_created_at_ranges():
    first = datetime.datetime(2025, 3, 2, 0, 0, tzinfo=datetime.UTC)
    last = datetime.datetime(2025, 3, 2, 23, 59, 59, 999999, tzinfo=datetime.UTC)
    moment = datetime.timedelta(microseconds=1)
    for at in (first - moment, first, first + (last - first) / 2, last, last + moment):
        logged(at=at)
    one_day = reports.LogFilter(since=DAY2, until=DAY2)
    query = str(one_day.apply(RequestLog.objects.all()).query)
    assert '"created_at" >=' in query
    assert '"created_at" <' in query
    assert "::date" not in query
    assert "django_datetime_cast_date" not in query
    assert one_day.apply(RequestLog.objects.all()).count() == 3
    assert reports.usage(one_day, [])[0]["requests"] == 3


def test_a_keys_usage_by_day_and_alias_for_its_owner_or_its_prefix():
    owner = get_user_model().objects.create(username="ada")
    other = get_user_model().objects.create(username="bob")
    mine, _ = ApiKey.objects.create_key("mine", owner=owner)
    theirs, _ = ApiKey.objects.create_key("theirs", owner=other)
    for day, alias, key, cost in [
        (DAY1, "gpt", mine, "0.5"),
        (DAY1, "gpt", mine, "0.25"),
        (DAY1, "llama", mine, "0"),
        (DAY2, "gpt", theirs, "9"),
        (DAY3, "gpt", mine, "1"),
    ]:
        logged(day, api_key=key, key_prefix=key.prefix, alias=alias, cost=Decimal(cost),
               prompt_tokens=2, completion_tokens=1, total_tokens=3)  # fmt: skip
    rows = reports.usage_by_day_and_alias(DAY1, DAY2, owner_id=owner.pk)
    assert [(r["day"], r["alias"], r["requests"], r["total_tokens"], r["cost"]) for r in rows] == [
        (DAY1, "gpt", 2, 6, Decimal("0.75")),
        (DAY1, "llama", 1, 3, Decimal(0)),
    ]
    by_key = reports.usage_by_day_and_alias(DAY1, DAY3, key_prefix=theirs.prefix)
    assert [(r["day"], r["requests"], r["cost"]) for r in by_key] == [(DAY2, 1, Decimal(9))]


def test_usage_by_day_and_alias_counts_for_the_owner_when_the_requests_were_logged():
    ada, bob = (get_user_model().objects.create(username=name) for name in ("ada", "bob"))
    key, _ = ApiKey.objects.create_key("moved", owner=ada)
    logged(DAY1, api_key=key, key_prefix=key.prefix)
    key.owner = bob
    key.save()
    logged(DAY2, api_key=key, key_prefix=key.prefix)
    assert [r["day"] for r in reports.usage_by_day_and_alias(DAY1, DAY3, owner_id=ada.pk)] == [DAY1]
    assert [r["day"] for r in reports.usage_by_day_and_alias(DAY1, DAY3, owner_id=bob.pk)] == [DAY2]


@pytest.mark.parametrize(
    ("values", "fraction", "expected"),
    [
        ([], 0.5, None),
        ([7.0], 0.5, 10.0),  # the top of its bucket, (5, 10]
        ([float(ms) for ms in range(1, 21)], 0.5, 10.0),  # even buckets: exact
        ([float(ms) for ms in range(1, 21)], 0.95, 19.0),
        ([100.0, 200.0, 300.0, 400.0], 0.95, 500.0),  # 400 in (300, 500]
        ([0.0, 0.0, 3.0], 0.5, 10 / 3),  # the bucket from 0 to 5 ms
        ([LATENCY_BOUNDS_MS[-1] + 1.0] * 3, 0.5, float(LATENCY_BOUNDS_MS[-1])),  # past them all
    ],
)
def test_a_percentile_is_placed_within_its_histogram_bucket(values, fraction, expected):
    counts = [0] * (len(LATENCY_BOUNDS_MS) + 1)
    for value in values:
        counts[next((i for i, b in enumerate(LATENCY_BOUNDS_MS) if value <= b), -1)] += 1
    assert reports.percentile(counts, fraction) == pytest.approx(expected)


def test_a_percentile_is_off_by_less_than_its_bucket():
    values = [float(ms) for ms in range(37, 4_000, 7)]
    counts = [0] * (len(LATENCY_BOUNDS_MS) + 1)
    for value in values:
        counts[next(i for i, b in enumerate(LATENCY_BOUNDS_MS) if value <= b)] += 1
    for fraction in (0.5, 0.9, 0.95, 0.99):
        exact = sorted(values)[int(fraction * len(values) + 0.999999) - 1]
        estimate = reports.percentile(counts, fraction)
        upper = next(b for b in LATENCY_BOUNDS_MS if exact <= b)
        lower = max([0, *(b for b in LATENCY_BOUNDS_MS if b < exact)])
        assert lower <= estimate <= upper


def test_latency_is_the_models_answers_not_the_endpoints_that_ask_for_none():
    logged(alias="a", duration_ms=1000.0)
    logged(alias="a", endpoint="messages.count_tokens", duration_ms=1.0)
    logged(alias="a", endpoint="responses.stored", duration_ms=1.0)
    logged(alias="", endpoint="models", duration_ms=1.0)
    (row,) = reports.latency_by_alias(reports.LogFilter())
    assert (row["alias"], row["requests"], row["p50_ms"]) == ("a", 1, 1000.0)
    (totals,) = reports.usage(reports.LogFilter(), [])
    assert totals["requests"] == 4, "every row is a request"
