"""CORS for /v1: browser pages of the allowed origins may call the API, on the ASGI fast
path and through the Django views alike; other origins get no CORS headers."""

import orjson
from django.test import TestCase, override_settings

from chatparity.models import ApiKey
from chatparity.transport.cors import CorsPolicy, is_preflight
from tests.asgi import FastPathTestCase
from tests.scripted import SCRIPTED

APP = "https://app.example.com"
CORS = {**SCRIPTED, "CORS_ALLOWED_ORIGINS": [APP, "http://localhost:5173"]}
# What openai-node asks for in a browser before a chat completion.
SDK_HEADERS = (
    "authorization,content-type,x-stainless-arch,x-stainless-lang,x-stainless-os,"
    "x-stainless-package-version,x-stainless-retry-count,x-stainless-runtime,"
    "x-stainless-runtime-version,x-stainless-timeout"
)


def preflight(origin, method="POST", requested=SDK_HEADERS):
    headers = {"origin": origin, "access-control-request-method": method}
    if requested is not None:
        headers["access-control-request-headers"] = requested
    return headers


class PolicyTests(TestCase):
    def test_a_preflight_is_an_options_request_naming_a_method(self):
        assert is_preflight("OPTIONS", {"access-control-request-method": "POST"})
        assert not is_preflight("OPTIONS", {})
        assert not is_preflight("POST", {"access-control-request-method": "POST"})

    def test_an_allowed_origin_is_echoed_and_granted_the_headers_it_asks_for(self):
        granted = CorsPolicy([APP]).preflight_headers(preflight(APP))
        assert granted == {
            "access-control-allow-origin": APP,
            "access-control-allow-methods": "GET, POST, DELETE",
            "access-control-allow-headers": SDK_HEADERS,
            "access-control-max-age": "86400",
            "vary": "origin, access-control-request-headers",
        }

    def test_origins_are_matched_as_browsers_send_them(self):
        policy = CorsPolicy(["https://App.Example.com"])
        assert policy.allows(APP)
        assert not policy.allows("https://app.example.com:8443")
        assert not policy.allows("http://app.example.com")
        assert CorsPolicy(["*"]).allows("http://anything.test")

    def test_another_origin_is_granted_nothing(self):
        assert CorsPolicy([APP]).preflight_headers(preflight("https://evil.example")) == {}

    def test_header_names_that_are_not_a_list_of_names_are_not_granted(self):
        granted = CorsPolicy([APP]).preflight_headers(preflight(APP, requested="a\x01b, c"))
        assert "access-control-allow-headers" not in granted
        assert "access-control-allow-origin" in granted

    def test_a_reply_exposes_its_own_headers_and_varies_by_origin(self):
        headers = {
            "content-type": "application/json",
            "x-request-id": "req_1",
            "retry-after": "3",
            "vary": "accept-encoding",
        }
        CorsPolicy([APP]).add_response_headers(APP, headers)
        assert headers["access-control-allow-origin"] == APP
        assert headers["access-control-expose-headers"] == "x-request-id, retry-after, vary"
        assert headers["vary"] == "accept-encoding, origin"
        assert "access-control-allow-credentials" not in headers

    def test_a_reply_to_another_origin_is_left_as_it_is(self):
        headers = {"content-type": "application/json"}
        CorsPolicy([APP]).add_response_headers("https://evil.example", headers)
        assert headers == {"content-type": "application/json"}


class TransportSpec:
    """What both transports answer a browser, with the fast path tests' key and ``echo``
    alias; a subclass says how a request is sent."""

    async def send(self, method, path, headers, body=b""):
        """(status, headers with lower-case names, body) of one request."""
        raise NotImplementedError

    async def complete(self, origin, *, key=None, **body):
        request = {"model": "echo", "messages": [{"role": "user", "content": "Hi"}], **body}
        headers = {
            "authorization": f"Bearer {key or self.plaintext}",
            "content-type": "application/json",
        }
        if origin is not None:
            headers["origin"] = origin
        return await self.send("POST", "/v1/chat/completions", headers, orjson.dumps(request))

    @override_settings(CHATPARITY=CORS)
    async def test_a_preflight_from_an_allowed_origin_is_granted(self):
        status, headers, body = await self.send("OPTIONS", "/v1/chat/completions", preflight(APP))
        assert (status, body) == (200, b"")
        assert headers["access-control-allow-origin"] == APP
        assert headers["access-control-allow-headers"] == SDK_HEADERS
        assert "POST" in headers["access-control-allow-methods"]
        assert headers["access-control-max-age"] == "86400"
        assert "origin" in headers["vary"]

    @override_settings(CHATPARITY=CORS)
    async def test_a_preflight_needs_no_key_and_reaches_no_endpoint(self):
        status, headers, _ = await self.send("OPTIONS", "/v1/models", preflight(APP, "GET"))
        assert status == 200
        assert "x-request-id" not in headers

    @override_settings(CHATPARITY=CORS)
    async def test_a_preflight_from_another_origin_is_answered_without_a_grant(self):
        asked = preflight("https://evil.example")
        status, headers, _ = await self.send("OPTIONS", "/v1/chat/completions", asked)
        assert status == 200
        assert not [name for name in headers if name.startswith("access-control-")]

    @override_settings(CHATPARITY=SCRIPTED)
    async def test_without_allowed_origins_no_origin_is_granted(self):
        status, headers, _ = await self.send("OPTIONS", "/v1/chat/completions", preflight(APP))
        assert status == 200
        assert not [name for name in headers if name.startswith("access-control-")]
        _, headers, _ = await self.complete(APP)
        assert not [name for name in headers if name.startswith("access-control-")]

    @override_settings(CHATPARITY=CORS)
    async def test_an_options_request_that_is_no_preflight_is_still_a_405(self):
        status, headers, body = await self.send("OPTIONS", "/v1/chat/completions", {"origin": APP})
        assert status == 405
        assert orjson.loads(body)["error"]["message"].startswith("Invalid method for URL")
        assert headers["access-control-allow-origin"] == APP

    @override_settings(CHATPARITY=CORS)
    async def test_a_completion_names_the_origin_and_exposes_the_request_id(self):
        status, headers, body = await self.complete(APP)
        assert status == 200
        assert orjson.loads(body)["choices"][0]["message"]["content"] == "Hello there"
        assert headers["access-control-allow-origin"] == APP
        exposed = headers["access-control-expose-headers"].split(", ")
        assert {"x-request-id", "openai-processing-ms"} <= set(exposed)
        assert "content-type" not in exposed
        assert "origin" in headers["vary"]

    @override_settings(CHATPARITY=CORS)
    async def test_a_stream_names_the_origin(self):
        status, headers, body = await self.complete(APP, stream=True)
        assert status == 200
        assert headers["access-control-allow-origin"] == APP
        assert body.endswith(b"data: [DONE]\n\n")

    @override_settings(CHATPARITY=CORS)
    async def test_an_error_names_the_origin_so_the_page_can_read_it(self):
        status, headers, body = await self.complete(APP, key="sk-cp-not-a-key")
        assert status == 401
        assert orjson.loads(body)["error"]["code"] == "invalid_api_key"
        assert headers["access-control-allow-origin"] == APP

    @override_settings(CHATPARITY=CORS)
    async def test_limits_and_when_to_retry_are_exposed(self):
        await ApiKey.objects.filter(pk=self.key.pk).aupdate(requests_per_minute=1)
        _, first, _ = await self.complete(APP)
        status, second, _ = await self.complete(APP)
        assert status == 429
        assert "x-ratelimit-remaining-requests" in first["access-control-expose-headers"]
        assert "retry-after" in second["access-control-expose-headers"]

    @override_settings(CHATPARITY=CORS)
    async def test_another_origin_gets_the_answer_without_cors_headers(self):
        status, headers, _ = await self.complete("https://evil.example")
        assert status == 200
        assert not [name for name in headers if name.startswith("access-control-")]

    @override_settings(CHATPARITY=CORS)
    async def test_a_request_without_an_origin_is_answered_as_before(self):
        status, headers, _ = await self.complete(None)
        assert status == 200
        assert not [name for name in headers if name.startswith("access-control-")]
        assert "vary" not in headers

    @override_settings(CHATPARITY={**CORS, "CORS_ALLOWED_ORIGINS": ["*"]})
    async def test_the_wildcard_allows_every_origin_by_name(self):
        _, headers, _ = await self.complete("http://localhost:3000")
        assert headers["access-control-allow-origin"] == "http://localhost:3000"


class FastPathCorsTests(TransportSpec, FastPathTestCase):
    async def send(self, method, path, headers, body=b""):
        start, content, communicator = await self.exchange(
            method, path, body, headers=list(headers.items())
        )
        await communicator.wait(timeout=10)
        names = {name.decode(): value.decode() for name, value in start["headers"]}
        assert len(names) == len(start["headers"]), "a header sent twice"
        return start["status"], names, content


class ViewCorsTests(TransportSpec, FastPathTestCase):
    async def send(self, method, path, headers, body=b""):
        headers = dict(headers)
        content_type = headers.pop("content-type", "application/octet-stream")
        response = await self.async_client.generic(
            method, path, body, content_type=content_type, headers=headers
        )
        if response.streaming:
            content = b"".join([part async for part in response.streaming_content])
        else:
            content = response.content
        names = {name.lower(): value for name, value in response.items()}
        return response.status_code, names, content
