"""The ``openai`` backend with ``wire_api: messages``: an upstream that speaks Anthropic's
Messages API natively (Anthropic itself, or another gateway) is called on ``/messages``
with the secret in ``x-api-key``, and its named events read back into the same events,
whichever endpoint the client called: a chat client reaches a Claude model, and a
Messages client any model, through one alias."""

import re

import orjson
import pytest
from django.test import TestCase

from chatparity.backends.upstream import UpstreamBackend
from chatparity.models import ApiKey, Backend, ModelAlias, RequestLog
from tests.backends import faulty_upstream
from tests.scripted import Call, ScriptedUpstream
from tests.support.upstream import UpstreamTestCase

SECRET = "sk-ant-native-secret-0000"
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    },
}
SCRIPTS = {
    "claude-text": ["Hello from Claude"],
    "claude-tools": [Call("get_weather", {"city": "Paris"}), "Sunny in Paris."],
}


def frames(body: bytes) -> list:
    return [
        orjson.loads(line.removeprefix(b"data: "))
        for line in body.split(b"\n")
        if line.startswith(b"data: ") and line != b"data: [DONE]"
    ]


class NativeMessagesTests(TestCase):
    @classmethod
    def setUpClass(cls):
        cls.upstream = ScriptedUpstream(SCRIPTS)
        cls.addClassCleanup(cls.upstream.close)
        cls.faulty, stop = faulty_upstream.start(SECRET)
        cls.addClassCleanup(stop)
        super().setUpClass()

    @classmethod
    def setUpTestData(cls):
        cls.key, cls.plaintext = ApiKey.objects.create_key("tests")
        backend = Backend.objects.create(
            name="anthropic", kind="openai", base_url=cls.upstream.base_url, secret=SECRET,
            timeout=5, options={"wire_api": "messages", "retries": 0},
        )  # fmt: skip
        for model in SCRIPTS:
            ModelAlias.objects.create(public_id=model, backend=backend, model=model)
        faulty = Backend.objects.create(
            name="faulty-anthropic", kind="openai", base_url=cls.faulty.base_url, secret=SECRET,
            timeout=5, options={"wire_api": "messages", "retries": 1, "backoff": 0},
        )  # fmt: skip
        ModelAlias.objects.create(public_id="overloaded", backend=faulty, model="overloaded")
        ModelAlias.objects.create(public_id="cut", backend=faulty, model="message-cut")

    def post(self, path, headers=None, **body):
        return self.async_client.post(
            path,
            data=orjson.dumps(body),
            content_type="application/json",
            headers=headers or {"Authorization": f"Bearer {self.plaintext}"},
        )

    def chat(self, model, **body):
        return self.post(
            "/v1/chat/completions",
            model=model,
            messages=[{"role": "user", "content": "Hi"}],
            **body,
        )

    def messages(self, model, **body):
        body = {"max_tokens": 256, "messages": [{"role": "user", "content": "Hi"}], **body}
        return self.post("/v1/messages", headers={"x-api-key": self.plaintext}, model=model, **body)

    async def test_a_chat_completion_is_asked_on_messages_with_the_secret_in_x_api_key(self):
        completion = (
            await self.post(
                "/v1/chat/completions",
                model="claude-text",
                messages=[
                    {"role": "system", "content": "Be brief."},
                    {"role": "user", "content": "Hi"},
                ],
                temperature=0.5,
                max_tokens=20,
            )
        ).json()
        assert completion["choices"][0]["message"]["content"] == "Hello from Claude"
        assert completion["choices"][0]["finish_reason"] == "stop"
        path, headers = self.upstream.heads[-1]
        assert path == "/v1/messages"
        assert headers["x-api-key"] == SECRET
        assert headers["anthropic-version"] == "2023-06-01"
        assert "authorization" not in headers
        assert self.upstream.requests[-1] == {
            "model": "claude-text",
            "max_tokens": 20,
            "system": "Be brief.",
            "messages": [{"role": "user", "content": [{"type": "text", "text": "Hi"}]}],
            "stream": True,
            "temperature": 0.5,
        }
        row = await RequestLog.objects.aget()
        assert (row.endpoint, row.prompt_tokens, row.completion_tokens, row.usage_counted) == (
            "chat.completions",
            10,
            5,
            False,
        )

    async def test_a_chat_clients_tool_round_trip_through_claude(self):
        first = (await self.chat("claude-tools", tools=[WEATHER], stream=True)).streaming_content
        chunks = frames(b"".join([part async for part in first]))
        call = next(
            c["choices"][0]["delta"]["tool_calls"][0]
            for c in chunks
            if c["choices"] and c["choices"][0]["delta"].get("tool_calls")
        )
        arguments = "".join(
            c["choices"][0]["delta"]["tool_calls"][0]["function"].get("arguments", "")
            for c in chunks
            if c["choices"] and c["choices"][0]["delta"].get("tool_calls")
        )
        # The upstream's toolu_ id, in the chat wire's form: call_ and the same 24.
        assert re.fullmatch(r"call_[A-Za-z0-9]{24}", call["id"])
        its_own = "toolu_" + call["id"].removeprefix("call_")
        assert (call["function"]["name"], orjson.loads(arguments)) == (
            "get_weather",
            {"city": "Paris"},
        )
        assert [c["choices"][0]["finish_reason"] for c in chunks if c["choices"]][
            -1
        ] == "tool_calls"
        assert self.upstream.requests[-1]["tools"] == [
            {
                "name": "get_weather",
                "input_schema": WEATHER["function"]["parameters"],
                "description": "The weather in a city.",
            }
        ]
        called = {
            "id": call["id"],
            "type": "function",
            "function": {"name": "get_weather", "arguments": arguments},
        }
        answer = (
            await self.post(
                "/v1/chat/completions",
                model="claude-tools",
                tools=[WEATHER],
                messages=[
                    {"role": "user", "content": "Weather in Paris?"},
                    {"role": "assistant", "content": None, "tool_calls": [called]},
                    {"role": "tool", "tool_call_id": call["id"], "content": "Sunny"},
                ],
            )
        ).json()
        assert answer["choices"][0]["message"]["content"] == "Sunny in Paris."
        assert self.upstream.requests[-1]["messages"][1:] == [
            {
                "role": "assistant",
                "content": [
                    {
                        "type": "tool_use",
                        "id": its_own,
                        "name": "get_weather",
                        "input": {"city": "Paris"},
                    }
                ],
            },
            {
                "role": "user",
                "content": [{"type": "tool_result", "tool_use_id": its_own, "content": "Sunny"}],
            },
        ]

    async def test_a_messages_client_through_a_messages_upstream(self):
        message = (
            await self.messages(
                "claude-tools", tools=[{"name": "get_weather", "input_schema": {"type": "object"}}]
            )
        ).json()
        (use,) = message["content"]
        assert (use["type"], use["name"], use["input"]) == (
            "tool_use",
            "get_weather",
            {"city": "Paris"},
        )
        assert message["stop_reason"] == "tool_use"
        assert message["id"] != "msg_scripted"  # the gateway's own ids
        assert message["usage"]["input_tokens"] == 10
        row = await RequestLog.objects.aget()
        assert (row.endpoint, row.backend) == ("messages", "anthropic")

    async def test_n_choices_are_asked_for_one_by_one(self):
        await ModelAlias.objects.filter(public_id="claude-text").aupdate(max_n=2)
        completion = (await self.chat("claude-text", n=2)).json()
        assert [c["message"]["content"] for c in completion["choices"]] == ["Hello from Claude"] * 2
        assert all("n" not in body for body in self.upstream.requests[-2:])

    async def test_an_overloaded_upstream_is_retried_then_an_error_in_each_clients_envelope(self):
        response = await self.chat("overloaded")
        assert response.status_code == 502
        assert response.json()["error"]["type"] == "overloaded_error"
        assert self.faulty.attempts["overloaded"] == 2  # retried once, as configured
        response = await self.messages("overloaded")
        assert response.status_code == 502
        assert response.json()["error"]["type"] == "api_error"
        assert "Overloaded" not in response.json()["error"]["message"], "the upstream's words stay"

    async def test_a_stream_cut_before_its_message_delta_is_an_error_not_an_answer(self):
        """The body ended cleanly, but the message never said why it stopped: cut short
        (its connection dropped behind a proxy, or the gateway upstream gave up)."""
        response = await self.messages("cut")
        assert response.status_code == 502
        assert response.json()["error"] == {
            "type": "api_error",
            "message": "The upstream sent a malformed stream: the stream ended before the"
            " message did.",
        }
        streamed = await self.messages("cut", stream=True)
        events = frames(b"".join([part async for part in streamed.streaming_content]))
        assert [event["type"] for event in events][-2:] == ["content_block_delta", "error"]
        assert (await self.chat("cut")).status_code == 502


def test_wire_api_may_be_messages():
    UpstreamBackend.check_options({"wire_api": "messages"})
    with pytest.raises(ValueError, match='"chat", "responses" or "messages"'):
        UpstreamBackend.check_options({"wire_api": "anthropic"})


class ReasoningTests(UpstreamTestCase):
    """A chat upstream that streams its reasoning (``reasoning_content``)."""

    async def test_a_messages_client_sees_it_as_thinking_and_a_chat_client_not_at_all(self):
        await self.alias("reasoning")
        body = {"model": "up-reasoning", "max_tokens": 64, "stream": True,
                "messages": [{"role": "user", "content": "Hi"}]}  # fmt: skip
        response = await self.async_client.post(
            "/v1/messages", data=orjson.dumps(body), content_type="application/json",
            headers={"x-api-key": self.plaintext},
        )  # fmt: skip
        streamed = b"".join([part async for part in response.streaming_content])
        events = [orjson.loads(line[6:]) for line in streamed.split(b"\n") if line[:6] == b"data: "]
        starts = [e["content_block"]["type"] for e in events if e["type"] == "content_block_start"]
        assert starts == ["thinking", "text"]
        deltas = [e["delta"] for e in events if e["type"] == "content_block_delta"]
        assert [d.get("thinking", d.get("text")) for d in deltas] == [
            "The user ",
            "greets me.",
            "Hello",
            " world",
        ]
        completion = (await self.post("up-reasoning")).json()
        assert completion["choices"][0]["message"]["content"] == "Hello world"
        assert "The user" not in orjson.dumps(completion).decode()
