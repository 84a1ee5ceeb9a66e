"""Conformance checks of OpenAI's Embeddings API (``POST /embeddings``).

They ask the run's embedding model (``--embedding-model``, else the first model
``GET /models`` names as one; with none, they are not run): the ``list`` object
and its vectors in input order, base64 as the little-endian float32 bytes of the
numbers, token ids, each input's vector whatever else shares its request, and
OpenAI's refusals of an empty input and an unknown parameter.
"""

from __future__ import annotations

import base64
import math
import struct
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

import httpx

from .framework import (
    INVALID,
    UNKNOWN_ARGUMENT,
    Check,
    Probe,
    is_int,
    judge_error,
    listed,
    short,
)

if TYPE_CHECKING:
    from .framework import Runner

TEXTS = ("The cat sleeps on the sofa.", "Stock markets fell sharply today.", "Rain tomorrow.")
TOKEN_IDS = [[1, 2, 3], [4, 5]]


@dataclass(frozen=True)
class EmbeddingsProbe(Probe):
    """A request to ``/embeddings``, of the run's embedding model."""

    path: str = "/embeddings"
    defaults: ClassVar[dict[str, Any]] = {"input": list(TEXTS), "encoding_format": "float"}

    def model_of(self, runner: Runner) -> str:
        return runner.embedding_model


def _probe(**body: Any) -> EmbeddingsProbe:
    return EmbeddingsProbe(body=body)


FLOATS = _probe()
BASE64 = _probe(encoding_format="base64")
ALONE = tuple(_probe(input=text) for text in TEXTS)


def vectors_of(
    response: httpx.Response, model: str, inputs: int, *, encoded: bool = False
) -> tuple[list[list[float]] | None, list[str]]:
    """The vectors of an embeddings ``list`` answering ``inputs`` inputs, in input order,
    and the problems of the object; None when there are none to look at."""
    body, data, problems = listed(response, f"{inputs} embeddings")
    if data is None:
        return None, problems
    if body.get("model") != model:
        problems.append(f"model is {short(body.get('model'))}, expected {model!r}")
    usage = body.get("usage")
    if not isinstance(usage, dict) or not is_int(usage.get("prompt_tokens")):
        problems.append(f"usage is {short(usage)}, expected prompt_tokens and total_tokens")
    elif usage.get("total_tokens") != usage["prompt_tokens"] or usage["prompt_tokens"] <= 0:
        problems.append(f"usage is {short(usage)}: total_tokens must be the prompt's, above 0")
    if len(data) != inputs:
        return None, [*problems, f"{len(data)} embeddings for {inputs} inputs"]
    vectors = []
    for position, item in enumerate(data):
        where = f"data[{position}]"
        if not isinstance(item, dict) or set(item) != {"object", "index", "embedding"}:
            return None, [*problems, f"{where} is {short(item)}, expected object, index, embedding"]
        if item["object"] != "embedding" or item["index"] != position:
            problems.append(f"{where} has object {short(item['object'])}, index {item['index']}")
        vector, problem = _vector(item["embedding"], encoded)
        if vector is None:
            return None, [*problems, f"{where}.embedding {problem}"]
        vectors.append(vector)
    if len({len(vector) for vector in vectors}) != 1:
        problems.append("the vectors are not all of one length")
    return vectors, problems


def _vector(embedding: Any, encoded: bool) -> tuple[list[float] | None, str]:
    if not encoded:
        numbers = isinstance(embedding, list) and embedding
        if not numbers or not all(type(x) in (int, float) for x in embedding):
            return None, f"is {short(embedding)}, expected numbers"
        return [float(x) for x in embedding], ""
    try:
        raw = base64.b64decode(embedding, validate=True)
    except (TypeError, ValueError):
        return None, f"is {short(embedding)}, expected base64"
    if not raw or len(raw) % 4:
        return None, f"is {len(raw)} bytes, not little-endian float32 numbers"
    return list(struct.unpack(f"<{len(raw) // 4}f", raw)), ""


def _norm(vector: list[float]) -> float:
    return math.sqrt(sum(x * x for x in vector))


def _cosine(a: list[float], b: list[float]) -> float:
    return sum(x * y for x, y in zip(a, b, strict=False)) / (_norm(a) * _norm(b) or 1.0)


def object_problems(model: str, responses: Sequence[httpx.Response]) -> list[str]:
    vectors, problems = vectors_of(responses[0], model, len(TEXTS))
    if vectors is not None and not all(math.isfinite(x) for v in vectors for x in v):
        problems.append("a vector has a number that is not finite")
    return problems


def base64_problems(model: str, responses: Sequence[httpx.Response]) -> list[str]:
    floats, problems = vectors_of(responses[0], model, len(TEXTS))
    decoded, more = vectors_of(responses[1], model, len(TEXTS), encoded=True)
    problems += more
    if floats is None or decoded is None:
        return problems
    for index, (plain, packed) in enumerate(zip(floats, decoded, strict=True)):
        if len(plain) != len(packed) or any(
            not math.isclose(x, y, rel_tol=1e-5, abs_tol=1e-6)
            for x, y in zip(plain, packed, strict=True)
        ):
            problems.append(f"data[{index}]: the base64 vector is not the float vector's float32")
    return problems


def alone_problems(model: str, responses: Sequence[httpx.Response]) -> list[str]:
    together, problems = vectors_of(responses[0], model, len(TEXTS))
    for index, response in enumerate(responses[1:]):
        alone, more = vectors_of(response, model, 1)
        problems += more
        if together is not None and alone is not None:
            similarity = _cosine(together[index], alone[0])
            if similarity < 0.999:
                problems.append(
                    f"input {index} embedded with others has cosine {similarity:.4f} to"
                    " itself embedded alone"
                )
    return problems


def token_ids_problems(model: str, responses: Sequence[httpx.Response]) -> list[str]:
    return vectors_of(responses[0], model, len(TOKEN_IDS))[1]


CHECKS: tuple[Check, ...] = (
    Check(
        "embeddings.object",
        "object list, data of {object embedding, index, embedding} in input order, one"
        " length, model echoed, usage",
        (FLOATS,),
        object_problems,
    ),
    Check(
        "embeddings.base64",
        "encoding_format base64: each vector's little-endian float32 bytes",
        (FLOATS, BASE64),
        base64_problems,
    ),
    Check(
        "embeddings.batch",
        "each input's vector in a batch is the vector of it embedded alone",
        (FLOATS, *ALONE),
        alone_problems,
    ),
    Check(
        "embeddings.token-ids",
        "input as lists of token ids: one vector for each",
        (_probe(input=TOKEN_IDS),),
        token_ids_problems,
    ),
    Check(
        "embeddings.errors.empty-input",
        "an empty string: 400 invalid_request_error",
        (_probe(input=""),),
        judge_error(400, type=INVALID),
    ),
    Check(
        "embeddings.errors.unknown-argument",
        "an unknown body key: 400 invalid_request_error",
        (_probe(**{UNKNOWN_ARGUMENT: 1}),),
        judge_error(400, type=INVALID),
    ),
)
