"""The Embeddings API (``POST /v1/embeddings``): OpenAI's request schema and errors,
and the answer object in either of its encodings.

:data:`EMBEDDINGS_REQUEST` is the schema, one table of
:mod:`~chatparity.protocol.schema` nodes: :func:`parse_embeddings_request`
validates with it and the OpenAPI document is generated from it. ``input`` is
a string, a list of strings, a list of token ids or a list of such lists; an
empty string, an empty list and lists that mix kinds are refused in OpenAI's
words (``'$.input' is invalid``). Token counts are the model's: the backend that
tokenizes refuses an input longer than its model reads (:func:`input_too_long`)
and a request whose inputs add up to more than it takes at once
(:func:`request_too_many_tokens`).

A vector travels as the little-endian float32 bytes OpenAI's ``base64`` encoding
carries (:class:`Embeddings`): encoded for the client as those bytes in base64,
or as a list of numbers (:func:`embeddings_object`).
"""

from __future__ import annotations

import array
import base64
import binascii
import re
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any, Literal

import orjson

from .errors import APIError
from .request import Limits, parse_model
from .schema import (
    NOT_NULL,
    Components,
    Enum,
    Integer,
    Limit,
    Member,
    Node,
    Parameters,
    Schema,
    String,
    wrong_type,
)
from .tokens import utf8_bytes
from .upstream import MAX_REPORTED_TOKENS, malformed

MAX_INPUTS = 2048
"""The most inputs one request embeds, as OpenAI allows."""
MAX_TOKEN_ID = 2**31 - 1

EncodingFormat = Literal["float", "base64"]
ENCODING_FORMATS: tuple[EncodingFormat, ...] = ("float", "base64")

Input = str | tuple[int, ...]
"""One input: a text, or the token ids of one (in the serving model's vocabulary)."""


@dataclass(frozen=True, slots=True)
class EmbeddingsRequest:
    """A validated request. ``body`` keeps the JSON object exactly as sent."""

    model: str
    inputs: tuple[Input, ...]
    body: dict[str, Any]
    encoding_format: EncodingFormat = "float"
    dimensions: int | None = None
    user: str | None = None
    # Not the client's: what the serving alias lets an upstream receive (``user``).
    forwarded_params: frozenset[str] = frozenset()

    @property
    def token_ids(self) -> bool:
        """Whether the inputs are token ids (else texts)."""
        return bool(self.inputs) and not isinstance(self.inputs[0], str)


@dataclass(frozen=True, slots=True)
class Embeddings:
    """What a backend answers: one vector per input, in input order, each the
    little-endian float32 bytes of its numbers; and the tokens the inputs were."""

    vectors: Sequence[bytes]
    prompt_tokens: int
    counted: bool = field(default=False)
    """The tokens were estimated, not reported (an upstream's usage not believed)."""


# Errors, in OpenAI's words.


def invalid_input() -> APIError:
    """What OpenAI answers for an ``input`` of no text: an empty string, an empty list,
    a list of mixed kinds."""
    return APIError(
        "'$.input' is invalid. Please check the API reference:"
        " https://platform.openai.com/docs/api-reference."
    )


def input_too_long(limit: int, tokens: int) -> APIError:
    """One input has more tokens than the model reads."""
    return APIError(
        f"This model's maximum context length is {limit} tokens, however you requested"
        f" {tokens} tokens ({tokens} in your prompt; 0 for the completion). Please reduce"
        " your prompt; or completion length."
    )


def request_too_many_tokens(limit: int, tokens: int) -> APIError:
    """The inputs add up to more tokens than one request may embed."""
    return APIError(
        f"Requested {tokens} tokens, max {limit} tokens per request",
        type="max_tokens_per_request",
        code="max_tokens_per_request",
    )


def dimensions_not_supported() -> APIError:
    """``dimensions`` on a model whose vectors cannot be shortened."""
    return APIError("This model does not support specifying dimensions.")


def too_many_dimensions(limit: int, dimensions: int) -> APIError:
    """``dimensions`` above what the model's vectors have."""
    return APIError(
        f"Invalid 'dimensions': integer above maximum value. Expected a value <= {limit},"
        f" but got {dimensions} instead.",
        param="dimensions",
        code="integer_above_max_value",
    )


def token_out_of_vocabulary(index: int, token: int, vocabulary: int) -> APIError:
    """A token id the serving model does not have."""
    return APIError(
        f"Invalid 'input[{index}]': token id {token} is not in this model's vocabulary of"
        f" {vocabulary} tokens.",
        param=f"input[{index}]",
        code="invalid_value",
    )


# The schema.


def _is_token(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= MAX_TOKEN_ID


def _token_list(value: Any) -> tuple[int, ...] | None:
    """``value`` as token ids, if it is a non-empty list of them."""
    if isinstance(value, list) and value and all(map(_is_token, value)):
        return tuple(value)
    return None


def _check_length(path: str, items: Sequence[Any], limit: int | Limit | None) -> None:
    if isinstance(limit, int) and len(items) > limit:
        raise APIError(
            f"Invalid '{path}': array too long. Expected an array with maximum length"
            f" {limit}, but got an array with length {len(items)} instead.",
            param=path,
            code="array_above_max_length",
        )


@dataclass(frozen=True, slots=True, eq=False)
class InputNode(Node):
    """``input``: one text or many, token ids or lists of them, read as a tuple of
    :data:`Input`. At most ``max_inputs``; a text at most ``max_chars`` characters, a
    list of token ids at most as many ids."""

    max_inputs: int | Limit = MAX_INPUTS
    max_chars: int | Limit | None = None
    expected: str = "a string or array"
    description: str | None = None

    def accepts(self, value: Any) -> bool:
        return isinstance(value, str | list)

    def parse(self, value: Any, path: str) -> tuple[Input, ...]:
        if isinstance(value, str):
            return (self._text(value, path),)
        if not isinstance(value, list):
            raise wrong_type(path, self.expected, value)
        if not value:
            raise invalid_input()
        if _is_token(value[0]):  # one input, as token ids
            return (self._tokens(value, path),)
        _check_length(path, value, self.max_inputs)
        if isinstance(value[0], str):
            if not all(isinstance(item, str) for item in value):
                raise invalid_input()
            return tuple(self._text(item, f"{path}[{i}]") for i, item in enumerate(value))
        return tuple(self._tokens(item, f"{path}[{i}]") for i, item in enumerate(value))

    def _tokens(self, value: Any, path: str) -> tuple[int, ...]:
        tokens = _token_list(value)
        if tokens is None:
            raise invalid_input()
        _check_length(path, tokens, self.max_chars)
        return tokens

    def _text(self, value: str, path: str) -> str:
        if not value:
            raise invalid_input()
        limit = self.max_chars
        if isinstance(limit, int) and len(value) > limit:
            raise APIError(
                f"Invalid '{path}': string too long. Expected a string with maximum length"
                f" {limit}, but got a string with length {len(value)} instead.",
                param=path,
                code="string_above_max_length",
            )
        return value

    def schema(self, components: Components) -> Schema:
        text: Schema = {"type": "string", "minLength": 1}
        tokens: Schema = {
            "type": "array",
            "items": {"type": "integer", "minimum": 0, "maximum": MAX_TOKEN_ID},
            "minItems": 1,
        }
        if isinstance(self.max_chars, int):
            text["maxLength"] = tokens["maxItems"] = self.max_chars

        def many(items: Schema) -> Schema:
            schema: Schema = {"type": "array", "items": items, "minItems": 1}
            if isinstance(self.max_inputs, int):
                schema["maxItems"] = self.max_inputs
            return schema

        return {"anyOf": [text, many(text), tokens, many(tokens)]}


EMBEDDINGS_REQUEST = Parameters(
    (
        Member("model", String(), NOT_NULL, "A model id from GET /models."),
        Member(
            "input",
            InputNode(max_inputs=Limit("max_inputs"), max_chars=Limit("max_content_chars")),
            NOT_NULL,
            "Text to embed: a string, strings, token ids, or lists of token ids (none empty).",
        ),
        Member(
            "dimensions",
            Integer(1),
            description="Fewer dimensions, for models whose vectors can be shortened; else a 400.",
        ),
        Member(
            "encoding_format",
            Enum(ENCODING_FORMATS),
            description="float (default), or base64: each vector's little-endian float32 bytes.",
        ),
        Member("user", String()),
    ),
    name="CreateEmbeddingRequest",
    description="OpenAI's Embeddings request. Unknown keys are a 400.",
)
"""Every parameter OpenAI accepts, with its schema; null always means "not given"."""


@lru_cache(maxsize=16)
def embeddings_request(limits: Limits) -> Parameters:
    """:data:`EMBEDDINGS_REQUEST` with the server's ``limits`` in it."""
    return EMBEDDINGS_REQUEST.bind(limits)


def parse_embeddings_request(body: Any, limits: Limits) -> EmbeddingsRequest:
    """Validate a decoded JSON body; raise :class:`APIError` as OpenAI would: the model
    first, then unknown keys, then each parameter in the order the body lists them."""
    parse_model(body)
    given = embeddings_request(limits).read(body, "", {})
    return EmbeddingsRequest(
        model=given["model"],
        inputs=given["input"],
        body=body,
        encoding_format=given.get("encoding_format") or "float",
        dimensions=given.get("dimensions"),
        user=given.get("user"),
    )


# The answer.

_LITTLE_ENDIAN = sys.byteorder == "little"


def floats(vector: bytes) -> list[float]:
    """A vector's numbers, from its little-endian float32 bytes."""
    numbers = array.array("f")
    numbers.frombytes(vector)
    if not _LITTLE_ENDIAN:
        numbers.byteswap()
    return numbers.tolist()


def packed(numbers: Sequence[float]) -> bytes:
    """Little-endian float32 bytes of ``numbers``."""
    vector = array.array("f", numbers)
    if not _LITTLE_ENDIAN:
        vector.byteswap()
    return vector.tobytes()


def embeddings_object(
    embeddings: Embeddings, *, model: str, encoding_format: EncodingFormat
) -> dict[str, Any]:
    """The ``list`` object OpenAI answers, ``data`` in input order."""
    encode = floats if encoding_format == "float" else _base64
    tokens = embeddings.prompt_tokens
    return {
        "object": "list",
        "data": [
            {"object": "embedding", "index": index, "embedding": encode(vector)}
            for index, vector in enumerate(embeddings.vectors)
        ],
        "model": model,
        "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
    }


def _base64(vector: bytes) -> str:
    return base64.b64encode(vector).decode("ascii")


# An upstream's answer, not trusted.

MAX_DIMENSIONS = 16384
"""The most numbers a vector from an upstream may have."""
MAX_ANSWER_BYTES_PER_INPUT = 128 * 1024
"""What an upstream's answer may weigh per input (a vector of thousands of numbers as
JSON text; base64, asked for, is a fifth of that)."""
# A float32 that is not finite: its exponent's bits all set, the top two bytes of its
# four (little-endian) being [1xxxxxxx] [x1111111]. Looked for at every offset, then
# checked to start a number.
_NOT_FINITE = re.compile(rb"(?=[\x80-\xff][\x7f\xff])")


def upstream_embeddings(answer: bytes, request: EmbeddingsRequest) -> Embeddings:
    """The vectors of an upstream's ``list`` object answering ``request``: one for each
    input, by ``index``, all of one width (``dimensions`` when asked for), of finite
    numbers, sent as numbers or in base64; a 502 (:func:`malformed`) for anything else.
    Its usage counts the tokens when believable (see :func:`_believable`), else they are
    counted here."""
    try:
        payload = orjson.loads(answer)
    except orjson.JSONDecodeError:
        raise malformed("the embeddings answer is not JSON", answer) from None
    data = payload.get("data") if isinstance(payload, dict) else None
    if not isinstance(data, list):
        raise malformed("the embeddings answer has no list of data", answer)
    count = len(request.inputs)
    if len(data) != count:
        raise malformed(f"the answer has {len(data)} embeddings for {count} inputs", answer)
    vectors: list[bytes | None] = [None] * count
    for item in data:
        index = item.get("index") if isinstance(item, dict) else None
        if not isinstance(index, int) or not 0 <= index < count or vectors[index] is not None:
            raise malformed("an embedding's index is missing, out of range or repeated", answer)
        vectors[index] = _vector(item.get("embedding"), answer)
    widths = {len(vector) for vector in vectors if vector is not None}
    width = widths.pop() // 4
    if widths or width > MAX_DIMENSIONS:
        raise malformed("the embeddings have different or too many dimensions", answer)
    if request.dimensions is not None and width != request.dimensions:
        raise malformed(f"{width} dimensions were sent for {request.dimensions} asked", answer)
    usage = payload.get("usage")
    reported = usage.get("prompt_tokens") if isinstance(usage, dict) else None
    if isinstance(reported, int) and _believable(reported, request):
        return Embeddings([v for v in vectors if v is not None], reported)
    return Embeddings([v for v in vectors if v is not None], counted_tokens(request), True)


def _vector(embedding: Any, answer: bytes) -> bytes:
    """One vector's float32 bytes, from numbers or base64."""
    try:
        if isinstance(embedding, str):
            vector = base64.b64decode(embedding, validate=True)
        elif isinstance(embedding, list) and all(type(x) in (int, float) for x in embedding):
            vector = packed(embedding)
        else:
            raise ValueError("neither numbers nor base64")
    except (ValueError, binascii.Error):
        raise malformed("an embedding is neither numbers nor base64", answer) from None
    if not vector or len(vector) % 4:
        raise malformed("an embedding is empty or not of float32 numbers", answer)
    if any(match.start() % 4 == 2 for match in _NOT_FINITE.finditer(vector)):
        raise malformed("an embedding has a number that is not finite", answer)
    return vector


INPUT_TOKENS = 16
"""The most special tokens a model adds to one input (BERT's two, a few in others)."""


def counted_tokens(request: EmbeddingsRequest) -> int:
    """The most tokens ``request``'s inputs can be: token ids counted, a text at most its
    UTF-8 bytes (no tokenizer makes more of it, see
    :func:`~chatparity.protocol.tokens.prompt_bound`) and :data:`INPUT_TOKENS`."""
    return sum(
        utf8_bytes(x) + INPUT_TOKENS if isinstance(x, str) else len(x) for x in request.inputs
    )


def _believable(tokens: int, request: EmbeddingsRequest) -> bool:
    """Whether ``tokens`` can be what the inputs are: no more than
    :func:`counted_tokens` (for token ids, their count exactly)."""
    if isinstance(tokens, bool):
        return False
    if request.token_ids:
        return tokens == counted_tokens(request)
    return 0 <= tokens <= min(counted_tokens(request), MAX_REPORTED_TOKENS)
