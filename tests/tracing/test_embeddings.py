"""An embeddings request's spans: the GenAI ``embeddings`` operation, its input tokens,
and never a vector or an input, even when the site traces content."""

from unittest import mock

import orjson
from django.core.cache import cache
from django.test import TestCase, override_settings
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind

from chatparity import signals
from chatparity.models import ApiKey, Backend, ModelAlias
from chatparity.tracing import spans
from chatparity.tracing.spans import Tracing


@override_settings(CHATPARITY={"TRACE_CONTENT": True})
class EmbeddingsSpanTests(TestCase):
    @classmethod
    def setUpTestData(cls):
        cls.key, cls.plaintext = ApiKey.objects.create_key("traced")
        backend = Backend.objects.create(name="embedder-traced", kind="embedder")
        ModelAlias.objects.create(public_id="embed-traced", backend=backend, model="minilm")

    def setUp(self):
        cache.clear()
        self.exporter = InMemorySpanExporter()
        provider = TracerProvider()
        provider.add_span_processor(SimpleSpanProcessor(self.exporter))
        patched = mock.patch.object(spans, "tracer", provider.get_tracer("tests"))
        patched.start()
        self.addCleanup(patched.stop)
        observer = Tracing()
        signals.observe(observer)
        self.addCleanup(signals.unobserve, observer)

    async def test_an_embeddings_request_is_an_embeddings_span_without_content(self):
        response = await self.async_client.post(
            "/v1/embeddings",
            data=orjson.dumps({"model": "embed-traced", "input": "a secret sentence"}),
            content_type="application/json",
            headers={"Authorization": f"Bearer {self.plaintext}"},
        )
        assert response.status_code == 200
        exported = self.exporter.get_finished_spans()
        request = next(span for span in exported if span.kind == SpanKind.SERVER)
        backend = next(span for span in exported if span.kind == SpanKind.CLIENT)
        assert request.name == "embeddings embed-traced"
        assert backend.name == "embeddings minilm"
        attributes = request.attributes
        assert attributes["gen_ai.operation.name"] == "embeddings"
        assert attributes["chatparity.endpoint"] == "embeddings"
        assert attributes["gen_ai.usage.input_tokens"] == 3
        everything = repr([dict(span.attributes) for span in exported])
        assert "secret" not in everything
