"""Stored responses cost their key what any request costs: reading them (a conversation
continued, a response or its input items fetched) is admitted under the key's limits
before anything stored is read, and what they hold is bounded in bytes per response,
per conversation and per key (security round 3, finding 1), whatever the database."""

import asyncio
from unittest import mock

import orjson
from django.contrib.auth import get_user_model
from django.core.cache import cache
from django.db.models.query import QuerySet
from django.test import TestCase, override_settings

from chatparity.gateway import responses
from chatparity.models import ApiKey, Backend, ModelAlias, StoredResponse
from tests.scripted import SCRIPTED

MIB = 1024 * 1024


def bounds(**bytes_):
    """The settings with these bounds of STORED_RESPONSE_BYTES (the others as default)."""
    return {**SCRIPTED, "STORED_RESPONSE_BYTES": bytes_}


def text_of(size):
    """An input of about ``size`` bytes: messages of at most MAX_CONTENT_CHARS each."""
    chunk = 1000 * 1000
    return [
        {"role": "user", "content": "x" * min(chunk, size - at)} for at in range(0, size, chunk)
    ]


@override_settings(CHATPARITY=SCRIPTED)
class StoredResponsesTestCase(TestCase):
    @classmethod
    def setUpTestData(cls):
        owner = get_user_model().objects.create(username="ada")
        cls.key, cls.plaintext = ApiKey.objects.create_key("tests", owner=owner)
        backend = Backend.objects.create(
            name="scripted", kind="scripted", options={"script": ["Hello", " there"]}
        )
        ModelAlias.objects.create(public_id="echo", backend=backend)

    def setUp(self):
        cache.clear()  # the limits' counters and the bytes each key stores

    def headers(self):
        return {"Authorization": f"Bearer {self.plaintext}"}

    def create(self, **body):
        return self.async_client.post(
            "/v1/responses",
            data=orjson.dumps({"model": "echo", **body}),
            content_type="application/json",
            headers=self.headers(),
        )

    def get(self, path):
        return self.async_client.get(path, headers=self.headers())

    async def limit(self, **fields):
        key = await ApiKey.objects.aget(pk=self.key.pk)
        for name, value in fields.items():
            setattr(key, name, value)
        await key.asave()  # its signal empties this worker's key cache at once


class ReadingTests(StoredResponsesTestCase):
    @override_settings(CHATPARITY=bounds(RESPONSE=2 * MIB, CHAIN=8 * MIB))
    async def test_a_7_7_mb_conversation_is_read_once_a_minute_by_a_key_limited_so(self):
        # The finding: 3 clients looping a 134-byte continuation on a key limited to one
        # request a minute got 24 of 25 answers 429, yet each decoded the whole chain.
        head = None
        for _ in range(4):  # ~1.93 MB each
            previous = {"previous_response_id": head} if head else {}
            created = await self.create(input=text_of(1_930_000), **previous)
            assert created.status_code == 200, created.content
            head = created.json()["id"]
        sizes = [size async for size in StoredResponse.objects.values_list("size", flat=True)]
        assert 7_700_000 < sum(sizes) < 8 * MIB
        await self.limit(requests_per_minute=1, max_concurrent=1)
        chains = []

        def counted(*args):
            chains.append(args)
            return chain(*args)

        chain = responses._chain
        continuation = {"input": [], "previous_response_id": head}
        with mock.patch.object(responses, "_chain", counted):
            answers = await asyncio.gather(*(self.create(**continuation) for _ in range(6)))
            read = await self.get(f"/v1/responses/{head}")
            listed = await self.get(f"/v1/responses/{head}/input_items")
        statuses = sorted(answer.status_code for answer in answers)
        assert statuses == [200, 429, 429, 429, 429, 429]
        assert len(chains) == 1  # only the admitted request read the conversation
        assert (read.status_code, listed.status_code) == (429, 429)

    async def test_a_conversation_above_its_bound_is_refused_before_any_of_it_is_read(self):
        head = None
        for _ in range(3):  # 4.5 MB, within the default bound
            previous = {"previous_response_id": head} if head else {}
            head = (await self.create(input=text_of(1_500_000), **previous)).json()["id"]
        in_bulk = QuerySet.in_bulk
        with (
            override_settings(CHATPARITY=bounds(CHAIN=4 * MIB)),
            mock.patch.object(QuerySet, "in_bulk", autospec=True, side_effect=in_bulk) as read,
        ):
            refused = await self.create(input="Go on", previous_response_id=head)
            ends_sooner = await self.create(input="Go on", previous_response_id=head, store=False)
        assert refused.status_code == 400
        error = refused.json()["error"]
        assert (error["type"], error["param"]) == ("invalid_request_error", "previous_response_id")
        assert "is too large to continue" in error["message"]
        assert ends_sooner.status_code == 400  # stored or not, the conversation is too large
        assert not read.called

    async def test_a_response_and_its_input_items_count_against_the_keys_requests(self):
        created = (await self.create(input="Hi")).json()["id"]
        await self.limit(requests_per_minute=2)
        statuses = [
            (await self.get(path)).status_code
            for path in (
                f"/v1/responses/{created}",
                f"/v1/responses/{created}/input_items",
                f"/v1/responses/{created}",
            )
        ]
        assert statuses == [200, 200, 429]


class StoringTests(StoredResponsesTestCase):
    @override_settings(CHATPARITY=bounds(RESPONSE=100_000))
    async def test_an_input_too_large_to_store_is_a_400_unless_it_is_not_stored(self):
        refused = await self.create(input=text_of(150_000))
        assert refused.status_code == 400
        error = refused.json()["error"]
        assert (error["type"], error["param"]) == ("invalid_request_error", "input")
        assert error["message"].startswith("The input is too large to store")
        assert not await StoredResponse.objects.aexists()
        assert (await self.create(input=text_of(150_000), store=False)).status_code == 200

    async def test_a_key_keeps_at_most_its_bound_until_it_deletes_some(self):
        first = (await self.create(input=text_of(10_000))).json()["id"]
        size = (await StoredResponse.objects.aget(pk=first)).size
        assert size > 10_000
        with override_settings(CHATPARITY=bounds(KEY=2 * size + 100)):
            assert (await self.create(input=text_of(10_000))).status_code == 200
            refused = await self.create(input=text_of(10_000))
            assert refused.status_code == 400
            assert refused.json()["error"]["param"] == "store"
            assert (await self.create(input=text_of(10_000), store=False)).status_code == 200
            deleted = await self.async_client.delete(
                f"/v1/responses/{first}", headers=self.headers()
            )
            assert deleted.status_code == 200
            assert (await self.create(input=text_of(10_000))).status_code == 200

    async def test_a_keys_count_starts_from_what_the_database_holds(self):
        # As after a cache flush, or in another worker: the count is the database's.
        await self.create(input=text_of(10_000))
        held = (await StoredResponse.objects.aget()).size
        cache.clear()
        with override_settings(CHATPARITY=bounds(KEY=held + 100)):
            assert (await self.create(input=text_of(10_000))).status_code == 400


class UnstorableIdTests(StoredResponsesTestCase):
    """An id no response can have is not found, asked of no database (PostgreSQL refuses
    a NUL in a query: it was a 503, which OpenAI's clients retry)."""

    async def test_a_nul_in_the_path_is_openais_404(self):
        for path in ("/v1/responses/resp_%00x", "/v1/responses/resp_%00x/input_items"):
            response = await self.get(path)
            assert response.status_code == 404, path
            assert response.json()["error"]["message"] == "Response with id 'resp_\x00x' not found."

    async def test_a_nul_in_previous_response_id_is_openais_400(self):
        response = await self.create(input="Hi", previous_response_id="resp_\x00x")
        assert response.status_code == 400
        assert response.json()["error"]["code"] == "previous_response_not_found"


class ExactBoundTests(StoredResponsesTestCase):
    """Each bound holds what it says to the byte: that much is kept, a byte more is not."""

    async def stored(self, **body):
        """The new stored response's id, the bytes its input adds, and its size."""
        created = await self.create(**body)
        assert created.status_code == 200, created.content
        stored = await StoredResponse.objects.aget(pk=created.json()["id"])
        adding = len(orjson.dumps(stored.input_items))
        assert stored.size == adding + len(orjson.dumps(stored.response))  # what counts
        return stored.id, adding, stored.size

    async def test_an_input_of_exactly_the_bound_of_a_response_is_stored(self):
        _, adding, _ = await self.stored(input=text_of(10_000))
        with override_settings(CHATPARITY=bounds(RESPONSE=adding - 1)):
            assert (await self.create(input=text_of(10_000))).status_code == 400
        with override_settings(CHATPARITY=bounds(RESPONSE=adding)):
            assert (await self.create(input=text_of(10_000))).status_code == 200

    async def test_a_key_may_fill_its_bound_to_the_byte(self):
        _, adding, size = await self.stored(input=text_of(10_000))
        with override_settings(CHATPARITY=bounds(KEY=size + adding - 1)):
            assert (await self.create(input=text_of(10_000))).status_code == 400
        with override_settings(CHATPARITY=bounds(KEY=size + adding)):
            assert (await self.create(input=text_of(10_000))).status_code == 200

    async def test_a_deleted_response_frees_exactly_its_bytes(self):
        first, adding, _ = await self.stored(input=text_of(10_000))
        deleted = await self.async_client.delete(f"/v1/responses/{first}", headers=self.headers())
        assert deleted.status_code == 200
        for fresh_count in (False, True):  # as counted, then as the database holds it
            if fresh_count:
                cache.clear()
            with override_settings(CHATPARITY=bounds(KEY=adding - 1)):
                assert (await self.create(input=text_of(10_000))).status_code == 400
        with override_settings(CHATPARITY=bounds(KEY=adding)):
            assert (await self.create(input=text_of(10_000))).status_code == 200

    async def test_a_key_that_holds_nothing_may_store_its_whole_bound(self):
        first, adding, _ = await self.stored(input=text_of(10_000))
        await StoredResponse.objects.filter(pk=first).adelete()
        cache.clear()  # counted afresh from the database, which holds nothing
        with override_settings(CHATPARITY=bounds(KEY=adding)):
            assert (await self.create(input=text_of(10_000))).status_code == 200

    async def test_a_conversation_may_fill_its_bound_to_the_byte(self):
        first, _, first_size = await self.stored(input=text_of(10_000))
        head, _, head_size = await self.stored(input=text_of(10_000), previous_response_id=first)
        chain = first_size + head_size
        go_on = {"input": "Go on", "previous_response_id": head}
        _, adding, _ = await self.stored(**go_on)  # what continuing adds, when stored
        for store, most in ((False, chain), (True, chain + adding)):
            with override_settings(CHATPARITY=bounds(CHAIN=most - 1)):
                assert (await self.create(**go_on, store=store)).status_code == 400
            with override_settings(CHATPARITY=bounds(CHAIN=most)):
                assert (await self.create(**go_on, store=store)).status_code == 200
