"""The deployments' shared state (in Redis or Django's cache) and their own quotas:
what every worker routes by."""

import asyncio
import json
import random
import time

import pytest
from django.test import override_settings

from chatparity.accounting import deployments as shared
from chatparity.accounting import limits
from chatparity.accounting.deployments import Outcome
from chatparity.conf import DEFAULTS
from chatparity.models import Backend, Deployment, ModelAlias
from chatparity.protocol.events import Usage
from tests.support.processes import in_a_process

pytestmark = pytest.mark.django_db


@pytest.fixture(params=["cache", "redis"])
def store(request, settings):
    """The counters in Django's cache (local memory), or in Redis."""
    url = request.getfixturevalue("redis_url") if request.param == "redis" else None
    if url:
        from redis import Redis

        with Redis.from_url(url) as client:
            client.flushdb()
    settings.CHATPARITY = {
        "REDIS_URL": url,
        "ROUTING": {**DEFAULTS["ROUTING"], "FAILURES": 3, "COOLDOWN_SECONDS": 2.0},
    }
    return request.param


def deployment(pk=1, **fields):
    """An unsaved deployment: the state is kept by its id."""
    return Deployment(pk=pk, alias_id=1, **fields)


def health(of, **options):
    snapshot = asyncio.run(shared.snapshot([of], 1, **options))
    return snapshot, snapshot.health[shared.scope(of)]


def tell(of, **outcome):
    return asyncio.run(shared.told(of, Outcome(**outcome)))


# -- which deployments serve an alias ----------------------------------------------


def test_an_alias_is_served_by_its_own_backend_first_then_its_deployments(settings):
    settings.CHATPARITY = {}
    own, other, off = (Backend.objects.create(name=name, kind="openai",
                                              base_url="https://x.test/v1")
                       for name in ("own", "other", "off"))  # fmt: skip
    off.enabled = False
    off.save()
    alias = ModelAlias.objects.create(public_id="m", backend=own, model="one")
    Deployment.objects.create(alias=alias, backend=other, model="two", tier=2)
    Deployment.objects.create(alias=alias, backend=other, model="drained", weight=0)
    Deployment.objects.create(alias=alias, backend=other, model="disabled", enabled=False)
    Deployment.objects.create(alias=alias, backend=off, model="three")
    read = ModelAlias.objects.prefetch_related("deployments__backend").get()
    assert [(d.backend.name, d.model, d.tier) for d in shared.serving(read)] == [
        ("own", "one", 1),
        ("other", "two", 2),
    ]
    # Read without its deployments (or saved without any): its own backend alone.
    (alone,) = shared.serving(ModelAlias.objects.get())
    assert (alone.backend.name, alone.model, alone.primary) == ("own", "one", True)


def test_the_alias_says_what_its_own_deployment_serves(settings):
    settings.CHATPARITY = {}
    first, second = (Backend.objects.create(name=name, kind="openai",
                                            base_url="https://x.test/v1")
                     for name in ("first", "second"))  # fmt: skip
    alias = ModelAlias.objects.create(public_id="m", backend=first, model="a")
    alias.backend, alias.model = second, "b"
    alias.save()
    (own,) = Deployment.objects.all()
    assert (own.backend, own.model, own.primary) == (second, "b", True)
    # A queryset update() sends no signal: the alias's own still wins when routing.
    ModelAlias.objects.update(model="c")
    read = ModelAlias.objects.prefetch_related("deployments__backend").get()
    assert shared.serving(read)[0].model == "c"


# -- health, on either store ---------------------------------------------------------


def test_a_retry_after_cools_a_deployment_for_that_long_and_only_ever_longer(store):
    limited = deployment()
    ends = tell(limited, failed=True, retry_after=30, rate_limited=True)
    snapshot, state = health(limited)
    assert ends == pytest.approx(snapshot.now + 30, abs=1)
    assert state.cooling(snapshot.now)
    assert state.cooling_until == pytest.approx(ends, abs=0.01)
    tell(limited, failed=True, retry_after=1, rate_limited=True)  # a shorter one later
    assert health(limited)[1].cooling_until == pytest.approx(ends, abs=0.01)


def test_failures_in_a_row_cool_a_deployment_down_with_backoff(store):
    flaky = deployment()
    assert tell(flaky, failed=True) == 0
    tell(flaky, failed=False)  # a success in between: the count starts again
    assert tell(flaky, failed=True) == tell(flaky, failed=True) == 0
    first = tell(flaky, failed=True)
    snapshot, state = health(flaky)
    assert first == pytest.approx(snapshot.now + 2, abs=0.5)  # COOLDOWN_SECONDS
    assert state.failures == 0  # counted afresh after a cooldown
    for _ in range(2):
        tell(flaky, failed=True)
    second = tell(flaky, failed=True)
    assert second == pytest.approx(time.time() + 4, abs=0.5)  # doubled: not back yet


def test_a_share_of_failures_over_the_window_cools_a_deployment(store, settings):
    settings.CHATPARITY["ROUTING"].update(FAILURES=100, MIN_REQUESTS=10, FAILURE_SHARE=0.5)
    mixed = deployment()
    outcomes = [True, False] * 4 + [True]  # 9 requests: too few to judge
    assert not any(tell(mixed, failed=failed) for failed in outcomes)
    assert tell(mixed, failed=True) > 0  # 10 requests, 6 failed
    assert health(mixed)[1].error_share == pytest.approx(0.6)


def test_a_success_under_way_before_a_cooldown_does_not_end_it(store):
    limited = deployment()
    tell(limited, failed=True, retry_after=30)
    tell(limited, failed=False, first_event_ms=5, samples="stream")
    snapshot, state = health(limited)
    assert state.cooling(snapshot.now)


def test_once_its_cooldown_ends_one_request_tries_a_deployment(store):
    back = deployment()
    tell(back, failed=True, retry_after=0.2)
    time.sleep(0.3)
    snapshot, state = health(back)
    assert (state.cooling(snapshot.now), state.half_open, state.probing) == (False, True, False)

    async def claims():
        return await asyncio.gather(*(shared.claim(back, 10) for _ in range(20)))

    assert sum(asyncio.run(claims())) == 1
    assert health(back)[1].probing
    tell(back, failed=False, trial=True, first_event_ms=3, samples="stream")
    state = health(back)[1]
    assert (state.half_open, state.probing, state.cooling_until) == (False, False, 0)


def test_a_failed_trial_cools_the_deployment_again(store):
    back = deployment()
    tell(back, failed=True, retry_after=0.1)
    time.sleep(0.2)
    assert asyncio.run(shared.claim(back, 10))
    assert tell(back, failed=True, trial=True) > time.time()
    state = health(back)[1]
    assert not state.probing  # the trial is over: the next one once this cooldown ends


def test_no_trial_is_claimed_once_the_last_one_cooled_the_deployment_again(store):
    # A request whose snapshot was read while the deployment was half-open, before the
    # trial failed: its claim comes after the trial ended, in a cooldown.
    back = deployment()
    tell(back, failed=True, retry_after=0.1)
    time.sleep(0.2)
    assert health(back)[1].half_open  # what the late request saw
    assert asyncio.run(shared.claim(back, 10))
    tell(back, failed=True, trial=True, retry_after=30, rate_limited=True)
    assert not asyncio.run(shared.claim(back, 10))


def test_a_trial_given_up_may_be_claimed_by_another(store):
    back = deployment()
    tell(back, failed=True, retry_after=0.1)
    time.sleep(0.2)
    assert asyncio.run(shared.claim(back, 10))
    asyncio.run(shared.unclaim(back))
    assert asyncio.run(shared.claim(back, 10))


def test_recent_times_to_first_event_are_kept_by_kind_newest_first(store, settings):
    settings.CHATPARITY["ROUTING"]["LATENCY_SAMPLES"] = 3
    timed = deployment()
    for ms in (10, 20, 30, 40):
        tell(timed, failed=False, first_event_ms=ms, samples="stream")
    tell(timed, failed=False, first_event_ms=999, samples="whole")
    assert health(timed, samples="stream")[1].samples == (40.0, 30.0, 20.0)
    assert health(timed, samples="whole")[1].samples == (999.0,)


def test_a_session_is_remembered_by_the_deployment_that_served_it(store, settings):
    # A fraction of a second is kept a whole one in Django's cache (its Redis backend
    # would drop the fraction, and expire the session at once).
    settings.CHATPARITY["ROUTING"]["STICKY_SECONDS"] = 0.3
    session = shared.session_key(1, "key 1", "conversation")
    assert session != shared.session_key(1, "key 2", "conversation")  # each caller's own
    assert "conversation" not in session
    tell(deployment(pk=7), failed=False, session=session)
    assert health(deployment(), session=session)[0].sticky == 7
    time.sleep(1.1)
    assert health(deployment(), session=session)[0].sticky is None


def test_the_weighted_sequence_moves_on_by_one_per_request(store):
    sequences = [health(deployment(), sequence=True)[0].sequence for _ in range(3)]
    assert sequences == [sequences[0], sequences[0] + 1, sequences[0] + 2]
    assert health(deployment())[0].sequence is None


def test_an_unreachable_store_is_said_so(settings):
    settings.CHATPARITY = {"REDIS_URL": "redis://127.0.0.1:1/0"}
    with pytest.raises(limits.Unavailable):
        health(deployment())


# -- a deployment's own quota ----------------------------------------------------------


def test_a_quota_holds_requests_per_minute_and_in_flight(store):
    quota = limits.Quota("test:quota", requests_per_minute=3, max_in_flight=2)

    async def take():
        return await limits.hold(quota, 10)

    async def run():
        first, second = await take(), await take()
        assert first is not None
        assert second is not None
        assert await take() is None  # two in flight
        await first.settle(Usage(4, 5))
        third = await take()
        assert third is not None
        await second.settle(Usage(0, 0))
        assert await take() is None  # three this minute
        used = await limits.counters().values(list(quota.counters(int(time.time() // 60))))
        return used

    requests, _tokens = asyncio.run(run())
    assert requests == 3


def test_in_flight_is_counted_without_a_limit(store):
    quota = limits.Quota("test:count")
    of = deployment(pk=9)

    async def run():
        held = [await limits.hold(shared.quota(of), 1) for _ in range(5)]
        snapshot = await shared.snapshot([of], 1)
        for hold in held:
            await hold.settle(Usage(1, 1))
        after = await shared.snapshot([of], 1)
        return snapshot, after

    assert quota.max_in_flight is None
    before, after = asyncio.run(run())
    assert before.health[shared.scope(of)].in_flight == 5
    assert after.health[shared.scope(of)].in_flight == 0


def take_quota(url: str, scope: str, seed: int, limit: int, concurrency: int) -> int:
    """As one worker: ``concurrency`` clients taking ``scope``'s quota of ``limit``
    requests a minute (and as many in flight) for a second; how many it admitted."""

    async def client(rng):
        admitted = 0
        deadline = time.monotonic() + 1.0
        while time.monotonic() < deadline:
            quota = limits.Quota(scope, requests_per_minute=limit, max_in_flight=limit // 4)
            hold = await limits.hold(quota, rng.randint(1, 100))
            if hold is not None:
                admitted += 1
                await asyncio.sleep(rng.random() / 200)
                await hold.settle(Usage(1, 1))
        return admitted

    async def clients():
        return await asyncio.gather(*(client(random.Random(seed * 100 + i))
                                      for i in range(concurrency)))  # fmt: skip

    with override_settings(CHATPARITY={"REDIS_URL": url}):
        return sum(asyncio.run(clients()))


def test_two_workers_at_concurrency_64_never_pass_a_quota_together(redis_url):
    scope = f"test:quota:{time.time()}"
    if int(time.time()) % 60 > 57:  # the counted minute must not end mid-test
        time.sleep(3)
    workers = [
        in_a_process(__name__, f"take_quota({redis_url!r}, {scope!r}, {seed}, 400, 32)")
        for seed in (1, 2)
    ]
    admitted = sum(json.loads(worker.communicate()[0]) for worker in workers)
    assert admitted == 400  # every slot of the minute taken, none more
