"""The routing proof's short forms (``tests/e2e/routing.py``): uvicorn workers on real
PostgreSQL and Redis, an alias of deployments that are upstreams of their own."""

import pytest

from tests.e2e import routing

pytestmark = pytest.mark.e2e


@pytest.mark.parametrize("workers", [1, 2, 4])
def test_weights_1_2_1_split_the_requests_within_2_percent(postgres_url, redis_url, workers):
    report = routing.split(postgres_url, redis_url, workers=workers, requests=3000)
    print(report.line())
    assert report.errors == []
    for name, weight in (("fast", 0.25), ("slow", 0.5), ("third", 0.25)):
        assert abs(report.split[name] - weight) <= 0.02, report.split


@pytest.mark.parametrize("workers", [1, 2, 4])
def test_after_a_429_its_deployment_is_left_alone_for_its_retry_after(
    postgres_url, redis_url, workers
):
    report = routing.retry_after(postgres_url, redis_url, workers=workers)
    print(report)
    assert report.errors == 0  # every request was served by another deployment
    # Between the first 429 (and what was on its way then) and the window's end, one
    # request tried it again, at its Retry-After of 5 s: no stampede, nothing sooner.
    assert len(report.arrivals_cooling) == 1, report.arrivals_cooling
    assert 5.0 <= report.arrivals_cooling[0] < 6.5
    assert report.recovered > 0  # then it serves again


def test_least_busy_sends_short_requests_to_the_idle_deployment(postgres_url, redis_url):
    counts = routing.least_busy(postgres_url, redis_url, workers=4)
    print(counts)
    assert counts["errors"] == 0
    assert counts["idle"] >= 0.9 * (counts["idle"] + counts["busy"])


def test_lowest_latency_sends_most_to_the_fast_deployment_and_still_tries_the_slow(
    postgres_url, redis_url
):
    counts = routing.lowest_latency(postgres_url, redis_url)["measured"]
    print(counts)
    assert counts["errors"] == 0
    total = counts["fast"] + counts["slow"]
    assert counts["fast"] >= 0.9 * total
    assert counts["slow"] >= 0.01 * total


def test_a_sessions_turns_stay_on_one_deployment_and_move_when_it_cools(postgres_url, redis_url):
    report = routing.sticky(postgres_url, redis_url)
    print(report)
    assert report.errors == 0
    turns = sum(sum(seen.values()) for seen in report.sessions.values())
    on_their_own = sum(seen.most_common(1)[0][1] for seen in report.sessions.values())
    assert on_their_own >= 0.99 * turns
    assert report.moved, "no session was on the deployment cooled down"
    for seen in report.moved.values():
        assert len(seen) == 1
        assert report.cooled not in seen


def test_an_upstream_killed_mid_run_fails_no_request_that_had_not_begun(postgres_url, redis_url):
    report = routing.kill(postgres_url, redis_url)
    print(f"{len(report.outcomes)} requests, {report.cut_midway} streams cut midway")
    assert report.failed_before_streaming == []
