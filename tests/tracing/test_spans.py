"""A request's spans, as OpenTelemetry's SDK exports them: one ``chat {model}`` span with
the GenAI attributes, children for its admission, each backend call and its log write;
the backend call's context reaches the upstream as ``traceparent``; no prompt or
completion text unless the site opts in."""

from unittest import mock

import orjson
from django.core.cache import cache
from django.test import override_settings
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from chatparity import signals
from chatparity.models import ModelAlias, RequestLog
from chatparity.tracing import spans
from chatparity.tracing.spans import Tracing
from tests.support.upstream import UpstreamTestCase


class TracedTestCase(UpstreamTestCase):
    """Requests to the faulty upstream, traced by the SDK into memory."""

    @classmethod
    def setUpTestData(cls):
        super().setUpTestData()
        ModelAlias.objects.create(public_id="up-canonical", backend=cls.backend, model="canonical")
        ModelAlias.objects.create(
            public_id="up-broken",
            backend=cls.backend,
            model="server-error",
            fallbacks=["up-canonical"],
        )

    def setUp(self):
        super().setUp()
        cache.clear()
        self.upstream.heads.clear()
        self.exporter = InMemorySpanExporter()
        provider = TracerProvider()
        provider.add_span_processor(SimpleSpanProcessor(self.exporter))
        patched = mock.patch.object(spans, "tracer", provider.get_tracer("tests"))
        patched.start()
        self.addCleanup(patched.stop)
        observer = Tracing()
        signals.observe(observer)
        self.addCleanup(signals.unobserve, observer)

    def finished(self):
        """The exported spans, and the request's among them (the one of kind SERVER)."""
        exported = self.exporter.get_finished_spans()
        return exported, next(span for span in exported if span.kind == SpanKind.SERVER)


class SpanTests(TracedTestCase):
    async def test_a_request_is_one_span_with_its_children_and_genai_attributes(self):
        response = await self.post("up-canonical", temperature=0.5, max_tokens=20)
        assert response.status_code == 200
        exported, request = self.finished()
        assert request.name == "chat up-canonical"
        attributes = request.attributes
        assert attributes["gen_ai.operation.name"] == "chat"
        assert attributes["gen_ai.request.model"] == "up-canonical"
        assert attributes["gen_ai.response.model"] == "up-canonical"
        assert attributes["gen_ai.usage.input_tokens"] == 5
        assert attributes["gen_ai.usage.output_tokens"] == 2
        assert attributes["gen_ai.response.finish_reasons"] == ("stop",)
        assert attributes["gen_ai.request.temperature"] == 0.5
        assert attributes["gen_ai.request.max_tokens"] == 20
        assert attributes["gen_ai.response.id"] == response.json()["id"]
        assert attributes["http.response.status_code"] == 200
        children = {span.name: span for span in exported if span is not request}
        assert set(children) == {"chatparity.admission", "chat canonical", "chatparity.log"}
        for child in children.values():
            assert child.parent.span_id == request.context.span_id
            assert child.context.trace_id == request.context.trace_id
        backend = children["chat canonical"]
        assert backend.kind == SpanKind.CLIENT
        assert backend.attributes["gen_ai.request.model"] == "canonical"
        assert backend.attributes["chatparity.backend"] == "faulty"
        assert backend.attributes["gen_ai.usage.output_tokens"] == 2

    async def test_the_upstream_request_carries_the_backend_calls_traceparent(self):
        response = await self.post("up-canonical", stream=True)
        assert response.status_code == 200
        b"".join([part async for part in response.streaming_content])
        exported, _ = self.finished()
        backend = next(span for span in exported if span.kind == SpanKind.CLIENT)
        trace_id = f"{backend.context.trace_id:032x}"
        span_id = f"{backend.context.span_id:016x}"
        # Flags: sampled, and (W3C level 2) a random trace id.
        assert f"traceparent: 00-{trace_id}-{span_id}-03" in self.upstream.heads["canonical"]

    async def post_traced(self, flags):
        """A completion whose client sent a traceparent with ``flags``: (trace, span) ids."""
        trace_id, span_id = "0af7651916cd43dd8448eb211c80319c", "b7ad6b7169203331"
        response = await self.async_client.post(
            "/v1/chat/completions",
            data=orjson.dumps(
                {"model": "up-canonical", "messages": [{"role": "user", "content": "Hi"}]}
            ),
            content_type="application/json",
            headers={
                "Authorization": f"Bearer {self.plaintext}",
                "traceparent": f"00-{trace_id}-{span_id}-{flags}",
            },
        )
        assert response.status_code == 200
        return int(trace_id, 16), int(span_id, 16)

    @override_settings(CHATPARITY={"TRACE_CLIENT_PARENT": True})
    async def test_a_trusted_clients_traceparent_makes_the_request_part_of_its_trace(self):
        trace_id, span_id = await self.post_traced("01")
        exported, request = self.finished()
        assert request.context.trace_id == trace_id
        assert request.parent.span_id == span_id
        assert {span.context.trace_id for span in exported} == {trace_id}

    async def test_a_clients_traceparent_is_linked_to_not_followed(self):
        # Security round 3: "-01" forced sampling in a trace id the client chose.
        trace_id, span_id = await self.post_traced("01")
        exported, request = self.finished()
        assert request.context.trace_id != trace_id
        assert request.parent is None
        [link] = request.links
        assert (link.context.trace_id, link.context.span_id) == (trace_id, span_id)
        assert {span.context.trace_id for span in exported} == {request.context.trace_id}

    async def test_a_client_cannot_keep_its_requests_out_of_sampled_traces(self):
        # Security round 3: "-00" left the request unsampled under a parent-based sampler.
        trace_id, _ = await self.post_traced("00")
        _, request = self.finished()
        assert request.context.trace_flags.sampled
        assert request.links[0].context.trace_id == trace_id

    async def test_a_failed_backend_and_its_fallback_are_two_calls(self):
        response = await self.post("up-broken")
        assert response.status_code == 200
        exported, request = self.finished()
        calls = [span for span in exported if span.kind == SpanKind.CLIENT]
        assert [span.name for span in calls] == ["chat server-error", "chat canonical"]
        assert calls[0].status.status_code == StatusCode.ERROR
        assert calls[1].status.status_code == StatusCode.UNSET
        assert request.attributes["gen_ai.request.model"] == "up-canonical"

    async def test_a_refused_request_is_an_error_span(self):
        response = await self.post("no-such-model")
        assert response.status_code == 404
        _, request = self.finished()
        assert request.name == "chat unknown"  # never a name the client made up
        assert request.status.status_code == StatusCode.ERROR
        assert request.attributes["error.type"] == "model_not_found"
        assert request.attributes["http.response.status_code"] == 404

    async def test_no_prompt_or_completion_text_by_default(self):
        await self.post("up-canonical")
        _, request = self.finished()
        assert not {"gen_ai.input.messages", "gen_ai.output.messages"} & set(request.attributes)
        assert "Hello world" not in orjson.dumps(dict(request.attributes)).decode()

    @override_settings(CHATPARITY={"TRACE_CONTENT": True})
    async def test_the_text_is_on_the_span_when_the_site_opts_in_and_not_in_the_log(self):
        await self.post("up-canonical")
        _, request = self.finished()
        prompt = orjson.loads(request.attributes["gen_ai.input.messages"])
        assert prompt == [{"role": "user", "content": "Hi"}]
        assert "Hello world" in request.attributes["gen_ai.output.messages"]
        row = await RequestLog.objects.aget(alias="up-canonical")
        assert (row.request_body, row.response_body) == (None, "")


class WithoutTracingTests(UpstreamTestCase):
    async def test_no_traceparent_reaches_the_upstream(self):
        self.upstream.heads.clear()
        response = await self.ask("canonical")
        assert response.status_code == 200
        assert "traceparent" not in self.upstream.heads["canonical"]
