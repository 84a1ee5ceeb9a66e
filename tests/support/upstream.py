"""The test case of chat completions through the openai backend to a fault-injecting
upstream (:mod:`tests.backends.faulty_upstream`), and a reader of their streams."""

import json

import orjson
from django.test import TestCase

from chatparity.models import ApiKey, Backend, ModelAlias
from tests.backends import faulty_upstream

SECRET = "sk-upstream-secret-0000"


def frames(body: bytes) -> list:
    """The JSON payloads of an SSE body, with ``[DONE]`` as a string."""
    events = [e.removeprefix(b"data: ") for e in body.split(b"\n\n") if e]
    return [e.decode() if e == b"[DONE]" else json.loads(e) for e in events]


class UpstreamTestCase(TestCase):
    """Chat completions through a backend of kind openai to a fault-injecting upstream,
    which behaves as the model an alias asks for says (``up-<behaviour>``)."""

    @classmethod
    def setUpClass(cls):
        cls.upstream, stop = faulty_upstream.start(SECRET)
        cls.addClassCleanup(stop)
        super().setUpClass()

    @classmethod
    def setUpTestData(cls):
        cls.key, cls.plaintext = ApiKey.objects.create_key("tests")
        cls.backend = Backend.objects.create(
            name="faulty", kind="openai", base_url=cls.upstream.base_url, secret=SECRET,
            timeout=5, options={"backoff": 0.01},
        )  # fmt: skip

    def setUp(self):
        self.upstream.attempts.clear()

    async def alias(self, behaviour, backend=None, **fields):
        return await ModelAlias.objects.acreate(
            public_id=f"up-{behaviour}", backend=backend or self.backend, model=behaviour, **fields
        )

    async def ask(self, behaviour, **body):
        await self.alias(behaviour)
        return await self.post(f"up-{behaviour}", **body)

    def post(self, model, **body):
        return self.async_client.post(
            "/v1/chat/completions",
            data=orjson.dumps(
                {"model": model, "messages": [{"role": "user", "content": "Hi"}], **body}
            ),
            content_type="application/json",
            headers={"Authorization": f"Bearer {self.plaintext}"},
        )

    @staticmethod
    async def stream_of(response):
        assert response.status_code == 200, response.content
        return frames(b"".join([part async for part in response.streaming_content]))

    @staticmethod
    def text(chunks):
        return "".join(
            c["choices"][0]["delta"].get("content") or ""
            for c in chunks
            if isinstance(c, dict) and c.get("choices")
        )
