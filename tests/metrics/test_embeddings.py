"""The metrics count embeddings requests as they count the others: by endpoint
``embeddings``, with their input tokens and cost, and no time to a first token."""

import orjson
from django.core.cache import cache
from django.test import TestCase
from prometheus_client import REGISTRY

from chatparity import signals
from chatparity.metrics.instruments import Metrics, flush
from chatparity.models import ApiKey, Backend, ModelAlias


def sample(name, **labels):
    flush()
    return REGISTRY.get_sample_value(name, labels) or 0.0


class EmbeddingsMetricsTests(TestCase):
    @classmethod
    def setUpTestData(cls):
        cls.key, cls.plaintext = ApiKey.objects.create_key("metrics")
        backend = Backend.objects.create(name="embedder-metrics", kind="embedder")
        ModelAlias.objects.create(
            public_id="embed-metered", backend=backend, input_price=500_000
        )  # half a dollar a token

    def setUp(self):
        cache.clear()
        observer = Metrics()
        signals.observe(observer)
        self.addCleanup(signals.unobserve, observer)

    async def test_an_embeddings_request_is_counted_by_its_endpoint(self):
        labels = {
            "endpoint": "embeddings",
            "alias": "embed-metered",
            "backend": "embedder-metrics",
            "status_class": "2xx",
            "stream": "false",
        }
        first = {"endpoint": "embeddings", "alias": "embed-metered"}
        before = (
            sample("chatparity_requests_total", **labels),
            sample("chatparity_tokens_total", alias="embed-metered", kind="prompt"),
            sample("chatparity_cost_total", alias="embed-metered"),
            sample("chatparity_time_to_first_token_seconds_count", **first),
        )
        response = await self.async_client.post(
            "/v1/embeddings",
            data=orjson.dumps({"model": "embed-metered", "input": ["one two", "three"]}),
            content_type="application/json",
            headers={"Authorization": f"Bearer {self.plaintext}"},
        )
        assert response.status_code == 200
        after = (
            sample("chatparity_requests_total", **labels),
            sample("chatparity_tokens_total", alias="embed-metered", kind="prompt"),
            sample("chatparity_cost_total", alias="embed-metered"),
            sample("chatparity_time_to_first_token_seconds_count", **first),
        )
        assert [b - a for a, b in zip(before, after, strict=True)] == [1, 3, 1.5, 0]
