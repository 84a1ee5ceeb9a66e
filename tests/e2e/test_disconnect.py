"""A client that hangs up mid-stream stops the model at once, and leaves its log row."""

import socket
import time
from concurrent.futures import ThreadPoolExecutor

import orjson
import pytest

pytestmark = pytest.mark.e2e


def wait_for(predicate, timeout=10.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        result = predicate()
        if result:
            return result
        time.sleep(0.05)
    raise AssertionError("condition not met in time")


def test_hanging_up_mid_stream_stops_generation_and_logs_cancelled(daphne_server):
    body = orjson.dumps(
        {
            "model": "smollm2",
            "messages": [{"role": "user", "content": "Write a very long story about a dragon."}],
            "stream": True,
            "max_tokens": 1500,
            "temperature": 0.9,
            "user": "hang-up-test",
        }
    )
    host, port = daphne_server.url.removeprefix("http://").split(":")
    sock = socket.create_connection((host, int(port)), timeout=30)
    head = [
        "POST /v1/chat/completions HTTP/1.1",
        "Host: 127.0.0.1",
        "Content-Type: application/json",
        f"Authorization: Bearer {daphne_server.key}",
        f"Content-Length: {len(body)}",
    ]
    sock.sendall(("\r\n".join(head) + "\r\n\r\n").encode() + body)
    received = b""
    while received.count(b"data: ") < 6:
        data = sock.recv(65536)
        assert data, f"server closed the stream early: {received!r}"
        received += data
    headers = received.split(b"\r\n\r\n", 1)[0].decode().lower()
    request_id = headers.split("x-request-id: ", 1)[1].split("\r\n", 1)[0]
    sock.close()

    (row,) = wait_for(lambda: daphne_server.log_rows(request_id=request_id))
    assert row["cancelled"] == 1
    assert 0 < row["completion_tokens"] < 1500
    # Generating would keep a core busy; after the hang-up the process is idle.
    before = daphne_server.cpu_seconds()
    time.sleep(1.0)
    assert daphne_server.cpu_seconds() - before < 0.3


def test_concurrent_requests_never_mix_tokens(http):
    prompts = ["Count to five.", "Name a fruit.", "Describe the sea.", "What is 2+2?"]

    def ask(prompt):
        body = {
            "model": "smollm2",
            "messages": [{"role": "user", "content": prompt}],
            "max_tokens": 24,
            "temperature": 0,
        }
        return http.post("/v1/chat/completions", json=body).json()["choices"][0]["message"][
            "content"
        ]

    alone = [ask(prompt) for prompt in prompts]
    with ThreadPoolExecutor(len(prompts)) as pool:
        together = list(pool.map(ask, prompts * 2))
    assert together == alone * 2
