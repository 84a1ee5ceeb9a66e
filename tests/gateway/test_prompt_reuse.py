"""The local model's reused prompt tokens, as each wire reports them: a session's second
turn through the views, on the real SmolLM2, says in its own field how many of its prompt
tokens were evaluated before (chat's ``prompt_tokens_details.cached_tokens``, Responses'
``input_tokens_details.cached_tokens``, Messages' ``cache_read_input_tokens``), and its
log row keeps the same number; a first turn reused nothing and says 0.

Greedy turns, so the number is known in advance: a reproducible request reuses whole
blocks of its earlier prompt only (chatparity/backends/prompt_cache.py).
"""

import uuid

import orjson
from django.test import TestCase

from chatparity.backends.prompt_cache import BLOCK_TOKENS
from chatparity.models import ApiKey, Backend, ModelAlias, RequestLog

BOXES = " ".join(
    f"Item {number} is a {('red', 'blue', 'green')[number % 3]} box." for number in range(30)
)
FIRST, SECOND = "What colour is item 7?", "And item 8?"


def system_prompt():
    """A system prompt no other test sends: the first turn finds nothing to reuse."""
    return f"Session {uuid.uuid4()}. {BOXES}"


def reused_by_second_turn(first_prompt_tokens):
    """What the second turn reuses: the first turn's prompt, up to its last whole block."""
    return first_prompt_tokens // BLOCK_TOKENS * BLOCK_TOKENS


def reused_when_sent_again(prompt_tokens):
    """What a prompt sent again reuses: itself, up to its last whole block before its last
    token (which is always evaluated)."""
    return (prompt_tokens - 1) // BLOCK_TOKENS * BLOCK_TOKENS


def sse_data(content):
    return [
        orjson.loads(line[6:])
        for line in content.decode().splitlines()
        if line.startswith("data: {")
    ]


class PromptReuseTestCase(TestCase):
    @classmethod
    def setUpTestData(cls):
        cls.key, cls.plaintext = ApiKey.objects.create_key("tests")
        local = Backend.objects.create(name="local", kind="local")
        ModelAlias.objects.create(public_id="smollm2", backend=local, model="SmolLM2")

    async def post(self, path, body, headers=None):
        response = await self.async_client.post(
            path,
            data=orjson.dumps({"model": "smollm2", **body}),
            content_type="application/json",
            headers=headers or {"Authorization": f"Bearer {self.plaintext}"},
        )
        assert response.status_code == 200, response.content
        if body.get("stream"):
            return b"".join([part async for part in response.streaming_content])
        return response.json()

    async def logged_cached_tokens(self):
        row = await RequestLog.objects.order_by("-id").afirst()
        return row.cached_tokens


class ChatCompletionsTests(PromptReuseTestCase):
    async def chat(self, messages, **body):
        return await self.post(
            "/v1/chat/completions",
            {"messages": messages, "temperature": 0, "max_tokens": 8, **body},
        )

    async def test_a_second_turn_reports_its_reused_tokens_as_cached_stream_or_not(self):
        asked = [{"role": "system", "content": system_prompt()}, {"role": "user", "content": FIRST}]
        first = await self.chat(asked)
        assert first["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
        assert await self.logged_cached_tokens() == 0
        answer = first["choices"][0]["message"]["content"]
        second_turn = [*asked, {"role": "assistant", "content": answer}]
        second_turn.append({"role": "user", "content": SECOND})
        reused = reused_by_second_turn(first["usage"]["prompt_tokens"])
        assert reused > 0
        second = await self.chat(second_turn)
        assert second["usage"]["prompt_tokens_details"]["cached_tokens"] == reused
        assert second["usage"]["prompt_tokens"] > reused  # OpenAI's count includes them
        assert await self.logged_cached_tokens() == reused
        streamed = sse_data(
            await self.chat(second_turn, stream=True, stream_options={"include_usage": True})
        )
        usage = streamed[-1]["usage"]
        reused_again = reused_when_sent_again(usage["prompt_tokens"])
        assert usage["prompt_tokens_details"]["cached_tokens"] == reused_again
        assert await self.logged_cached_tokens() == reused_again


class ResponsesTests(PromptReuseTestCase):
    async def respond(self, instructions, turns, **body):
        return await self.post(
            "/v1/responses",
            {
                "instructions": instructions,
                "input": turns,
                "temperature": 0,
                "max_output_tokens": 16,
                "store": False,
                **body,
            },
        )

    async def test_a_second_turn_reports_its_reused_tokens_as_cached_input(self):
        instructions = system_prompt()
        asked = [{"role": "user", "content": FIRST}]
        first = await self.respond(instructions, asked)
        assert first["usage"]["input_tokens_details"]["cached_tokens"] == 0
        answer = first["output"][0]["content"][0]["text"]
        second_turn = [*asked, {"role": "assistant", "content": answer}]
        second_turn.append({"role": "user", "content": SECOND})
        reused = reused_by_second_turn(first["usage"]["input_tokens"])
        streamed = sse_data(await self.respond(instructions, second_turn, stream=True))
        usage = streamed[-1]["response"]["usage"]
        assert usage["input_tokens_details"]["cached_tokens"] == reused > 0
        assert usage["input_tokens"] > reused  # as OpenAI counts: cached ones included
        assert await self.logged_cached_tokens() == reused


class MessagesTests(PromptReuseTestCase):
    async def create(self, system, messages, **body):
        headers = {"x-api-key": self.plaintext, "anthropic-version": "2023-06-01"}
        return await self.post(
            "/v1/messages",
            {"system": system, "messages": messages, "temperature": 0, "max_tokens": 8, **body},
            headers,
        )

    async def test_a_second_turn_reports_its_reused_tokens_as_cache_reads_apart_from_input(self):
        system = system_prompt()
        asked = [{"role": "user", "content": FIRST}]
        first = await self.create(system, asked)
        assert first["usage"]["cache_read_input_tokens"] == 0
        prompt_tokens = first["usage"]["input_tokens"]
        answer = first["content"][0]["text"]
        second_turn = [*asked, {"role": "assistant", "content": answer}]
        second_turn.append({"role": "user", "content": SECOND})
        reused = reused_by_second_turn(prompt_tokens)
        second = await self.create(system, second_turn)
        assert second["usage"]["cache_read_input_tokens"] == reused > 0
        # Anthropic's input_tokens leave out the tokens read from the cache.
        row = await RequestLog.objects.order_by("-id").afirst()
        assert (row.cached_tokens, row.prompt_tokens) == (
            reused,
            second["usage"]["input_tokens"] + reused,
        )
        streamed = sse_data(await self.create(system, second_turn, stream=True))
        (closing,) = [event for event in streamed if event["type"] == "message_delta"]
        reused_again = reused_when_sent_again(row.prompt_tokens)
        assert closing["usage"]["cache_read_input_tokens"] == reused_again
        assert closing["usage"]["input_tokens"] == row.prompt_tokens - reused_again
