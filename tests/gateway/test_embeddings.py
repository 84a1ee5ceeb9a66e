"""/v1/embeddings on both transports: the embedded model and an upstream behind the
same keys, alias scopes, limits, budgets and log as chat; a chat alias refused for
embeddings and an embedding alias refused for chat, each in its endpoint's envelope."""

import asyncio
import base64
import sys
from decimal import Decimal
from unittest import mock

import orjson
import pytest
from asgiref.sync import sync_to_async
from django.test import override_settings

from chatparity.accounting import limits
from chatparity.backends.embedder import MODEL_PACKAGE
from chatparity.models import ApiKey, Backend, Endpoint, ModelAlias, RequestLog
from chatparity.protocol.embeddings import floats
from tests.asgi import FastPathTestCase
from tests.scripted import SCRIPTED, WithScriptedUpstream, scripted_vector

SETTINGS = {**SCRIPTED, "FIRST_BYTE_TIMEOUT": 5}


@override_settings(CHATPARITY=SETTINGS)
class EmbeddingsTestCase(WithScriptedUpstream, FastPathTestCase):
    @classmethod
    def setUpTestData(cls):
        super().setUpTestData()
        embedder = Backend.objects.create(name="embedder", kind="embedder")
        ModelAlias.objects.create(
            public_id="embed-small", backend=embedder, model="all-MiniLM-L6-v2",
            input_price=Decimal("0.02"),
        )  # fmt: skip
        upstream = Backend.objects.create(
            name="scripted-upstream", kind="openai", base_url=cls.upstream.base_url,
            timeout=2, options={"backoff": 0.01, "retries": 0},
        )  # fmt: skip
        ModelAlias.objects.create(public_id="up-embed", backend=upstream, model="text-embedding")
        ModelAlias.objects.create(
            public_id="up-failing", backend=upstream, model="fault:html", fallbacks=["embed-small"]
        )
        ModelAlias.objects.create(
            public_id="up-gone", backend=upstream, model="fault:hang-up",
            fallbacks=["echo", "embed-small"],
        )  # fmt: skip

    async def embed(self, headers=None, **body):
        """The status, headers and JSON body the fast path answers."""
        start, content, communicator = await self.exchange(
            "POST", "/v1/embeddings", orjson.dumps(body), headers
        )
        await communicator.wait(timeout=30)
        return (
            start["status"],
            {k.decode(): v.decode() for k, v in start["headers"]},
            orjson.loads(content),
        )

    async def last_row(self):
        return await RequestLog.objects.alatest("id")


class EmbeddedModelTests(EmbeddingsTestCase):
    async def test_float_vectors_in_input_order_with_usage(self):
        status, headers, answer = await self.embed(
            model="embed-small", input=["The cat sleeps.", "A kitten naps."]
        )
        assert status == 200, answer
        assert headers["content-type"] == "application/json"
        assert answer["object"] == "list"
        assert answer["model"] == "embed-small"
        assert [item["index"] for item in answer["data"]] == [0, 1]
        assert {item["object"] for item in answer["data"]} == {"embedding"}
        assert all(len(item["embedding"]) == 384 for item in answer["data"])
        assert answer["usage"] == {"prompt_tokens": 9, "total_tokens": 9}  # kit ##ten

    async def test_base64_is_the_float32_of_the_float_answer(self):
        _, _, as_floats = await self.embed(model="embed-small", input="hello")
        _, _, as_base64 = await self.embed(
            model="embed-small", input="hello", encoding_format="base64"
        )
        packed = base64.b64decode(as_base64["data"][0]["embedding"])
        assert floats(packed) == as_floats["data"][0]["embedding"]

    async def test_the_view_answers_what_the_fast_path_answers(self):
        _, _, fast = await self.embed(model="EMBED-SMALL", input=[[7592, 2088]])
        view = await self.async_client.post(
            "/v1/embeddings",
            data={"model": "EMBED-SMALL", "input": [[7592, 2088]]},
            content_type="application/json",
            headers={"Authorization": f"Bearer {self.plaintext}"},
        )
        assert view.status_code == 200
        assert view.json() == fast
        assert fast["model"] == "EMBED-SMALL"

    async def test_the_log_row_counts_input_tokens_at_the_input_price_and_keeps_no_vector(self):
        with override_settings(CHATPARITY={**SETTINGS, "LOG_BODIES": True}):
            status, _, _ = await self.embed(model="embed-small", input=["one two three"])
        assert status == 200
        row = await self.last_row()
        assert row.endpoint == Endpoint.EMBEDDINGS
        assert (row.alias, row.backend, row.upstream_model) == (
            "embed-small", "embedder", "all-MiniLM-L6-v2",
        )  # fmt: skip
        assert (row.prompt_tokens, row.completion_tokens, row.total_tokens) == (3, 0, 3)
        assert row.cost == Decimal("0.02") * 3 / 1_000_000
        assert row.request_body == {"model": "embed-small", "input": ["one two three"]}
        assert row.response_body == ""
        assert row.status_code == 200

    async def test_an_input_too_long_for_the_model_is_openais_400_and_logged(self):
        status, _, answer = await self.embed(model="embed-small", input="word " * 300)
        assert status == 400
        assert answer["error"]["message"].startswith("This model's maximum context length is 256")
        row = await self.last_row()
        assert (row.endpoint, row.status_code) == (Endpoint.EMBEDDINGS, 400)

    async def test_dimensions_on_a_model_that_cannot_be_shortened(self):
        status, _, answer = await self.embed(model="embed-small", input="x", dimensions=64)
        assert status == 400
        assert answer["error"]["message"] == "This model does not support specifying dimensions."

    async def test_without_the_embeddings_extra_it_is_a_503_naming_the_fix_and_logged(self):
        # The packaged model not installed, as on a site without chatparity[embeddings].
        with mock.patch.dict(sys.modules, {MODEL_PACKAGE: None}):
            status, _, answer = await self.embed(model="embed-small", input="hello")
        assert status == 503
        assert answer["error"] == {
            "message": "The embedding model is not installed on this server: install"
            " chatparity's 'embeddings' extra in the server's environment, or set the"
            " backend's model_path and tokenizer_path.",
            "type": "server_error",
            "param": None,
            "code": "model_unavailable",
        }
        row = await self.last_row()
        assert (row.endpoint, row.status_code) == (Endpoint.EMBEDDINGS, 503)


class RequestTests(EmbeddingsTestCase):
    async def test_an_empty_input_is_openais_invalid_input(self):
        status, _, answer = await self.embed(model="embed-small", input=[""])
        assert status == 400
        assert answer["error"]["message"].startswith("'$.input' is invalid.")

    async def test_an_unknown_model_is_a_404_even_with_a_bad_body(self):
        status, _, answer = await self.embed(model="nope", input="")
        assert (status, answer["error"]["code"]) == (404, "model_not_found")
        row = await self.last_row()
        assert (row.endpoint, row.status_code) == (Endpoint.EMBEDDINGS, 404)

    async def test_a_body_that_is_not_json_leaves_a_row_of_this_endpoint(self):
        start, _, communicator = await self.exchange("POST", "/v1/embeddings", b"{")
        await communicator.wait(timeout=30)
        assert start["status"] == 400
        row = await self.last_row()
        assert (row.endpoint, row.status_code) == (Endpoint.EMBEDDINGS, 400)

    async def test_a_chat_alias_is_refused_for_embeddings(self):
        status, _, answer = await self.embed(model="echo", input="hi")
        assert status == 400
        assert answer["error"] == {
            "message": "The model `echo` does not serve embeddings: it is a chat model.",
            "type": "invalid_request_error",
            "param": "model",
            "code": "model_not_supported",
        }

    async def test_an_embedding_alias_is_refused_for_chat_responses_and_messages(self):
        start, content = await self.ask(model="embed-small")
        assert start["status"] == 400
        assert orjson.loads(content)["error"]["code"] == "model_not_supported"
        responses = await self.async_client.post(
            "/v1/responses",
            data={"model": "embed-small", "input": "hi"},
            content_type="application/json",
            headers={"Authorization": f"Bearer {self.plaintext}"},
        )
        assert responses.status_code == 400
        assert responses.json()["error"]["param"] == "model"
        messages = await self.async_client.post(
            "/v1/messages",
            data={
                "model": "embed-small",
                "max_tokens": 8,
                "messages": [{"role": "user", "content": "hi"}],
            },
            content_type="application/json",
            headers={"x-api-key": self.plaintext, "anthropic-version": "2023-06-01"},
        )
        assert messages.status_code == 400
        assert messages.json()["type"] == "error"
        assert "embedding model" in messages.json()["error"]["message"]

    async def test_models_lists_embedding_aliases(self):
        _, content, communicator = await self.exchange("GET", "/v1/models")
        await communicator.wait(timeout=10)
        listed = {model["id"] for model in orjson.loads(content)["data"]}
        assert {"embed-small", "up-embed", "echo"} <= listed


class UpstreamTests(EmbeddingsTestCase):
    async def test_an_upstreams_vectors_pass_through_as_asked(self):
        status, _, answer = await self.embed(model="up-embed", input=["a", "b"], dimensions=4)
        assert status == 200, answer
        for item, text in zip(answer["data"], ("a", "b"), strict=True):
            assert item["embedding"] == pytest.approx(scripted_vector(text, 4), rel=1e-6)
        assert self.upstream.requests[-1]["model"] == "text-embedding"
        assert answer["model"] == "up-embed"

    async def test_user_goes_upstream_only_when_the_alias_forwards_it(self):
        status, _, answer = await self.embed(model="up-embed", input="a", user="u-1")
        assert status == 200, answer
        assert "user" not in self.upstream.requests[-1]
        alias = await ModelAlias.objects.aget(public_id="up-embed")
        alias.forwarded_params = ["user"]
        await alias.asave(update_fields=["forwarded_params"])  # as the admin saves it
        status, _, answer = await self.embed(model="up-embed", input="a", user="u-1")
        assert status == 200, answer
        assert self.upstream.requests[-1]["user"] == "u-1"

    async def test_a_malformed_upstream_falls_back_to_the_embedded_model(self):
        status, _, answer = await self.embed(model="up-failing", input="hello")
        assert status == 200, answer
        assert len(answer["data"][0]["embedding"]) == 384
        row = await self.last_row()
        assert (row.alias, row.backend) == ("embed-small", "embedder")

    async def test_fallbacks_that_do_not_embed_are_skipped(self):
        status, _, answer = await self.embed(model="up-gone", input="hello")
        assert status == 200, answer
        assert (await self.last_row()).alias == "embed-small"


class LimitTests(EmbeddingsTestCase):
    async def limited_key(self, **limits):
        key, plaintext = await sync_to_async(ApiKey.objects.create_key)("limited", **limits)
        return key, [("authorization", f"Bearer {plaintext}"), ("content-type", "application/json")]

    async def test_requests_per_minute(self):
        _, headers = await self.limited_key(requests_per_minute=1)
        assert (await self.embed(headers, model="embed-small", input="a"))[0] == 200
        status, response_headers, answer = await self.embed(headers, model="embed-small", input="a")
        assert status == 429
        assert answer["error"]["type"] == "requests"
        assert "retry-after" in response_headers

    async def test_tokens_per_minute_count_the_inputs(self):
        _, headers = await self.limited_key(tokens_per_minute=10)
        status, response_headers, _ = await self.embed(
            headers, model="embed-small", input="one two three four"
        )
        assert status == 200
        assert response_headers["x-ratelimit-limit-tokens"] == "10"
        # 4 used; 7 more, counted exactly before admission, would pass 10.
        status, _, answer = await self.embed(
            headers, model="embed-small", input="one two three four five six seven"
        )
        assert status == 429
        assert answer["error"]["type"] == "tokens"

    async def test_a_token_budget_is_spent_by_the_tokens_used(self):
        _, headers = await self.limited_key(token_budget=6)
        first = await self.embed(headers, model="embed-small", input="one two three four")
        assert first[0] == 200  # 4 tokens reserved (counted exactly), 4 used: 2 left
        status, _, answer = await self.embed(headers, model="embed-small", input="five six seven")
        assert status == 429
        assert answer["error"]["code"] == "insufficient_quota"

    async def test_concurrent_punctuation_never_passes_a_budget(self):
        # Security round 4: embeddings were reserved at four characters a token and used
        # as many WordPiece tokens as punctuation marks: 7 requests at once spent 3.5
        # times their budget. Their tokens are counted before admission.
        key, headers = await self.limited_key(token_budget=800)
        answers = await asyncio.gather(
            *(self.embed(headers, model="embed-small", input="!" * 200) for _ in range(7))
        )
        statuses = sorted(status for status, _, _ in answers)
        assert statuses == [200] * 4 + [429] * 3  # 200 tokens each, counted exactly
        assert {
            answer["usage"]["prompt_tokens"] for status, _, answer in answers if status == 200
        } == {200}
        key = await ApiKey.objects.aget(pk=key.pk)
        assert ("tokens this month", 800, 800) in await limits.standing(key)

    async def test_a_key_sees_only_its_aliases(self):
        key, headers = await self.limited_key(all_aliases=False)
        await key.allowed_aliases.aadd(await ModelAlias.objects.aget(public_id="echo"))
        status, _, answer = await self.embed(headers, model="embed-small", input="a")
        assert (status, answer["error"]["code"]) == (404, "model_not_found")
