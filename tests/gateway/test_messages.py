"""/v1/messages and /v1/messages/count_tokens: Anthropic's Messages API on the one
pipeline, through the ASGI fast path and the Django views, behind the same keys,
limits and log as chat, answering in Anthropic's envelope."""

import re

import orjson
from django.test import override_settings

from chatparity.models import ApiKey, Backend, ModelAlias, RequestLog
from chatparity.protocol.messages_stream import PING
from tests.asgi import FastPathTestCase
from tests.scripted import SCRIPTED, ScriptedBackend

HI = [{"role": "user", "content": "Hi"}]
WEATHER = {
    "name": "get_weather",
    "description": "The weather in a city.",
    "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}},
}
SETTINGS = {**SCRIPTED, "KEEPALIVE_SECONDS": 0.05, "FIRST_BYTE_TIMEOUT": 0.3}


def alias(name, *script, **fields):
    backend = Backend.objects.create(name=name, kind="scripted", options={"script": list(script)})
    return ModelAlias.objects.create(public_id=name, backend=backend, **fields)


def parse_events(content):
    """The events of a Messages stream, each checked to name its type on its event line."""
    events = []
    for frame in content.split(b"\n\n")[:-1]:
        kind, data = frame.split(b"\n")
        event = orjson.loads(data.removeprefix(b"data: "))
        assert kind == b"event: " + event["type"].encode()
        events.append(event)
    return events


@override_settings(CHATPARITY=SETTINGS)
class MessagesTestCase(FastPathTestCase):
    @classmethod
    def setUpTestData(cls):
        super().setUpTestData()
        alias("weather", {"call": "get_weather", "arguments": '{"city": "Paris"}'})
        alias("broken", "Hel", "<error>")
        alias("stuck", "<hang>")

    async def post(self, path="/v1/messages", body=None, headers=None, query_string=""):
        """The status, headers and body the fast path answers."""
        if headers is None:
            headers = [("x-api-key", self.plaintext), ("anthropic-version", "2023-06-01")]
        start, answer, communicator = await self.exchange(
            "POST", path, orjson.dumps(body) if body is not None else b"", headers, query_string
        )
        await communicator.wait(timeout=10)
        return start["status"], {k.decode(): v.decode() for k, v in start["headers"]}, answer

    async def create(self, **body):
        request = {"model": "echo", "max_tokens": 64, "messages": HI, **body}
        status, headers, content = await self.post(body=request)
        return (
            status,
            headers,
            (parse_events(content) if body.get("stream") else orjson.loads(content)),
        )


class CreateTests(MessagesTestCase):
    async def test_a_message_is_the_accumulated_answer_with_its_usage(self):
        status, headers, message = await self.create(model="ECHO")
        assert status == 200
        assert message["id"].startswith("msg_")
        assert (message["type"], message["role"], message["model"]) == (
            "message",
            "assistant",
            "ECHO",
        )
        assert message["content"] == [{"type": "text", "text": "Hello there"}]
        assert (message["stop_reason"], message["stop_sequence"]) == ("end_turn", None)
        assert message["usage"]["output_tokens"] == 2
        assert headers["request-id"] == headers["x-request-id"]
        row = await RequestLog.objects.aget(request_id=headers["request-id"])
        assert (row.endpoint, row.status_code, row.alias, row.completion_id) == (
            "messages",
            200,
            "echo",
            message["id"],
        )

    async def test_a_stream_is_anthropics_named_events_adding_up_to_the_message(self):
        status, headers, events = await self.create(stream=True)
        assert status == 200
        assert headers["content-type"].startswith("text/event-stream")
        assert [event["type"] for event in events] == [
            "message_start",
            "content_block_start",
            "content_block_delta",
            "content_block_delta",
            "content_block_stop",
            "message_delta",
            "message_stop",
        ]
        assert "".join(
            e["delta"]["text"] for e in events if e["type"] == "content_block_delta"
        ) == ("Hello there")
        row = await RequestLog.objects.aget(request_id=headers["request-id"])
        assert (row.endpoint, row.stream, row.completion_id) == (
            "messages",
            True,
            events[0]["message"]["id"],
        )

    async def test_ids_are_anthropics_alike_in_a_stream_and_a_message(self):
        _, headers, message = await self.create(model="weather", tools=[WEATHER])
        _, streamed_headers, events = await self.create(
            model="weather", tools=[WEATHER], stream=True
        )
        streamed = events[0]["message"]["id"]
        for made in (message["id"], streamed):
            assert re.fullmatch(r"msg_01[1-9A-HJ-NP-Za-km-z]{22}", made)
        for sent in (headers, streamed_headers):
            assert re.fullmatch(r"req_01[1-9A-HJ-NP-Za-km-z]{22}", sent["request-id"])
            assert sent["x-request-id"] == sent["request-id"]
        assert message["id"] != streamed
        started = [e["content_block"] for e in events if e["type"] == "content_block_start"]
        assert (
            [block["id"] for block in started]
            == [message["content"][0]["id"]]
            == [
                "toolu_" + "0" * 24  # the backend's call_ and 24: its 24 kept
            ]
        )

    async def test_a_tool_use_and_its_result_reach_the_backend_with_its_own_call_id(self):
        _, _, message = await self.create(model="weather", tools=[WEATHER])
        (use,) = message["content"]
        assert use == {
            "type": "tool_use",
            "id": "toolu_" + "0" * 24,
            "name": "get_weather",
            "input": {"city": "Paris"},
        }
        assert message["stop_reason"] == "tool_use"
        answered = [
            *HI,
            {"role": "assistant", "content": [use]},
            {
                "role": "user",
                "content": [{"type": "tool_result", "tool_use_id": use["id"], "content": "Sunny"}],
            },
        ]
        ScriptedBackend.asked.clear()
        status, _, message = await self.create(messages=answered, tools=[WEATHER])
        assert status == 200
        assert message["content"] == [{"type": "text", "text": "Hello there"}]
        (asked,) = ScriptedBackend.asked
        calling, result = asked.messages[1:]
        assert [call["id"] for call in calling.tool_calls] == ["call_" + "0" * 24]
        assert result.tool_call_id == "call_" + "0" * 24

    async def test_claude_codes_way_of_asking_is_served(self):
        """Bearer auth, ?beta=true, beta headers, system blocks, adaptive thinking."""
        headers = [
            ("authorization", f"Bearer {self.plaintext}"),
            ("anthropic-version", "2023-06-01"),
            ("anthropic-beta", "claude-code-20250219,context-management-2025-06-27"),
            ("user-agent", "claude-cli/2.1.328 (external, sdk-cli)"),
        ]
        body = {
            "model": "echo",
            "max_tokens": 128000,
            "system": [
                {
                    "type": "text",
                    "text": "You are Claude Code.",
                    "cache_control": {"type": "ephemeral"},
                }
            ],
            "messages": HI,
            "thinking": {"type": "adaptive", "display": "omitted"},
            "context_management": {"edits": [{"type": "clear_thinking_20251015", "keep": "all"}]},
            "output_config": {"effort": "medium"},
            "metadata": {"user_id": "{}"},
            "stream": True,
        }
        status, headers, content = await self.post(
            body=body, headers=headers, query_string="beta=true"
        )
        assert status == 200
        assert parse_events(content)[-1] == {"type": "message_stop"}
        row = await RequestLog.objects.aget(request_id=headers["request-id"])
        assert row.user_agent.startswith("claude-cli/")

    async def test_the_views_answer_as_the_fast_path(self):
        response = await self.async_client.post(
            "/v1/messages?beta=true",
            data={"model": "echo", "max_tokens": 8, "messages": HI},
            content_type="application/json",
            headers={"x-api-key": self.plaintext},
        )
        assert response.status_code == 200
        assert response.json()["content"] == [{"type": "text", "text": "Hello there"}]
        assert response["request-id"].startswith("req_")


class ErrorTests(MessagesTestCase):
    async def assert_error(self, status, kind, *, path="/v1/messages", body=None, headers=None):
        got, answer_headers, content = await self.post(path, body, headers)
        error = orjson.loads(content)
        assert got == status, error
        assert set(error) == {"type", "error", "request_id"}
        assert error["type"] == "error"
        assert error["error"]["type"] == kind
        assert error["request_id"] == answer_headers["request-id"]
        return error["error"]["message"], answer_headers

    async def test_no_key_or_a_wrong_one_is_an_authentication_error(self):
        message, _ = await self.assert_error(401, "authentication_error", headers=[])
        assert message == "x-api-key header is required"
        await self.assert_error(
            401, "authentication_error", headers=[("x-api-key", "sk-nope-nope")]
        )
        await self.assert_error(
            401, "authentication_error", headers=[("authorization", "Bearer sk-nope")]
        )
        assert not await RequestLog.objects.aexists()

    async def test_an_invalid_body_is_an_invalid_request_error_with_a_row(self):
        message, headers = await self.assert_error(
            400, "invalid_request_error", body={"model": "echo", "messages": HI}
        )
        assert message == "Missing required parameter: 'max_tokens'."
        row = await RequestLog.objects.aget(request_id=headers["request-id"])
        assert (row.endpoint, row.status_code) == ("messages", 400)
        # No JSON at all: still a row of this endpoint's.
        _, headers = await self.assert_error(400, "invalid_request_error", body=None)
        row = await RequestLog.objects.aget(request_id=headers["request-id"])
        assert (row.endpoint, row.status_code) == ("messages", 400)

    async def test_an_unknown_model_is_not_found(self):
        body = {"model": "claude-nope", "max_tokens": 5, "messages": HI}
        message, _ = await self.assert_error(404, "not_found_error", body=body)
        assert "claude-nope" in message

    async def test_an_image_is_refused_clearly(self):
        image = {"type": "image", "source": {"type": "url", "url": "https://example.com/a.png"}}
        body = {
            "model": "echo",
            "max_tokens": 5,
            "messages": [{"role": "user", "content": [image]}],
        }
        message, _ = await self.assert_error(400, "invalid_request_error", body=body)
        assert (
            message
            == "messages.0.content.0.type: 'image' content blocks are not supported by this server."
        )

    async def test_a_fifth_cache_breakpoint_is_refused_as_anthropic_refuses_it(self):
        marked = {"type": "text", "text": "Hi", "cache_control": {"type": "ephemeral"}}
        body = {
            "model": "echo",
            "max_tokens": 5,
            "messages": [{"role": "user", "content": [marked] * 5}],
        }
        message, headers = await self.assert_error(400, "invalid_request_error", body=body)
        assert message == "A maximum of 4 blocks with cache_control may be provided. Found 5."
        row = await RequestLog.objects.aget(request_id=headers["request-id"])
        assert (row.endpoint, row.status_code) == ("messages", 400)

    async def test_a_body_too_large_is_request_too_large(self):
        with override_settings(CHATPARITY={**SETTINGS, "MAX_BODY_BYTES": 100}):
            body = {
                "model": "echo",
                "max_tokens": 5,
                "messages": [{"role": "user", "content": "x" * 200}],
            }
            await self.assert_error(413, "request_too_large", body=body)

    async def test_a_rate_limit_is_a_rate_limit_error_with_retry_after(self):
        await ApiKey.objects.filter(pk=self.key.pk).aupdate(requests_per_minute=1)
        status, _, _ = await self.create()
        assert status == 200
        body = {"model": "echo", "max_tokens": 5, "messages": HI}
        _, headers = await self.assert_error(429, "rate_limit_error", body=body)
        assert int(headers["retry-after"]) >= 1

    async def test_a_backend_failure_before_the_first_byte_is_an_api_error(self):
        body = {"model": "broken", "max_tokens": 5, "messages": HI}
        # The scripted backend says "Hel" first: without streaming, the failure is the answer.
        message, headers = await self.assert_error(502, "api_error", body=body)
        assert message == "upstream refused"
        row = await RequestLog.objects.aget(request_id=headers["request-id"])
        assert row.status_code == 502

    async def test_a_failure_after_the_first_byte_is_an_error_event(self):
        status, _, events = await self.create(model="broken", stream=True)
        assert status == 200
        assert [event["type"] for event in events][-2:] == ["content_block_delta", "error"]
        assert events[-1]["error"]["type"] == "api_error"

    async def test_a_slow_backend_gets_pings_then_a_timeout_error_event(self):
        request = {"model": "stuck", "max_tokens": 5, "messages": HI, "stream": True}
        status, _, content = await self.post(body=request)
        assert status == 200
        assert content.startswith(PING + PING)
        events = parse_events(content)
        assert [event["type"] for event in events if event["type"] != "ping"] == [
            "message_start",
            "error",
        ]
        assert events[-1]["error"]["type"] == "timeout_error"

    async def test_other_paths_and_methods_answer_in_anthropics_envelope(self):
        await self.assert_error(404, "not_found_error", path="/v1/messages/batches", body={})
        start, _, communicator = await self.exchange(
            "GET", "/v1/messages", headers=[("x-api-key", self.plaintext)]
        )
        await communicator.wait(timeout=10)
        assert start["status"] == 405


class CountTokensTests(MessagesTestCase):
    async def test_a_backend_without_a_tokenizer_counts_the_tools_too(self):
        # Security round 4: a 540 KB tool was counted as the 4 tokens of its "Hi".
        tool = {"name": "big", "description": "x" * 540_000, "input_schema": {"type": "object"}}
        body = {"model": "echo", "messages": HI, "tools": [tool]}
        status, _, content = await self.post("/v1/messages/count_tokens", body)
        assert status == 200
        assert orjson.loads(content)["input_tokens"] > 540_000 // 4

    async def test_cache_markers_change_no_count(self):
        marker = {"type": "ephemeral", "ttl": "1h"}
        tool = {"name": "read", "description": "Reads.", "input_schema": {"type": "object"}}
        bare = {
            "model": "echo",
            "system": [{"type": "text", "text": "Rules."}],
            "messages": HI,
            "tools": [tool],
        }
        marked = {
            **bare,
            "system": [{"type": "text", "text": "Rules.", "cache_control": marker}],
            "tools": [{**tool, "cache_control": marker}],
            "cache_control": marker,
        }
        counts = []
        for body in (bare, marked):
            status, _, content = await self.post("/v1/messages/count_tokens", body)
            assert status == 200
            counts.append(orjson.loads(content)["input_tokens"])
        assert counts[0] == counts[1]

    async def test_a_count_for_a_model_it_may_not_use_is_a_request_too(self):
        # Security round 4: a 404 for an unknown model never counted against the key.
        await ApiKey.objects.filter(pk=self.key.pk).aupdate(requests_per_minute=1)
        status, _, _ = await self.post(
            "/v1/messages/count_tokens", {"model": "nope", "messages": HI}
        )
        assert status == 404
        body = {"model": "echo", "messages": HI}
        status, _, content = await self.post("/v1/messages/count_tokens", body)
        assert (status, orjson.loads(content)["error"]["type"]) == (429, "rate_limit_error")

    async def test_a_backend_without_a_tokenizer_is_counted_at_four_characters_a_token(self):
        body = {
            "model": "echo",
            "system": "Be brief.",
            "messages": [{"role": "user", "content": "Hi there"}],
        }
        status, headers, content = await self.post("/v1/messages/count_tokens", body)
        assert status == 200
        assert orjson.loads(content) == {"input_tokens": (3 + 3) + (3 + 2)}
        row = await RequestLog.objects.aget(request_id=headers["request-id"])
        assert (row.endpoint, row.status_code, row.alias, row.backend) == (
            "messages.count_tokens",
            200,
            "echo",
            "scripted",
        )
        assert (row.prompt_tokens, row.completion_tokens, row.cost) == (0, 0, 0), "unbilled"

    async def test_a_count_is_a_request_under_the_keys_own_limits(self):
        """A tokenizer's work is real: counts may not flood past the key's requests per
        minute, and a count gives its slot in flight back."""
        await ApiKey.objects.filter(pk=self.key.pk).aupdate(max_concurrent=1, requests_per_minute=2)
        body = {"model": "echo", "messages": HI}
        for _ in range(2):
            status, _, _ = await self.post("/v1/messages/count_tokens", body)
            assert status == 200
        status, headers, content = await self.post("/v1/messages/count_tokens", body)
        error = orjson.loads(content)
        assert (status, error["error"]["type"]) == (429, "rate_limit_error"), error
        assert int(headers["retry-after"]) >= 1
        logged = [row async for row in RequestLog.objects.order_by("id")]
        assert [(row.endpoint, row.status_code) for row in logged] == [
            ("messages.count_tokens", 200),
            ("messages.count_tokens", 200),
            ("messages.count_tokens", 429),
        ]

    async def test_counting_refuses_what_creating_refuses(self):
        status, _, content = await self.post(
            "/v1/messages/count_tokens", {"model": "echo", "messages": HI, "max_tokens": 5}
        )
        assert status == 400
        assert (
            orjson.loads(content)["error"]["message"]
            == "max_tokens: Extra inputs are not permitted"
        )
        status, headers, _ = await self.post(
            "/v1/messages/count_tokens", {"model": "nope", "messages": HI}
        )
        assert status == 404
        row = await RequestLog.objects.aget(request_id=headers["request-id"])
        assert (row.endpoint, row.status_code, row.alias) == (
            "messages.count_tokens",
            404,
            "unknown",
        )
        embedder = await Backend.objects.acreate(name="embedder", kind="embedder")
        await ModelAlias.objects.acreate(public_id="embed", backend=embedder)
        for path in ("/v1/messages/count_tokens", "/v1/messages"):
            body = {"model": "embed", "messages": HI, "max_tokens": 5}
            if path.endswith("count_tokens"):
                del body["max_tokens"]
            status, _, content = await self.post(path, body)
            assert (status, orjson.loads(content)["error"]["type"]) == (
                400,
                "invalid_request_error",
            )
