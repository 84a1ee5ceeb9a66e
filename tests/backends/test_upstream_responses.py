"""The ``openai`` backend with ``wire_api: responses``: an upstream that speaks the
Responses API natively is called on ``/responses`` and its typed events read back into
the same events, whichever endpoint the client called, with the chat path's distrust."""

import asyncio
import contextlib
import json

import orjson
import pytest
from django.test import TestCase, override_settings

from chatparity.backends.upstream import UpstreamBackend
from chatparity.models import ApiKey, Backend, ModelAlias, RequestLog
from tests.backends.faulty_upstream import _json, _stream
from tests.support.loopback import Loopback, read_request
from tests.support.upstream import frames

SECRET = "sk-native-secret-0000"


def event(kind, **fields):
    return f"event: {kind}\ndata: {json.dumps({'type': kind, **fields})}\n\n"


def response(status="completed", output=(), usage=None, **fields):
    return {"id": "resp_up", "object": "response", "status": status, "output": list(output),
            "usage": usage, **fields}  # fmt: skip


USAGE = {
    "input_tokens": 5,
    "input_tokens_details": {"cached_tokens": 1},
    "output_tokens": 2,
    "output_tokens_details": {"reasoning_tokens": 0},
    "total_tokens": 7,
}
MESSAGE = {
    "id": "msg_up",
    "type": "message",
    "role": "assistant",
    "status": "completed",
    "content": [{"type": "output_text", "text": "Hello world", "annotations": []}],
}
CALL = {
    "id": "fc_up",
    "type": "function_call",
    "call_id": "call_up",
    "name": "get_weather",
    "arguments": '{"city":"Paris"}',
    "status": "completed",
}
TEXT = [
    event("response.created", response=response("in_progress")),
    event("response.output_item.added", output_index=0, item={**MESSAGE, "content": []}),
    event("response.output_text.delta", item_id="msg_up", output_index=0, delta="Hello"),
    event("response.output_text.delta", item_id="msg_up", output_index=0, delta=" world"),
    event("response.output_text.done", item_id="msg_up", output_index=0, text="Hello world"),
    event("response.output_item.done", output_index=0, item=MESSAGE),
    event("response.completed", response=response(output=[MESSAGE], usage=USAGE)),
]
CALLING = [
    event("response.created", response=response("in_progress")),
    event("response.output_item.added", output_index=0, item={**CALL, "arguments": ""}),
    event("response.function_call_arguments.delta", item_id="fc_up", delta='{"city":'),
    event("response.function_call_arguments.delta", item_id="fc_up", delta='"Paris"}'),
    event("response.function_call_arguments.done", item_id="fc_up", arguments=CALL["arguments"]),
    event("response.output_item.done", output_index=0, item=CALL),
    event("response.completed", response=response(output=[CALL], usage=USAGE)),
]
SEARCHED = {"id": "ws_up", "type": "web_search_call", "status": "completed",
            "action": {"type": "search", "query": "weather Paris"}}  # fmt: skip
NAMESPACED = {**CALL, "name": "agents__close", "arguments": "{}"}
BEHAVIOURS = {
    "text": lambda w: _stream(w, TEXT),
    "calling": lambda w: _stream(w, CALLING),
    # A hosted tool run upstream (its item is not relayed), then a namespace's function
    # called by the flat name it was offered under.
    "searching": lambda w: _stream(
        w,
        [
            event("response.created", response=response("in_progress")),
            event("response.output_item.added", output_index=0, item=SEARCHED),
            event("response.output_item.done", output_index=0, item=SEARCHED),
            event("response.output_item.done", output_index=1, item=NAMESPACED),
            event("response.completed", response=response(output=[SEARCHED, NAMESPACED])),
        ],
    ),
    # Only the done events, no deltas: the text is still all there.
    "done-only": lambda w: _stream(w, [TEXT[0], TEXT[4], TEXT[5], TEXT[6]]),
    "incomplete": lambda w: _stream(
        w,
        [
            *TEXT[:3],
            event(
                "response.incomplete",
                response=response(
                    "incomplete", usage=USAGE, incomplete_details={"reason": "max_output_tokens"}
                ),
            ),
        ],
    ),
    "failed": lambda w: _stream(
        w,
        [
            *TEXT[:3],
            event(
                "response.failed",
                response=response(
                    "failed",
                    error={"code": "server_error", "message": "upstream at 10.0.0.7 broke"},
                ),
            ),
        ],
    ),
    "failed-first": lambda w: _stream(
        w, [event("error", code="invalid_prompt", message="no", param=None)]
    ),
    "whole": lambda w: _json(w, 200, response(output=[MESSAGE], usage=USAGE)),
    "huge-usage": lambda w: _stream(
        w,
        [
            *TEXT[:-1],
            event(
                "response.completed",
                response=response(usage={**USAGE, "output_tokens": 3_000_000_000}),
            ),
        ],
    ),
    "silent-end": lambda w: _stream(w, TEXT[:4]),  # no completed event: finished all the same
}


class NativeUpstream(Loopback):
    """A loopback server answering ``/v1/responses`` as the request's model says; it keeps
    each request's path and body by model."""

    def __init__(self):
        self.requests = {}
        super().__init__(self._answer)

    async def _answer(self, reader, writer):
        with contextlib.suppress(ConnectionError, asyncio.IncompleteReadError):
            path, body = await read_request(reader)
            self.requests.setdefault(body["model"], []).append((path, body))
            await BEHAVIOURS[body["model"]](writer)
        writer.close()


class NativeResponsesTests(TestCase):
    @classmethod
    def setUpClass(cls):
        cls.upstream = NativeUpstream()
        cls.addClassCleanup(cls.upstream.stop)
        super().setUpClass()

    @classmethod
    def setUpTestData(cls):
        cls.key, cls.plaintext = ApiKey.objects.create_key("tests")
        cls.backend = Backend.objects.create(
            name="native", kind="openai", base_url=f"http://127.0.0.1:{cls.upstream.port}/v1",
            secret=SECRET, timeout=5, options={"wire_api": "responses", "retries": 0},
        )  # fmt: skip
        for behaviour in BEHAVIOURS:
            ModelAlias.objects.create(public_id=behaviour, backend=cls.backend, model=behaviour)

    def post(self, path, **body):
        return self.async_client.post(
            path,
            data=orjson.dumps(body),
            content_type="application/json",
            headers={"Authorization": f"Bearer {self.plaintext}"},
        )

    def chat(self, model, **body):
        return self.post(
            "/v1/chat/completions",
            model=model,
            messages=[{"role": "user", "content": "Hi"}],
            **body,
        )

    def sent(self, model):
        """The path and body of the last request the upstream got for ``model``."""
        return self.upstream.requests[model][-1]

    async def test_a_chat_completion_is_asked_on_responses_streamed_and_not_stored(self):
        completion = (await self.chat("text", temperature=0.5, max_tokens=20)).json()
        assert completion["choices"][0]["message"]["content"] == "Hello world"
        assert completion["choices"][0]["finish_reason"] == "stop"
        assert completion["usage"]["prompt_tokens_details"]["cached_tokens"] == 1
        path, body = self.sent("text")
        assert path == "/v1/responses"
        assert body == {
            "model": "text",
            "input": [
                {"type": "message", "role": "user",
                 "content": [{"type": "input_text", "text": "Hi"}]}
            ],
            "stream": True,
            "store": False,
            "temperature": 0.5,
            "max_output_tokens": 20,
        }  # fmt: skip
        row = await RequestLog.objects.aget()
        assert (row.total_tokens, row.usage_counted) == (7, False)

    async def test_a_response_is_served_from_the_upstreams_events(self):
        answer = (await self.post("/v1/responses", model="text", input="Hi")).json()
        assert answer["output"][0]["content"][0]["text"] == "Hello world"
        assert answer["id"] != "resp_up"  # the gateway's own ids
        assert answer["usage"]["input_tokens"] == 5

    async def test_a_function_call_and_its_answer_go_both_ways(self):
        tool = {"type": "function", "function": {"name": "get_weather", "parameters": {}}}
        completion = (await self.chat("calling", tools=[tool], stream=True)).streaming_content
        chunks = frames(b"".join([part async for part in completion]))
        calls = [c["choices"][0]["delta"].get("tool_calls") for c in chunks[:-1] if c["choices"]]
        first = next(call for call in calls if call)[0]
        assert (first["id"], first["function"]["name"]) == ("call_up", "get_weather")
        arguments = "".join(
            call[0]["function"].get("arguments", "") for call in calls if call is not None
        )
        assert arguments == '{"city":"Paris"}'
        assert chunks[-2]["choices"][0]["finish_reason"] == "tool_calls"
        _, body = self.sent("calling")
        assert body["tools"] == [
            {"type": "function", "name": "get_weather", "description": None,
             "parameters": {"type": "object", "properties": {}}, "strict": False}
        ]  # fmt: skip
        assert body["tool_choice"] == "auto"

    async def test_hosted_tools_are_passed_on_when_the_alias_says_so(self):
        agents = {"type": "namespace", "name": "agents", "description": "Sub-agents.",
                  "tools": [{"type": "function", "name": "close", "strict": False}]}  # fmt: skip
        search = {"type": "web_search", "external_web_access": False}
        # Defaults read into the request as the alias serves it keep them too.
        await ModelAlias.objects.filter(public_id="searching").aupdate(
            default_params={"temperature": 0.5}
        )
        passing = "".join(("pa", "ss"))  # as read from a file: a string made at run time
        with override_settings(CHATPARITY={"HOSTED_TOOLS": {"*": "refuse", "SEARCHING": passing}}):
            answer = await self.post(
                "/v1/responses", model="searching", input="Hi", tools=[agents, search]
            )
        assert answer.status_code == 200
        (call,) = answer.json()["output"]
        assert (call["name"], call["namespace"], call["call_id"]) == ("close", "agents", "call_up")
        _, body = self.sent("searching")
        assert body["temperature"] == 0.5
        assert body["tools"] == [
            {"type": "function", "name": "agents__close", "description": None,
             "parameters": {"type": "object", "properties": {}}, "strict": False},
            search,
        ]  # fmt: skip

    async def test_hosted_tools_never_reach_the_upstream_unless_its_alias_passes_them(self):
        # A key holder naming the deployer's vector stores, files and an MCP server of
        # their own: run on the deployer's upstream account if passed on.
        hosted = [
            {"type": "file_search", "vector_store_ids": ["vs_the_deployers"]},
            {"type": "code_interpreter", "container": {"type": "auto", "file_ids": ["file-x"]}},
            {"type": "mcp", "server_label": "mine", "server_url": "https://attacker.example/mcp",
             "require_approval": "never"},
        ]  # fmt: skip
        for policies in ({}, {"*": "omit"}, {"*": "pass", "searching": "omit"}):
            with override_settings(CHATPARITY={"HOSTED_TOOLS": policies}):
                answer = await self.post(
                    "/v1/responses", model="searching", input="Hi", tools=hosted
                )
            assert answer.status_code == 200, answer.content
            _, body = self.sent("searching")
            assert "tools" not in body, policies
            row = await RequestLog.objects.alatest("created_at")
            assert row.omitted_tools == ["file_search", "code_interpreter", "mcp"]
        asked = len(self.upstream.requests["searching"])
        with override_settings(CHATPARITY={"HOSTED_TOOLS": {"*": "refuse"}}):
            answer = await self.post("/v1/responses", model="searching", input="Hi", tools=hosted)
        assert answer.status_code == 400
        assert answer.json()["error"]["code"] == "unsupported_value"
        assert len(self.upstream.requests["searching"]) == asked

    async def test_earlier_calls_and_their_outputs_are_sent_as_items(self):
        call = {"id": "call_1", "type": "function",
                "function": {"name": "get_weather", "arguments": "{}"}}  # fmt: skip
        await self.post(
            "/v1/chat/completions",
            model="text",
            messages=[
                {"role": "system", "content": "Be brief."},
                {"role": "user", "content": "Weather?"},
                {"role": "assistant", "content": None, "tool_calls": [call]},
                {"role": "tool", "tool_call_id": "call_1", "content": "Sunny"},
            ],
        )
        _, body = self.sent("text")
        assert [item.get("role") or item["type"] for item in body["input"]] == [
            "system",
            "user",
            "function_call",
            "function_call_output",
        ]
        assert body["input"][2] == {
            "type": "function_call", "call_id": "call_1", "name": "get_weather", "arguments": "{}"
        }  # fmt: skip
        assert body["input"][3]["output"] == "Sunny"

    async def test_done_events_alone_still_carry_the_whole_text(self):
        completion = (await self.chat("done-only")).json()
        assert completion["choices"][0]["message"]["content"] == "Hello world"

    async def test_an_incomplete_response_finishes_for_length(self):
        completion = (await self.chat("incomplete")).json()
        assert completion["choices"][0]["finish_reason"] == "length"

    async def test_a_failed_response_midway_is_an_error_frame_in_our_words(self):
        response = await self.chat("failed", stream=True)
        chunks = frames(b"".join([part async for part in response.streaming_content]))
        error = chunks[-2]["error"]
        assert chunks[-1] == "[DONE]"
        assert error["code"] == "server_error"
        assert "10.0.0.7" not in error["message"]

    async def test_an_error_event_before_anything_keeps_its_code(self):
        response = await self.chat("failed-first")
        assert response.status_code == 502
        assert response.json()["error"]["code"] == "invalid_prompt"

    async def test_a_whole_response_is_read_too(self):
        completion = (await self.chat("whole")).json()
        assert completion["choices"][0]["message"]["content"] == "Hello world"
        assert completion["usage"]["completion_tokens"] == 2

    async def test_usage_that_cannot_be_believed_is_counted(self):
        await self.chat("huge-usage")
        row = await RequestLog.objects.aget()
        assert (row.completion_tokens, row.usage_counted) == (2, True)

    async def test_a_stream_that_ends_without_its_last_event_is_finished(self):
        completion = (await self.chat("silent-end")).json()
        assert completion["choices"][0]["message"]["content"] == "Hello world"
        assert completion["choices"][0]["finish_reason"] == "stop"

    async def test_n_choices_are_asked_for_one_by_one(self):
        await ModelAlias.objects.filter(public_id="text").aupdate(max_n=2)
        completion = (await self.chat("text", n=2)).json()
        assert [c["message"]["content"] for c in completion["choices"]] == ["Hello world"] * 2
        assert all("n" not in body for _, body in self.upstream.requests["text"][-2:])


def test_wire_api_is_chat_or_responses():
    UpstreamBackend.check_options({"wire_api": "responses"})
    with pytest.raises(ValueError, match="wire_api"):
        UpstreamBackend.check_options({"wire_api": "grpc"})
