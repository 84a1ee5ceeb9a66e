"""The response cache, a stage of the pipeline before the backend call: the same request
again is answered from it in its own wire's framing (a stream or an object, whichever
filled it), chunk for chunk the stored answer; never for another owner; only what may
be kept is; a hit costs nothing and counts as a request only; a client, a key or a plan
may keep it out; and nothing wrong with the store, an entry or a header fails a
request."""

from decimal import Decimal

import orjson
import pytest
from asgiref.sync import async_to_sync, sync_to_async
from django.contrib.auth.models import User
from django.core.cache import caches
from django.core.cache.backends.locmem import LocMemCache
from django.test import override_settings
from django.urls import reverse

from chatparity.accounting.reports import LogFilter, cache_by_alias
from chatparity.conformance import chat as chat_judges
from chatparity.conformance import messages as messages_judges
from chatparity.conformance import responses as responses_judges
from chatparity.models import ApiKey, Backend, Deployment, ModelAlias, Plan, RequestLog
from tests.scripted import ScriptedBackend, WithScriptedUpstream, scripted_vector
from tests.services import free_port
from tests.support.caching import (
    STORE,
    CachingTestCase,
    as_response,
    cache_settings,
    with_store,
)

CHAT = "/v1/chat/completions"
DOWN = {  # nothing listens there
    "BACKEND": "django.core.cache.backends.redis.RedisCache",
    "LOCATION": f"redis://127.0.0.1:{free_port()}/0",
}
ON = {"enabled": True}
HI = [{"role": "user", "content": "Hi"}]
GREEDY = {"model": "cached", "messages": HI, "temperature": 0}
PRICES = {"input_price": Decimal(100_000), "output_price": Decimal(200_000)}
# The scripted backend's usage: 1 prompt token, 1 a step; at PRICES ten cents a prompt
# token and twenty a completion token.


def chunks_of(content):
    stream = chat_judges.parse_stream(content)
    assert stream.problems == [], stream.problems
    return stream


def deltas(stream):
    return [
        chunk["choices"][0]["delta"].get("content")
        for chunk in stream.chunks
        if chunk["choices"] and chunk["choices"][0]["delta"].get("content")
    ]


def stream_problems(stream, model="cached", *, include_usage=False):
    return [
        *chat_judges.stream_envelope_problems(stream, model),
        *chat_judges.stream_choice_problems(stream),
        *chat_judges.stream_usage_problems(stream, include_usage=include_usage),
    ]


@override_settings(CHATPARITY=cache_settings(), CACHES=with_store())
class ResponseCacheTestCase(CachingTestCase):
    @classmethod
    def setUpTestData(cls):
        super().setUpTestData()
        cls.owner = User.objects.create_user("owner")
        cls.key.owner = cls.owner
        cls.key.save()
        cls.sibling, cls.sibling_plaintext = ApiKey.objects.create_key("sibling", owner=cls.owner)
        stranger = User.objects.create_user("stranger")
        cls.stranger, cls.stranger_plaintext = ApiKey.objects.create_key("other", owner=stranger)
        cls.orphan, cls.orphan_plaintext = ApiKey.objects.create_key("no owner")
        cls.backend = Backend.objects.create(
            name="hello", kind="scripted", options={"script": ["Hello", " there"]}
        )
        cls.alias = ModelAlias.objects.create(
            public_id="cached", backend=cls.backend, response_cache=ON, **PRICES
        )

    def setUp(self):
        super().setUp()
        ScriptedBackend.asked.clear()

    async def configure(self, **fields):
        """Change the alias (saved: this worker reads it again at once)."""
        alias = await ModelAlias.objects.aget(public_id="cached")
        for name, value in fields.items():
            setattr(alias, name, value)
        await alias.asave()

    async def rows(self):
        return [row async for row in RequestLog.objects.order_by("id")]


class AnsweredFromTheCache(ResponseCacheTestCase):
    async def test_a_stream_is_answered_from_what_a_whole_answer_filled(self):
        status, headers, content = await self.post(CHAT, GREEDY)
        assert status == 200
        assert headers["x-chatparity-cache"] == "miss"
        first = orjson.loads(content)
        status, headers, content = await self.post(
            CHAT, {**GREEDY, "stream": True, "stream_options": {"include_usage": True}}
        )
        assert status == 200
        assert headers["x-chatparity-cache"] == "hit"
        assert headers["content-type"].startswith("text/event-stream")
        stream = chunks_of(content)
        assert stream_problems(stream, include_usage=True) == []
        assert deltas(stream) == ["Hello", " there"]  # chunk for chunk what the backend sent
        assert stream.chunks[-1]["usage"]["total_tokens"] == first["usage"]["total_tokens"]
        assert stream.chunks[0]["id"] != first["id"]  # an answer of its own
        assert stream.chunks[0]["system_fingerprint"] == "fp_scripted"
        assert len(ScriptedBackend.asked) == 1

    async def test_a_whole_answer_is_the_stream_that_filled_it(self):
        await self.post(CHAT, {**GREEDY, "stream": True})
        _status, headers, content = await self.post(CHAT, GREEDY)
        assert headers["x-chatparity-cache"] == "hit"
        answer = orjson.loads(content)
        assert chat_judges.completion_envelope_problems(answer, "cached") == []
        assert chat_judges.completion_choice_problems(answer) == []
        assert answer["choices"][0]["message"]["content"] == "Hello there"
        assert len(ScriptedBackend.asked) == 1

    async def test_the_model_is_echoed_as_asked(self):
        await self.post(CHAT, GREEDY)
        _, headers, content = await self.post(CHAT, {**GREEDY, "model": "CACHED"})
        assert headers["x-chatparity-cache"] == "hit"
        assert orjson.loads(content)["model"] == "CACHED"

    async def test_a_hit_costs_nothing_and_says_what_it_saved(self):
        await self.post(CHAT, GREEDY)
        await self.post(CHAT, GREEDY)
        miss, hit = await self.rows()
        assert (miss.cache, miss.cost, miss.total_tokens) == ("miss", Decimal("0.5"), 3)
        assert (hit.cache, hit.cost, hit.total_tokens, hit.prompt_tokens) == ("hit", 0, 0, 0)
        assert hit.cost_saved == Decimal("0.5")
        assert hit.finish_reasons == ["stop"]
        assert hit.status_code == 200
        assert hit.completion_id
        assert hit.completion_id != miss.completion_id
        report = await cache_by_alias_now()
        assert report == [
            {
                "alias": "cached",
                "cache_hits": 1,
                "cache_misses": 1,
                "cost_saved": Decimal("0.5"),
                "hit_percent": 50.0,
            }
        ]

    async def test_an_alias_without_a_cache_is_as_before(self):
        await self.configure(response_cache={})
        _, headers, _ = await self.post(CHAT, GREEDY)
        _, headers, _ = await self.post(CHAT, GREEDY)
        assert "x-chatparity-cache" not in headers
        assert len(ScriptedBackend.asked) == 2
        assert [(row.cache, row.cache_note) for row in await self.rows()] == [("", "")] * 2
        assert not await held()

    async def test_an_alias_whose_cache_is_off_keeps_its_options_unused(self):
        await self.configure(response_cache={"enabled": False, "ttl": 60})
        await self.post(CHAT, GREEDY)
        _, headers, _ = await self.post(CHAT, GREEDY)
        assert "x-chatparity-cache" not in headers
        assert len(ScriptedBackend.asked) == 2


async def cache_by_alias_now():
    return await sync_to_async(cache_by_alias)(LogFilter())


async def held():
    """The keys of the entries the store holds (the budget's counters left out)."""
    store = caches[STORE]
    if isinstance(store, LocMemCache):
        keys = list(store._cache)
    else:  # Redis
        client = store._cache.get_client()
        keys = [key.decode() for key in await sync_to_async(client.keys)("*cp:rc:*")]
    return [key for key in keys if ":cp:rc:written:" not in key]


class Scoped(ResponseCacheTestCase):
    async def test_another_owner_is_never_answered_from_an_owner_s_entry(self):
        await self.post(CHAT, GREEDY)
        _, headers, _ = await self.post(CHAT, GREEDY, key=self.stranger_plaintext)
        assert headers["x-chatparity-cache"] == "miss"
        _, headers, _ = await self.post(CHAT, GREEDY, key=self.orphan_plaintext)
        assert headers["x-chatparity-cache"] == "miss"
        assert len(ScriptedBackend.asked) == 3

    async def test_an_owner_s_keys_share_their_entries(self):
        await self.post(CHAT, GREEDY)
        _, headers, _ = await self.post(CHAT, GREEDY, key=self.sibling_plaintext)
        assert headers["x-chatparity-cache"] == "hit"

    async def test_scoped_per_key_no_other_key_shares(self):
        await self.configure(response_cache={**ON, "scope": "key"})
        await self.post(CHAT, GREEDY)
        _, headers, _ = await self.post(CHAT, GREEDY, key=self.sibling_plaintext)
        assert headers["x-chatparity-cache"] == "miss"
        _, headers, _ = await self.post(CHAT, GREEDY)
        assert headers["x-chatparity-cache"] == "hit"

    async def test_a_key_without_an_owner_is_its_own_scope(self):
        await self.post(CHAT, GREEDY, key=self.orphan_plaintext)
        _, headers, _ = await self.post(CHAT, GREEDY, key=self.orphan_plaintext)
        assert headers["x-chatparity-cache"] == "hit"
        _, headers, _ = await self.post(CHAT, GREEDY)
        assert headers["x-chatparity-cache"] == "miss"

    async def test_a_changed_alias_is_a_new_key(self):
        """Its upstream model, its backend, its defaults: answers of before are not served."""
        await self.post(CHAT, GREEDY)
        await self.configure(model="another-model")
        _, headers, _ = await self.post(CHAT, GREEDY)
        assert headers["x-chatparity-cache"] == "miss"
        await self.configure(default_params={"max_tokens": 1})
        _, headers, content = await self.post(CHAT, GREEDY)
        assert headers["x-chatparity-cache"] == "miss"
        assert orjson.loads(content)["choices"][0]["message"]["content"] == "Hello"

    async def test_a_changed_deployment_is_a_new_key(self):
        """Every deployment's upstream model: an answer one deployment gave is not served
        once the alias's deployments change (one added, one's model changed)."""
        await self.post(CHAT, GREEDY)
        _, headers, _ = await self.post(CHAT, GREEDY)
        assert headers["x-chatparity-cache"] == "hit"
        twin = await Backend.objects.acreate(
            name="twin", kind="scripted", options={"script": ["Hello", " there"]}
        )
        added = await Deployment.objects.acreate(alias=self.alias, backend=twin, model="m1")
        _, headers, _ = await self.post(CHAT, GREEDY)
        assert headers["x-chatparity-cache"] == "miss"
        _, headers, _ = await self.post(CHAT, GREEDY)
        assert headers["x-chatparity-cache"] == "hit"
        added.model = "m2"
        await added.asave()
        _, headers, _ = await self.post(CHAT, GREEDY)
        assert headers["x-chatparity-cache"] == "miss"


class WhatIsKept(ResponseCacheTestCase):
    async def test_only_reproducible_requests_by_default(self):
        asked = {"model": "cached", "messages": HI}  # temperature 1, no seed
        await self.post(CHAT, asked)
        _, headers, _ = await self.post(CHAT, asked)
        assert headers["x-chatparity-cache"] == "bypass"
        row = (await self.rows())[-1]
        assert row.cache == "bypass"
        assert row.cache_note.startswith("not reproducible")
        _, headers, _ = await self.post(CHAT, {**asked, "seed": 42})
        _, headers, _ = await self.post(CHAT, {**asked, "seed": 42})
        assert headers["x-chatparity-cache"] == "hit"
        await self.configure(response_cache={**ON, "nonreproducible": True})
        await self.post(CHAT, asked)
        _, headers, _ = await self.post(CHAT, asked)
        assert headers["x-chatparity-cache"] == "hit"

    async def test_tool_calls_only_where_the_alias_says(self):
        self.backend.options = {"script": [{"call": "get_weather", "arguments": "{}"}]}
        await self.backend.asave()
        tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {}}}]
        asked = {**GREEDY, "tools": tools}
        await self.post(CHAT, asked)
        _, headers, _ = await self.post(CHAT, asked)
        assert headers["x-chatparity-cache"] == "miss"
        assert (await self.rows())[-1].cache_note == "calls tools"
        await self.configure(response_cache={**ON, "tool_calls": True})
        _, _, first = await self.post(CHAT, asked)
        _, headers, content = await self.post(CHAT, {**asked, "stream": True})
        assert headers["x-chatparity-cache"] == "hit"
        stream = chunks_of(content)
        assert chat_judges.streamed_tool_call_problems(stream) == []
        replayed = stream.chunks[0]["choices"][0]["delta"]["tool_calls"][0]
        kept = orjson.loads(first)["choices"][0]["message"]["tool_calls"][0]
        assert replayed["function"]["name"] == "get_weather"
        assert replayed["id"].startswith("call_")
        assert replayed["id"] != kept["id"]

    async def test_an_answer_cut_short_is_not_kept(self):
        self.backend.options = {"script": ["Hello", "<error>"]}
        await self.backend.asave()
        _, _, content = await self.post(CHAT, {**GREEDY, "stream": True})
        assert b'"error"' in content
        assert not await held()
        assert (await self.rows())[-1].cache == "miss"

    async def test_an_answer_a_fallback_gave_is_not_kept(self):
        failing = await Backend.objects.acreate(
            name="failing", kind="scripted", options={"script": ["<error>"]}
        )
        await ModelAlias.objects.acreate(public_id="helper", backend=self.backend)
        await self.configure(backend=failing, fallbacks=["helper"])
        status, headers, _content = await self.post(CHAT, GREEDY)
        assert status == 200
        assert headers["x-chatparity-cache"] == "miss"
        assert (await self.rows())[-1].cache_note == "answered by a fallback"
        assert not await held()

    async def test_a_completion_a_budget_cut_is_not_kept(self):
        """A request that sets no max_tokens, cut to what its key's budget left: another
        budget would have let it say more."""
        self.key.token_budget = 80  # the prompt reserved at its bound (50), 30 to say
        await self.key.asave()
        await self.configure(max_output_tokens=1000)
        self.backend.options = {"script": ["word"] * 60}
        await self.backend.asave()
        _, _, content = await self.post(CHAT, GREEDY)
        assert orjson.loads(content)["choices"][0]["finish_reason"] == "length", content
        assert (await self.rows())[-1].cache_note == "completion cut to what a limit left"
        assert not await held()

    async def test_a_conversation_continued_from_a_stored_response_is_passed_by(self):
        _, _, content = await self.post("/v1/responses", {"model": "cached", "input": "Hi"})
        previous = orjson.loads(content)["id"]
        asked = {"model": "cached", "input": "Again", "previous_response_id": previous}
        _, headers, _ = await self.post("/v1/responses", asked)
        assert headers["x-chatparity-cache"] == "bypass"
        assert (await self.rows())[-1].cache_note == "continues a stored response"


class ClientControl(ResponseCacheTestCase):
    async def test_no_cache_answers_afresh_and_keeps_the_answer(self):
        await self.post(CHAT, GREEDY)
        _, headers, _ = await self.post(CHAT, GREEDY, cache_control="no-cache")
        assert headers["x-chatparity-cache"] == "bypass"
        assert len(ScriptedBackend.asked) == 2
        assert (await self.rows())[-1].cache_note == "Cache-Control: no-cache"

    async def test_no_store_reads_but_keeps_nothing(self):
        _, headers, _ = await self.post(CHAT, GREEDY, cache_control="no-store")
        assert headers["x-chatparity-cache"] == "miss"
        assert not await held()
        await self.post(CHAT, GREEDY)
        _, headers, _ = await self.post(CHAT, GREEDY, cache_control="no-store")
        assert headers["x-chatparity-cache"] == "hit"

    async def test_a_directive_it_does_not_know_is_served_uncached(self):
        await self.post(CHAT, GREEDY)
        status, headers, _ = await self.post(CHAT, GREEDY, cache_control="max-age=60")
        assert status == 200
        assert headers["x-chatparity-cache"] == "bypass"
        row = (await self.rows())[-1]
        assert row.cache_note == "Cache-Control: max-age=60 not understood"
        assert len(ScriptedBackend.asked) == 2

    async def test_a_key_or_its_plan_may_keep_its_requests_out(self):
        await self.post(CHAT, GREEDY)
        self.sibling.response_cache = False
        await self.sibling.asave()
        _, headers, _ = await self.post(CHAT, GREEDY, key=self.sibling_plaintext)
        assert headers["x-chatparity-cache"] == "bypass"
        assert (await self.rows())[-1].cache_note == "off for this key"
        plan = await Plan.objects.acreate(name="uncached", response_cache=False)
        await plan.users.aadd(self.owner)
        _, headers, _ = await self.post(CHAT, GREEDY)
        assert headers["x-chatparity-cache"] == "bypass"
        assert (await self.rows())[-1].cache_note == "off for this key's plan"


class Limits(ResponseCacheTestCase):
    async def test_hits_count_as_requests_per_minute(self):
        self.key.requests_per_minute = 2
        await self.key.asave()
        await self.post(CHAT, GREEDY)
        status, headers, _ = await self.post(CHAT, GREEDY)
        assert status == 200
        assert headers["x-chatparity-cache"] == "hit"
        status, _, content = await self.post(CHAT, GREEDY)
        assert status == 429, content
        assert orjson.loads(content)["error"]["type"] == "requests"

    async def test_hits_spend_no_tokens_nor_budget(self):
        self.key.tokens_per_minute = 200
        self.key.token_budget = 200
        await self.key.asave()
        await self.post(CHAT, {**GREEDY, "max_tokens": 40})
        self.key.token_budget = 3  # all it used
        await self.key.asave()
        for _ in range(3):
            status, headers, _ = await self.post(CHAT, {**GREEDY, "max_tokens": 40})
            assert status == 200
            assert headers["x-chatparity-cache"] == "hit"
        status, _, content = await self.post(CHAT, {**GREEDY, "max_tokens": 39})
        assert status == 429
        assert orjson.loads(content)["error"]["code"] == "insufficient_quota"


class StoreFaults(ResponseCacheTestCase):
    async def test_a_store_that_is_down_never_fails_a_request(self):
        with override_settings(CACHES=with_store(DOWN)):
            for _ in range(2):  # failing, then resting after the failure
                status, headers, content = await self.post(CHAT, GREEDY)
                assert status == 200, content
                assert headers["x-chatparity-cache"] == "bypass"
                assert (await self.rows())[-1].cache_note == "store unavailable"

    async def test_an_answer_too_large_is_not_kept(self):
        with override_settings(CHATPARITY=cache_settings(MAX_ENTRY_BYTES=64)):
            await self.post(CHAT, GREEDY)
            _, headers, _ = await self.post(CHAT, GREEDY)
        assert headers["x-chatparity-cache"] == "miss"
        assert (await self.rows())[-1].cache_note.startswith("too large to keep (")

    async def test_what_is_written_stays_within_the_budget(self):
        with override_settings(CHATPARITY=cache_settings(MAX_BYTES=10)):
            await self.post(CHAT, GREEDY)
            _, headers, _ = await self.post(CHAT, GREEDY)
        assert headers["x-chatparity-cache"] == "miss"
        assert not await held()

    async def test_an_entry_that_cannot_be_read_is_a_miss(self):
        status, _, _ = await self.post(CHAT, GREEDY)
        (key,) = await held()
        caches[STORE].set(key.split(":", 2)[-1], b"garbage")  # without KEY_PREFIX, version
        status, headers, _content = await self.post(CHAT, GREEDY)
        assert status == 200
        assert headers["x-chatparity-cache"] == "miss"
        assert (await self.rows())[-1].cache_note == "entry unreadable"
        _, headers, _ = await self.post(CHAT, GREEDY)
        assert headers["x-chatparity-cache"] == "hit"  # written again


class Purged(ResponseCacheTestCase):
    def test_the_admin_purges_an_alias_s_entries(self):
        async_to_sync(self.post)(CHAT, GREEDY)
        admin = User.objects.create_superuser("admin", password="pw")
        self.client.force_login(admin)
        changelist = reverse("admin:chatparity_modelalias_changelist")
        action = {"action": "purge_response_cache", "_selected_action": [self.alias.pk]}
        response = self.client.post(changelist, action, follow=True)
        assert "Purged the response cache of 1 alias(es)." in response.content.decode()
        _, headers, _ = async_to_sync(self.post)(CHAT, GREEDY)
        assert headers["x-chatparity-cache"] == "miss"
        _, headers, _ = async_to_sync(self.post)(CHAT, GREEDY)
        assert headers["x-chatparity-cache"] == "hit"


class OtherWires(ResponseCacheTestCase):
    async def test_responses_hits_in_its_own_framing(self):
        asked = {"model": "cached", "input": "Hi", "temperature": 0}
        whole = await self.post("/v1/responses", asked)
        stream = await self.post("/v1/responses", {**asked, "stream": True})
        assert (whole[1]["x-chatparity-cache"], stream[1]["x-chatparity-cache"]) == ("miss", "hit")
        events, problems = responses_judges.event_stream(as_response(*stream))
        assert problems == []
        assert responses_judges.sequence_problems(events, "cached") == []
        assert responses_judges.order_problems(events, "cached") == []
        answers = [as_response(*whole), as_response(*stream)]
        assert responses_judges.parity_problems("cached", answers) == []
        assert events.final["id"] != orjson.loads(whole[2])["id"]
        # Stored as any response: its id may be read back.
        _, content, communicator = await self.exchange(
            "GET", f"/v1/responses/{events.final['id']}", headers=self.headers()
        )
        await communicator.wait(timeout=10)
        assert orjson.loads(content)["output"] == events.final["output"]

    async def test_one_entry_answers_every_wire(self):
        await self.post("/v1/responses", {"model": "cached", "input": "Hi", "temperature": 0})
        _, headers, content = await self.post(CHAT, GREEDY)
        assert headers["x-chatparity-cache"] == "hit"
        assert orjson.loads(content)["choices"][0]["message"]["content"] == "Hello there"

    async def test_messages_hits_in_its_own_framing(self):
        asked = {"model": "cached", "max_tokens": 64, "messages": HI, "temperature": 0}
        whole = await self.post("/v1/messages", asked)
        stream = await self.post("/v1/messages", {**asked, "stream": True})
        assert (whole[1]["x-chatparity-cache"], stream[1]["x-chatparity-cache"]) == ("miss", "hit")
        events, problems = messages_judges.message_stream(as_response(*stream))
        assert problems == []
        assert messages_judges.order_problems(events, "cached") == []
        answers = [as_response(*whole), as_response(*stream)]
        assert messages_judges.parity_problems("cached", answers) == []


def embedding(*texts):
    return {"model": "cached-embed", "input": list(texts), "dimensions": 8}


@override_settings(CHATPARITY=cache_settings(), CACHES=with_store())
class Embeddings(WithScriptedUpstream, ResponseCacheTestCase):
    @classmethod
    def setUpTestData(cls):
        super().setUpTestData()
        upstream = Backend.objects.create(
            name="embedding upstream", kind="openai", base_url=cls.upstream.base_url,
            options={"retries": 0},
        )  # fmt: skip
        ModelAlias.objects.create(
            public_id="cached-embed", backend=upstream, model="text-embedding",
            response_cache=ON, input_price=Decimal(100_000),
        )  # fmt: skip

    def setUp(self):
        super().setUp()
        self.upstream.requests.clear()

    async def test_a_re_indexing_job_pays_only_for_the_new_texts(self):
        await self.post("/v1/embeddings", embedding("the cat", "a dog barks"))
        status, headers, content = await self.post(
            "/v1/embeddings", embedding("the cat", "a dog barks", "three words here")
        )
        assert status == 200
        assert headers["x-chatparity-cache"] == "miss"
        assert self.upstream.requests[-1]["input"] == ["three words here"]
        answer = orjson.loads(content)
        texts = ["the cat", "a dog barks", "three words here"]
        for item, text in zip(answer["data"], texts, strict=True):
            assert item["embedding"] == pytest.approx(scripted_vector(text, 8), rel=1e-6)
        assert answer["usage"]["prompt_tokens"] == 2 + 3 + 3  # the upstream counts words
        row = (await self.rows())[-1]
        assert (row.cache, row.prompt_tokens, row.cost) == ("partial", 3, Decimal("0.3"))
        assert row.cost_saved == Decimal("0.5")
        status, headers, content = await self.post(
            "/v1/embeddings",
            {**embedding("three words here", "the cat"), "encoding_format": "base64"},
        )
        assert headers["x-chatparity-cache"] == "hit"
        assert len(self.upstream.requests) == 2
        row = (await self.rows())[-1]
        assert (row.cache, row.prompt_tokens, row.cost) == ("hit", 0, 0)
        assert row.cost_saved == Decimal("0.5")
        assert orjson.loads(content)["usage"]["prompt_tokens"] == 5

    async def test_vectors_are_never_another_owner_s(self):
        await self.post("/v1/embeddings", embedding("the cat"))
        _, headers, _ = await self.post(
            "/v1/embeddings", embedding("the cat"), key=self.stranger_plaintext
        )
        assert headers["x-chatparity-cache"] == "miss"
        assert len(self.upstream.requests) == 2

    async def test_a_store_that_is_down_never_fails_an_embeddings_request(self):
        with override_settings(CACHES=with_store(DOWN)):
            status, headers, content = await self.post("/v1/embeddings", embedding("the cat"))
        assert status == 200
        assert len(orjson.loads(content)["data"]) == 1
        assert headers["x-chatparity-cache"] == "bypass"
        assert (await self.rows())[-1].cache_note == "store unavailable"

    async def test_another_dimension_is_another_vector(self):
        await self.post("/v1/embeddings", embedding("the cat"))
        _, headers, _ = await self.post("/v1/embeddings", {**embedding("the cat"), "dimensions": 4})
        assert headers["x-chatparity-cache"] == "miss"
