"""The bytes on the wire, read with raw httpx: framing, order, headers, statuses."""

import orjson
import pytest

pytestmark = pytest.mark.e2e

ASK = [{"role": "user", "content": "Tell me a long story about a dragon."}]


def frames(response):
    body = response.read()
    assert body.endswith(b"data: [DONE]\n\n")
    parts = body.split(b"\n\n")
    assert parts[-1] == b""
    assert all(part.startswith(b"data: ") for part in parts[:-1])
    return [orjson.loads(part[6:]) for part in parts[:-2]]


def post(http, **body):
    return http.post("/v1/chat/completions", json={"model": "smollm2", "messages": ASK, **body})


def stream(http, **body):
    return http.stream(
        "POST",
        "/v1/chat/completions",
        json={"model": "smollm2", "messages": ASK, "stream": True, **body},
    )


def test_stream_frames_follow_the_canonical_order(http):
    with stream(http, max_tokens=5, temperature=0) as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        assert response.headers["x-request-id"].startswith("req_")
        assert int(response.headers["openai-processing-ms"]) >= 0
        chunks = frames(response)
    first, *middle, last = chunks
    assert first["choices"][0]["delta"] == {"role": "assistant", "content": "", "refusal": None}
    assert last["choices"][0]["delta"] == {}
    assert last["choices"][0]["finish_reason"] == "length"
    for chunk in chunks:
        assert list(chunk) == [
            "id", "object", "created", "model", "service_tier", "system_fingerprint", "choices",
        ]  # fmt: skip
        (choice,) = chunk["choices"]
        assert list(choice) == ["index", "delta", "logprobs", "finish_reason"]
    for chunk in [first, *middle]:
        assert chunk["choices"][0]["finish_reason"] is None
        assert chunk["choices"][0]["logprobs"] is None
    assert "".join(c["choices"][0]["delta"]["content"] for c in middle)
    assert len({(c["id"], c["created"], c["model"], c["system_fingerprint"]) for c in chunks}) == 1


def test_usage_chunk_comes_last_and_every_other_chunk_has_null_usage(http):
    with stream(http, max_tokens=3, stream_options={"include_usage": True}) as response:
        *chunks, usage = frames(response)
    assert all(chunk["usage"] is None for chunk in chunks)
    assert usage["choices"] == []
    assert usage["usage"]["completion_tokens"] == 3
    assert usage["usage"]["total_tokens"] == usage["usage"]["prompt_tokens"] + 3
    assert set(usage["usage"]) == {
        "prompt_tokens", "completion_tokens", "total_tokens",
        "prompt_tokens_details", "completion_tokens_details",
    }  # fmt: skip


def test_non_stream_is_the_accumulated_stream(http):
    body = {"max_tokens": 20, "temperature": 0, "logprobs": True, "top_logprobs": 2}
    plain = post(http, **body).json()
    with stream(http, **body, stream_options={"include_usage": True}) as response:
        chunks = frames(response)
    text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])
    streamed_logprobs = [
        entry
        for c in chunks
        if c["choices"] and c["choices"][0]["logprobs"]
        for entry in c["choices"][0]["logprobs"]["content"]
    ]
    (choice,) = plain["choices"]
    assert choice["message"] == {
        "role": "assistant", "content": text, "refusal": None, "annotations": [],
    }  # fmt: skip
    assert choice["finish_reason"] == chunks[-2]["choices"][0]["finish_reason"]
    assert plain["usage"] == chunks[-1]["usage"]
    assert choice["logprobs"]["content"] == streamed_logprobs
    assert len(streamed_logprobs) == 20
    assert all(len(entry["top_logprobs"]) == 2 for entry in streamed_logprobs)


@pytest.mark.parametrize("stream", [False, True])
def test_errors_before_the_first_byte_have_a_real_status(http, stream):
    response = post(http, stream=stream, temperature=3)
    assert response.status_code == 400
    assert response.headers["content-type"] == "application/json"
    assert response.json()["error"]["param"] == "temperature"
    too_long = post(http, stream=stream, max_tokens=100_000)
    assert too_long.status_code == 400
    assert too_long.json()["error"]["code"] == "context_length_exceeded"


def test_body_that_is_not_json_gets_openais_parse_error(http):
    response = http.post(
        "/v1/chat/completions", content=b"{nope", headers={"content-type": "application/json"}
    )
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["message"].startswith("We could not parse the JSON body of your request.")
    assert (error["type"], error["param"], error["code"]) == ("invalid_request_error", None, None)


def test_missing_key_is_401_with_headers(daphne_server):
    import httpx

    response = httpx.post(f"{daphne_server.base_url}/chat/completions", json={})
    assert response.status_code == 401
    assert response.json()["error"]["type"] == "invalid_request_error"
    assert response.headers["x-request-id"].startswith("req_")
    assert "openai-processing-ms" in response.headers


def test_same_seed_same_text(http):
    body = {"max_tokens": 24, "temperature": 1.0, "seed": 1234}
    first, second = (post(http, **body).json() for _ in range(2))
    assert first["choices"][0]["message"]["content"] == second["choices"][0]["message"]["content"]


def test_stop_sequences_are_never_emitted(http):
    plain = post(http, max_tokens=12, temperature=0).json()["choices"][0]["message"]["content"]
    stop = plain.split()[1]
    cut = post(http, max_tokens=12, temperature=0, stop=[stop, "zzz"]).json()["choices"][0]
    assert cut["finish_reason"] == "stop"
    assert stop not in cut["message"]["content"]
    assert plain.startswith(cut["message"]["content"])
