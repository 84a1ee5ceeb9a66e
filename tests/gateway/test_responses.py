"""/v1/responses: created, streamed, stored, read, listed, continued and deleted, through
the ASGI fast path and the Django views, behind the same keys, limits and log as chat."""

import asyncio
import re
from datetime import timedelta
from unittest import mock

import orjson
import pytest
from asgiref.testing import ApplicationCommunicator
from django.contrib.auth import get_user_model
from django.core.asgi import get_asgi_application
from django.core.cache import cache
from django.db import DataError, OperationalError, connections
from django.test import override_settings
from django.utils import timezone

from chatparity.backends.base import BackendConfig
from chatparity.gateway import responses
from chatparity.gateway.responses import Keeper
from chatparity.models import ApiKey, Backend, ModelAlias, RequestLog, StoredResponse
from chatparity.protocol.errors import APIError
from chatparity.protocol.events import Finish, TextDelta, ToolCallDelta, Usage
from chatparity.transport.fastpath import FastPath
from tests.asgi import FastPathTestCase, http_scope, reply_body
from tests.scripted import WithScriptedUpstream
from tests.support import routed
from tests.support.waiting import until
from tests.support.wire import TWO_DELTAS


class ScriptBackend:
    """Answers ``options["script"]``: text pieces, ``["call", id, name, arguments]``,
    ``"<fail>"`` (an upstream error midway) or ``"<refuse>"`` (before the first event).
    Every request it serves is kept in :attr:`served`."""

    system_fingerprint = "fp_script"
    served: list = []

    def __init__(self, config: BackendConfig) -> None:
        self.config = config

    async def stream(self, request, model):
        ScriptBackend.served.append(request)
        calls = 0
        for step in self.config.options["script"]:
            if step == "<refuse>":
                raise APIError("upstream refused", status=502, type="server_error")
            if step == "<fail>":
                raise APIError("upstream broke", status=502, type="server_error")
            if isinstance(step, list):
                _, call_id, name, arguments = step
                yield ToolCallDelta(0, calls, arguments, id=call_id, name=name)
                calls += 1
            else:
                yield TextDelta(0, step)
        yield Finish(0, "tool_calls" if calls else "stop")
        yield Usage(prompt_tokens=5, completion_tokens=2)


SETTINGS = {"BACKEND_CLASSES": {"script": "tests.gateway.test_responses.ScriptBackend"}}


def alias(name, *script, **fields):
    backend = Backend.objects.create(name=name, kind="script", options={"script": list(script)})
    return ModelAlias.objects.create(public_id=name, backend=backend, **fields)


def parse_events(content):
    """The events of a Responses stream, each checked to name its type on its event line."""
    events = []
    for frame in content.split(b"\n\n")[:-1]:
        kind, data = frame.split(b"\n")
        event = orjson.loads(data.removeprefix(b"data: "))
        assert kind == b"event: " + event["type"].encode()
        events.append(event)
    return events


@override_settings(CHATPARITY=SETTINGS)
class ResponsesTestCase(FastPathTestCase):
    @classmethod
    def setUpTestData(cls):
        cls.owner = get_user_model().objects.create(username="ada")
        cls.key, cls.plaintext = ApiKey.objects.create_key("tests", owner=cls.owner)
        cls.sibling, cls.sibling_plaintext = ApiKey.objects.create_key("other", owner=cls.owner)
        cls.stranger, cls.stranger_plaintext = ApiKey.objects.create_key("stranger")
        alias("echo", "Hello", " there")
        alias("weather", ["call", "call_1", "get_weather", '{"city":"Paris"}'])
        alias("broken", "Hel", "<fail>")
        alias("refusing", "<refuse>")
        alias(
            "calls",
            "Checking.",
            ["call", "call_" + "k" * 24, "get_weather", "{}"],
            ["call", None, "get_weather", "{}"],
        )

    def setUp(self):
        super().setUp()
        ScriptBackend.served.clear()

    async def fast(self, method, path, body=None, plaintext=None):
        """The status, headers and body the fast path answers."""
        headers = [("authorization", f"Bearer {plaintext or self.plaintext}")]
        content = orjson.dumps(body) if body else b""
        start, answer, communicator = await self.exchange(method, path, content, headers)
        await communicator.wait(timeout=10)
        return start["status"], dict(start["headers"]), answer

    async def create(self, plaintext=None, **body):
        status, _, content = await self.fast(
            "POST", "/v1/responses", {"model": "echo", **body}, plaintext
        )
        return status, orjson.loads(content) if not body.get("stream") else content

    async def view(self, method, path, plaintext=None, **body):
        headers = {"Authorization": f"Bearer {plaintext or self.plaintext}"}
        if method == "POST":
            return await self.async_client.post(
                path, data=body, content_type="application/json", headers=headers
            )
        return await self.async_client.generic(method, path, headers=headers)


class CreateTests(ResponsesTestCase):
    async def test_a_response_is_the_accumulated_answer_with_its_usage(self):
        status, response = await self.create(input="Hi", metadata={"k": "v"})
        assert status == 200
        assert response["id"].startswith("resp_")
        assert (response["object"], response["status"], response["model"]) == (
            "response",
            "completed",
            "echo",
        )
        (message,) = response["output"]
        assert message["id"].startswith("msg_")
        assert (message["role"], message["status"]) == ("assistant", "completed")
        assert message["content"] == [
            {"type": "output_text", "annotations": [], "logprobs": [], "text": "Hello there"}
        ]
        assert response["usage"]["input_tokens"] == 5
        assert response["usage"]["output_tokens"] == 2
        assert response["metadata"] == {"k": "v"}

    async def test_the_fast_path_and_the_views_answer_alike(self):
        _, fast = await self.create(input="Hi")
        slow = (await self.view("POST", "/v1/responses", model="echo", input="Hi")).json()
        for varying in ("id", "created_at"):
            assert fast.pop(varying) != slow.pop(varying) or varying == "created_at"
        for answer in (fast, slow):
            answer["output"][0].pop("id")
        assert fast == slow

    async def test_every_responses_route_is_served_by_the_fast_path(self):
        for path in ("/v1/responses", "/v1/responses/resp_1", "/v1/responses/resp_1/input_items"):
            route = self.application._route(http_scope("GET", path))
            assert route is not None, path
            assert route[0].__module__ == "chatparity.gateway.responses"

    async def test_a_stream_is_typed_events_numbered_in_order_ending_with_completed(self):
        status, content = await self.create(input="Hi", stream=True)
        assert status == 200
        events = parse_events(content)
        assert [event["sequence_number"] for event in events] == list(range(len(events)))
        assert [event["type"] for event in events] == TWO_DELTAS
        final = events[-1]["response"]
        _, _, stored = await self.fast("GET", f"/v1/responses/{final['id']}")
        assert orjson.loads(stored) == final

    async def test_a_tool_call_is_a_function_call_item(self):
        tool = {"type": "function", "name": "get_weather", "parameters": {"type": "object"}}
        status, response = await self.create(model="weather", input="Weather?", tools=[tool])
        assert status == 200
        (call,) = response["output"]
        assert call["id"].startswith("fc_")
        assert (call["type"], call["call_id"], call["name"], call["arguments"]) == (
            "function_call",
            "call_1",
            "get_weather",
            '{"city":"Paris"}',
        )
        assert response["tools"][0]["strict"] is True
        served = ScriptBackend.served[0]
        assert [t.name for t in served.tools] == ["get_weather"]

    async def test_every_id_is_openais_form_streamed_or_not(self):
        tool = {"type": "function", "name": "get_weather", "parameters": {"type": "object"}}
        asked = {"model": "calls", "input": "Weather?", "tools": [tool]}
        _, response = await self.create(**asked)
        _, _, content = await self.fast("POST", "/v1/responses", {**asked, "stream": True})
        streamed = parse_events(content)[-1]["response"]
        for made in (response, streamed):
            assert re.fullmatch(r"resp_[0-9a-f]{50}", made["id"])
            message, kept, made_up = made["output"]
            assert re.fullmatch(r"msg_[0-9a-f]{50}", message["id"])
            assert [re.fullmatch(r"fc_[0-9a-f]{50}", call["id"]) for call in (kept, made_up)]
            assert kept["call_id"] == "call_" + "k" * 24  # the backend's own
            assert re.fullmatch(r"call_[A-Za-z0-9]{24}", made_up["call_id"])  # it gave none
        assert len({made["id"] for made in (response, streamed)}) == 2

    async def test_the_log_row_names_the_endpoint_and_the_response(self):
        _, response = await self.create(input="Hi")
        row = await RequestLog.objects.aget()
        assert (row.endpoint, row.completion_id, row.alias) == ("responses", response["id"], "echo")
        assert (row.status_code, row.prompt_tokens, row.completion_tokens) == (200, 5, 2)
        assert row.finish_reasons == ["stop"]

    @override_settings(CHATPARITY={**SETTINGS, "LOG_BODIES": True})
    async def test_logged_bodies_are_the_request_and_the_response_object(self):
        _, response = await self.create(input="Hi")
        row = await RequestLog.objects.aget()
        assert row.request_body == {"model": "echo", "input": "Hi"}
        assert orjson.loads(row.response_body) == response

    async def test_a_body_that_is_not_json_leaves_a_row_of_this_endpoint(self):
        status, _, _ = await self.fast("POST", "/v1/responses")
        assert status == 400
        row = await RequestLog.objects.aget()
        assert (row.endpoint, row.status_code) == ("responses", 400)

    async def test_an_invalid_stream_request_is_a_400_envelope(self):
        status, headers, content = await self.fast(
            "POST", "/v1/responses", {"model": "echo", "input": "Hi", "stream": True, "n": 2}
        )
        assert (status, headers[b"content-type"]) == (400, b"application/json")
        assert orjson.loads(content)["error"] == {
            "message": "Unknown parameter: 'n'.",
            "type": "invalid_request_error",
            "param": "n",
            "code": "unknown_parameter",
        }
        row = await RequestLog.objects.aget()
        assert (row.endpoint, row.status_code) == ("responses", 400)

    async def test_an_unknown_model_is_openais_404(self):
        status, response = await self.create(model="nope", input="Hi")
        assert status == 404
        assert response["error"]["code"] == "model_not_found"

    async def test_a_failure_before_the_first_byte_keeps_its_status(self):
        status, _, content = await self.fast(
            "POST", "/v1/responses", {"model": "refusing", "input": "Hi", "stream": True}
        )
        assert status == 502
        assert orjson.loads(content)["error"]["message"] == "upstream refused"

    async def test_a_failure_midway_ends_the_stream_with_response_failed(self):
        status, content = await self.create(model="broken", input="Hi", stream=True)
        assert status == 200
        events = parse_events(content)
        assert [event["type"] for event in events[-2:]] == [
            "response.output_text.delta",
            "response.failed",
        ]
        failed = events[-1]["response"]
        assert (failed["status"], failed["error"]["message"]) == ("failed", "upstream broke")
        row = await RequestLog.objects.aget()
        assert (row.status_code, row.error_type) == (200, "server_error")
        assert not await StoredResponse.objects.aexists()

    async def test_a_failure_midway_without_stream_is_an_error_status(self):
        status, response = await self.create(model="broken", input="Hi")
        assert status == 502
        assert response["error"]["message"] == "upstream broke"

    async def test_the_keys_limits_count_responses_like_completions(self):
        await ApiKey.objects.filter(pk=self.key.pk).aupdate(requests_per_minute=1)
        first, _ = await self.create(input="Hi")
        second, response = await self.create(input="Hi")
        assert (first, second) == (200, 429)
        assert response["error"]["code"] == "rate_limit_exceeded"


class StoreTests(ResponsesTestCase):
    async def test_a_stored_response_is_read_back_as_it_was_answered(self):
        _, response = await self.create(input="Hi")
        for reader in (self.plaintext, self.sibling_plaintext):  # its key, or its owner's
            status, _, content = await self.fast(
                "GET", f"/v1/responses/{response['id']}", plaintext=reader
            )
            assert (status, orjson.loads(content)) == (200, response)
        slow = await self.view("GET", f"/v1/responses/{response['id']}")
        assert slow.json() == response

    async def test_another_owners_key_finds_nothing(self):
        _, response = await self.create(input="Hi")
        status, _, content = await self.fast(
            "GET", f"/v1/responses/{response['id']}", plaintext=self.stranger_plaintext
        )
        assert status == 404
        assert orjson.loads(content)["error"]["message"] == (
            f"Response with id '{response['id']}' not found."
        )

    async def test_without_store_only_the_log_row_is_kept(self):
        _, response = await self.create(input="Hi", store=False)
        assert response["store"] is False
        status, _, _ = await self.fast("GET", f"/v1/responses/{response['id']}")
        assert status == 404
        assert not await StoredResponse.objects.aexists()
        logged = [row async for row in RequestLog.objects.order_by("id")]
        assert [(row.endpoint, row.status_code) for row in logged] == [
            ("responses", 200),
            ("responses.stored", 404),  # the read: a row of its own, unbilled
        ]

    async def test_an_expired_response_is_neither_read_nor_continued(self):
        _, response = await self.create(input="Hi")
        old = timezone.now() - timedelta(days=31)
        await StoredResponse.objects.filter(pk=response["id"]).aupdate(created_at=old)
        status, _, _ = await self.fast("GET", f"/v1/responses/{response['id']}")
        assert status == 404
        status, refused = await self.create(input="Hi", previous_response_id=response["id"])
        assert status == 400
        assert refused["error"] == {
            "message": f"Previous response with id '{response['id']}' not found.",
            "type": "invalid_request_error",
            "param": "previous_response_id",
            "code": "previous_response_not_found",
        }

    async def test_a_deleted_response_is_gone(self):
        _, response = await self.create(input="Hi")
        path = f"/v1/responses/{response['id']}"
        status, _, content = await self.fast("DELETE", path)
        assert (status, orjson.loads(content)) == (
            200,
            {"id": response["id"], "object": "response", "deleted": True},
        )
        assert (await self.fast("GET", path))[0] == 404
        assert (await self.fast("DELETE", path))[0] == 404
        reads = RequestLog.objects.filter(endpoint="responses.stored").order_by("id")
        assert [(row.status_code, row.total_tokens, row.cost) async for row in reads] == [
            (200, 0, 0),
            (404, 0, 0),
            (404, 0, 0),
        ]

    async def test_a_stranger_cannot_delete_it(self):
        _, response = await self.create(input="Hi")
        path = f"/v1/responses/{response['id']}"
        assert (await self.fast("DELETE", path, plaintext=self.stranger_plaintext))[0] == 404
        assert await StoredResponse.objects.filter(pk=response["id"]).aexists()

    async def test_the_database_away_costs_the_client_nothing_but_the_stored_copy(self):
        failing = mock.patch.object(Keeper, "save", side_effect=OperationalError("gone"))
        with failing, self.assertLogs("chatparity.gateway.responses", "ERROR") as logs:
            status, response = await self.create(input="Hi")
        assert (status, response["status"]) == (200, "completed")
        assert "answered but not stored" in logs.output[0]

    async def test_the_responses_of_concurrent_requests_are_all_kept(self):
        answered = await asyncio.gather(*(self.create(input=f"Hi {i}") for i in range(6)))
        ids = {response["id"] for _, response in answered}
        stored = {each.id async for each in StoredResponse.objects.all()}
        assert stored == ids

    async def test_a_response_the_database_refuses_costs_only_its_own_copy(self):
        original = Keeper.save

        async def refusing(keeper, batch):
            if any(each.input_items[0]["content"][0]["text"] == "refused" for each in batch):
                raise DataError("refused")
            await original(keeper, batch)

        with (
            mock.patch.object(Keeper, "save", refusing),
            self.assertLogs("chatparity.gateway.responses", "ERROR"),
        ):
            answered = await asyncio.gather(
                *(self.create(input=text) for text in ("kept", "refused", "kept too"))
            )
        assert [status for status, _ in answered] == [200, 200, 200]
        stored = [each.input_items[0]["content"][0]["text"] async for each in
                  StoredResponse.objects.order_by("created_at")]  # fmt: skip
        assert sorted(stored) == ["kept", "kept too"]

    async def test_a_response_whose_id_is_as_long_as_the_column_is_found(self):
        _, answered = await self.create(input="Hi")
        stored = await StoredResponse.objects.aget(pk=answered["id"])
        stored.pk = "resp_" + "x" * (StoredResponse._meta.get_field("id").max_length - 5)
        await stored.asave(force_insert=True)
        status, _, content = await self.fast("GET", f"/v1/responses/{stored.pk}")
        assert (status, orjson.loads(content)["id"]) == (200, answered["id"])

    async def test_stored_responses_the_database_cannot_read_now_are_a_503(self):
        _, answered = await self.create(input="Hi")
        refusal = OperationalError("connection refused")
        with mock.patch.object(responses, "_first", side_effect=refusal):
            status, _, content = await self.fast("GET", f"/v1/responses/{answered['id']}")
        read = orjson.loads(content)["error"]
        assert (status, read["message"]) == (503, "Stored responses cannot be read right now.")
        with mock.patch.object(responses, "_chain", side_effect=refusal):
            status, go_on = await self.create(input="Go on", previous_response_id=answered["id"])
        assert (status, go_on["error"]["message"]) == (503, read["message"])

    async def test_reading_stored_responses_spends_no_tokens(self):
        self.key.tokens_per_minute = 10_000
        await self.key.asave()  # its signal empties the key cache

        async def tokens_left_after_a_response():
            status, headers, content = await self.fast(
                "POST", "/v1/responses", {"model": "echo", "input": "Hi"}
            )
            assert status == 200
            return int(headers[b"x-ratelimit-remaining-tokens"]), orjson.loads(content)["id"]

        first, answered = await tokens_left_after_a_response()
        second, _ = await tokens_left_after_a_response()
        for path in (f"/v1/responses/{answered}", f"/v1/responses/{answered}/input_items"):
            assert (await self.fast("GET", path))[0] == 200
        third, _ = await tokens_left_after_a_response()
        assert first - second == second - third  # a response's tokens, and none for reads

    async def test_the_route_of_new_responses_takes_posts_only(self):
        status, headers, content = await self.fast("GET", "/v1/responses")
        message = orjson.loads(content)["error"]["message"]
        assert (status, message) == (405, "Invalid method for URL (GET /v1/responses)")
        assert b"x-request-id" in headers

    async def test_the_stored_row_says_who_asked_what(self):
        _, response = await self.create(input="Hi", instructions="Be brief.")
        stored = await StoredResponse.objects.aget()
        assert (stored.id, stored.api_key_id, stored.owner_id) == (
            response["id"],
            self.key.pk,
            self.owner.pk,
        )
        assert (stored.model, stored.status, stored.previous_response_id) == (
            "echo",
            "completed",
            "",
        )
        assert [item["content"][0]["text"] for item in stored.input_items] == ["Hi"]


class ContinueTests(ResponsesTestCase):
    async def test_a_continued_response_sees_the_whole_conversation_before_it(self):
        _, first = await self.create(input="My name is Ada.", instructions="Be kind.")
        _, second = await self.create(input="Again?", previous_response_id=first["id"])
        _, third = await self.create(
            input="And my name?", previous_response_id=second["id"], instructions="Be brief."
        )
        assert third["previous_response_id"] == second["id"]
        served = ScriptBackend.served[-1]
        assert [(m.role, m.content) for m in served.messages] == [
            ("system", "Be brief."),  # earlier instructions are not carried over
            ("user", "My name is Ada."),
            ("assistant", "Hello there"),
            ("user", "Again?"),
            ("assistant", "Hello there"),
            ("user", "And my name?"),
        ]
        stored = await StoredResponse.objects.aget(pk=third["id"])
        assert stored.previous_response_id == second["id"]

    async def test_a_chain_longer_than_messages_allowed_is_refused_after_reading_that_far(self):
        previous = None
        for turn in range(6):
            _, response = await self.create(input=f"Turn {turn}", previous_response_id=previous)
            previous = response["id"]
        # Each response gives one message at least: past MAX_MESSAGES + 1 of them the
        # conversation is refused whatever comes before, so no more are read.
        read = []

        def chain(*args):
            responses_read = original(*args)
            read.append(len(responses_read))
            return responses_read

        original = responses._chain
        for most in (2, 3):
            with (
                override_settings(CHATPARITY={**SETTINGS, "MAX_MESSAGES": most}),
                mock.patch.object(responses, "_chain", chain),
            ):
                status, refused = await self.create(input="More", previous_response_id=previous)
            assert (status, refused["error"]["param"]) == (400, "input")
        assert read == [3, 4]

    async def test_a_tool_call_is_answered_by_its_output_in_the_next_request(self):
        tool = {"type": "function", "name": "get_weather", "parameters": {"type": "object"}}
        _, asked = await self.create(model="weather", input="Weather?", tools=[tool])
        output = {"type": "function_call_output", "call_id": "call_1", "output": "Sunny"}
        status, _ = await self.create(
            input=[output], previous_response_id=asked["id"], tools=[tool]
        )
        assert status == 200
        served = ScriptBackend.served[-1]
        asking, assistant, result = served.messages
        assert (asking.role, asking.content) == ("user", "Weather?")
        assert assistant.tool_calls[0]["id"] == "call_1"
        assert (result.role, result.tool_call_id, result.content) == ("tool", "call_1", "Sunny")

    async def test_an_output_for_no_call_is_refused(self):
        output = {"type": "function_call_output", "call_id": "call_9", "output": "Sunny"}
        status, refused = await self.create(input=[output])
        assert status == 400
        assert refused["error"]["message"] == (
            "No tool call found for function call output with call_id call_9."
        )

    async def test_the_owners_other_key_may_continue_a_stranger_may_not(self):
        _, first = await self.create(input="Hi")
        status, _ = await self.create(
            plaintext=self.sibling_plaintext, input="Hi", previous_response_id=first["id"]
        )
        assert status == 200
        status, refused = await self.create(
            plaintext=self.stranger_plaintext, input="Hi", previous_response_id=first["id"]
        )
        assert (status, refused["error"]["code"]) == (400, "previous_response_not_found")


AGENTS = {
    "type": "namespace",
    "name": "agents",
    "description": "Sub-agents.",
    "tools": [{"type": "function", "name": "close", "parameters": {"type": "object"}}],
}
WEB_SEARCH = {"type": "web_search", "external_web_access": False}


class ToolsTests(WithScriptedUpstream, ResponsesTestCase):
    """Namespaces served on every backend, hosted tools as the alias's policy says."""

    upstream_scripts = {"chatting": ["Hello"], "messaging": ["Hello"]}

    @classmethod
    def setUpTestData(cls):
        super().setUpTestData()
        alias("closing", ["call", "call_1", "agents__close", '{"id":1}'])
        alias("strict", "Hi")
        for model, wire_api in (("chatting", "chat"), ("messaging", "messages")):
            backend = Backend.objects.create(
                name=model, kind="openai", base_url=cls.upstream.base_url, secret="sk-up",
                timeout=5, options={"wire_api": wire_api, "retries": 0},
            )  # fmt: skip
            ModelAlias.objects.create(public_id=model, backend=backend, model=model)

    async def test_a_call_of_a_namespaces_function_comes_back_with_the_namespace(self):
        for stream in (False, True):
            status, answer = await self.create(
                model="closing", input="Close it.", tools=[AGENTS], stream=stream
            )
            assert status == 200
            response = parse_events(answer)[-1]["response"] if stream else answer
            (call,) = response["output"]
            assert (call["name"], call["namespace"]) == ("close", "agents")
            assert response["tools"] == [
                {**AGENTS, "tools": [{**AGENTS["tools"][0], "description": None, "strict": True}]}
            ]
        assert [tool.name for tool in ScriptBackend.served[0].tools] == ["agents__close"]

    async def test_a_continued_call_of_a_namespace_is_its_flat_name_again(self):
        _, asked = await self.create(model="closing", input="Close it.", tools=[AGENTS])
        _, _, stored = await self.fast("GET", f"/v1/responses/{asked['id']}")
        assert orjson.loads(stored)["output"][0]["namespace"] == "agents"
        output = {"type": "function_call_output", "call_id": "call_1", "output": "Closed."}
        status, _ = await self.create(
            input=[output], previous_response_id=asked["id"], tools=[AGENTS]
        )
        assert status == 200
        _, assistant, result = ScriptBackend.served[-1].messages
        assert assistant.tool_calls[0]["function"]["name"] == "agents__close"
        assert (result.tool_call_id, result.content) == ("call_1", "Closed.")

    async def test_hosted_tools_are_left_out_by_default(self):
        tool = {"type": "function", "name": "get_weather", "parameters": {"type": "object"}}
        status, response = await self.create(input="Hi", tools=[tool, WEB_SEARCH])
        assert status == 200
        row = await RequestLog.objects.aget()
        assert row.omitted_tools == ["web_search"]
        assert response["tools"][1] == WEB_SEARCH  # repeated as asked
        served = ScriptBackend.served[0]
        assert [t.name for t in served.tools] == ["get_weather"]
        assert served.hosted_tools == ()

    async def test_an_alias_may_refuse_them_as_a_tool_not_served(self):
        refuse = "".join(("re", "fuse"))  # as read from a file: a string made at run time
        policies = {**SETTINGS, "HOSTED_TOOLS": {"STRICT": refuse}}
        with override_settings(CHATPARITY=policies):
            status, refused = await self.create(model="strict", input="Hi", tools=[WEB_SEARCH])
            assert status == 400
            assert refused["error"] == {
                "message": "Invalid value: 'web_search'. Tool type 'web_search' is not"
                " supported by this server.",
                "type": "invalid_request_error",
                "param": "tools[0].type",
                "code": "unsupported_value",
            }
            status, _ = await self.create(model="echo", input="Hi", tools=[WEB_SEARCH])
            assert status == 200  # the other aliases: "*", "omit" unless set
        assert not ScriptBackend.served[0].hosted_tools
        row = await RequestLog.objects.filter(alias="strict").aget()
        assert (row.status_code, row.error_code) == (400, "unsupported_value")

    async def test_passed_only_to_the_responses_api_else_left_out_and_named_on_the_row(self):
        # An upstream on the Chat Completions or Messages wire has no field for them:
        # "pass" cannot pass them there, and the operator is told they were left out.
        with override_settings(CHATPARITY={**SETTINGS, "HOSTED_TOOLS": {"*": "pass"}}):
            for model in ("chatting", "messaging"):
                status, response = await self.create(model=model, input="Hi", tools=[WEB_SEARCH])
                assert status == 200, response
                assert "tools" not in self.upstream.requests[-1]
                row = await RequestLog.objects.alatest("id")
                assert (row.alias, row.omitted_tools) == (model, ["web_search"])

    async def test_every_policy_refuses_a_model_no_alias_serves_as_unknown(self):
        with override_settings(CHATPARITY={**SETTINGS, "HOSTED_TOOLS": {"*": "refuse"}}):
            status, refused = await self.create(model="nobody", input="Hi", tools=[WEB_SEARCH])
        assert (status, refused["error"]["code"]) == (404, "model_not_found")


class StoredTextTests(ResponsesTestCase):
    async def test_a_nul_character_is_stored_as_a_replacement_character(self):
        # PostgreSQL's JSON refuses NUL: the response is kept, that character replaced.
        status, response = await self.create(input="a\x00b")
        assert status == 200
        stored = await StoredResponse.objects.aget(pk=response["id"])
        (message,) = stored.input_items
        assert message["content"] == [{"type": "input_text", "text": "a\ufffdb"}]


class StoringTests(ResponsesTestCase):
    async def test_a_client_leaving_while_its_response_is_stored_holds_up_no_other(self):
        original, saving, release = Keeper.save, asyncio.Event(), asyncio.Event()

        async def held_save(keeper, batch):
            saving.set()
            await release.wait()  # a busy database: the batch takes until the test says
            await original(keeper, batch)

        body = orjson.dumps({"model": "echo", "input": "Hi"})
        headers = [("authorization", f"Bearer {self.plaintext}")]
        with mock.patch.object(Keeper, "save", held_save):
            first = self.communicator("POST", "/v1/responses", headers)
            await first.send_input({"type": "http.request", "body": body})
            await asyncio.wait_for(saving.wait(), 10)  # first's batch is being written
            leaving = self.communicator("POST", "/v1/responses", headers)
            waiting = self.communicator("POST", "/v1/responses", headers)
            await leaving.send_input({"type": "http.request", "body": body})
            await waiting.send_input({"type": "http.request", "body": body})
            keeper = responses._keepers.get()
            await until(lambda: len(keeper._pending) == 2)  # both wait for the next batch
            await leaving.send_input({"type": "http.disconnect"})
            await until(leaving.input_queue.empty)  # its leaving is read while its row waits
            release.set()
            assert (await first.receive_output(timeout=5))["status"] == 200
            assert (await waiting.receive_output(timeout=5))["status"] == 200
            await leaving.wait(timeout=5)
        assert await StoredResponse.objects.acount() == 3  # the leaver's too


class InputItemsTests(ResponsesTestCase):
    async def make(self):
        items = [{"role": "user", "content": word} for word in ("one", "two", "three")]
        _, response = await self.create(input=items)
        return response["id"]

    async def listing(self, response_id, query=""):
        """The listing's status and body, through the fast path and the views alike."""
        path = f"/v1/responses/{response_id}/input_items"
        headers = [("authorization", f"Bearer {self.plaintext}")]
        start, content, communicator = await self.exchange("GET", path, b"", headers, query)
        await communicator.wait(timeout=10)
        view = await self.async_client.get(
            f"{path}?{query}", headers={"Authorization": f"Bearer {self.plaintext}"}
        )
        assert (view.status_code, view.content) == (start["status"], content)
        return start["status"], orjson.loads(content)

    def texts(self, listing):
        return [item["content"][0]["text"] for item in listing["data"]]

    async def test_the_input_is_listed_newest_first_as_openai_lists_it(self):
        response_id = await self.make()
        status, _, content = await self.fast("GET", f"/v1/responses/{response_id}/input_items")
        listing = orjson.loads(content)
        assert status == 200
        assert (listing["object"], listing["has_more"]) == ("list", False)
        assert self.texts(listing) == ["three", "two", "one"]
        assert listing["first_id"] == listing["data"][0]["id"]
        assert listing["last_id"] == listing["data"][-1]["id"]
        assert all(item["id"].startswith("msg_") for item in listing["data"])

    async def test_order_after_and_limit_page_through_it(self):
        response_id = await self.make()
        _, page = await self.listing(response_id, "order=asc&limit=2")
        assert (self.texts(page), page["has_more"]) == (["one", "two"], True)
        _, rest = await self.listing(response_id, f"order=asc&limit=2&after={page['last_id']}")
        assert (self.texts(rest), rest["has_more"]) == (["three"], False)

    async def test_a_page_that_ends_with_the_last_item_has_no_more(self):
        response_id = await self.make()
        _, page = await self.listing(response_id, "order=asc&limit=3")
        assert (self.texts(page), page["has_more"]) == (["one", "two", "three"], False)

    async def test_a_page_holds_one_item_to_a_hundred(self):
        response_id = await self.make()
        _, one = await self.listing(response_id, "limit=1")
        assert (self.texts(one), one["has_more"]) == (["three"], True)
        _, hundred = await self.listing(response_id, "limit=100")
        assert self.texts(hundred) == ["three", "two", "one"]
        status, refused = await self.listing(response_id, "limit=0")
        assert (status, refused["error"]["param"]) == (400, "limit")

    async def test_a_parameter_given_twice_is_read_as_its_last_value(self):
        response_id = await self.make()
        _, page = await self.listing(response_id, "limit=1&limit=2&order=asc&order=desc")
        assert self.texts(page) == ["three", "two"]

    async def test_a_page_after_the_first_item_starts_at_the_second(self):
        response_id = await self.make()
        _, first = await self.listing(response_id, "order=asc&limit=1")
        _, rest = await self.listing(response_id, f"order=asc&after={first['first_id']}")
        assert self.texts(rest) == ["two", "three"]

    async def test_a_bad_limit_or_order_is_openais_400(self):
        response_id = await self.make()
        status, refused = await self.listing(response_id, "limit=101")
        assert (status, refused["error"]["param"]) == (400, "limit")
        status, refused = await self.listing(response_id, "order=sideways")
        assert (status, refused["error"]["code"]) == (400, "invalid_value")

    async def test_a_limit_in_other_digits_is_a_400_not_a_500(self):
        response_id = await self.make()
        status, refused = await self.listing(response_id, "limit=%C2%B2")  # "²"
        assert (status, refused["error"]["param"]) == (400, "limit")

    async def test_without_a_key_nothing_is_read_of_the_query(self):
        start, _, communicator = await self.exchange(
            "GET", "/v1/responses/resp_x/input_items", b"", [], "limit=%C2%B2"
        )
        await communicator.wait(timeout=10)
        assert start["status"] == 401

    async def test_a_strangers_key_lists_nothing(self):
        response_id = await self.make()
        status, _, _ = await self.fast(
            "GET", f"/v1/responses/{response_id}/input_items", plaintext=self.stranger_plaintext
        )
        assert status == 404


ROUTED = "responses_routed"


@pytest.fixture(scope="module")
def routed_database(postgres_url, django_db_blocker):
    with routed.chatparity_database(postgres_url, ROUTED, django_db_blocker) as url:
        yield url


async def through_the_fast_path(method, path, plaintext, body=None):
    headers = [("authorization", f"Bearer {plaintext}"), ("content-type", "application/json")]
    communicator = ApplicationCommunicator(
        FastPath(get_asgi_application()), http_scope(method, path, headers)
    )
    await communicator.send_input({"type": "http.request", "body": orjson.dumps(body or {})})
    start = await communicator.receive_output(timeout=10)
    content = await reply_body(communicator)
    await communicator.wait(timeout=10)
    return start["status"], orjson.loads(content)


def test_stored_responses_are_kept_and_read_on_a_new_connection_once_the_server_dropped_the_last(
    routed_database, django_db_blocker, settings
):
    # A restarted PostgreSQL, or a proxy's idle timeout: each first query after it finds
    # the worker's connection broken, and must not cost the client its stored copy or a 503.
    settings.DATABASE_ROUTERS = [routed.ChatparityIn(ROUTED)]
    settings.CHATPARITY = {**SETTINGS, "CACHE_SECONDS": 60}  # the key and alias as read
    with django_db_blocker.unblock():
        _, plaintext = ApiKey.objects.create_key("reconnecting")
        alias("echo-routed", "Hello")

        def after_a_drop(method, path, **body):
            assert routed.drop_connections(routed_database) >= 1
            connections[ROUTED].close()  # this thread's, which the test reads with
            return asyncio.run(through_the_fast_path(method, path, plaintext, body))

        asked = {"model": "echo-routed", "input": "Hi"}
        status, first = asyncio.run(
            through_the_fast_path("POST", "/v1/responses", plaintext, asked)
        )
        assert status == 200
        status, kept = after_a_drop("POST", "/v1/responses", **asked)  # stored first
        assert status == 200
        assert StoredResponse.objects.filter(pk=kept["id"]).exists()
        cache.clear()  # what the key stores, counted again from the database first
        assert after_a_drop("POST", "/v1/responses", **asked)[0] == 200
        go_on = {**asked, "previous_response_id": first["id"], "store": False}
        assert after_a_drop("POST", "/v1/responses", **go_on)[0] == 200  # the chain read first
        status, read = after_a_drop("GET", f"/v1/responses/{first['id']}")
        assert (status, read["id"]) == (200, first["id"])
