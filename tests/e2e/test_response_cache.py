"""The response cache across workers: two uvicorn workers of the example project on one
PostgreSQL, the limits in one Redis and the response cache in another, two owners
sending the same request 32 at a time. Every answer an upstream call made is unique, so
each answer a client gets names the request that filled it: no owner is ever answered
with another owner's, and both workers answer from the one store."""

import asyncio
import json
import os
import threading
import uuid
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import pytest

from tests import services
from tests.e2e.load import log_rows, manage, project_env, running_workers, scratch

pytestmark = pytest.mark.e2e

CONCURRENT = 32
OWNERS = ("alice ", "bob ")
ASKED = {"model": "cached", "messages": [{"role": "user", "content": "Hi"}], "temperature": 0}


class UniqueUpstream:
    """An OpenAI-compatible upstream whose every answer is a text never sent before."""

    def __init__(self) -> None:
        self.calls = 0
        upstream = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                upstream.calls += 1
                text = f"answer-{uuid.uuid4().hex}"
                usage = {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4}
                envelope = {"id": "chatcmpl-x", "created": 1, "model": body["model"]}
                if body.get("stream"):
                    chunks = [
                        {**envelope, "object": "chat.completion.chunk",
                         "choices": [{"index": 0, "delta": {"role": "assistant",
                                                            "content": text},
                                      "finish_reason": None}]},
                        {**envelope, "object": "chat.completion.chunk",
                         "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]},
                        {**envelope, "object": "chat.completion.chunk", "choices": [],
                         "usage": usage},
                    ]  # fmt: skip
                    payload = "".join(f"data: {json.dumps(c)}\n\n" for c in chunks)
                    payload, kind = payload + "data: [DONE]\n\n", "text/event-stream"
                else:
                    message = {"role": "assistant", "content": text}
                    answer = {**envelope, "object": "chat.completion", "usage": usage,
                              "choices": [{"index": 0, "message": message,
                                           "finish_reason": "stop"}]}  # fmt: skip
                    payload, kind = json.dumps(answer), "application/json"
                data = payload.encode()
                self.send_response(200)
                self.send_header("Content-Type", kind)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, format: str, *args: object) -> None:
                """Quiet."""

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.base_url = f"http://127.0.0.1:{self.server.server_address[1]}/v1"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


SETUP = """
from django.contrib.auth.models import User
from chatparity.models import ApiKey, Backend, ModelAlias
backend = Backend.objects.create(name="unique", kind="openai", base_url="{url}",
                                 options={{"retries": 0}})
ModelAlias.objects.create(public_id="cached", backend=backend, model="m",
                          response_cache={{"enabled": True}})
for name in ("alice", "bob"):
    owner = User.objects.create_user(name)
    for device in ("laptop", "server"):
        print(name, ApiKey.objects.create_key(device, owner=owner)[1])
"""


def answer_text(response: httpx.Response) -> str:
    if response.headers["content-type"].startswith("text/event-stream"):
        for line in response.text.splitlines():
            if line.startswith("data: {"):
                delta = json.loads(line[6:])["choices"]
                if delta and delta[0]["delta"].get("content"):
                    return delta[0]["delta"]["content"]
        raise AssertionError(f"no content: {response.text}")
    return response.json()["choices"][0]["message"]["content"]


async def wave(urls, keys):
    """``CONCURRENT`` requests at once, each owner's keys and both workers in turn, half
    streamed: (owner, response) each."""
    async with httpx.AsyncClient(timeout=30) as client:

        async def one(index):
            owner, key = keys[index % len(keys)]
            body = {**ASKED, "stream": index % 4 < 2}
            response = await client.post(
                f"{urls[index % len(urls)]}/v1/chat/completions",
                json=body,
                headers={"Authorization": f"Bearer {key}"},
            )
            return owner, response

        return await asyncio.gather(*(one(index) for index in range(CONCURRENT)))


def test_no_owner_is_ever_answered_with_another_owner_s_answer(postgres_url, redis_url):
    database_url = services.create_database(postgres_url, f"chatparity_cache_{os.getpid()}")
    upstream = UniqueUpstream()
    try:
        with services.redis(own=True) as answers_url:
            env = project_env(database_url, redis_url)
            env["CHATPARITY_RESPONSE_CACHE_URL"] = answers_url
            manage(env, "migrate", "--verbosity", "0")
            printed = manage(env, "shell", "-c", SETUP.format(url=upstream.base_url))
            keys = [tuple(line.split()) for line in printed.splitlines() if line.startswith(OWNERS)]
            with running_workers(env, 2, scratch("response-cache")) as workers:
                urls = [worker.url for worker in workers]
                outcomes = asyncio.run(wave(urls, keys))
                outcomes += asyncio.run(wave(urls, keys))  # the entries written by now
            rows = log_rows(database_url)
    finally:
        upstream.close()
    assert all(response.status_code == 200 for _, response in outcomes)
    # Each upstream answer is unique: the request that filled an entry is the miss that
    # got its text first.
    filled_by = {}
    for owner, response in outcomes:
        if response.headers["x-chatparity-cache"] == "miss":
            filled_by.setdefault(answer_text(response), owner)
    crossed = [
        (owner, filled_by.get(answer_text(response)))
        for owner, response in outcomes
        if filled_by.get(answer_text(response)) != owner
    ]
    states = Counter(
        (owner, response.headers["x-chatparity-cache"]) for owner, response in outcomes
    )
    print(f"\n{states}; upstream calls {upstream.calls}; cross-owner answers {len(crossed)}")
    assert crossed == []
    for owner in ("alice", "bob"):
        assert states[(owner, "hit")] >= CONCURRENT // 2  # the second wave at least
    hits_by_worker = Counter(
        response.url.port
        for _, response in outcomes
        if response.headers["x-chatparity-cache"] == "hit"
    )
    assert len(hits_by_worker) == 2  # each worker answers from the shared store
    logged = Counter(row["cache"] for row in rows.values())
    assert logged["hit"] == sum(n for (_, state), n in states.items() if state == "hit")
    assert logged["miss"] == upstream.calls
