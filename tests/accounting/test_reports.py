"""Usage reports over the request log."""

import pytest

from chatparity.accounting import reports
from chatparity.models import RequestLog


def log(**fields):
    defaults = {"request_id": "r", "key_prefix": "sk-cp-abcd", "status_code": 200}
    return RequestLog.objects.create(**{**defaults, "duration_ms": 10.0, **fields})


@pytest.mark.django_db
def test_usage_without_dimensions_is_one_row_of_totals():
    log(alias="a", total_tokens=3)
    log(alias="b", total_tokens=4, status_code=500, error_type="server_error")
    (totals,) = reports.usage(RequestLog.objects.all(), [])
    assert (totals["requests"], totals["errors"], totals["total_tokens"]) == (2, 1, 7)


@pytest.mark.django_db
def test_usage_per_alias_counts_each_alias_once():
    for alias in ("a", "a", "b"):
        log(alias=alias, total_tokens=1)
    rows = reports.usage(RequestLog.objects.all(), ["alias"])
    assert [(r["alias"], r["requests"]) for r in rows] == [("a", 2), ("b", 1)]


@pytest.mark.django_db
def test_usage_per_endpoint_counts_chat_completions_and_responses_apart():
    log(endpoint="chat.completions", total_tokens=3)
    log(endpoint="responses", total_tokens=4)
    log(endpoint="responses", total_tokens=5, status_code=400, error_type="invalid_request_error")
    rows = reports.usage(RequestLog.objects.all(), ["endpoint"])
    assert [(r["endpoint"], r["requests"], r["errors"], r["total_tokens"]) for r in rows] == [
        ("chat.completions", 1, 0, 3),
        ("responses", 2, 1, 9),
    ]


@pytest.mark.django_db
def test_a_log_filter_on_an_endpoint_keeps_only_its_rows():
    log(endpoint="chat.completions", alias="a")
    log(endpoint="responses", alias="b")
    chosen = reports.LogFilter(endpoint="responses").apply(RequestLog.objects.all())
    assert [row.alias for row in chosen] == ["b"]
    everything = reports.LogFilter().apply(RequestLog.objects.all())
    assert sorted(row.alias for row in everything) == ["a", "b"]
