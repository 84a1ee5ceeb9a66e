"""A slow backend keeps its client informed: keepalive comments while it starts, a
first-byte timeout when it never does, and a row that says what the client got."""

import asyncio
import re
import time

import httpx
import openai
import orjson
from asgiref.testing import ApplicationCommunicator
from django.core.asgi import get_asgi_application
from django.test import TestCase, override_settings

from chatparity.backends.base import BackendConfig
from chatparity.gateway.pipeline import KEEPALIVE
from chatparity.models import ApiKey, Backend, ModelAlias, RequestLog
from chatparity.protocol.errors import APIError
from chatparity.protocol.events import Finish, TextDelta, Usage
from chatparity.transport.fastpath import FastPath
from tests.asgi import FastPathTestCase, http_scope, reply_body
from tests.backends import faulty_upstream
from tests.scripted import SCRIPTED


class SlowStartBackend:
    """Waits ``options["delay"]`` seconds (forever when None) before its first event, then
    answers ``options["text"]``, or fails with the HTTP status ``options["fail"]``."""

    system_fingerprint = "fp_slow"
    stopped: list[str] = []  # names of the backends whose wait was cut short

    def __init__(self, config: BackendConfig) -> None:
        self.config = config

    async def stream(self, request, model):
        options = self.config.options
        delay = options["delay"]
        try:
            await (asyncio.Event().wait() if delay is None else asyncio.sleep(delay))
        except asyncio.CancelledError:
            SlowStartBackend.stopped.append(self.config.name)
            raise
        if "fail" in options:
            raise APIError("upstream is overloaded", status=options["fail"], type="server_error")
        yield TextDelta(0, options["text"])
        yield Finish(0, "stop")
        yield Usage(prompt_tokens=1, completion_tokens=1)


SETTINGS = {
    "BACKEND_CLASSES": {"slow": "tests.gateway.test_pipeline.SlowStartBackend"},
    "KEEPALIVE_SECONDS": 0.05,
    "FIRST_BYTE_TIMEOUT": 1.0,
}


def keepalives_then_data(content):
    """The keepalive comments before the first data frame, and the data frames."""
    frames = [frame + b"\n\n" for frame in content.split(b"\n\n")[:-1]]
    comments = [frame for frame in frames if frame.startswith(b":")]
    data = [frame for frame in frames if frame.startswith((b"data: ", b"event: "))]
    assert frames == comments + data, "keepalives come before the first data frame only"
    return comments, [frame.split(b"data: ", 1)[1][:-2] for frame in data]


class ChatCompletions:
    """Mixed into a gateway test class: its requests ask ``/v1/chat/completions``."""

    path = "/v1/chat/completions"

    @staticmethod
    def request(model, **body):
        return {"model": model, "messages": [{"role": "user", "content": "Hi"}], **body}


class Responses:
    """Mixed into a gateway test class: its requests ask ``/v1/responses``."""

    path = "/v1/responses"

    @staticmethod
    def request(model, **body):
        return {"model": model, "input": "Hi", **body}


class GatewayTestCase(TestCase):
    """Requests through the ASGI fast path, timed, to the endpoint a mixin names
    (:class:`ChatCompletions`, :class:`Responses`)."""

    def setUp(self):
        self.application = FastPath(get_asgi_application())

    async def send(self, model, **body):
        headers = [("authorization", f"Bearer {self.plaintext}")]
        scope = http_scope("POST", self.path, headers)
        communicator = ApplicationCommunicator(self.application, scope)
        request = orjson.dumps(self.request(model, **body))
        await communicator.send_input({"type": "http.request", "body": request})
        return communicator

    async def ask(self, model, **body):
        """The response's start, when it came (seconds after the request), and its body."""
        sent = time.perf_counter()
        communicator = await self.send(model, **body)
        start = await communicator.receive_output(timeout=10)
        started = time.perf_counter() - sent
        body = await reply_body(communicator)
        await communicator.wait(timeout=10)
        return start, started, body

    async def row(self):
        return await RequestLog.objects.aget()


class SlowBackend:
    """Mixed into a gateway test class: aliases of slow backends, and what any endpoint
    does with them."""

    @classmethod
    def setUpTestData(cls):
        cls.key, cls.plaintext = ApiKey.objects.create_key("tests")

        def alias(name, fallbacks=(), **options):
            backend = Backend.objects.create(name=name, kind="slow", options=options)
            ModelAlias.objects.create(public_id=name, backend=backend, fallbacks=list(fallbacks))

        alias("fast", delay=0, text="quick")
        alias("slow", delay=0.5, text="late")
        alias("silent", delay=None)
        alias("refusing", delay=0.2, fail=400)
        alias("overloaded-then-slow", delay=0.2, fail=503, fallbacks=["slow"])

    def setUp(self):
        super().setUp()
        SlowStartBackend.stopped.clear()

    async def test_a_slow_request_that_is_invalid_still_gets_its_status(self):
        start, _, content = await self.ask("slow", stream=True, temperature=7)
        assert start["status"] == 400
        assert orjson.loads(content)["error"]["param"] == "temperature"

    @override_settings(CHATPARITY={**SETTINGS, "KEEPALIVE_SECONDS": 5.0, "FIRST_BYTE_TIMEOUT": 0.2})
    async def test_a_timeout_before_the_first_keepalive_is_a_504(self):
        start, started, content = await self.ask("silent", stream=True)
        assert start["status"] == 504
        assert 0.2 <= started < 2
        assert orjson.loads(content)["error"]["code"] == "request_timeout"
        row = await self.row()
        assert (row.status_code, row.error_code) == (504, "request_timeout")

    @override_settings(CHATPARITY={**SETTINGS, "FIRST_BYTE_TIMEOUT": 0.2})
    async def test_a_non_stream_request_whose_backend_never_answers_is_a_504(self):
        start, started, content = await self.ask("silent")
        assert start["status"] == 504
        assert 0.2 <= started < 2
        error = orjson.loads(content)["error"]
        assert (error["type"], error["code"]) == ("timeout_error", "request_timeout")
        assert SlowStartBackend.stopped == ["silent"]
        row = await self.row()
        assert (row.status_code, row.error_code) == (504, "request_timeout")

    async def test_a_client_that_leaves_during_keepalives_stops_the_backend(self):
        communicator = await self.send("silent", stream=True)
        start = await communicator.receive_output(timeout=10)
        assert start["status"] == 200
        assert (await communicator.receive_output(timeout=10))["body"] == KEEPALIVE
        await communicator.send_input({"type": "http.disconnect"})
        await communicator.wait(timeout=10)
        assert SlowStartBackend.stopped == ["silent"]
        row = await self.row()
        assert (row.status_code, row.cancelled) == (200, True)

    @override_settings(CHATPARITY={**SETTINGS, "FIRST_BYTE_TIMEOUT": 5.0})
    async def test_a_client_gone_before_the_early_headers_stops_the_backend(self):
        body = orjson.dumps(self.request("silent", stream=True))
        messages = [{"type": "http.request", "body": body}]

        async def receive():
            return messages.pop() if messages else await asyncio.Event().wait()

        async def send(message):
            raise OSError("the connection is gone")

        scope = http_scope("POST", self.path, [("authorization", f"Bearer {self.plaintext}")])
        began = time.perf_counter()
        await self.application(scope, receive, send)
        assert time.perf_counter() - began < 2.5  # not the first-byte timeout's 5 s
        assert SlowStartBackend.stopped == ["silent"]
        row = await self.row()
        assert (row.status_code, row.cancelled) == (200, True)


@override_settings(CHATPARITY=SETTINGS)
class SlowChatTests(ChatCompletions, SlowBackend, GatewayTestCase):
    """Chat completions wait for a slow backend in chunks and data frames."""

    async def test_a_fast_backend_sends_no_keepalive(self):
        start, _, content = await self.ask("fast", stream=True)
        assert start["status"] == 200
        comments, data = keepalives_then_data(content)
        assert comments == []
        assert data[-1] == b"[DONE]"

    async def test_a_slow_stream_gets_its_headers_and_keepalives_until_its_first_event(self):
        start, started, content = await self.ask("slow", stream=True)
        assert start["status"] == 200
        assert dict(start["headers"])[b"content-type"] == b"text/event-stream; charset=utf-8"
        assert started < 0.4  # the backend's first event comes after 0.5 s
        comments, data = keepalives_then_data(content)
        assert len(comments) >= 3
        assert set(comments) == {KEEPALIVE}
        deltas = [orjson.loads(frame)["choices"][0]["delta"] for frame in data[:-1]]
        assert "".join(delta.get("content") or "" for delta in deltas) == "late"
        assert data[-1] == b"[DONE]"
        row = await self.row()
        assert (row.status_code, row.error_code, row.completion_tokens) == (200, "", 1)

    async def test_openais_client_reads_a_kept_alive_stream_as_any_other(self):
        sent = []

        async def recording(scope, receive, send):
            async def record(message):
                sent.append(message.get("body", b""))
                await send(message)

            await self.application(scope, receive, record)

        http = httpx.AsyncClient(transport=httpx.ASGITransport(app=recording))
        client = openai.AsyncOpenAI(
            api_key=self.plaintext, base_url="http://testserver/v1", http_client=http
        )
        async with client:
            stream = await client.chat.completions.create(
                model="slow", messages=[{"role": "user", "content": "Hi"}], stream=True
            )
            chunks = [chunk async for chunk in stream]
        assert "".join(chunk.choices[0].delta.content or "" for chunk in chunks) == "late"
        assert chunks[-1].choices[0].finish_reason == "stop"
        assert b"".join(sent).startswith(KEEPALIVE)

    async def test_a_fallback_serves_while_only_keepalives_were_sent(self):
        start, _, content = await self.ask("overloaded-then-slow", stream=True)
        assert start["status"] == 200
        comments, data = keepalives_then_data(content)
        assert comments
        assert orjson.loads(data[1])["choices"][0]["delta"]["content"] == "late"
        row = await self.row()
        assert (row.alias, row.status_code, row.error_code) == ("slow", 200, "")

    async def test_a_failure_after_keepalives_is_an_error_frame_and_the_row_says_200(self):
        start, _, content = await self.ask("refusing", stream=True)
        assert start["status"] == 200
        comments, data = keepalives_then_data(content)
        assert comments
        assert [orjson.loads(data[0])["error"]["message"], data[1]] == [
            "upstream is overloaded",
            b"[DONE]",
        ]
        row = await self.row()
        assert (row.status_code, row.error_type) == (200, "server_error")

    async def test_a_stream_whose_backend_never_answers_ends_with_a_504_frame(self):
        start, _, content = await self.ask("silent", stream=True)
        assert start["status"] == 200
        comments, data = keepalives_then_data(content)
        assert len(comments) >= 10
        error = orjson.loads(data[0])["error"]
        assert (error["type"], error["code"], data[1:]) == (
            "timeout_error", "request_timeout", [b"[DONE]"],
        )  # fmt: skip
        assert SlowStartBackend.stopped == ["silent"]
        row = await self.row()
        assert (row.status_code, row.error_code, row.cancelled) == (200, "request_timeout", False)


@override_settings(CHATPARITY={**SETTINGS, "FIRST_BYTE_TIMEOUT": 0.5})
class SilentUpstreamTests(ChatCompletions, GatewayTestCase):
    """An upstream that accepts the connection and never answers (its backend's own
    timeout ten minutes away): the client hears keepalives, then a 504, in
    ``FIRST_BYTE_TIMEOUT``."""

    @classmethod
    def setUpClass(cls):
        cls.upstream, stop = faulty_upstream.start("")
        cls.addClassCleanup(stop)
        super().setUpClass()

    @classmethod
    def setUpTestData(cls):
        cls.key, cls.plaintext = ApiKey.objects.create_key("tests")
        backend = Backend.objects.create(
            name="faulty", kind="openai", base_url=cls.upstream.base_url, timeout=600
        )
        ModelAlias.objects.create(public_id="silent-upstream", backend=backend, model="silent")

    async def test_a_stream_hears_keepalives_then_a_504_frame(self):
        start, started, content = await self.ask("silent-upstream", stream=True)
        assert start["status"] == 200
        assert started < 0.4
        comments, data = keepalives_then_data(content)
        assert len(comments) >= 5
        assert orjson.loads(data[0])["error"]["code"] == "request_timeout"
        row = await self.row()
        assert (row.status_code, row.error_code) == (200, "request_timeout")

    async def test_a_request_that_does_not_stream_gets_a_504_in_time(self):
        start, started, content = await self.ask("silent-upstream")
        assert start["status"] == 504
        assert 0.5 <= started < 3
        assert orjson.loads(content)["error"]["code"] == "request_timeout"


@override_settings(CHATPARITY=SETTINGS)
class SlowBackendThroughViewsTests(TestCase):
    """The Django views (no fast path) keep a slow stream alive the same way."""

    @classmethod
    def setUpTestData(cls):
        _, cls.plaintext = ApiKey.objects.create_key("tests")
        backend = Backend.objects.create(
            name="slow", kind="slow", options={"delay": 0.2, "text": "late"}
        )
        ModelAlias.objects.create(public_id="slow", backend=backend)

    async def test_a_slow_stream_gets_keepalives_through_the_views(self):
        response = await self.async_client.post(
            "/v1/chat/completions",
            data={"model": "slow", "stream": True, "messages": [{"role": "user", "content": "Hi"}]},
            content_type="application/json",
            headers={"Authorization": f"Bearer {self.plaintext}"},
        )
        content = b"".join([part async for part in response.streaming_content])
        comments, data = keepalives_then_data(content)
        assert comments
        assert data[-1] == b"[DONE]"


@override_settings(CHATPARITY=SETTINGS)
class SlowResponsesTests(Responses, SlowBackend, GatewayTestCase):
    """The Responses API waits for a slow backend the same way, in its own events."""

    async def test_a_slow_response_gets_keepalives_then_its_events(self):
        start, started, content = await self.ask("slow", stream=True)
        assert (start["status"], started < 0.4) == (200, True)
        comments, data = keepalives_then_data(content)
        assert len(comments) >= 3
        events = [orjson.loads(frame) for frame in data]
        assert [event["type"] for event in events[:2]] == [
            "response.created",
            "response.in_progress",
        ]
        assert events[-1]["response"]["output"][0]["content"][0]["text"] == "late"
        row = await self.row()
        assert (row.endpoint, row.completion_id) == ("responses", events[-1]["response"]["id"])

    async def test_a_response_failing_after_keepalives_is_created_then_failed(self):
        start, _, content = await self.ask("refusing", stream=True)
        assert start["status"] == 200
        comments, data = keepalives_then_data(content)
        assert comments
        events = [orjson.loads(frame) for frame in data]
        assert [event["type"] for event in events] == [
            "response.created",
            "response.in_progress",
            "response.failed",
        ]
        assert [event["sequence_number"] for event in events] == [0, 1, 2]
        assert events[-1]["response"]["error"] == {
            "code": "server_error",
            "message": "upstream is overloaded",
        }
        row = await self.row()
        assert (row.status_code, row.error_type) == (200, "server_error")


@override_settings(CHATPARITY=SCRIPTED)
class ChatIdTests(FastPathTestCase):
    """Every id the chat wire hands out is OpenAI's form, streamed or not."""

    @classmethod
    def setUpTestData(cls):
        super().setUpTestData()
        backend = Backend.objects.create(
            name="weather",
            kind="scripted",
            options={"script": [{"call": "get_weather", "arguments": "{}"}]},
        )
        ModelAlias.objects.create(public_id="weather", backend=backend)

    async def test_completion_request_and_tool_call_ids_are_openais_form(self):
        tool = {"type": "function", "function": {"name": "get_weather"}}
        start, content = await self.ask(model="weather", tools=[tool])
        answer = orjson.loads(content)
        streamed_start, streamed = await self.ask(model="weather", tools=[tool], stream=True)
        chunks = [
            orjson.loads(frame.removeprefix(b"data: "))
            for frame in streamed.split(b"\n\n")
            if frame.startswith(b"data: {")
        ]
        for made in (answer["id"], *(chunk["id"] for chunk in chunks)):
            assert re.fullmatch(r"chatcmpl-[A-Za-z0-9]{29}", made)
        for headers in (start["headers"], streamed_start["headers"]):
            assert re.fullmatch(rb"req_[0-9a-f]{32}", dict(headers)[b"x-request-id"])
        (call,) = answer["choices"][0]["message"]["tool_calls"]
        (opened,) = chunks[0]["choices"][0]["delta"]["tool_calls"]
        assert call["id"] == opened["id"] == "call_" + "0" * 24  # the backend's, kept


class ModelsLogTests(FastPathTestCase):
    """GET /v1/models leaves a row like any request past authentication: unbilled, and
    under no limit (it asks no model anything)."""

    async def get(self, path, headers=None):
        start, content, communicator = await self.exchange("GET", path, headers=headers)
        await communicator.wait(timeout=10)
        return start["status"], orjson.loads(content)

    async def test_listing_and_retrieving_leave_a_row_each_that_costs_nothing(self):
        assert (await self.get("/v1/models"))[0] == 200
        assert (await self.get("/v1/models/ECHO"))[0] == 200
        assert (await self.get("/v1/models/made-up"))[0] == 404
        rows = [row async for row in RequestLog.objects.order_by("id")]
        assert [(row.endpoint, row.status_code, row.alias) for row in rows] == [
            ("models", 200, ""),
            ("models", 200, "echo"),
            ("models", 404, "unknown"),  # a name made up is never stored
        ]
        assert {(row.total_tokens, row.cost, row.key_prefix) for row in rows} == {
            (0, 0, self.key.prefix)
        }

    async def test_a_key_past_its_requests_per_minute_still_lists_models(self):
        await ApiKey.objects.filter(pk=self.key.pk).aupdate(requests_per_minute=1)
        start, _ = await self.ask()
        assert start["status"] == 200
        for _ in range(3):
            status, answer = await self.get("/v1/models")
            assert status == 200, answer
        start, _ = await self.ask()
        assert start["status"] == 429
        assert await RequestLog.objects.filter(endpoint="models").acount() == 3

    async def test_a_wrong_key_leaves_no_row(self):
        status, _ = await self.get("/v1/models", headers=[("authorization", "Bearer sk-nope")])
        assert status == 401
        assert not await RequestLog.objects.aexists()
