"""The ASGI fast path: ``/v1`` answered in front of Django, the same as the views."""

import threading
from unittest import mock

import orjson
from asgiref.sync import sync_to_async
from asgiref.testing import ApplicationCommunicator
from django.core.asgi import get_asgi_application
from django.test import TestCase, override_settings

from chatparity import usage
from chatparity.asgi import FastPath
from chatparity.models import ApiKey, Backend, ModelAlias, RequestLog
from tests.asgi import http_scope
from tests.scripted import SCRIPTED


@override_settings(CHATPARITY=SCRIPTED)
class FastPathTests(TestCase):
    @classmethod
    def setUpTestData(cls):
        cls.key, cls.plaintext = ApiKey.objects.create_key("tests")
        backend = Backend.objects.create(
            name="scripted", kind="scripted", options={"script": ["Hello", " there"]}
        )
        ModelAlias.objects.create(public_id="echo", backend=backend)

    def setUp(self):
        self.application = FastPath(get_asgi_application())

    def headers(self, **extra):
        return [
            ("authorization", f"Bearer {self.plaintext}"),
            ("content-type", "application/json"),
            ("user-agent", "fast-path-test/1.0"),
            *extra.items(),
        ]

    async def exchange(self, method, path, body=b"", headers=None, root_path=""):
        """The response start, its body, and the communicator (still running)."""
        headers = self.headers() if headers is None else headers
        communicator = ApplicationCommunicator(
            self.application,
            http_scope(method, path, headers, root_path=root_path, client=("10.1.2.3", 50000)),
        )
        await communicator.send_input({"type": "http.request", "body": body})
        start = await communicator.receive_output(timeout=10)
        parts = []
        while True:
            message = await communicator.receive_output(timeout=10)
            parts.append(message["body"])
            if not message.get("more_body"):
                break
        return start, b"".join(parts), communicator

    async def ask(self, **body):
        request = {"model": "echo", "messages": [{"role": "user", "content": "Hi"}], **body}
        start, content, communicator = await self.exchange(
            "POST", "/v1/chat/completions", orjson.dumps(request)
        )
        await communicator.wait(timeout=10)
        return start, content

    async def test_a_completion_is_what_the_view_answers(self):
        start, content = await self.ask()
        view = await self.async_client.post(
            "/v1/chat/completions",
            data={"model": "echo", "messages": [{"role": "user", "content": "Hi"}]},
            content_type="application/json",
            headers={"Authorization": f"Bearer {self.plaintext}"},
        )
        fast, slow = orjson.loads(content), view.json()
        for varying in ("id", "created"):
            assert fast.pop(varying)
            assert slow.pop(varying)
        assert fast == slow
        assert fast["choices"][0]["message"]["content"] == "Hello there"
        headers = dict(start["headers"])
        assert start["status"] == 200
        assert headers[b"content-type"] == b"application/json"
        assert headers[b"x-request-id"].startswith(b"req_")
        assert int(headers[b"openai-processing-ms"]) >= 0

    async def test_a_stream_is_server_sent_events_ending_in_done(self):
        start, content = await self.ask(stream=True)
        headers = dict(start["headers"])
        assert headers[b"content-type"] == b"text/event-stream; charset=utf-8"
        assert headers[b"cache-control"] == b"no-cache"
        frames = content.split(b"\n\n")
        assert frames[-2:] == [b"data: [DONE]", b""]
        pieces = [orjson.loads(frame[6:])["choices"][0]["delta"] for frame in frames[:-2]]
        assert "".join(piece.get("content") or "" for piece in pieces) == "Hello there"

    async def test_every_request_leaves_its_log_row(self):
        await self.ask(stream=True)
        await self.ask(model="missing")
        rows = [row async for row in RequestLog.objects.order_by("id")]
        assert [(row.alias, row.status_code) for row in rows] == [("echo", 200), ("missing", 404)]
        assert rows[0].completion_tokens == 2
        assert (rows[0].client_ip, rows[0].user_agent) == ("10.1.2.3", "fast-path-test/1.0")
        key = await ApiKey.objects.aget(pk=self.key.pk)
        assert key.last_used_at is not None

    async def test_the_answer_does_not_wait_for_the_log_row(self):
        release = threading.Event()
        original = usage.insert_rows

        def slow_insert(rows):
            assert release.wait(timeout=10)
            return original(rows)

        body = orjson.dumps({"model": "echo", "messages": [{"role": "user", "content": "Hi"}]})
        with mock.patch.object(usage, "insert_rows", slow_insert):
            start, _, communicator = await self.exchange("POST", "/v1/chat/completions", body)
            assert start["status"] == 200  # the whole answer, while the row waits
            assert await RequestLog.objects.acount() == 0
            await sync_to_async(release.set, thread_sensitive=False)()
            await communicator.wait(timeout=10)
        assert await RequestLog.objects.acount() == 1

    async def test_errors_are_openais_envelopes(self):
        start, content, _ = await self.exchange("POST", "/v1/chat/completions", b"{}", headers=[])
        assert start["status"] == 401
        assert orjson.loads(content)["error"]["message"].startswith("You didn't provide an API key")
        start, content, _ = await self.exchange("GET", "/v1/chat/completions")
        assert start["status"] == 405
        start, content, _ = await self.exchange("GET", "/v1/embeddings")
        assert start["status"] == 404
        assert orjson.loads(content)["error"]["message"] == "Invalid URL (GET /v1/embeddings)"

    @override_settings(CHATPARITY={**SCRIPTED, "MAX_BODY_BYTES": 100})
    async def test_a_body_above_the_limit_is_413(self):
        start, _, _ = await self.exchange(
            "POST", "/v1/chat/completions", b"x" * 101, headers=self.headers()
        )
        assert start["status"] == 413
        declared = self.headers(**{"content-length": "5000"})
        start, _, _ = await self.exchange("POST", "/v1/chat/completions", headers=declared)
        assert start["status"] == 413

    async def test_models_are_listed_and_retrieved(self):
        _, content, _ = await self.exchange("GET", "/v1/models")
        assert [model["id"] for model in orjson.loads(content)["data"]] == ["echo"]
        _, content, _ = await self.exchange("GET", "/v1/models/ECHO")
        assert orjson.loads(content)["id"] == "echo"

    async def test_a_site_mounted_under_a_root_path_is_served(self):
        start, content, _ = await self.exchange("GET", "/gw/v1/models", root_path="/gw")
        assert start["status"] == 200
        assert orjson.loads(content)["object"] == "list"

    async def test_other_requests_go_to_django(self):
        start, content, _ = await self.exchange("GET", "/admin/login/", headers=[])
        assert start["status"] == 200
        assert b"<form" in content
