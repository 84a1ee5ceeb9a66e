"""Usage reports over the request log."""

import pytest

from chatparity import reports
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
