"""The short form of the load proof (``tests/e2e/load.py``): two workers on real
PostgreSQL and Redis, mixed requests, hang-ups, injected upstream failures."""

import pytest

from tests.e2e import load

pytestmark = pytest.mark.e2e


def test_nothing_is_lost_under_load_with_faults(postgres_url, redis_url):
    report = load.run(postgres_url, redis_url, requests=400, workers=2, concurrency=32)
    print(report.table())
    assert report.problems == []
    assert report.requests == report.rows == 400
    assert report.hang_ups >= 40
    assert report.cancelled >= report.hang_ups // 2  # most hung up before the end
    assert report.injected >= 5
    assert report.admitted == load.RATE_LIMIT
