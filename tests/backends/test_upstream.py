"""The ``openai`` backend against a real HTTP upstream on loopback that misbehaves on
request: whatever it sends, the client sees OpenAI's canonical stream or error."""

import asyncio
import json
import socket
import time
from contextlib import closing
from unittest import mock

import orjson
from asgiref.sync import sync_to_async
from asgiref.testing import ApplicationCommunicator
from django.core.asgi import get_asgi_application
from django.test import TransactionTestCase, override_settings

from chatparity.backends import _http1
from chatparity.backends import upstream as upstream_backend
from chatparity.models import ApiKey, Backend, ModelAlias, RequestLog
from chatparity.transport.fastpath import FastPath
from tests.accounting.test_limits import HI
from tests.asgi import completion_scope, keep_test_connection
from tests.backends import faulty_upstream
from tests.support.upstream import SECRET, UpstreamTestCase


def closed_port() -> int:
    with closing(socket.socket()) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class CanonicalForwardingTests(UpstreamTestCase):
    async def test_forwards_with_the_secret_the_effective_model_and_usage_asked(self):
        response = await self.ask("canonical", stream=True, temperature=0.5)
        chunks = await self.stream_of(response)
        sent = self.upstream.bodies["canonical"]
        assert sent["model"] == "canonical"
        assert sent["stream_options"] == {"include_usage": True}
        assert sent["temperature"] == 0.5
        head = self.upstream.heads["canonical"]
        assert f"authorization: bearer {SECRET}".lower() in head
        assert "content-type: application/json" in head
        assert self.text(chunks) == "Hello world"
        assert {c["model"] for c in chunks[:-1]} == {"up-canonical"}
        assert all("usage" not in c for c in chunks[:-1])  # the client did not ask for it
        assert chunks[-1] == "[DONE]"

    async def test_non_stream_is_the_accumulated_stream_with_upstream_usage(self):
        completion = (await self.ask("canonical", temperature=0)).json()
        assert completion["choices"][0]["message"]["content"] == "Hello world"
        assert completion["usage"]["prompt_tokens"] == 5
        assert completion["usage"]["completion_tokens"] == 2
        row = await RequestLog.objects.aget()
        assert (row.backend, row.upstream_model, row.total_tokens) == ("faulty", "canonical", 7)


# What a client may send that costs money, keeps data upstream or speaks for the account.
UNFORWARDED = {
    "service_tier": "priority",
    "store": True,
    "metadata": {"who": "me"},
    "web_search_options": {},
    "prediction": {"type": "content", "content": "Hello"},
    "modalities": ["text"],
    "user": "u-1",
    "safety_identifier": "s-1",
}
# What finds an agent's cached prefix: forwarded, else its input is billed in full.
PROMPT_CACHE = {"prompt_cache_key": "session-1", "prompt_cache_retention": "24h"}
SAMPLING = {
    "temperature": 0.5,
    "top_p": 0.9,
    "max_tokens": 5,
    "stop": ["\n"],
    "n": 1,
    "presence_penalty": 0.1,
    "frequency_penalty": 0.1,
    "logit_bias": {"50256": -100},
    "logprobs": True,
    "top_logprobs": 2,
    "seed": 7,
    "reasoning_effort": "low",
    "verbosity": "low",
}


class AllowListTests(UpstreamTestCase):
    """Only the sampling and format parameters reach an upstream, and those its alias
    forwards."""

    async def test_parameters_that_cost_money_or_keep_data_do_not_reach_the_upstream(self):
        response = await self.ask("whole", **SAMPLING, **UNFORWARDED)
        assert response.status_code == 200
        sent = self.upstream.bodies["whole"]
        assert sent.keys() == {"model", "messages", "stream", *SAMPLING}
        assert {name: sent[name] for name in SAMPLING} == SAMPLING

    async def test_the_prompt_caches_parameters_reach_it(self):
        assert (await self.ask("whole", **PROMPT_CACHE)).status_code == 200
        assert self.upstream.bodies["whole"].items() >= PROMPT_CACHE.items()
        options = {"prompt_cache_options": {"mode": "explicit", "ttl": "30m"}}
        assert (await self.post("up-whole", **options)).status_code == 200
        assert self.upstream.bodies["whole"].items() >= options.items()

    async def test_tools_and_formats_reach_it(self):
        tool = {"type": "function", "function": {"name": "get_weather"}}
        response_format = {"type": "json_schema", "json_schema": {"name": "w", "schema": {}}}
        body = {"tools": [tool], "tool_choice": "auto", "parallel_tool_calls": False}
        await self.alias("whole-tool-calls")
        await self.post("up-whole-tool-calls", response_format=response_format, **body)
        sent = self.upstream.bodies["whole-tool-calls"]
        assert sent.items() >= {**body, "response_format": response_format}.items()

    async def test_an_alias_forwards_the_parameters_it_lists(self):
        await self.alias("whole", forwarded_params=["service_tier", "store", "metadata"])
        assert (await self.post("up-whole", **UNFORWARDED)).status_code == 200
        sent = self.upstream.bodies["whole"]
        assert (sent["service_tier"], sent["store"], sent["metadata"]) == (
            "priority", True, {"who": "me"},
        )  # fmt: skip
        assert "web_search_options" not in sent
        assert "user" not in sent

    async def test_an_alias_default_is_forwarded_only_when_listed(self):
        await self.alias("whole", default_params={"service_tier": "flex", "temperature": 0})
        assert (await self.post("up-whole")).status_code == 200
        assert "service_tier" not in self.upstream.bodies["whole"]
        assert self.upstream.bodies["whole"]["temperature"] == 0


class CompletionLimitTests(UpstreamTestCase):
    """A request that sets no max_tokens is sent with the completion its limits left it:
    the upstream ends the answer where the budget does."""

    async def test_what_a_budget_left_is_the_upstreams_max_tokens(self):
        from django.core.cache import cache

        cache.clear()
        key = await ApiKey.objects.aget(pk=self.key.pk)
        key.token_budget = 100
        await key.asave(update_fields=["token_budget"])
        assert (await self.ask("whole")).status_code == 200
        assert self.upstream.bodies["whole"]["max_tokens"] == 100 - HI  # "Hi" at its bound
        assert (await self.post("up-whole", max_tokens=5)).status_code == 200
        assert self.upstream.bodies["whole"]["max_tokens"] == 5  # the client's, as sent


class RepairTests(UpstreamTestCase):
    async def test_quirky_stream_comes_out_canonical(self):
        chunks = await self.stream_of(
            await self.ask("quirky", stream=True, stream_options={"include_usage": True})
        )
        *body, usage, done = chunks
        assert done == "[DONE]"
        assert len({(c["id"], c["created"]) for c in chunks[:-1]}) == 1
        assert body[0]["choices"][0]["delta"] == {
            "role": "assistant",
            "content": "",
            "refusal": None,
        }
        assert all("role" not in c["choices"][0]["delta"] for c in body[1:])
        assert [c["choices"][0]["finish_reason"] for c in body] == [None] * (len(body) - 1) + [
            "stop"
        ]
        assert body[-1]["choices"][0]["delta"] == {}
        assert self.text(body) == "Hello!"
        assert all(c["usage"] is None for c in body)
        # No usage upstream: each delta counted as a token.
        assert usage["choices"] == []
        assert usage["usage"]["completion_tokens"] == 3

    async def test_tool_call_ids_and_names_are_sent_once(self):
        chunks = await self.stream_of(await self.ask("tool-quirks", stream=True))
        calls = [c["choices"][0]["delta"].get("tool_calls") for c in chunks[:-1]]
        calls = [call[0] for call in calls if call]
        assert calls[0] == {
            "index": 0, "id": "call_1", "type": "function",
            "function": {"name": "get_weather", "arguments": ""},
        }  # fmt: skip
        assert all(set(call) == {"index", "function"} for call in calls[1:])
        assert all(set(call["function"]) == {"arguments"} for call in calls[1:])
        arguments = "".join(call["function"]["arguments"] for call in calls)
        assert json.loads(arguments) == {"city": "Paris"}
        assert chunks[-2]["choices"][0]["finish_reason"] == "tool_calls"


class DeprecatedFunctionsTests(UpstreamTestCase):
    """``functions`` reach an upstream as tools; its tool call reaches the client as the
    ``function_call`` it asked for."""

    async def test_functions_are_sent_as_tools_and_the_call_comes_back_as_function_call(self):
        function = {
            "name": "get_weather",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
        }
        response = await self.ask(
            "tool-quirks", stream=True, functions=[function], function_call={"name": "get_weather"}
        )
        chunks = await self.stream_of(response)
        sent = self.upstream.bodies["tool-quirks"]
        assert not {"functions", "function_call"} & sent.keys()
        assert sent["tools"] == [{"type": "function", "function": function}]
        assert sent["tool_choice"] == {"type": "function", "function": {"name": "get_weather"}}
        deltas = [c["choices"][0]["delta"] for c in chunks[:-1] if c["choices"]]
        assert not any("tool_calls" in delta for delta in deltas)
        calls = [delta["function_call"] for delta in deltas if "function_call" in delta]
        assert calls[0] == {"name": "get_weather", "arguments": ""}
        assert json.loads("".join(call["arguments"] for call in calls)) == {"city": "Paris"}
        assert chunks[-2]["choices"][0]["finish_reason"] == "stop"  # named, as OpenAI

    async def test_a_function_call_in_the_history_is_sent_as_a_tool_call_and_its_result(self):
        messages = [
            {"role": "user", "content": "Weather in Paris?"},
            {
                "role": "assistant",
                "content": None,
                "function_call": {"name": "get_weather", "arguments": '{"city":"Paris"}'},
            },
            {"role": "function", "name": "get_weather", "content": "sunny"},
        ]
        await self.alias("whole")
        response = await self.async_client.post(
            "/v1/chat/completions",
            data=orjson.dumps({"model": "up-whole", "messages": messages}),
            content_type="application/json",
            headers={"Authorization": f"Bearer {self.plaintext}"},
        )
        assert response.status_code == 200, response.content
        sent = self.upstream.bodies["whole"]["messages"]
        assert sent[1]["tool_calls"][0]["function"] == messages[1]["function_call"]
        assert sent[2] == {
            "role": "tool", "tool_call_id": sent[1]["tool_calls"][0]["id"], "content": "sunny"
        }  # fmt: skip


class WholeCompletionTests(UpstreamTestCase):
    """A client that does not stream gets the upstream's whole completion, re-read."""

    async def test_the_upstream_is_asked_for_a_whole_completion(self):
        completion = (await self.ask("whole", temperature=0)).json()
        sent = self.upstream.bodies["whole"]
        assert sent["stream"] is False
        assert "stream_options" not in sent
        assert completion["object"] == "chat.completion"
        assert completion["id"].startswith("chatcmpl-")
        assert completion["model"] == "up-whole"
        assert completion["choices"][0]["message"]["content"] == "Hello world"
        assert completion["choices"][0]["finish_reason"] == "stop"
        assert completion["usage"]["total_tokens"] == 7
        row = await RequestLog.objects.aget()
        assert (row.prompt_tokens, row.completion_tokens) == (5, 2)

    async def test_tool_calls_keep_their_ids_order_and_arguments(self):
        tool = {"type": "function", "function": {"name": "get_weather"}}
        completion = (await self.ask("whole-tool-calls", tools=[tool])).json()
        choice = completion["choices"][0]
        calls = choice["message"]["tool_calls"]
        assert [call["id"] for call in calls] == ["call_Paris", "call_Rome"]
        assert [call["function"]["arguments"] for call in calls] == [
            '{"city":"Paris"}',
            '{"city":"Rome"}',
        ]
        assert choice["finish_reason"] == "tool_calls"

    async def test_without_usage_the_tokens_are_estimated_from_the_text(self):
        completion = (await self.ask("whole-without-usage")).json()
        assert completion["usage"]["completion_tokens"] == 3  # "Hello world": 11 characters

    async def test_whole_completions_reuse_the_connection(self):
        connections = self.upstream.connections
        await self.alias("whole")
        for _ in range(3):
            assert (await self.post("up-whole")).status_code == 200
        assert self.upstream.connections - connections == 1

    async def test_an_upstream_that_streams_anyway_is_read_as_a_stream(self):
        completion = (await self.ask("canonical")).json()
        assert self.upstream.bodies["canonical"]["stream"] is False
        assert completion["choices"][0]["message"]["content"] == "Hello world"


class DistrustTests(UpstreamTestCase):
    """What an upstream says is checked: its usage, its content type, its line lengths;
    a stream request never gets an empty 200."""

    async def test_usage_that_cannot_be_believed_is_counted_and_the_row_says_so(self):
        for behaviour in ("negative-usage", "huge-usage"):
            with self.assertLogs("chatparity.backends.upstream", "WARNING") as logged:
                completion = (await self.ask(behaviour)).json()
            assert completion["usage"]["completion_tokens"] == faulty_upstream.LONG_CHUNKS
            assert "usage not believed" in logged.output[0]
        rows = [row async for row in RequestLog.objects.order_by("alias")]
        assert [(r.alias, r.completion_tokens, r.usage_counted) for r in rows] == [
            ("up-huge-usage", faulty_upstream.LONG_CHUNKS, True),
            ("up-negative-usage", faulty_upstream.LONG_CHUNKS, True),
        ]

    async def test_usage_the_upstream_reports_within_bounds_is_believed(self):
        await self.ask("canonical", max_tokens=2)
        row = await RequestLog.objects.aget()
        assert (row.completion_tokens, row.usage_counted) == (2, False)

    async def test_a_whole_completion_answering_a_stream_request_is_streamed(self):
        chunks = await self.stream_of(await self.ask("whole", stream=True))
        assert self.upstream.bodies["whole"]["stream"] is True
        assert self.text(chunks) == "Hello world"
        assert chunks[-2]["choices"][0]["finish_reason"] == "stop"
        assert chunks[-1] == "[DONE]"
        row = await RequestLog.objects.aget()
        assert (row.completion_tokens, row.usage_counted) == (2, False)

    async def test_an_answer_neither_json_nor_a_stream_is_a_502_not_an_empty_200(self):
        for stream in (True, False):
            response = await self.ask("html", stream=stream)
            assert response.status_code == 502
            assert response.json()["error"]["code"] == "upstream_error"
            await ModelAlias.objects.filter(public_id="up-html").adelete()

    async def test_a_stream_without_any_choice_is_a_502_not_an_empty_200(self):
        response = await self.ask("empty-stream", stream=True)
        assert response.status_code == 502
        assert response.json()["error"]["code"] == "upstream_error"

    @override_settings(CHATPARITY={"MAX_UPSTREAM_LINE_BYTES": faulty_upstream.LONG_LINE})
    async def test_a_line_over_the_cap_is_a_502_and_its_connection_is_dropped(self):
        connections = self.upstream.connections
        response = await self.ask("long-line-first", stream=True)
        assert response.status_code == 502
        assert response.json()["error"]["code"] == "upstream_error"
        assert (await self.post("up-long-line-first", stream=True)).status_code == 502
        assert self.upstream.connections - connections == 2  # neither went back to the pool

    @override_settings(CHATPARITY={"MAX_UPSTREAM_LINE_BYTES": faulty_upstream.LONG_LINE})
    async def test_a_line_over_the_cap_mid_stream_is_an_error_frame(self):
        chunks = await self.stream_of(await self.ask("long-line", stream=True))
        assert self.text(chunks[:-2]) == "Hello"
        assert chunks[-2]["error"]["code"] == "upstream_error"
        assert chunks[-1] == "[DONE]"

    async def test_a_whole_answer_over_its_cap_is_a_502(self):
        with mock.patch.object(upstream_backend, "MAX_ANSWER_BYTES", 100):
            response = await self.ask("whole")
        assert response.status_code == 502
        assert response.json()["error"]["code"] == "upstream_error"

    async def test_an_error_answer_is_read_up_to_its_cap_and_keeps_its_status(self):
        with (
            mock.patch.object(upstream_backend, "MAX_ERROR_BYTES", 10),
            self.assertLogs("chatparity.backends.upstream", "WARNING") as logged,
        ):
            response = await self.ask("bad-request")
        assert response.status_code == 400
        assert (
            response.json()["error"]["message"]
            == "The upstream model returned an error (status 400)."
        )
        assert "Bad key" not in logged.output[0]  # the body was left unread

    async def test_a_line_under_the_cap_is_read(self):
        chunks = await self.stream_of(await self.ask("long-line", stream=True))
        assert self.text(chunks) == "Hello" + "x" * faulty_upstream.LONG_LINE + " world"


class EmulationTests(UpstreamTestCase):
    async def test_choices_an_upstream_ignoring_n_left_out_are_asked_for_one_by_one(self):
        completion = (await self.ask("canonical", n=3)).json()
        assert [c["index"] for c in completion["choices"]] == [0, 1, 2]
        assert {c["message"]["content"] for c in completion["choices"]} == {"Hello world"}
        assert self.upstream.attempts["canonical"] == 3
        assert self.upstream.bodies["canonical"]["n"] == 1  # the last one asked for one
        assert completion["usage"]["completion_tokens"] == 3 * 2

    async def test_required_with_one_tool_is_sent_as_that_named_tool(self):
        tool = {"type": "function", "function": {"name": "get_weather"}}
        await self.ask("tool-quirks", tools=[tool], tool_choice="required")
        sent = self.upstream.bodies["tool-quirks"]["tool_choice"]
        assert sent == {"type": "function", "function": {"name": "get_weather"}}


class FailureTests(UpstreamTestCase):
    async def test_client_error_keeps_status_type_and_code_with_a_message_of_ours(self):
        with self.assertLogs("chatparity.backends.upstream", "WARNING") as logged:
            response = await self.ask("bad-request")
        assert response.status_code == 400
        error = response.json()["error"]
        assert error == {
            "message": "The upstream model returned an error (status 400, code 'model_not_found').",
            "type": "invalid_request_error",
            "param": "model",
            "code": "model_not_found",
        }
        assert self.upstream.attempts["bad-request"] == 1  # a 4xx is not retried
        row = await RequestLog.objects.aget()
        assert (row.status_code, row.error_code) == (400, "model_not_found")
        # What the upstream said is the server's to read, the secret masked.
        assert "backend faulty" in logged.output[0]
        assert "Bad key *** for this model" in logged.output[0]
        assert SECRET not in "".join(logged.output)

    async def test_free_text_in_an_upstream_error_never_reaches_the_client(self):
        with self.assertLogs("chatparity.backends.upstream", "WARNING") as logged:
            response = await self.ask("leaky-error")
        assert response.status_code == 400
        assert response.json()["error"] == {
            "message": "The upstream model returned an error (status 400).",
            "type": "invalid_request_error",
            "param": None,
            "code": None,
        }
        assert "vllm-0.internal.corp:8000 refused key sk-up***" in logged.output[0]

    async def test_a_backend_may_pass_on_its_upstreams_messages_secret_masked(self):
        trusted = await Backend.objects.acreate(
            name="trusted", kind="openai", base_url=self.upstream.base_url, secret=SECRET,
            options={"pass_error_text": True},
        )  # fmt: skip
        await self.alias("bad-request", backend=trusted)
        with self.assertLogs("chatparity.backends.upstream", "WARNING"):
            response = await self.post("up-bad-request")
        assert response.status_code == 400
        assert response.json()["error"]["message"] == "Bad key *** for this model"
        assert response.json()["error"]["code"] == "model_not_found"

    async def test_rate_limit_is_passed_on_as_a_429(self):
        response = await self.ask("rate-limited", stream=True)
        assert response.status_code == 429
        assert response.json()["error"] == {
            "message": "The upstream model returned an error (status 429, code 'rate_limit').",
            "type": "requests",
            "param": None,
            "code": "rate_limit",
        }

    async def test_server_errors_are_retried_then_a_502(self):
        response = await self.ask("server-error")
        assert response.status_code == 502
        assert response.json()["error"]["type"] == "server_error"
        assert self.upstream.attempts["server-error"] == 3

    async def test_an_html_error_page_becomes_the_envelope(self):
        with self.assertLogs("chatparity.backends.upstream", "WARNING") as logged:
            response = await self.ask("not-json-error", stream=True)
        assert response.status_code == 502
        assert response.json()["error"] == {
            "message": "The upstream model returned an error (status 502).",
            "type": "server_error",
            "param": None,
            "code": "upstream_error",
        }
        assert "<html>bad gateway</html>" in logged.output[-1]

    async def test_a_flaky_upstream_is_retried_until_it_answers(self):
        completion = (await self.ask("flaky")).json()
        assert completion["choices"][0]["message"]["content"] == "Hello world"
        assert self.upstream.attempts["flaky"] == 3

    async def test_reset_before_the_first_byte_is_retried_then_a_502(self):
        response = await self.ask("reset", stream=True)
        assert response.status_code == 502
        assert response.json()["error"]["code"] == "upstream_error"
        assert self.upstream.attempts["reset"] == 3

    async def test_refused_connection_is_a_503_after_retries(self):
        port = closed_port()
        down = await Backend.objects.acreate(
            name="down", kind="openai", base_url=f"http://127.0.0.1:{port}/v1",
            options={"backoff": 0.01},
        )  # fmt: skip
        await self.alias("canonical", backend=down)
        with self.assertLogs("chatparity.backends.upstream", "WARNING") as logged:
            response = await self.post("up-canonical", stream=True)
        assert response.status_code == 503
        # Where the upstream lives is for the server's log only.
        assert str(port) not in response.content.decode()
        assert len(logged.output) == 3  # each attempt
        assert "backend down: could not connect: ConnectError(" in logged.output[0]
        assert str(port) in logged.output[0]
        assert response.json()["error"] == {
            "message": "The upstream is unavailable.",
            "type": "server_error",
            "param": None,
            "code": "upstream_unavailable",
        }
        assert (await RequestLog.objects.aget()).status_code == 503

    async def test_unavailable_backend_falls_over_to_the_fallback_aliases(self):
        down = await Backend.objects.acreate(
            name="down", kind="openai", base_url=f"http://127.0.0.1:{closed_port()}/v1",
            options={"retries": 0},
        )  # fmt: skip
        await self.alias("canonical")
        await ModelAlias.objects.acreate(
            public_id="primary", backend=down, model="canonical",
            fallbacks=["does-not-exist", "up-canonical"],
        )  # fmt: skip
        response = await self.post("primary")
        assert response.status_code == 200
        completion = response.json()
        assert completion["model"] == "primary"
        assert completion["choices"][0]["message"]["content"] == "Hello world"
        row = await RequestLog.objects.aget()  # under the alias that answered
        assert (row.alias, row.backend, row.status_code) == ("up-canonical", "faulty", 200)

    async def test_a_row_written_with_a_base_url_that_is_not_http_sends_nothing(self):
        # Past the model's checks (a queryset update, a fixture): refused when built.
        odd = await Backend.objects.acreate(
            name="odd", kind="openai", base_url="ftp://127.0.0.1/v1", options={"retries": 0}
        )
        await self.alias("canonical", backend=odd)
        with self.assertLogs("chatparity", "ERROR") as logged:
            response = await self.post("up-canonical")
        assert response.status_code == 500
        assert not self.upstream.attempts
        (failure,) = [record.exc_info[1] for record in logged.records if record.exc_info]
        assert "backend 'odd'" in str(failure)

    async def test_a_row_written_with_a_bad_option_sends_nothing_and_says_why_in_the_log(self):
        odd = await Backend.objects.acreate(
            name="odd", kind="openai", base_url=self.upstream.base_url, options={"retries": "2"}
        )
        await self.alias("canonical", backend=odd)
        with self.assertLogs("chatparity", "ERROR") as logged:
            response = await self.post("up-canonical")
        assert response.status_code == 500
        assert not self.upstream.attempts
        (failure,) = [record.exc_info[1] for record in logged.records if record.exc_info]
        assert str(failure) == "backend 'odd': 'retries' must be an integer from 0 to 10, not '2'."

    async def test_slow_first_byte_is_a_504_timeout(self):
        slow = await Backend.objects.acreate(
            name="slow", kind="openai", base_url=self.upstream.base_url, timeout=0.5
        )
        await self.alias("slow-first-byte", backend=slow)
        started = time.monotonic()
        response = await self.post("up-slow-first-byte", stream=True)
        assert time.monotonic() - started < 5
        assert response.status_code == 504
        assert response.json()["error"] == {
            "message": "The upstream did not answer in time.",
            "type": "timeout_error",
            "param": None,
            "code": "request_timeout",
        }

    async def test_malformed_json_before_content_is_a_502(self):
        response = await self.ask("malformed-first", stream=True)
        assert response.status_code == 502
        assert response.json()["error"]["code"] == "upstream_error"


class MidStreamFailureTests(UpstreamTestCase):
    async def assert_error_frame(self, behaviour, error_type):
        chunks = await self.stream_of(await self.ask(behaviour, stream=True))
        assert chunks[-1] == "[DONE]"
        assert set(chunks[-2]) == {"error"}
        assert chunks[-2]["error"]["type"] == error_type
        row = await RequestLog.objects.aget()
        assert (row.status_code, row.error_type) == (200, error_type)
        return chunks

    async def test_drop_mid_stream_is_one_error_frame_then_done(self):
        chunks = await self.assert_error_frame("drop", "server_error")
        assert self.text(chunks[:-2]) == "Hello world"

    async def test_malformed_json_mid_stream(self):
        await self.assert_error_frame("malformed", "server_error")

    async def test_an_upstream_error_event_mid_stream(self):
        with self.assertLogs("chatparity.backends.upstream", "WARNING") as logged:
            chunks = await self.assert_error_frame("error-event", "server_error")
        assert chunks[-2]["error"]["message"] == "The upstream model returned an error."
        assert "overloaded" in logged.output[0]

    async def test_a_never_ending_stream_times_out(self):
        endless = await Backend.objects.acreate(
            name="endless", kind="openai", base_url=self.upstream.base_url, timeout=1
        )
        await self.alias("endless", backend=endless)
        response = await self.post("up-endless", stream=True)
        chunks = await self.stream_of(response)
        assert chunks[-2]["error"]["code"] == "request_timeout"
        assert chunks[-1] == "[DONE]"


class ConnectionReuseTests(UpstreamTestCase):
    """An upstream that keeps connections alive gets one connection for many requests."""

    def setUp(self):
        super().setUp()
        self.connections = self.upstream.connections

    def new_connections(self):
        return self.upstream.connections - self.connections

    async def test_sequential_requests_share_one_connection(self):
        await self.alias("keep-alive")
        for _ in range(5):
            chunks = await self.stream_of(await self.post("up-keep-alive", stream=True))
            assert self.text(chunks) == "Hello world"
        completion = (await self.post("up-keep-alive")).json()
        assert completion["choices"][0]["message"]["content"] == "Hello world"
        assert self.upstream.attempts["keep-alive"] == 6
        assert self.new_connections() == 1

    async def test_choices_asked_for_one_by_one_reuse_the_connection(self):
        completion = (await self.ask("keep-alive", n=3)).json()
        assert [c["index"] for c in completion["choices"]] == [0, 1, 2]
        assert self.upstream.attempts["keep-alive"] == 3
        assert self.new_connections() == 1

    async def test_error_answers_and_their_retries_reuse_the_connection(self):
        response = await self.ask("keep-alive-busy")
        assert response.status_code == 502
        assert self.upstream.attempts["keep-alive-busy"] == 3
        response = await self.ask("keep-alive-bad-request")
        assert response.status_code == 400
        assert self.new_connections() == 1


class HangUpTests(TransactionTestCase):
    def setUp(self):
        keep_test_connection(self)
        self.upstream, stop = faulty_upstream.start(SECRET)
        self.addCleanup(stop)

    async def test_client_hang_up_closes_the_upstream_request_at_once(self):
        _, plaintext = await sync_to_async(ApiKey.objects.create_key)("hang-up")
        backend = await Backend.objects.acreate(
            name="up", kind="openai", base_url=self.upstream.base_url
        )
        await ModelAlias.objects.acreate(public_id="smollm2", backend=backend, model="slow-tokens")
        communicator = ApplicationCommunicator(get_asgi_application(), completion_scope(plaintext))
        body = {"model": "smollm2", "messages": [{"role": "user", "content": "Hi"}], "stream": True}
        await communicator.send_input({"type": "http.request", "body": orjson.dumps(body)})
        assert (await communicator.receive_output(timeout=10))["status"] == 200
        received = 0
        while received < 3:
            received += (await communicator.receive_output(timeout=10))["body"].count(b"data: ")
        hung_up = time.monotonic()
        await communicator.send_input({"type": "http.disconnect"})
        await communicator.wait(timeout=10)
        for _ in range(100):
            if "slow-tokens" in self.upstream.closed:
                break
            await asyncio.sleep(0.01)
        assert self.upstream.closed["slow-tokens"] - hung_up < 1.0
        row = await RequestLog.objects.aget()
        assert row.cancelled
        assert row.status_code == 200
        assert row.completion_tokens >= 2


class BackPressureTests(TransactionTestCase):
    """A client that stops reading makes the gateway stop reading its upstream."""

    def setUp(self):
        keep_test_connection(self)
        self.upstream, stop = faulty_upstream.start(SECRET)
        self.addCleanup(stop)

    async def test_a_stream_holds_a_small_buffer_whatever_the_upstream_sends(self):
        _, plaintext = await sync_to_async(ApiKey.objects.create_key)("slow reader")
        backend = await Backend.objects.acreate(
            name="up", kind="openai", base_url=self.upstream.base_url
        )
        await ModelAlias.objects.acreate(public_id="smollm2", backend=backend, model="huge-stream")
        received = 0  # bytes the gateway read from the upstream
        data_received = _http1._Connection.data_received

        def counting(connection, data):
            nonlocal received
            received += len(data)
            data_received(connection, data)

        frames = 0
        stopped_reading, hung_up = asyncio.Event(), asyncio.Event()

        async def send(message):  # a client that reads ten frames, then nothing
            nonlocal frames
            if message["type"] == "http.response.body":
                sent = message["body"].count(b"data: ")  # frames ready together: one message
                if frames + sent > 10:  # this message's frames stay held, counted as such
                    stopped_reading.set()
                    await hung_up.wait()  # as a server's send waits for the socket to drain
                frames += sent

        body = {"model": "smollm2", "messages": [{"role": "user", "content": "Hi"}], "stream": True}
        inbox = [{"type": "http.request", "body": orjson.dumps(body)}]

        async def receive():
            if inbox:
                return inbox.pop()
            await hung_up.wait()
            return {"type": "http.disconnect"}

        with mock.patch.object(_http1._Connection, "data_received", counting):
            served = asyncio.ensure_future(
                FastPath(get_asgi_application())(completion_scope(plaintext), receive, send)
            )
            await asyncio.wait_for(stopped_reading.wait(), 10)
            await asyncio.sleep(0.5)  # the upstream goes on sending
            held = received - frames * len(faulty_upstream.data(faulty_upstream.chunk("x" * 8192)))
            hung_up.set()
            await asyncio.wait_for(served, 10)
        assert held <= 64 * 1024
        row = await RequestLog.objects.aget()
        assert row.cancelled
