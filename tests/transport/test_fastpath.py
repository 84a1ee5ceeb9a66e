"""The ASGI fast path: ``/v1`` answered in front of Django, the same as the views."""

import asyncio
import re
import threading
import time
from unittest import mock

import orjson
import pytest
from asgiref.sync import sync_to_async
from django.core.asgi import get_asgi_application
from django.core.exceptions import ImproperlyConfigured
from django.test import modify_settings, override_settings
from django.urls import clear_url_caches, get_resolver

from chatparity.accounting import inserts
from chatparity.models import ApiKey, Backend, ModelAlias, RequestLog
from chatparity.signals import request_logged
from chatparity.transport.fastpath import FastPath
from tests.asgi import FastPathTestCase, reply_body
from tests.scripted import SCRIPTED, ScriptedBackend
from tests.support import spools

# The production settings of SecurityMiddleware, behind a proxy that says the scheme.
HTTPS = {
    "SECURE_SSL_REDIRECT": True,
    "SECURE_PROXY_SSL_HEADER": ("HTTP_X_FORWARDED_PROTO", "https"),
    "SECURE_HSTS_SECONDS": 3600,
    "SECURE_HSTS_INCLUDE_SUBDOMAINS": True,
}
# What SecurityMiddleware may add to a response.
SECURITY_HEADERS = (
    b"strict-transport-security",
    b"x-content-type-options",
    b"referrer-policy",
    b"cross-origin-opener-policy",
)


class FastPathTests(FastPathTestCase):
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

    async def test_frames_ready_together_go_in_one_message_with_the_end(self):
        communicator = self.communicator("POST", "/v1/chat/completions")
        body = orjson.dumps(self.request(stream=True))
        await communicator.send_input({"type": "http.request", "body": body})
        assert (await communicator.receive_output(timeout=10))["status"] == 200
        only = await communicator.receive_output(timeout=10)  # one write, not five
        assert not only.get("more_body")
        assert only["body"].count(b"data: ") == 5  # role, two pieces, finisher, [DONE]
        assert only["body"].endswith(b"data: [DONE]\n\n")
        await communicator.wait(timeout=10)

    async def test_no_frame_waits_for_the_next(self):
        await self.hanging_alias()
        communicator = self.communicator("POST", "/v1/chat/completions")
        body = self.request(model="hangs", stream=True)
        await communicator.send_input({"type": "http.request", "body": orjson.dumps(body)})
        assert (await communicator.receive_output(timeout=10))["status"] == 200
        sent = await communicator.receive_output(timeout=10)  # while the backend hangs
        assert sent["more_body"]
        assert b'"content":"Once"' in sent["body"]
        assert ScriptedBackend.hanging == 1
        await communicator.send_input({"type": "http.disconnect"})
        await communicator.wait(timeout=10)
        assert ScriptedBackend.hanging == 0
        row = await RequestLog.objects.aget()
        assert (row.cancelled, row.completion_tokens) == (True, 1)

    async def test_a_client_gone_while_the_next_frame_is_awaited_stops_the_backend(self):
        # The frames ready go out when the stream must wait: the client is gone by then,
        # and the step left waiting is unwound as its task would have unwound it.
        await self.hanging_alias()
        request = orjson.dumps(self.request(model="hangs", stream=True))
        messages = [{"type": "http.request", "body": request}]
        sent = []

        async def receive():
            if messages:
                return messages.pop()
            await asyncio.Event().wait()  # no disconnect: the send fails instead

        async def send(message):
            if message.get("more_body"):
                raise OSError("the client is gone")
            sent.append(message)

        scope = self.communicator("POST", "/v1/chat/completions").scope
        await asyncio.wait_for(self.application(scope, receive, send), timeout=10)
        assert [message["type"] for message in sent] == ["http.response.start"]
        assert ScriptedBackend.hanging == 0
        row = await RequestLog.objects.aget()
        assert (row.cancelled, row.completion_tokens) == (True, 1)

    def request(self, **body):
        return {"model": "echo", "messages": [{"role": "user", "content": "Hi"}], **body}

    async def hanging_alias(self):
        backend = await Backend.objects.acreate(
            name="hangs", kind="scripted", options={"script": ["Once", "<hang>"]}
        )
        await ModelAlias.objects.acreate(public_id="hangs", backend=backend)

    async def test_every_request_leaves_its_log_row(self):
        await self.ask(stream=True)
        await self.ask(model="missing")
        rows = [row async for row in RequestLog.objects.order_by("id")]
        assert [(row.alias, row.status_code) for row in rows] == [("echo", 200), ("unknown", 404)]
        assert rows[0].completion_tokens == 2
        assert (rows[0].client_ip, rows[0].user_agent) == ("10.1.2.3", "fast-path-test/1.0")
        key = await ApiKey.objects.aget(pk=self.key.pk)
        assert key.last_used_at is not None

    async def test_the_answer_does_not_wait_for_the_log_row(self):
        release = threading.Event()
        original = inserts.insert_rows

        def slow_insert(rows):
            assert release.wait(timeout=10)
            return original(rows)

        body = orjson.dumps({"model": "echo", "messages": [{"role": "user", "content": "Hi"}]})
        with mock.patch.object(inserts, "insert_rows", slow_insert):
            start, _, communicator = await self.exchange("POST", "/v1/chat/completions", body)
            assert start["status"] == 200  # the whole answer, while the row waits
            assert await RequestLog.objects.acount() == 0
            await sync_to_async(release.set, thread_sensitive=False)()
            await communicator.wait(timeout=10)
        assert await RequestLog.objects.acount() == 1

    async def test_a_client_that_hangs_up_once_answered_leaves_its_whole_accounting(self):
        # Servers report a finished response as a disconnect (uvicorn at once): that
        # must not cut short the settling, the row or its announcement.
        announced = []

        async def receiver(sender, row, **kwargs):
            announced.append(row.request_id)

        request_logged.connect(receiver)
        self.addCleanup(request_logged.disconnect, receiver)
        body = orjson.dumps({"model": "echo", "messages": [{"role": "user", "content": "Hi"}]})
        start, _, communicator = await self.exchange("POST", "/v1/chat/completions", body)
        await communicator.send_input({"type": "http.disconnect"})
        await communicator.wait(timeout=10)
        row = await RequestLog.objects.aget()
        assert (row.status_code, row.cancelled, row.completion_tokens) == (200, False, 2)
        assert announced == [dict(start["headers"])[b"x-request-id"].decode()]

    async def test_errors_are_openais_envelopes(self):
        start, content, _ = await self.exchange("POST", "/v1/chat/completions", b"{}", headers=[])
        assert start["status"] == 401
        assert orjson.loads(content)["error"]["message"].startswith("You didn't provide an API key")
        start, content, _ = await self.exchange("GET", "/v1/chat/completions")
        assert start["status"] == 405
        start, content, _ = await self.exchange("GET", "/v1/images/generations")
        assert start["status"] == 404
        message = orjson.loads(content)["error"]["message"]
        assert message == "Invalid URL (GET /v1/images/generations)"

    @override_settings(CHATPARITY={**SCRIPTED, "MAX_BODY_BYTES": 100})
    async def test_a_body_above_the_limit_is_413(self):
        start, _, _ = await self.exchange(
            "POST", "/v1/chat/completions", b"x" * 101, headers=self.headers()
        )
        assert start["status"] == 413
        declared = self.headers(**{"content-length": "5000"})
        start, _, _ = await self.exchange("POST", "/v1/chat/completions", headers=declared)
        assert start["status"] == 413

    @override_settings(CHATPARITY={**SCRIPTED, "MAX_BODY_BYTES": 100})
    async def test_a_body_of_exactly_the_limit_is_served(self):
        body = b'{"model":"echo","messages":[{"role":"user","content":"Hi"}]}'
        exact = body.ljust(100)  # JSON allows the trailing spaces
        for declared in ({}, {"content-length": "100"}):
            start, _, _ = await self.exchange(
                "POST", "/v1/chat/completions", exact, headers=self.headers(**declared)
            )
            assert start["status"] == 200
        declared = self.headers(**{"content-length": "101"})
        start, _, _ = await self.exchange("POST", "/v1/chat/completions", exact + b" ", declared)
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

    def test_the_urlconf_is_loaded_when_the_fast_path_is_made_not_by_a_request(self):
        # So that what a site freezes after start-up (tune_gc_for_serving) includes it.
        clear_url_caches()
        assert "url_patterns" not in vars(get_resolver())
        FastPath(get_asgi_application())
        assert "url_patterns" in vars(get_resolver())

    async def test_other_requests_go_to_django(self):
        start, content, _ = await self.exchange("GET", "/admin/login/", headers=[])
        assert start["status"] == 200
        assert b"<form" in content


@override_settings(CHATPARITY={**SCRIPTED, "BODY_TIMEOUT": 0.3})
class BodyTests(FastPathTestCase):
    """The key is checked before the body is read, and the body has a deadline."""

    async def test_a_missing_or_wrong_key_is_refused_before_the_body_is_sent(self):
        for authorization in ([], [("authorization", "Bearer sk-cp-wrong-key-123456")]):
            headers = [*authorization, ("content-length", "1000")]
            communicator = self.communicator("POST", "/v1/chat/completions", headers)
            # No http.request message: the body never comes.
            start = await communicator.receive_output(timeout=2)
            assert start["status"] == 401
            content = (await communicator.receive_output(timeout=2))["body"]
            assert orjson.loads(content)["error"]["type"] == "invalid_request_error"
            await communicator.wait(timeout=2)
        assert await RequestLog.objects.acount() == 0

    async def assert_timed_out(self, communicator):
        start = await communicator.receive_output(timeout=5)
        assert start["status"] == 408
        assert dict(start["headers"])[b"connection"] == b"close"
        content = (await communicator.receive_output(timeout=5))["body"]
        assert orjson.loads(content) == {
            "error": {
                "message": "The request body was not received in time.",
                "type": "invalid_request_error",
                "param": None,
                "code": "request_timeout",
            }
        }
        await communicator.wait(timeout=5)
        row = await RequestLog.objects.aget()  # the key was valid: the request is logged
        assert (row.status_code, row.error_code, row.client_ip) == (
            408, "request_timeout", "10.1.2.3",
        )  # fmt: skip

    async def test_a_body_that_stalls_is_408_and_the_connection_closes(self):
        communicator = self.communicator("POST", "/v1/chat/completions")
        await communicator.send_input(
            {"type": "http.request", "body": b'{"model": "ec', "more_body": True}
        )
        await self.assert_timed_out(communicator)

    async def test_a_body_that_trickles_gets_the_deadline_not_more(self):
        communicator = self.communicator("POST", "/v1/chat/completions")

        async def trickle():
            while True:
                await communicator.send_input(
                    {"type": "http.request", "body": b" ", "more_body": True}
                )
                await asyncio.sleep(0.02)

        started = time.monotonic()
        trickling = asyncio.ensure_future(trickle())
        try:
            await self.assert_timed_out(communicator)
        finally:
            trickling.cancel()
        assert 0.3 <= time.monotonic() - started < 3

    async def test_a_body_sent_in_parts_within_the_deadline_is_served_whole(self):
        communicator = self.communicator("POST", "/v1/chat/completions")
        request = {"model": "echo", "messages": [{"role": "user", "content": "Hi, in parts"}]}
        body = orjson.dumps(request)
        with self.settings(CHATPARITY={**SCRIPTED, "BODY_TIMEOUT": 0.3, "LOG_BODIES": True}):
            for part in (body[:10], body[10:35]):
                await communicator.send_input(
                    {"type": "http.request", "body": part, "more_body": True}
                )
                await asyncio.sleep(0.1)
            await communicator.send_input({"type": "http.request", "body": body[35:]})
            start = await communicator.receive_output(timeout=5)
            assert start["status"] == 200
            await reply_body(communicator)
            await communicator.wait(timeout=5)
        row = await RequestLog.objects.aget()
        assert row.request_body == request  # every part, in order, once

    async def test_a_client_that_leaves_mid_body_leaves_a_cancelled_row(self):
        communicator = self.communicator("POST", "/v1/chat/completions")
        await communicator.send_input({"type": "http.request", "body": b"{", "more_body": True})
        await communicator.send_input({"type": "http.disconnect"})
        await communicator.wait(timeout=5)
        row = await RequestLog.objects.aget()
        assert row.cancelled


class HostTests(FastPathTestCase):
    """ALLOWED_HOSTS holds on the fast path as in Django's ``HttpRequest.get_host()``."""

    async def status(self, host, **headers):
        start, _, _ = await self.exchange(
            "GET", "/v1/models", headers=self.headers(host=host, **headers)
        )
        return start["status"]

    async def test_a_host_not_allowed_is_400_as_through_django(self):
        with self.assertLogs("django.security.DisallowedHost", "ERROR") as logged:
            start, content, _ = await self.exchange(
                "GET", "/v1/models", headers=self.headers(host="evil.example")
            )
        assert start["status"] == 400
        assert orjson.loads(content)["error"]["code"] == "invalid_host"
        assert "Invalid HTTP_HOST header: 'evil.example'" in logged.output[0]
        view = await self.async_client.get("/v1/models", headers={"host": "evil.example"})
        assert view.status_code == 400

    async def test_a_repeated_host_is_400_as_through_django(self):
        # Security round 3: the fast path took the last Host and served the request.
        headers = [*self.headers(host="evil.example"), ("host", "localhost")]
        with self.assertLogs("django.security.DisallowedHost", "ERROR") as logged:
            start, content, _ = await self.exchange("GET", "/v1/models", headers=headers)
            django, _, _ = await self.exchange("GET", "/healthz", headers=headers)
        assert (start["status"], django["status"]) == (400, 400)
        assert orjson.loads(content)["error"]["code"] == "invalid_host"
        assert "Invalid HTTP_HOST header: 'evil.example,localhost'" in logged.output[0]

    async def test_allowed_hosts_are_served(self):
        # ALLOWED_HOSTS of the development settings, and the test client's host.
        for host in ("localhost", "localhost:8000", "127.0.0.1:8000", "[::1]", "testserver"):
            assert await self.status(host) == 200, host
        start, _, _ = await self.exchange("GET", "/v1/models")  # no Host: the server's name
        assert start["status"] == 200

    @override_settings(ALLOWED_HOSTS=[], DEBUG=True)
    async def test_with_debug_and_no_allowed_hosts_only_localhost_is_allowed(self):
        for host in ("localhost:8000", "api.localhost", "127.0.0.1", "[::1]:8000"):
            assert await self.status(host) == 200, host
        with self.assertLogs("django.security.DisallowedHost", "ERROR"):
            assert await self.status("chat.example.com") == 400

    @override_settings(ALLOWED_HOSTS=[], DEBUG=False)
    async def test_without_debug_no_allowed_hosts_allows_none(self):
        with self.assertLogs("django.security.DisallowedHost", "ERROR"):
            assert await self.status("localhost") == 400

    async def test_the_forwarded_host_counts_only_when_trusted(self):
        forwarded = {"x-forwarded-host": "evil.example"}
        assert await self.status("localhost", **forwarded) == 200
        with self.settings(USE_X_FORWARDED_HOST=True):
            with self.assertLogs("django.security.DisallowedHost", "ERROR"):
                assert await self.status("localhost", **forwarded) == 400
            assert await self.status("evil.example", **{"x-forwarded-host": "localhost"}) == 200

    async def test_a_host_allowed_once_is_checked_again_when_the_settings_change(self):
        assert await self.status("localhost") == 200
        with self.settings(ALLOWED_HOSTS=["chat.example.com"]):
            with self.assertLogs("django.security.DisallowedHost", "ERROR"):
                assert await self.status("localhost") == 400
            assert await self.status("chat.example.com") == 200


@override_settings(**HTTPS)
class HttpsTests(FastPathTestCase):
    """The fast path does what SecurityMiddleware does for the views."""

    async def test_plain_http_is_redirected_to_https_before_the_key_is_checked(self):
        start, content, _ = await self.exchange(
            "GET", "/v1/models", headers=self.headers(host="localhost:8000"), query_string="a=1"
        )
        assert start["status"] == 301
        headers = dict(start["headers"])
        assert headers[b"location"] == b"https://localhost:8000/v1/models?a=1"
        assert b"strict-transport-security" not in headers  # never over plain HTTP
        assert headers[b"x-content-type-options"] == b"nosniff"
        assert content == b""
        assert await RequestLog.objects.acount() == 0

    async def test_https_replies_carry_hsts(self):
        start, _, _ = await self.exchange(
            "GET", "/v1/models", headers=self.headers(**{"x-forwarded-proto": "https"})
        )
        assert start["status"] == 200
        headers = dict(start["headers"])
        assert headers[b"strict-transport-security"] == b"max-age=3600; includeSubDomains"
        assert headers[b"x-content-type-options"] == b"nosniff"

    async def test_the_security_headers_are_the_views(self):
        for proto in ("http", "https"):
            start, _, _ = await self.exchange(
                "GET",
                "/v1/models",
                headers=self.headers(**{"x-forwarded-proto": proto}),
            )
            view = await self.async_client.get(
                "/v1/models",
                headers={"Authorization": f"Bearer {self.plaintext}", "X-Forwarded-Proto": proto},
            )
            assert start["status"] == view.status_code
            fast = {n: v for n, v in start["headers"] if n in SECURITY_HEADERS}
            slow = {n.lower().encode(): v.encode() for n, v in view.items()}
            assert fast == {n: slow[n] for n in SECURITY_HEADERS if n in slow}
            assert fast, proto

    @override_settings(SECURE_REDIRECT_EXEMPT=[r"^v1/models$"])
    async def test_an_exempt_path_is_served_over_http(self):
        start, _, _ = await self.exchange("GET", "/v1/models")
        assert start["status"] == 200

    @override_settings(SECURE_SSL_HOST="secure.example.com")
    async def test_the_redirect_goes_to_secure_ssl_host(self):
        start, _, _ = await self.exchange(
            "GET", "/v1/models", headers=self.headers(host="localhost")
        )
        assert dict(start["headers"])[b"location"] == b"https://secure.example.com/v1/models"

    @modify_settings(MIDDLEWARE={"remove": "django.middleware.security.SecurityMiddleware"})
    async def test_without_security_middleware_nothing_is_redirected_or_added(self):
        start, _, _ = await self.exchange("GET", "/v1/models")
        assert start["status"] == 200
        assert not {name for name, _ in start["headers"]} & set(SECURITY_HEADERS)


# Reliability (issue 39): a worker starts only with a spool folder it may use.


@pytest.mark.parametrize("layout", spools.REFUSED, ids=spools.layout_id)
def test_a_worker_whose_spool_folder_is_refused_does_not_start(settings, tmp_path, layout):
    configured, said = layout(tmp_path)
    settings.CHATPARITY = {**SCRIPTED, "SPOOL_DIR": str(configured)}
    with pytest.raises(ImproperlyConfigured, match=re.escape(said)) as refused:
        FastPath(get_asgi_application())
    assert f"CHATPARITY['SPOOL_DIR'] ({configured}) cannot be used" in str(refused.value)


def test_a_worker_starts_with_its_spool_folder_made_and_resolved(settings, tmp_path):
    configured, real = spools.a_folder_under_a_linked_volume(tmp_path)
    settings.CHATPARITY = {**SCRIPTED, "SPOOL_DIR": str(configured)}
    FastPath(get_asgi_application())
    assert real.is_dir()
    assert real.stat().st_mode & 0o777 == 0o700
