"""Routing: the deployment of an alias that serves a request, chosen by the alias's
strategy among the first tier available, moved on before the first byte when one
fails, its health and sessions shared through the counters' store."""

import asyncio
import contextlib
import random
from collections import Counter

import orjson
import pytest
from django.core.cache import cache
from django.test import TestCase, override_settings

from chatparity.accounting import deployments as shared
from chatparity.accounting.deployments import Health
from chatparity.conf import DEFAULTS
from chatparity.gateway import routing
from chatparity.gateway.routing import Candidate, by_weight, choose, position
from chatparity.models import ApiKey, Backend, Deployment, ModelAlias, RequestLog, Routing
from tests.scripted import SCRIPTED, ScriptedBackend
from tests.support.counters import OnRedis
from tests.support.upstream import UpstreamTestCase
from tests.support.waiting import until


def candidates(*weights, **healths):
    """Candidates of these weights, named d0, d1, ...; ``healths`` by name."""
    return [
        Candidate(
            Deployment(pk=index + 1, name=f"d{index}", weight=weight),
            healths.get(f"d{index}", Health()),
        )
        for index, weight in enumerate(weights)
    ]


def split(chosen):
    return Counter(candidate.deployment.name for candidate in chosen)


# -- the strategies, on their own ----------------------------------------------------


def test_weights_split_10000_requests_within_2_percent_of_their_proportions():
    group = candidates(1, 2, 1)
    counts = split(by_weight(group, position(n)) for n in range(1, 10_001))
    assert abs(counts["d0"] - 2500) <= 200
    assert abs(counts["d2"] - 2500) <= 200
    assert abs(counts["d1"] - 5000) <= 200
    # The sequence shared by every worker spreads better than chance: within 10.
    assert max(abs(counts[name] - want) for name, want in (("d0", 2500), ("d1", 5000))) <= 10


def test_fractional_weights_are_honoured_not_truncated():
    # Bifrost 5473: a weight under 0.01 was truncated to 0% of the traffic.
    group = candidates(0.005, 1, 0.5)
    counts = split(by_weight(group, position(n)) for n in range(1, 30_001))
    assert counts["d0"] == pytest.approx(30_000 * 0.005 / 1.505, abs=10)
    assert counts["d2"] == pytest.approx(30_000 * 0.5 / 1.505, abs=10)


def test_any_stretch_of_the_sequence_splits_as_the_weights_say():
    # Two workers take turns in one sequence: each stretch of it is as even as the whole.
    group = candidates(3, 1)
    for start in (1, 777, 123_456_789):
        counts = split(by_weight(group, position(n)) for n in range(start, start + 400))
        assert abs(counts["d0"] - 300) <= 3


def test_least_busy_takes_the_fewest_in_flight_relative_to_the_weight():
    group = candidates(1, 1, 2, d0=Health(in_flight=3), d1=Health(in_flight=2),
                       d2=Health(in_flight=3))  # fmt: skip
    assert choose(Routing.LEAST_BUSY, group, 0.0).deployment.name == "d2"  # 1.5 per unit of weight
    group = candidates(1, 1, d0=Health(in_flight=0), d1=Health(in_flight=1))
    assert choose(Routing.LEAST_BUSY, group, 0.9).deployment.name == "d0"


def test_least_busy_breaks_ties_at_random_not_by_order():
    # LiteLLM 39322: ties always went to the first deployment.
    group = candidates(1, 1, 1)
    rng = random.Random(7)
    counts = split(choose(Routing.LEAST_BUSY, group, 0.0, rng=rng) for _ in range(3000))
    assert all(900 <= counts[name] <= 1100 for name in ("d0", "d1", "d2"))


def test_lowest_latency_sends_most_to_the_fastest_and_explores_the_others():
    group = candidates(
        1, 1, d0=Health(samples=(900.0, 1000.0, 1100.0)), d1=Health(samples=(90.0, 100.0, 110.0))
    )
    rng = random.Random(3)
    counts = split(
        choose(Routing.LOWEST_LATENCY, group, 0.5, exploration=0.05, rng=rng) for _ in range(10_000)
    )
    assert 0.93 <= counts["d1"] / 10_000 <= 0.97
    assert counts["d0"] / 10_000 >= 0.03


def test_lowest_latency_ranks_by_the_first_token_not_by_the_answers_length():
    # LiteLLM 40202: the time to first token was divided by the tokens answered, so a
    # slow starter with long answers ranked first. Samples are first-token times only.
    slow_starter = Health(samples=(3000.0,) * 5)
    fast_starter = Health(samples=(1000.0,) * 5)
    group = candidates(1, 1, d0=slow_starter, d1=fast_starter)
    assert choose(Routing.LOWEST_LATENCY, group, 0.0, exploration=0).deployment.name == "d1"


def test_lowest_latency_tries_a_deployment_never_measured_when_it_explores():
    group = candidates(1, 1, 1, d0=Health(samples=(10.0,)), d1=Health(samples=(500.0,)))
    rng = random.Random(1)
    explored = [
        choose(Routing.LOWEST_LATENCY, group, 0.0, exploration=1.0, rng=rng).deployment.name
        for _ in range(50)
    ]
    assert set(explored) == {"d2"}
    unmeasured = candidates(1, 3)
    assert choose(Routing.LOWEST_LATENCY, unmeasured, 0.9).deployment.name == "d1"  # by weight


def test_most_headroom_takes_the_largest_share_of_quota_left():
    group = candidates(1, 1, 1)
    group[0].deployment.requests_per_minute = 100
    group[1].deployment.tokens_per_minute = 1000
    group[2].deployment.max_in_flight = 4
    used = [Health(used_requests=50), Health(used_tokens=300), Health(in_flight=3)]
    group = [Candidate(c.deployment, health) for c, health in zip(group, used, strict=True)]
    assert choose(Routing.MOST_HEADROOM, group, 0.0).deployment.name == "d1"  # 70% left


def test_a_session_is_named_by_its_header_then_by_the_body():
    body = {"user": "u", "safety_identifier": "s", "metadata": {"user_id": "m"},
            "prompt_cache_key": "p"}  # fmt: skip
    assert routing.session_of(body, {"x-session-id": "h"}) == "h"
    assert routing.session_of(body, {}) == "p"
    assert routing.session_of({**body, "prompt_cache_key": None}, {}) == "m"
    assert routing.session_of({"user": "u", "safety_identifier": "s"}, {}) == "s"
    assert routing.session_of({"user": "u"}, {}) == "u"
    assert routing.session_of({"user": 3}, {}) == ""
    assert len(routing.session_of({"user": "x" * 5000}, {})) == routing.MAX_SESSION_CHARS


DEADLINES = [
    ("600", 600.0), ("2.5", 2.5), ("NOT_GIVEN", None), ("-1", None), ("inf", None), ("", None),
]  # fmt: skip


@pytest.mark.parametrize(("sent", "seconds"), DEADLINES)
def test_the_clients_deadline_is_read_from_its_sdks_header(sent, seconds):
    assert routing.client_deadline({"x-stainless-timeout": sent}) == seconds


# -- through the pipeline ------------------------------------------------------------


def settings(**routing_settings):
    """The scripted kinds, with ``CHATPARITY["ROUTING"]`` changed as given."""
    return {**SCRIPTED, "ROUTING": {**DEFAULTS["ROUTING"], **routing_settings}}


@override_settings(CHATPARITY=settings(MAX_WAIT_SECONDS=0))
class RoutedTestCase(TestCase):
    """Scripted backends that say their name (``a``, ``b``, ``c``), fail (``bad``: a
    502), rate-limit (``limited``: a 429 asking for 30 s) or hang (``hung``)."""

    @classmethod
    def setUpTestData(cls):
        cls.key, cls.plaintext = ApiKey.objects.create_key("routed")
        cls.backends = {
            name: Backend.objects.create(name=name, kind="scripted", options=options)
            for name, options in {
                "a": {"script": ["A"]},
                "b": {"script": ["B"]},
                "c": {"script": ["C"]},
                "bad": {"script": ["<error>"]},
                "limited": {"script": ["<rate-limited>"], "retry_after": 30},
                "refusing": {"script": ["<refuse>"]},
                "hung": {"script": ["<hang>"]},
            }.items()
        }

    def setUp(self):
        cache.clear()
        routing.chance.seed(0)

    async def alias(self, public_id, *deployments, **fields):
        """An alias whose deployments are ``deployments``: backend names, or (name,
        fields) pairs; the first is the alias's own backend."""
        specs = [(d, {}) if isinstance(d, str) else d for d in deployments]
        (first, own), *others = specs
        alias = await ModelAlias.objects.acreate(
            public_id=public_id, backend=self.backends[first], **fields
        )
        if own:
            await Deployment.objects.filter(alias=alias, primary=True).aupdate(**own)
        for name, extra in others:
            await Deployment.objects.acreate(alias=alias, backend=self.backends[name], **extra)
        return alias

    async def ask(self, model, headers=None, **body):
        messages = [{"role": "user", "content": "Hi"}]
        response = await self.async_client.post(
            "/v1/chat/completions",
            data=orjson.dumps({"model": model, "messages": messages, **body}),
            content_type="application/json",
            headers={"Authorization": f"Bearer {self.plaintext}", **(headers or {})},
        )
        await routing.told()
        return response

    async def answered_by(self, model, **kwargs):
        response = await self.ask(model, **kwargs)
        assert response.status_code == 200, response.content
        return orjson.loads(response.content)["choices"][0]["message"]["content"]

    async def rows(self):
        return [row async for row in RequestLog.objects.order_by("pk")]


class OneDeploymentTests(RoutedTestCase):
    async def test_an_alias_of_one_backend_is_served_as_before_keeping_no_state(self):
        alias = await self.alias("solo", "a")
        assert [await self.answered_by("solo") for _ in range(3)] == ["A"] * 3
        deployment = await Deployment.objects.aget(alias=alias)
        kept = [f"cp:rt:{alias.pk}:seq", f"{shared.scope(deployment)}:inflight:0"]
        kept += [f"{shared.scope(deployment)}:{name}" for name in ("until", "fails")]
        assert cache.get_many(kept) == {}
        row = (await self.rows())[-1]
        assert (row.backend, row.deployment, row.deployments_tried) == ("a", "a", 1)

    async def test_its_failure_is_answered_as_before(self):
        await self.alias("solo", "bad")
        response = await self.ask("solo")
        assert response.status_code == 502
        assert (await self.rows())[-1].deployments_tried == 1

    async def test_an_upstreams_429_passes_its_retry_after_on(self):
        await self.alias("solo", "limited")
        response = await self.ask("solo")
        assert (response.status_code, response.headers["retry-after"]) == (429, "30")


class GroupTests(RoutedTestCase):
    async def test_weights_split_the_requests(self):
        await self.alias("split", "a", ("b", {"weight": 2}), "c")
        answers = Counter([await self.answered_by("split") for _ in range(200)])
        assert abs(answers["A"] - 50) <= 4
        assert abs(answers["B"] - 100) <= 4

    async def test_a_weight_of_0_drains_a_deployment(self):
        await self.alias("drained", ("a", {"weight": 0}), "b")
        assert {await self.answered_by("drained") for _ in range(20)} == {"B"}

    async def test_a_failure_before_the_first_byte_moves_to_another_deployment(self):
        await self.alias("flaky", "bad", "a")
        assert [await self.answered_by("flaky") for _ in range(6)] == ["A"] * 6
        rows = await self.rows()
        assert {row.deployment for row in rows} == {"a"}
        assert 2 in {row.deployments_tried for row in rows}  # bad was asked first, once

    async def test_a_deployment_that_fails_in_a_row_cools_down(self):
        await self.alias("flaky", "bad", "a")
        for _ in range(10):
            await self.answered_by("flaky")
        tried = [row.deployments_tried for row in await self.rows()]
        assert tried.count(2) == DEFAULTS["ROUTING"]["FAILURES"]  # then it cooled down

    async def test_after_a_429_no_request_asks_the_deployment_for_its_retry_after(self):
        await self.alias("limits", "limited", "a")
        for _ in range(20):
            assert await self.answered_by("limits") == "A"
        tried = [row.deployments_tried for row in await self.rows()]
        assert tried.count(2) == 1

    async def test_a_client_error_is_not_asked_again_elsewhere(self):
        await self.alias("picky", "refusing", ("a", {"weight": 0.000001}))
        response = await self.ask("picky")
        assert response.status_code == 400
        row = (await self.rows())[-1]
        assert (row.deployment, row.deployments_tried) == ("refusing", 1)

    async def test_the_group_spent_turns_to_the_aliases_fallbacks(self):
        await self.alias("rescue", "c")
        self.backends["bad2"] = await Backend.objects.acreate(
            name="bad2", kind="scripted", options={"script": ["<error>"]}
        )
        await self.alias("doomed", "bad", "bad2", fallbacks=["rescue"])
        assert await self.answered_by("doomed") == "C"
        row = (await self.rows())[-1]
        assert (row.alias, row.deployment, row.deployments_tried) == ("rescue", "c", 3)

    async def test_tier_2_serves_only_while_tier_1_has_none_available(self):
        await self.alias("tiers", "limited", ("b", {"tier": 2}))
        assert await self.answered_by("tiers") == "B"  # limited failed, cooling
        await self.alias("healthy", "a", ("b", {"tier": 2}))
        assert {await self.answered_by("healthy") for _ in range(10)} == {"A"}

    async def test_every_deployment_cooling_is_a_503_that_says_when_to_retry(self):
        self.backends["limited2"] = await Backend.objects.acreate(
            name="limited2", kind="scripted",
            options={"script": ["<rate-limited>"], "retry_after": 20},
        )  # fmt: skip
        await self.alias("throttled", "limited", "limited2")
        first = await self.ask("throttled")
        assert first.status_code == 429  # the last deployment's, with its Retry-After
        assert first.headers["retry-after"] in ("20", "30")
        again = await self.ask("throttled")
        assert again.status_code == 503
        assert again.headers["retry-after"] == "20"  # the first deployment back
        assert orjson.loads(again.content)["error"]["code"] == "service_unavailable"

    async def test_a_deployment_at_its_quota_leaves_the_request_to_another(self):
        await self.alias("capped", ("hung", {"max_in_flight": 1}), ("a", {"weight": 0.0001}))
        hanging = asyncio.ensure_future(self.ask("capped", stream=True))
        await until(lambda: ScriptedBackend.hanging)
        deployment = await Deployment.objects.aget(alias__public_id="capped", primary=True)
        snapshot = await shared.snapshot([deployment], deployment.alias_id)
        assert snapshot.health[shared.scope(deployment)].in_flight == 1
        assert await self.answered_by("capped") == "A"
        hanging.cancel()  # its row written now, on this test's connection (PostgreSQL)
        with contextlib.suppress(asyncio.CancelledError):
            await hanging


class WaitingTests(RoutedTestCase):
    @override_settings(CHATPARITY=settings(MAX_WAIT_SECONDS=5))
    async def test_a_request_waits_for_the_first_deployment_back_within_its_deadline(self):
        for name in ("l1", "l2"):
            self.backends[name] = await Backend.objects.acreate(
                name=name, kind="scripted", options={"script": ["<rate-limited>"], "retry_after": 1}
            )
        await self.alias("patient", "l1", "l2")
        assert (await self.ask("patient")).status_code == 429  # both cooling now
        recovered = self.backends["l1"]
        recovered.options = {"script": ["back"]}
        await recovered.asave()
        assert await self.answered_by("patient") == "back"

    @override_settings(CHATPARITY=settings(MAX_WAIT_SECONDS=5))
    async def test_a_request_does_not_wait_past_the_clients_deadline(self):
        for name in ("l1", "l2"):
            self.backends[name] = await Backend.objects.acreate(
                name=name, kind="scripted", options={"script": ["<rate-limited>"], "retry_after": 3}
            )
        await self.alias("hurried", "l1", "l2")
        await self.ask("hurried")
        response = await self.ask("hurried", headers={"x-stainless-timeout": "2"})
        assert response.status_code == 503


class TrialTests(RoutedTestCase):
    async def test_one_request_tries_a_deployment_back_from_its_cooldown(self):
        self.backends["brief"] = await Backend.objects.acreate(
            name="brief",
            kind="scripted",
            options={"script": ["<rate-limited>"], "retry_after": 0.3},
        )
        await self.alias("trial", "brief", "a")
        # Until the weighted choice has asked it once (where the sequence starts
        # depends on the alias's id): it cools down for 0.3 s.
        for _ in range(4):  # of two deployments weighted alike, it is asked within two
            await self.answered_by("trial")
            if (await self.rows())[-1].deployments_tried == 2:
                break
        else:
            raise AssertionError("the weighted choice never asked the cooling deployment")
        first = len(await self.rows())
        # Its trial is refused for longer: however long the 8 take (PostgreSQL is
        # slower), its cooldown cannot end again among them.
        brief = self.backends["brief"]
        brief.options = {**brief.options, "retry_after": 30}
        await brief.asave()
        await asyncio.sleep(0.4)
        answers = await asyncio.gather(*(self.answered_by("trial") for _ in range(8)))
        assert answers == ["A"] * 8
        tried = [row.deployments_tried for row in (await self.rows())[first:]]
        assert tried.count(2) == 1  # one trial, which failed again: the others kept away


class StickyTests(RoutedTestCase):
    async def test_a_sessions_turns_go_to_one_deployment_while_it_is_healthy(self):
        await self.alias("sticky", "a", "b", "c", sticky_sessions="on")
        for session in ("s1", "s2", "s3", "s4"):
            served = {
                await self.answered_by("sticky", headers={"x-session-id": session})
                for _ in range(10)
            }
            assert len(served) == 1

    async def test_a_session_moves_when_its_deployment_cools_down(self):
        flaky = self.backends["a"]
        await self.alias("sticky", ("a", {"weight": 1000}), "b", sticky_sessions="on")
        headers = {"x-session-id": "s"}
        assert await self.answered_by("sticky", headers=headers) == "A"
        flaky.options = {"script": ["<rate-limited>"], "retry_after": 30}
        await flaky.asave()
        moved = [await self.answered_by("sticky", headers=headers) for _ in range(5)]
        assert moved == ["B"] * 5

    async def test_sessions_do_not_stick_when_the_alias_says_so(self):
        await self.alias("loose", "a", "b", sticky_sessions="off")
        served = {await self.answered_by("loose", headers={"x-session-id": "s"}) for _ in range(8)}
        assert served == {"A", "B"}


class WireTests(RoutedTestCase):
    async def test_responses_and_messages_are_routed_as_chat_is(self):
        await self.alias("wires", "bad", "a")
        headers = {"Authorization": f"Bearer {self.plaintext}"}
        for path, body in (
            ("/v1/responses", {"model": "wires", "input": "Hi"}),
            ("/v1/messages", {"model": "wires", "max_tokens": 5,
                              "messages": [{"role": "user", "content": "Hi"}]}),
        ):  # fmt: skip
            response = await self.async_client.post(
                path, data=body, content_type="application/json", headers=headers
            )
            assert response.status_code == 200, response.content
        assert {row.deployment for row in await self.rows()} == {"a"}

    async def test_embeddings_are_routed_as_chat_is(self):
        for name, script in (("e-bad", ["<error>"]), ("e-good", ["x"])):
            self.backends[name] = await Backend.objects.acreate(
                name=name, kind="scripted-embedder", options={"script": script}
            )
        await self.alias("vectors", "e-bad", "e-good")
        response = await self.async_client.post(
            "/v1/embeddings",
            data={"model": "vectors", "input": "hi"},
            content_type="application/json",
            headers={"Authorization": f"Bearer {self.plaintext}"},
        )
        assert response.status_code == 200, response.content
        assert (await self.rows())[-1].deployment == "e-good"


class OnRedisGroupTests(OnRedis, GroupTests):
    """The same, the shared state in Redis."""


class OnRedisStickyTests(OnRedis, StickyTests):
    """The same, the shared state in Redis."""


class OnRedisTrialTests(OnRedis, TrialTests):
    """The same, the shared state in Redis."""


class UpstreamGroupTests(UpstreamTestCase):
    """Deployments of the ``openai`` kind, over HTTP to a misbehaving upstream."""

    async def group(self, *models):
        alias = await ModelAlias.objects.acreate(
            public_id="group", backend=self.backend, model=models[0]
        )
        for model in models[1:]:
            await Deployment.objects.acreate(alias=alias, backend=self.backend, model=model)

    async def test_a_deployment_that_fails_is_not_asked_again_by_its_backend(self):
        # Its own retries would delay the request: another deployment serves it instead.
        await self.group("server-error", "canonical")
        for _ in range(3):
            response = await self.post("group", stream=True)
            assert self.text(await self.stream_of(response)) == "Hello world"
            await routing.told()
        tried = [row.deployments_tried async for row in RequestLog.objects.all()]
        assert self.upstream.attempts["server-error"] == tried.count(2) >= 1

    async def test_an_upstreams_retry_after_cools_its_deployment_for_that_long(self):
        await self.group("retry-after", "canonical")
        for _ in range(4):
            assert (await self.post("group")).status_code == 200
            await routing.told()
        assert self.upstream.attempts["retry-after"] == 1
        own = await Deployment.objects.aget(alias__public_id="group", primary=True)
        snapshot = await shared.snapshot([own], own.alias_id)
        cooling = snapshot.health[shared.scope(own)].cooling_until - snapshot.now
        assert 6 < cooling <= 7
