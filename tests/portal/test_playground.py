"""The playground's key: made on a POST under CSRF protection for a signed-in user with a
plan, short-lived, with the plan's limits, owned and logged as the user's, at most one
serving per user, its plaintext kept nowhere on the server; and the page lists the
user's own chat models."""

import datetime
import re

import orjson
from django.contrib.sessions.models import Session
from django.test import Client, TestCase, override_settings
from django.utils import timezone

from chatparity.models import ApiKey, Backend, ModelAlias, Plan, RequestLog, hash_key
from tests.support.users import portal_user

PAGE, NEW_KEY = "/portal/playground/", "/portal/playground/key/"
REQUEST = "/portal/playground/request/"
# What the playground's script asks.
ASKED = {
    "model": "smollm2",
    "messages": [{"role": "user", "content": "Hi"}],
    "max_tokens": 2,
    "stream": True,
    "stream_options": {"include_usage": True},
}


class PlaygroundTestCase(TestCase):
    @classmethod
    def setUpTestData(cls):
        local = Backend.objects.create(name="local", kind="local")
        embedder = Backend.objects.create(name="embedder", kind="embedder")
        cls.smollm2 = ModelAlias.objects.create(public_id="smollm2", backend=local)
        cls.other = ModelAlias.objects.create(public_id="other", backend=local)
        ModelAlias.objects.create(public_id="embed-small", backend=embedder)
        ModelAlias.objects.create(public_id="retired", backend=local, enabled=False)
        cls.plan = Plan.objects.create(name="starter", requests_per_minute=2, token_budget=9_000)
        cls.alice = portal_user("alice", cls.plan)
        cls.bob = portal_user("bob", cls.plan)

    def setUp(self):
        self.client.force_login(self.alice)

    def new_key(self, client=None):
        """A playground key for the signed-in user: the JSON answer."""
        response = (client or self.client).post(NEW_KEY)
        assert response.status_code == 201, response.content
        return response.json()

    def ask(self, plaintext):
        """A completion with ``plaintext``, which does not stream."""
        return Client().post(
            "/v1/chat/completions",
            orjson.dumps({"model": "smollm2", "messages": ASKED["messages"], "max_tokens": 2}),
            content_type="application/json",
            headers={"Authorization": f"Bearer {plaintext}"},
        )


class PageTests(PlaygroundTestCase):
    def test_the_page_offers_the_users_chat_models_and_no_key(self):
        page = self.client.get(PAGE)
        assert page.status_code == 200
        assert "no-store" in page["Cache-Control"]
        html = page.content.decode()
        assert re.findall(r"<option>(.*?)</option>", html) == ["other", "smollm2"]
        assert 'data-chat-url="/v1/chat/completions"' in html
        assert "chatparity_portal/playground.js" in html
        assert "sk-cp-" not in html  # the key is asked for by the script, not in the page
        assert not ApiKey.objects.filter(owner=self.alice).exists()

    def test_the_models_are_those_of_the_plan(self):
        self.plan.all_aliases = False
        self.plan.save()
        self.plan.allowed_aliases.set([self.other])
        html = self.client.get(PAGE).content.decode()
        assert re.findall(r"<option>(.*?)</option>", html) == ["other"]

    @override_settings(ROOT_URLCONF="tests.support.bare_site_urls")
    def test_the_script_is_sent_where_the_site_mounts_the_api(self):
        html = self.client.get(PAGE).content.decode()
        assert 'data-chat-url="/llm/v1/chat/completions"' in html

    def test_a_user_without_a_plan_is_told_so(self):
        self.client.force_login(portal_user("dave"))
        html = self.client.get(PAGE).content.decode()
        assert "no plan" in html
        assert 'id="playground"' not in html


class KeyTests(PlaygroundTestCase):
    def test_the_key_is_the_users_short_lived_under_the_plan(self):
        answer = self.new_key()
        key = ApiKey.objects.get(hashed_key=hash_key(answer["key"]))
        assert (key.owner, key.name, key.prefix) == (self.alice, "playground", answer["prefix"])
        assert key.needs_plan
        assert (key.requests_per_minute, key.token_budget) == (2, 9_000)
        lasts = key.expires_at - timezone.now()
        assert datetime.timedelta(minutes=59) < lasts <= datetime.timedelta(minutes=60)
        assert datetime.datetime.fromisoformat(answer["expires_at"]) == key.expires_at

    def test_its_plaintext_is_kept_nowhere_on_the_server(self):
        response = self.client.post(NEW_KEY)
        plaintext = response.json()["key"]
        assert "no-store" in response["Cache-Control"]
        for session in Session.objects.all():
            assert plaintext not in str(session.get_decoded())
        key = ApiKey.objects.get(owner=self.alice)
        assert plaintext not in str(list(ApiKey.objects.values_list()))
        assert key.hashed_key == hash_key(plaintext)

    async def test_it_streams_on_v1_is_logged_as_the_users_and_its_use_is_read_back(self):
        client = self.async_client
        await client.aforce_login(self.alice)
        plaintext = (await client.post(NEW_KEY)).json()["key"]
        answered = await client.post(
            "/v1/chat/completions",
            ASKED,
            content_type="application/json",
            headers={"Authorization": f"Bearer {plaintext}"},
        )
        assert answered.status_code == 200
        content = b"".join([part async for part in answered.streaming_content])
        frames = content.decode().split("\n\n")
        chunks = [orjson.loads(frame[6:]) for frame in frames if frame.startswith("data: {")]
        completion_id, usage = chunks[0]["id"], chunks[-1]["usage"]
        row = await RequestLog.objects.select_related("api_key").aget(completion_id=completion_id)
        assert row.api_key.owner_id == self.alice.pk
        read_back = (await client.get(REQUEST, {"id": completion_id})).json()
        assert read_back["completion_tokens"] == usage["completion_tokens"] == row.completion_tokens
        assert read_back["cost"] == str(row.cost)
        assert "request_body" not in read_back

        await client.aforce_login(self.bob)
        assert (await client.get(REQUEST, {"id": completion_id})).status_code == 404  # not his
        await client.aforce_login(self.alice)
        assert (await client.get(REQUEST, {"id": "chatcmpl-none"})).status_code == 404

    def test_only_playground_requests_are_read_back(self):
        _, plaintext = ApiKey.objects.create_key("laptop", owner=self.alice)
        completion_id = self.ask(plaintext).json()["id"]
        assert self.client.get(REQUEST, {"id": completion_id}).status_code == 404

    def test_the_plans_limits_apply_to_it(self):
        plaintext = self.new_key()["key"]
        assert self.ask(plaintext).status_code == 200
        assert self.ask(plaintext).status_code == 200
        refused = self.ask(plaintext)
        assert refused.status_code == 429
        assert refused.json()["error"]["code"] == "rate_limit_exceeded"

    def test_a_new_key_revokes_the_one_before_at_once(self):
        first = self.new_key()["key"]
        second = self.new_key()["key"]
        assert (
            self.ask(
                first,
            ).status_code
            == 401
        )
        assert (
            self.ask(
                second,
            ).status_code
            == 200
        )
        serving = ApiKey.objects.filter(owner=self.alice, is_active=True)
        assert [key.hashed_key for key in serving] == [hash_key(second)]

    def test_another_users_playground_key_is_left_alone(self):
        bobs = Client()
        bobs.force_login(self.bob)
        bobs_key = self.new_key(bobs)["key"]
        self.new_key()
        assert (
            self.ask(
                bobs_key,
            ).status_code
            == 200
        )

    def test_signing_out_revokes_it(self):
        plaintext = self.new_key()["key"]
        self.client.post("/portal/logout/")
        assert self.ask(plaintext).status_code == 401

    @override_settings(CHATPARITY={"PORTAL": {"MAX_KEYS": 1}})
    def test_it_does_not_count_against_max_keys_nor_crowd_the_key_list(self):
        assert self.client.post("/portal/keys/new/", {"name": "laptop"}).status_code == 201
        self.new_key()
        self.new_key()
        listing = self.client.get("/portal/")
        html = listing.content.decode()
        assert "You hold 1 of at most 1 active keys" in html
        assert len(re.findall(r"<td>playground</td>", html)) == 1  # the one serving
        assert ApiKey.objects.filter(owner=self.alice, name="playground").count() == 2


class RefusalTests(PlaygroundTestCase):
    def test_a_key_needs_a_post_with_the_csrf_token(self):
        strict = Client(enforce_csrf_checks=True)
        strict.force_login(self.alice)
        assert strict.post(NEW_KEY).status_code == 403
        assert self.client.get(NEW_KEY).status_code == 405
        token = re.search(
            r'name="csrfmiddlewaretoken" value="([^"]+)"', strict.get(PAGE).content.decode()
        )[1]
        assert strict.post(NEW_KEY, headers={"X-CSRFToken": token}).status_code == 201

    def test_no_key_without_a_plan_the_permission_or_a_session(self):
        self.client.force_login(portal_user("dave"))
        no_plan = self.client.post(NEW_KEY)
        assert no_plan.status_code == 403
        assert "no plan" in no_plan.json()["error"]
        self.client.force_login(portal_user("carol", self.plan, permitted=False))
        assert self.client.post(NEW_KEY).status_code == 403
        assert self.client.get(PAGE).status_code == 403
        assert Client().post(NEW_KEY).status_code == 302  # to sign in
        assert not ApiKey.objects.exists()
