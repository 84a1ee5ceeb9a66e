"""The views end to end in-process: Django's async test client, the real local model."""

import shutil
import tempfile
from pathlib import Path
from unittest import mock

import orjson
from django.core.cache import cache
from django.core.handlers.asgi import ASGIRequest
from django.db import OperationalError
from django.test import TestCase, override_settings
from django.utils import timezone

from chatparity.accounting import inserts, keys, spool
from chatparity.models import ApiKey, Backend, ModelAlias, RequestLog
from chatparity.transport import views
from tests.asgi import http_scope
from tests.scripted import SCRIPTED


class ViewTestCase(TestCase):
    @classmethod
    def setUpTestData(cls):
        cls.key, cls.plaintext = ApiKey.objects.create_key("tests")
        cls.local = Backend.objects.create(name="local", kind="local")
        ModelAlias.objects.create(public_id="smollm2", backend=cls.local, model="SmolLM2")

    def post(self, body, **headers):
        return self.async_client.post(
            "/v1/chat/completions",
            data=orjson.dumps(body) if isinstance(body, dict) else body,
            content_type="application/json",
            headers={"Authorization": f"Bearer {self.plaintext}", **headers},
        )

    @staticmethod
    async def read_stream(response):
        return b"".join([part async for part in response.streaming_content])

    def ask(self, model="smollm2", **body):
        return self.post({"model": model, "messages": [{"role": "user", "content": "Hi"}], **body})


class CompletionTests(ViewTestCase):
    async def test_success_leaves_one_log_row_with_tokens(self):
        response = await self.ask(max_tokens=4, temperature=0)
        assert response.status_code == 200
        completion = response.json()
        row = await RequestLog.objects.aget(completion_id=completion["id"])
        assert (row.status_code, row.alias, row.backend, row.upstream_model) == (
            200, "smollm2", "local", "SmolLM2",
        )  # fmt: skip
        assert row.finish_reasons == ["length"]
        assert row.completion_tokens == 4
        assert row.prompt_tokens == completion["usage"]["prompt_tokens"]
        assert row.key_prefix == self.key.prefix
        assert row.request_id == response["x-request-id"]
        assert row.request_body is None
        assert row.response_body == ""

    async def test_alias_is_matched_case_insensitively_and_echoed(self):
        response = await self.ask(model="SMOLLM2", max_tokens=1)
        assert response.json()["model"] == "SMOLLM2"

    async def test_alias_defaults_apply_unless_the_client_sets_them(self):
        await ModelAlias.objects.acreate(
            public_id="smollm2-short", backend=self.local, default_params={"max_tokens": 2}
        )
        short = (await self.ask(model="smollm2-short")).json()
        assert short["usage"]["completion_tokens"] == 2
        longer = (await self.ask(model="smollm2-short", max_tokens=3, temperature=0)).json()
        assert longer["usage"]["completion_tokens"] == 3
        newer = await self.ask(model="smollm2-short", max_completion_tokens=3, temperature=0)
        assert newer.json()["usage"]["completion_tokens"] == 3

    async def test_deprecated_functions_are_answered_with_function_call(self):
        city = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
        weather = {"name": "get_weather", "parameters": city}
        forced = {"functions": [weather], "function_call": {"name": "get_weather"}}
        completion = (await self.ask(max_tokens=60, temperature=0, **forced)).json()
        (choice,) = completion["choices"]
        assert (choice["message"]["content"], choice["finish_reason"]) == (None, "stop")
        assert choice["message"]["function_call"]["name"] == "get_weather"
        assert "tool_calls" not in choice["message"]
        stream = await self.ask(max_tokens=60, temperature=0, stream=True, **forced)
        chunks = [
            orjson.loads(frame[6:])
            for frame in (await self.read_stream(stream)).split(b"\n\n")
            if frame.startswith(b"data: {")
        ]
        assert chunks[0]["choices"][0]["delta"]["function_call"] == {
            "name": "get_weather",
            "arguments": "",
        }
        arguments = "".join(
            c["choices"][0]["delta"]["function_call"]["arguments"] for c in chunks[:-1]
        )
        assert arguments == choice["message"]["function_call"]["arguments"]

    @override_settings(CHATPARITY={"LOG_BODIES": True})
    async def test_bodies_are_logged_only_when_enabled(self):
        completion = (await self.ask(max_tokens=2)).json()
        row = await RequestLog.objects.aget(completion_id=completion["id"])
        assert row.request_body["max_tokens"] == 2
        assert orjson.loads(row.response_body)["choices"] == completion["choices"]


class ErrorTests(ViewTestCase):
    async def test_missing_and_wrong_keys_are_401_without_a_log_row(self):
        missing = await self.async_client.post("/v1/chat/completions", data={})
        wrong = await self.post({}, Authorization="Bearer sk-cp-wrong-key-123456")
        assert (missing.status_code, wrong.status_code) == (401, 401)
        assert wrong.json()["error"]["code"] == "invalid_api_key"
        assert "sk-cp-wrong-key-123456" not in wrong.content.decode()
        assert await RequestLog.objects.acount() == 0

    async def test_revoked_key_is_refused_at_once(self):
        assert (await self.ask(max_tokens=1)).status_code == 200
        self.key.is_active = False
        await self.key.asave()
        assert (await self.ask()).status_code == 401

    async def test_expired_key_is_refused_at_once(self):
        assert (await self.ask(max_tokens=1)).status_code == 200
        self.key.expires_at = timezone.now()
        await self.key.asave()
        assert (await self.ask()).status_code == 401

    async def test_a_key_revoked_elsewhere_is_refused_within_cache_seconds(self):
        # Another worker's change (or a queryset update) sends this process no signal.
        with mock.patch.object(keys, "clock", return_value=1000.0) as clock:
            assert (await self.ask(max_tokens=1)).status_code == 200
            await ApiKey.objects.filter(pk=self.key.pk).aupdate(is_active=False)
            assert (await self.ask(max_tokens=1)).status_code == 200  # still cached
            clock.return_value += 1.01  # CACHE_SECONDS (1.0) later
            assert (await self.ask()).status_code == 401

    async def test_key_scoped_to_other_aliases_gets_404_and_a_filtered_model_list(self):
        other = await ModelAlias.objects.acreate(public_id="other", backend=self.local)
        self.key.all_aliases = False
        await self.key.asave()
        await self.key.allowed_aliases.aset([other])
        response = await self.ask(model="smollm2", max_tokens=1)
        assert response.status_code == 404
        assert response.json()["error"]["code"] == "model_not_found"
        models = await self.async_client.get(
            "/v1/models", headers={"Authorization": f"Bearer {self.plaintext}"}
        )
        assert [m["id"] for m in models.json()["data"]] == ["other"]
        assert (await self.ask(model="other", max_tokens=1)).status_code == 200

    async def test_narrowing_a_key_takes_effect_at_once(self):
        other = await ModelAlias.objects.acreate(public_id="other", backend=self.local)
        smollm2 = await ModelAlias.objects.aget(public_id="smollm2")
        self.key.all_aliases = False
        await self.key.asave()
        await self.key.allowed_aliases.aset([other, smollm2])
        with mock.patch.object(keys, "clock", return_value=1000.0):  # the cache never expires
            assert (await self.ask(max_tokens=1)).status_code == 200
            await self.key.allowed_aliases.aremove(smollm2)
            assert (await self.ask(max_tokens=1)).status_code == 404
            await self.key.allowed_aliases.aadd(smollm2)
            assert (await self.ask(max_tokens=1)).status_code == 200

    async def test_unknown_model_is_404_and_logged(self):
        response = await self.ask(model="gpt-9")
        assert response.status_code == 404
        assert response.json() == {
            "error": {
                "message": "The model `gpt-9` does not exist or you do not have access to it.",
                "type": "invalid_request_error",
                "param": None,
                "code": "model_not_found",
            }
        }
        row = await RequestLog.objects.aget()
        assert (row.status_code, row.error_code, row.alias) == (404, "model_not_found", "unknown")

    async def test_the_model_is_checked_before_the_rest_of_the_body(self):
        unknown = await self.post({"model": "gpt-9", "temperature": 9})
        assert (unknown.status_code, unknown.json()["error"]["code"]) == (404, "model_not_found")
        empty = await self.post({"model": ""})
        assert (empty.status_code, empty.json()["error"]["message"]) == (
            400, "you must provide a model parameter",
        )  # fmt: skip
        known = await self.post({"model": "smollm2", "temperature": 9})
        assert (known.status_code, known.json()["error"]["param"]) == (400, "messages")

    async def test_made_up_models_are_logged_as_unknown_never_as_sent(self):
        # Security round 3: 3,000 made-up names of ~2.9 KB each bloated the dashboard's
        # charts, its alias list and the admin's alias filter.
        for name in ("gpt-" + "9" * 2900, "<script>x</script>", "another"):
            assert (await self.ask(model=name)).status_code == 404
        assert {row.alias async for row in RequestLog.objects.all()} == {"unknown"}

    @override_settings(CHATPARITY={"LOG_BODIES": True})
    async def test_a_made_up_model_is_kept_as_sent_only_in_the_logged_body(self):
        assert (await self.ask(model="gpt-9")).status_code == 404
        row = await RequestLog.objects.aget()
        assert (row.alias, row.request_body["model"]) == ("unknown", "gpt-9")

    async def test_made_up_models_count_against_the_keys_limits(self):
        # Security round 3: an unknown model was a 404 before any limit (12 of 12 on a
        # key limited to 2 a minute).
        cache.clear()
        self.key.requests_per_minute = 2
        await self.key.asave()
        statuses = [(await self.ask(model=f"made-up-{i}")).status_code for i in range(3)]
        assert statuses == [404, 404, 429]
        assert (await self.ask(max_tokens=1)).status_code == 429  # the same minute's

    async def test_invalid_request_is_400_and_logged(self):
        response = await self.ask(n=0)
        assert response.status_code == 400
        assert response.json()["error"]["param"] == "n"
        row = await RequestLog.objects.aget()
        assert (row.status_code, row.error_type) == (400, "invalid_request_error")

    async def test_wrong_method_is_405_in_the_envelope(self):
        response = await self.async_client.get("/v1/chat/completions")
        assert response.status_code == 405
        assert response.json()["error"]["type"] == "invalid_request_error"


@override_settings(CHATPARITY=SCRIPTED)
class BackendFailureTests(ViewTestCase):
    async def scripted(self, *script):
        backend = await Backend.objects.acreate(
            name="scripted", kind="scripted", options={"script": list(script)}
        )
        await ModelAlias.objects.acreate(public_id="scripted", backend=backend)

    async def test_failure_after_first_byte_is_one_error_frame_then_done(self):
        await self.scripted("Hel", "lo", "<fail>")
        response = await self.ask(model="scripted", stream=True)
        assert response.status_code == 200
        frames = (await self.read_stream(response)).split(b"\n\n")
        assert frames[-3] == (
            b'data: {"error":{"message":"The server had an error while processing your'
            b' request.","type":"server_error","param":null,"code":null}}'
        )
        assert frames[-2:] == [b"data: [DONE]", b""]
        row = await RequestLog.objects.aget()
        assert (row.status_code, row.error_type, row.completion_tokens) == (200, "server_error", 2)

    async def test_failure_before_first_byte_is_a_real_status(self):
        await self.scripted("<error>")
        response = await self.ask(model="scripted", stream=True)
        assert response.status_code == 502
        assert response.json()["error"]["code"] == "bad"
        assert (await RequestLog.objects.aget()).status_code == 502

    async def test_backend_crash_before_first_byte_is_a_500_envelope_and_logged(self):
        await self.scripted("<fail>")
        response = await self.ask(model="scripted", stream=True)
        assert response.status_code == 500
        assert response.json()["error"] == {
            "message": "The server had an error while processing your request.",
            "type": "server_error",
            "param": None,
            "code": None,
        }
        assert (await RequestLog.objects.aget()).status_code == 500

    async def test_non_stream_failure_midway_is_a_500_envelope(self):
        await self.scripted("partial", "<fail>")
        response = await self.ask(model="scripted")
        assert response.status_code == 500
        assert response.json()["error"]["type"] == "server_error"
        assert (await RequestLog.objects.aget()).status_code == 500


def touching(path):
    """Settings that declare the program ``touch <path>`` as the command ``touch``."""
    return {**SCRIPTED, "COMMANDS": {"touch": {"argv": ["touch", str(path)]}}}


class ChoicesLimitTests(ViewTestCase):
    """``n`` has a maximum per alias (``max_n``, else ``CHATPARITY["MAX_N"]`` for its
    backend's kind, else 1), checked before the request is admitted or anything runs."""

    def assert_refused(self, response, most, n):
        assert response.status_code == 400
        assert response.json()["error"] == {
            "message": "Invalid 'n': integer above maximum value. Expected a value"
            f" <= {most}, but got {n} instead.",
            "type": "invalid_request_error",
            "param": "n",
            "code": "integer_above_max_value",
        }

    async def test_the_local_model_gives_four_choices_and_is_not_admitted_above(self):
        cache.clear()
        self.key.requests_per_minute = 1
        await self.key.asave()
        self.assert_refused(await self.ask(n=128), 4, 128)
        row = await RequestLog.objects.aget()
        assert (row.status_code, row.error_code, row.n) == (400, "integer_above_max_value", 128)
        completion = (await self.ask(n=4, max_tokens=1)).json()  # the one request this minute
        assert [choice["index"] for choice in completion["choices"]] == [0, 1, 2, 3]

    async def test_a_command_gives_two_choices_and_runs_nothing_above(self):
        marker = Path(tempfile.mkdtemp()) / "ran"
        self.addCleanup(shutil.rmtree, marker.parent)
        backend = await Backend.objects.acreate(
            name="cli", kind="command", options={"command": "touch"}
        )
        await ModelAlias.objects.acreate(public_id="cli", backend=backend)
        with override_settings(CHATPARITY=touching(marker)):
            self.assert_refused(await self.ask(model="cli", n=128), 2, 128)
            self.assert_refused(await self.ask(model="cli", n=3), 2, 3)
            assert not marker.exists()
            assert (await self.ask(model="cli", n=2)).status_code == 200
        assert marker.exists()

    @override_settings(CHATPARITY=SCRIPTED)
    async def test_other_kinds_give_one_unless_the_alias_sets_its_own(self):
        backend = await Backend.objects.acreate(
            name="scripted", kind="scripted", options={"script": ["<fail>"]}
        )  # a 500 if it ever ran
        alias = await ModelAlias.objects.acreate(public_id="scripted", backend=backend)
        self.assert_refused(await self.ask(model="scripted", n=2), 1, 2)
        alias.max_n = 3
        await alias.asave()
        self.assert_refused(await self.ask(model="scripted", n=128), 3, 128)
        assert (await self.ask(model="scripted", n=3)).status_code == 500  # it ran

    @override_settings(CHATPARITY={"MAX_N": {"local": 1}})
    async def test_settings_set_the_maximum_of_a_kind(self):
        self.assert_refused(await self.ask(n=2), 1, 2)

    @override_settings(CHATPARITY=SCRIPTED)
    async def test_a_fallback_that_gives_fewer_choices_is_passed_over(self):
        down = await Backend.objects.acreate(
            name="down", kind="scripted", options={"script": ["<error>"]}
        )
        up = await Backend.objects.acreate(name="up", kind="scripted", options={"script": ["Hi"]})
        await ModelAlias.objects.acreate(public_id="one", backend=up)
        await ModelAlias.objects.acreate(public_id="two", backend=up, max_n=2)
        await ModelAlias.objects.acreate(
            public_id="primary", backend=down, max_n=2, fallbacks=["one", "two"]
        )
        assert (await self.ask(model="primary", n=2)).status_code == 200
        assert (await RequestLog.objects.aget()).alias == "two"


class ModelsTests(ViewTestCase):
    async def test_lists_only_listed_enabled_aliases(self):
        await ModelAlias.objects.acreate(public_id="hidden", backend=self.local, listed=False)
        await ModelAlias.objects.acreate(public_id="off", backend=self.local, enabled=False)
        response = await self.async_client.get(
            "/v1/models", headers={"Authorization": f"Bearer {self.plaintext}"}
        )
        body = response.json()
        assert body["object"] == "list"
        assert [m["id"] for m in body["data"]] == ["smollm2"]
        assert set(body["data"][0]) == {"id", "object", "created", "owned_by"}

    async def test_an_alias_whose_backend_is_disabled_is_shown_not_served(self):
        self.local.enabled = False
        await self.local.asave()
        shown = await self.async_client.get(
            "/v1/models/smollm2", headers={"Authorization": f"Bearer {self.plaintext}"}
        )
        assert (shown.status_code, shown.json()["id"]) == (200, "smollm2")
        refused = await self.ask(max_tokens=1)
        assert (refused.status_code, refused.json()["error"]["code"]) == (404, "model_not_found")

    async def test_retrieve_unknown_model_is_404(self):
        response = await self.async_client.get(
            "/v1/models/nope", headers={"Authorization": f"Bearer {self.plaintext}"}
        )
        assert response.status_code == 404
        assert response.json()["error"]["code"] == "model_not_found"


class InvalidUrlTests(ViewTestCase):
    async def test_unknown_paths_under_v1_are_openais_404_envelope(self):
        for path in ("/v1/models/", "/v1/completions", "/v1/chat/completions/extra"):
            response = await self.async_client.get(path)
            assert response.status_code == 404, path
            assert response.json() == {
                "error": {
                    "message": f"Invalid URL (GET {path})",
                    "type": "invalid_request_error",
                    "param": None,
                    "code": None,
                }
            }
            assert response["x-request-id"].startswith("req_")


class BusyDatabaseTests(ViewTestCase):
    """A log write refused by a busy database is retried, and never cuts the stream."""

    def refuse_writes(self, times):
        original = inserts.insert_rows
        calls = []

        def insert_rows(rows):
            calls.append(rows)
            if len(calls) <= times:
                raise OperationalError("database is locked")
            return original(rows)

        patcher = mock.patch.object(inserts, "insert_rows", insert_rows)
        patcher.start()
        self.addCleanup(patcher.stop)
        return calls

    async def test_a_refused_log_write_is_retried(self):
        calls = self.refuse_writes(times=2)
        response = await self.ask(max_tokens=2, stream=True)
        body = await self.read_stream(response)
        assert body.endswith(b"data: [DONE]\n\n")
        assert len(calls) == 3
        assert await RequestLog.objects.acount() == 1

    async def test_a_spooled_log_row_still_ends_the_stream_with_done(self):
        self.refuse_writes(times=99)
        response = await self.ask(max_tokens=2, stream=True)
        body = await self.read_stream(response)
        assert body.endswith(b"data: [DONE]\n\n")
        assert b'"finish_reason":"length"' in body
        assert spool.pending()  # written once the database takes it

    async def test_a_spooled_log_row_does_not_change_the_clients_error(self):
        self.refuse_writes(times=99)
        response = await self.ask(model="gpt-9")
        assert spool.pending()
        assert response.status_code == 404
        assert response.json()["error"]["code"] == "model_not_found"


class UnreadableBody:
    """A request body that must not be read."""

    def read(self, *args):
        raise AssertionError("the body of an unauthenticated request was read")


class BodyTests(ViewTestCase):
    async def test_the_key_is_checked_before_the_body_is_read(self):
        for authorization in ([], [("authorization", "Bearer sk-cp-wrong-key-123456")]):
            headers = [*authorization, ("content-type", "application/json")]
            scope = http_scope("POST", "/v1/chat/completions", headers)
            response = await views.chat_completions(ASGIRequest(scope, UnreadableBody()))
            assert response.status_code == 401
        assert await RequestLog.objects.acount() == 0
