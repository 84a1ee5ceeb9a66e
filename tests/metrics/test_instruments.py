"""The metrics count what requests did: by endpoint, configured alias, backend, status
class and stream; their tokens, cost, latency and the gateway's own time; refusals,
upstream retries, fallbacks, log rows and cache lookups."""

import orjson
from django.core.cache import cache
from django.test import TestCase, override_settings
from prometheus_client import REGISTRY, CollectorRegistry, Histogram

from chatparity import signals
from chatparity.gateway import routing
from chatparity.metrics.instruments import Metrics, _Tally, flush
from chatparity.models import ApiKey, Backend, Deployment, ModelAlias
from tests.scripted import SCRIPTED
from tests.support.upstream import UpstreamTestCase


def sample(name, **labels):
    """The value of the sample ``name`` with ``labels``, 0 when none was recorded yet
    (what this process's requests added applied first, as a scrape does)."""
    flush()
    return REGISTRY.get_sample_value(name, labels) or 0.0


class Samples:
    """Samples read before a test, to compare with after (the registry is the process's)."""

    def __init__(self, *names_and_labels):
        self.before = {key: sample(key[0], **dict(key[1])) for key in names_and_labels}

    def added(self, name, **labels):
        key = (name, tuple(sorted(labels.items())))
        return sample(name, **labels) - self.before.get(key, 0.0)


def key_of(name, **labels):
    return (name, tuple(sorted(labels.items())))


def observe_metrics(test):
    """Have :class:`Metrics` observe requests during ``test``, as ``chatparity.metrics``
    installs it."""
    observer = Metrics()
    signals.observe(observer)
    test.addCleanup(signals.unobserve, observer)


class ObservedTestCase(TestCase):
    """Requests with :class:`Metrics` observing them, as ``chatparity.metrics`` installs it."""

    def setUp(self):
        cache.clear()
        observe_metrics(self)

    def post(self, model, *, key=None, **body):
        return self.async_client.post(
            "/v1/chat/completions",
            data=orjson.dumps(
                {"model": model, "messages": [{"role": "user", "content": "Hi"}], **body}
            ),
            content_type="application/json",
            headers={"Authorization": f"Bearer {key or self.plaintext}"},
        )


@override_settings(CHATPARITY=SCRIPTED)
class RequestMetricsTests(ObservedTestCase):
    @classmethod
    def setUpTestData(cls):
        cls.key, cls.plaintext = ApiKey.objects.create_key("metrics")
        backend = Backend.objects.create(
            name="scripted-metrics", kind="scripted", options={"script": ["Hello", " you"]}
        )
        cls.alias = ModelAlias.objects.create(
            public_id="metered",
            backend=backend,
            input_price=500_000,  # USD per million tokens
            output_price=250_000,
        )
        failing = Backend.objects.create(
            name="scripted-failing", kind="scripted", options={"script": ["<error>"]}
        )
        ModelAlias.objects.create(public_id="failing", backend=failing, fallbacks=["metered"])
        midway = Backend.objects.create(
            name="scripted-midway", kind="scripted", options={"script": ["Hi", "<error>"]}
        )
        ModelAlias.objects.create(public_id="midway", backend=midway)
        caching = Backend.objects.create(
            name="scripted-caching", kind="scripted",
            options={"script": ["Hello"], "provider": "anthropic",
                     "usage": {"prompt_tokens": 1000, "cached_tokens": 600, "reasoning_tokens": 1,
                               "cache_write_5m_tokens": 100, "cache_write_1h_tokens": 200}},
        )  # fmt: skip
        ModelAlias.objects.create(public_id="caching", backend=caching, input_price=500_000,
                                  output_price=500_000)  # fmt: skip

    async def test_tokens_are_counted_by_kind_and_the_cost_at_the_providers_formula(self):
        kinds = ("prompt", "completion", "cache_read", "cache_write_5m", "cache_write_1h",
                 "reasoning")  # fmt: skip
        before = Samples(
            *(key_of("chatparity_tokens_total", alias="caching", kind=kind) for kind in kinds),
            key_of("chatparity_cost_total", alias="caching"),
        )
        assert (await self.post("caching")).status_code == 200
        added = [before.added("chatparity_tokens_total", alias="caching", kind=kind)
                 for kind in kinds]  # fmt: skip
        assert added == [1000, 1, 600, 100, 200, 1]
        # (100 + 600 x 0.1 + 100 x 1.25 + 200 x 2 + 1) x $0.50
        assert before.added("chatparity_cost_total", alias="caching") == 343.0

    async def test_a_request_is_counted_with_its_labels_tokens_cost_and_times(self):
        labels = {
            "endpoint": "chat.completions",
            "alias": "metered",
            "backend": "scripted-metrics",
            "status_class": "2xx",
            "stream": "false",
        }
        before = Samples(
            key_of("chatparity_requests_total", **labels),
            key_of("chatparity_tokens_total", alias="metered", kind="prompt"),
            key_of("chatparity_tokens_total", alias="metered", kind="completion"),
            key_of("chatparity_cost_total", alias="metered"),
            key_of(
                "chatparity_request_duration_seconds_count",
                endpoint="chat.completions",
                alias="metered",
                stream="false",
            ),
            key_of(
                "chatparity_time_to_first_token_seconds_count",
                endpoint="chat.completions",
                alias="metered",
            ),
            key_of(
                "chatparity_overhead_seconds_count", endpoint="chat.completions", stream="false"
            ),
            key_of("chatparity_log_rows_total", outcome="written"),
        )
        in_flight = sample("chatparity_requests_in_flight")
        response = await self.post("metered")
        assert response.status_code == 200
        assert before.added("chatparity_requests_total", **labels) == 1
        assert before.added("chatparity_tokens_total", alias="metered", kind="prompt") == 1
        assert before.added("chatparity_tokens_total", alias="metered", kind="completion") == 2
        assert before.added("chatparity_cost_total", alias="metered") == 1.0  # 0.5 + 2 x 0.25
        duration = {"endpoint": "chat.completions", "alias": "metered", "stream": "false"}
        assert before.added("chatparity_request_duration_seconds_count", **duration) == 1
        first = {"endpoint": "chat.completions", "alias": "metered"}
        assert before.added("chatparity_time_to_first_token_seconds_count", **first) == 1
        overhead = {"endpoint": "chat.completions", "stream": "false"}
        assert before.added("chatparity_overhead_seconds_count", **overhead) == 1
        assert before.added("chatparity_log_rows_total", outcome="written") == 1
        assert sample("chatparity_requests_in_flight") == in_flight
        assert sample("chatparity_log_rows_pending") == 0

    async def test_a_message_is_counted_under_the_messages_endpoint(self):
        labels = {
            "endpoint": "messages",
            "alias": "metered",
            "backend": "scripted-metrics",
            "status_class": "2xx",
            "stream": "true",
        }
        before = Samples(key_of("chatparity_requests_total", **labels))
        body = {"model": "metered", "max_tokens": 8, "stream": True,
                "messages": [{"role": "user", "content": "Hi"}]}  # fmt: skip
        response = await self.async_client.post(
            "/v1/messages", data=orjson.dumps(body), content_type="application/json",
            headers={"x-api-key": self.plaintext},
        )  # fmt: skip
        assert response.status_code == 200
        async for _ in response.streaming_content:
            pass
        assert before.added("chatparity_requests_total", **labels) == 1

    async def test_models_no_alias_serves_fold_into_one_label(self):
        labels = {
            "endpoint": "chat.completions",
            "alias": "unknown",
            "backend": "",
            "status_class": "4xx",
            "stream": "true",
        }
        before = Samples(key_of("chatparity_requests_total", **labels))
        for model in ("made-up-1", "made-up-2"):
            response = await self.post(model, stream=True)
            assert response.status_code == 404
        assert before.added("chatparity_requests_total", **labels) == 2
        assert sample("chatparity_requests_total", **{**labels, "alias": "made-up-1"}) == 0

    async def test_a_backend_failing_before_its_first_event_counts_and_falls_back(self):
        before = Samples(
            key_of(
                "chatparity_backend_errors_total",
                backend="scripted-failing",
                when="before_first_event",
            ),
            key_of("chatparity_fallbacks_total", backend="scripted-failing"),
        )
        response = await self.post("failing")
        assert response.status_code == 200
        assert (
            before.added(
                "chatparity_backend_errors_total",
                backend="scripted-failing",
                when="before_first_event",
            )
            == 1
        )
        assert before.added("chatparity_fallbacks_total", backend="scripted-failing") == 1

    async def test_a_backend_failing_midway_counts(self):
        labels = {"backend": "scripted-midway", "when": "midway"}
        before = Samples(key_of("chatparity_backend_errors_total", **labels))
        response = await self.post("midway", stream=True)
        assert b'"error"' in b"".join([part async for part in response.streaming_content])
        assert before.added("chatparity_backend_errors_total", **labels) == 1

    async def test_refusals_are_counted_by_the_limits_kind(self):
        await ModelAlias.objects.filter(pk=self.alias.pk).aupdate(requests_per_minute=1)
        before = Samples(key_of("chatparity_rate_limited_total", kind="requests"))
        assert (await self.post("metered")).status_code == 200
        assert (await self.post("metered")).status_code == 429
        assert before.added("chatparity_rate_limited_total", kind="requests") == 1

    async def test_key_and_alias_lookups_count_hits_and_misses(self):
        before = Samples(
            key_of("chatparity_cache_lookups_total", cache="key", result="miss"),
            key_of("chatparity_cache_lookups_total", cache="key", result="hit"),
        )
        await self.post("metered")
        await self.post("metered")
        assert before.added("chatparity_cache_lookups_total", cache="key", result="miss") == 1
        assert before.added("chatparity_cache_lookups_total", cache="key", result="hit") == 1


class UpstreamRetryTests(UpstreamTestCase):
    def setUp(self):
        super().setUp()
        observe_metrics(self)

    async def test_each_upstream_retry_is_counted_by_backend(self):
        before = Samples(key_of("chatparity_upstream_retries_total", backend="faulty"))
        assert (await self.ask("flaky")).status_code == 200
        assert self.upstream.attempts["flaky"] == 3
        assert before.added("chatparity_upstream_retries_total", backend="faulty") == 2


def test_a_tallied_histogram_reads_as_one_observed_directly():
    registry = CollectorRegistry()
    direct = Histogram("direct", "", buckets=(0.001, 0.01, 0.1), registry=registry)
    tallied = Histogram("tallied", "", buckets=(0.001, 0.01, 0.1), registry=registry)
    tally = _Tally()
    for value in (0.0, 0.001, 0.0011, 0.01, 0.05, 0.1, 0.2, 30.0):
        direct.observe(value)
        tally.observe(tallied, value)
    tally.flush()
    samples = {
        s.name: s.value for m in registry.collect() for s in m.samples if "le" not in s.labels
    }
    buckets = {
        (s.name.split("_")[0], s.labels["le"]): s.value
        for m in registry.collect()
        for s in m.samples
        if "le" in s.labels
    }
    assert samples["direct_sum"] == samples["tallied_sum"]
    assert samples["direct_count"] == samples["tallied_count"] == 8
    for (name, le), value in buckets.items():
        assert buckets[("tallied" if name == "direct" else "direct", le)] == value


@override_settings(CHATPARITY=SCRIPTED)
class DeploymentMetricsTests(ObservedTestCase):
    """Each deployment of an alias: how it answered, how fast, how often it cooled down."""

    @classmethod
    def setUpTestData(cls):
        cls.key, cls.plaintext = ApiKey.objects.create_key("deployments")
        backends = {
            name: Backend.objects.create(name=f"m-{name}", kind="scripted", options=options)
            for name, options in {
                "good": {"script": ["Hi"]},
                "bad": {"script": ["<error>"]},
                "limited": {"script": ["<rate-limited>"], "retry_after": 60},
            }.items()
        }
        alias = ModelAlias.objects.create(public_id="spread", backend=backends["bad"])
        Deployment.objects.create(alias=alias, backend=backends["limited"])
        Deployment.objects.create(alias=alias, backend=backends["good"], weight=0.001)

    async def test_each_deployments_answers_failures_and_cooldowns_are_counted(self):
        names = ("answered", "failed", "rate_limited")
        counted = [
            key_of("chatparity_deployment_requests_total", alias="spread",
                   deployment=f"m-{backend}", outcome=outcome)
            for backend, outcome in zip(("good", "bad", "limited"), names, strict=True)
        ]  # fmt: skip
        cooled = key_of("chatparity_deployment_cooldowns_total", alias="spread",
                        deployment="m-limited")  # fmt: skip
        timed = key_of("chatparity_deployment_first_event_seconds_count", alias="spread",
                       deployment="m-good")  # fmt: skip
        before = Samples(*counted, cooled, timed)
        for _ in range(4):
            assert (await self.post("spread")).status_code == 200
            await routing.told()

        def added(key):
            return before.added(key[0], **dict(key[1]))

        assert [added(key) for key in counted] == [4, 3, 1]  # bad failed 3 times: cooled
        assert (added(cooled), added(timed)) == (1, 4)
