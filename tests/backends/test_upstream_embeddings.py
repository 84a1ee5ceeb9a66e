"""The ``openai`` backend's embeddings, against a scripted upstream on loopback that
answers or misbehaves as asked: the client gets the upstream's vectors or a clear
error, never a wrong vector."""

import asyncio

import pytest

from chatparity.backends.base import BackendConfig, EmbeddingBackend
from chatparity.backends.upstream import UpstreamBackend
from chatparity.protocol.embeddings import EmbeddingsRequest, floats
from chatparity.protocol.errors import APIError
from tests.scripted import EMBEDDING_FAULTS, ScriptedUpstream, scripted_vector

SECRET = "sk-upstream-embeddings-0000"


@pytest.fixture(scope="module")
def upstream():
    server = ScriptedUpstream()
    yield server
    server.close()


def backend(upstream, **options):
    options.setdefault("backoff", 0.01)
    config = BackendConfig(
        name="scripted", kind="openai", base_url=upstream.base_url, secret=SECRET,
        timeout=2, options=options,
    )  # fmt: skip
    return UpstreamBackend(config)


def ask(*inputs, **fields):
    body = {"input": list(inputs) if len(inputs) > 1 else inputs[0]}
    return EmbeddingsRequest(model="embed", inputs=tuple(inputs), body=body, **fields)


def embed(upstream, request, model="text-embedding-3-small", **options):
    return asyncio.run(backend(upstream, **options).embed(request, model))


def test_it_is_an_embedding_backend(upstream):
    assert isinstance(backend(upstream), EmbeddingBackend)


def test_vectors_come_back_in_input_order_asked_in_base64(upstream):
    answer = embed(upstream, ask("first", "second"))
    assert [floats(v) for v in answer.vectors] == [
        pytest.approx(scripted_vector(text, 8), rel=1e-6) for text in ("first", "second")
    ]
    assert answer.prompt_tokens == 2
    assert not answer.counted
    path, headers = upstream.heads[-1]
    assert path == "/v1/embeddings"
    assert headers["authorization"] == f"Bearer {SECRET}"
    assert upstream.requests[-1] == {
        "model": "text-embedding-3-small",
        "input": ["first", "second"],
        "encoding_format": "base64",
    }


def test_dimensions_go_upstream_and_user_only_when_the_alias_forwards_it(upstream):
    answer = embed(upstream, ask("text", dimensions=4, user="u-1"))
    assert len(floats(answer.vectors[0])) == 4
    assert upstream.requests[-1]["dimensions"] == 4
    assert "user" not in upstream.requests[-1]
    embed(upstream, ask("text", user="u-1", forwarded_params=frozenset({"user"})))
    assert upstream.requests[-1]["user"] == "u-1"


def test_token_ids_are_passed_on_and_counted_exactly(upstream):
    answer = embed(upstream, ask((1, 2, 3), (4, 5)))
    assert upstream.requests[-1]["input"] == [[1, 2, 3], [4, 5]]
    assert answer.prompt_tokens == 5


@pytest.mark.parametrize("fault", ["count", "index", "width", "base64", "nan", "html", "stream"])
def test_a_malformed_answer_is_a_502(upstream, fault):
    assert fault in EMBEDDING_FAULTS
    with pytest.raises(APIError) as failed:
        embed(upstream, ask("a", "b"), model=f"fault:{fault}")
    assert (failed.value.status, failed.value.code) == (502, "upstream_error")


def test_vectors_of_a_width_not_asked_for_are_a_502(upstream):
    with pytest.raises(APIError) as failed:
        embed(upstream, ask("a", dimensions=4), model="fault:width")
    assert failed.value.status == 502


def test_usage_not_believed_is_counted_instead(upstream):
    answer = embed(upstream, ask("a few words here"), model="fault:usage")
    assert answer.counted
    assert answer.prompt_tokens == len("a few words here") + 16  # its bound: a token a byte


def test_a_5xx_is_retried(upstream):
    answer = embed(upstream, ask("again"), model="fault:flaky")
    assert len(answer.vectors) == 1
    assert upstream.asked["fault:flaky"] == 2


def test_an_upstream_refusal_keeps_its_status_not_its_words(upstream):
    with pytest.raises(APIError) as failed:
        embed(upstream, ask("a"), model="fault:refuse")
    assert failed.value.status == 400
    assert failed.value.message != "no"
    with pytest.raises(APIError) as passed:
        embed(upstream, ask("a"), model="fault:refuse", pass_error_text=True)
    assert passed.value.message == "no"


def test_a_hang_up_is_a_502_and_a_slow_upstream_a_504(upstream):
    with pytest.raises(APIError) as dropped:
        embed(upstream, ask("a"), model="fault:hang-up", retries=0)
    assert dropped.value.status == 502
    with pytest.raises(APIError) as slow:
        embed(upstream, ask("a"), model="fault:slow")
    assert (slow.value.status, slow.value.code) == (504, "request_timeout")


def test_a_messages_upstream_serves_no_embeddings(upstream):
    with pytest.raises(APIError) as refused:
        embed(upstream, ask("a"), wire_api="messages")
    assert (refused.value.status, refused.value.param) == (400, "model")
