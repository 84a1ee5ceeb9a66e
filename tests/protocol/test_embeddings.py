"""The Embeddings request, validated as OpenAI validates it, and its answer object."""

import base64
import struct

import pytest

from chatparity.protocol.embeddings import (
    EMBEDDINGS_REQUEST,
    Embeddings,
    embeddings_object,
    floats,
    packed,
    parse_embeddings_request,
)
from chatparity.protocol.errors import APIError
from chatparity.protocol.request import Limits
from chatparity.protocol.schema import Components

LIMITS = Limits(max_messages=2048, max_content_chars=100)
INVALID_INPUT = "'$.input' is invalid. Please check the API reference: https://platform.openai.com/docs/api-reference."


def parse(**body):
    return parse_embeddings_request({"model": "embed-small", **body}, LIMITS)


def refusal(**body):
    with pytest.raises(APIError) as refused:
        parse_embeddings_request(body, LIMITS)
    error = refused.value
    return error.status, error.message, error.param, error.code


def test_input_is_one_text_or_many():
    assert parse(input="hello").inputs == ("hello",)
    assert parse(input=["a", "b"]).inputs == ("a", "b")


def test_input_is_token_ids_or_lists_of_them():
    one = parse(input=[1, 2, 3])
    assert one.inputs == ((1, 2, 3),)
    assert one.token_ids
    assert parse(input=[[1, 2], [3]]).inputs == ((1, 2), (3,))
    assert not parse(input="x").token_ids


@pytest.mark.parametrize(
    "sent",
    ["", [], [""], ["a", ""], [[]], [[1], []], ["a", 1], [1, "a"], [[1], "a"], [1.5], [-1], [True]],
)
def test_empty_or_mixed_input_is_openais_invalid_input(sent):
    assert refusal(model="m", input=sent) == (400, INVALID_INPUT, None, None)


def test_input_of_another_type_is_a_wrong_type():
    assert refusal(model="m", input=5) == (
        400,
        "Invalid type for 'input': expected a string or array, but got an integer instead.",
        "input",
        "invalid_type",
    )


def test_at_most_2048_inputs():
    assert len(parse(input=["x"] * 2048).inputs) == 2048
    status, message, param, code = refusal(model="m", input=["x"] * 2049)
    assert (status, param, code) == (400, "input", "array_above_max_length")
    assert message.endswith("maximum length 2048, but got an array with length 2049 instead.")


def test_a_list_of_token_ids_is_bounded_as_a_text_is_not_as_inputs_are():
    limits = Limits(max_content_chars=3000, max_inputs=2)
    body = {"model": "m", "input": [7] * 3000}
    assert len(parse_embeddings_request(body, limits).inputs[0]) == 3000
    assert refusal(model="m", input=[[7] * 101])[2:] == ("input[0]", "array_above_max_length")
    with pytest.raises(APIError) as refused:
        parse_embeddings_request({"model": "m", "input": ["a", "b", "c"]}, limits)
    assert refused.value.code == "array_above_max_length"


def test_a_text_longer_than_the_server_takes_is_refused_where_it_is():
    assert refusal(model="m", input=["ok", "x" * 101])[2:] == (
        "input[1]",
        "string_above_max_length",
    )


def test_missing_model_and_input():
    assert refusal(input="x")[1] == "you must provide a model parameter"
    assert refusal(model="m")[1:] == (
        "Missing required parameter: 'input'.",
        "input",
        "missing_required_parameter",
    )


def test_encoding_format_and_dimensions():
    request = parse(input="x", encoding_format="base64", dimensions=64, user="u-1")
    assert (request.encoding_format, request.dimensions, request.user) == ("base64", 64, "u-1")
    assert parse(input="x").encoding_format == "float"
    assert refusal(model="m", input="x", encoding_format="binary") == (
        400,
        "Invalid value: 'binary'. Supported values are: 'float' and 'base64'.",
        "encoding_format",
        "invalid_value",
    )
    assert refusal(model="m", input="x", dimensions=0)[2:] == (
        "dimensions",
        "integer_below_min_value",
    )


def test_unknown_parameters_are_refused():
    assert refusal(model="m", input="x", stream=True)[1] == (
        "Unrecognized request argument supplied: stream"
    )


def test_the_answer_in_float_and_base64():
    vectors = [packed([0.5, -0.25]), packed([1.0, 0.0])]
    answer = Embeddings(vectors, prompt_tokens=7)
    as_floats = embeddings_object(answer, model="embed-small", encoding_format="float")
    assert as_floats == {
        "object": "list",
        "data": [
            {"object": "embedding", "index": 0, "embedding": [0.5, -0.25]},
            {"object": "embedding", "index": 1, "embedding": [1.0, 0.0]},
        ],
        "model": "embed-small",
        "usage": {"prompt_tokens": 7, "total_tokens": 7},
    }
    as_base64 = embeddings_object(answer, model="embed-small", encoding_format="base64")
    first = base64.b64decode(as_base64["data"][0]["embedding"])
    assert struct.unpack("<2f", first) == (0.5, -0.25)


def test_vectors_are_little_endian_float32():
    assert packed([1.0]) == struct.pack("<f", 1.0)
    assert floats(struct.pack("<3f", 1.5, -2.0, 0.125)) == [1.5, -2.0, 0.125]


def test_the_schema_documents_the_four_input_shapes():
    document = Components()
    assert document.describe(EMBEDDINGS_REQUEST.bind(LIMITS)) == {
        "$ref": "#/components/schemas/CreateEmbeddingRequest"
    }
    request = document.schemas["CreateEmbeddingRequest"]
    shapes = request["properties"]["input"]["anyOf"]
    assert [shape["type"] for shape in shapes] == ["string", "array", "array", "array"]
    assert shapes[1]["maxItems"] == 2048
    assert shapes[0]["maxLength"] == 100
    assert request["required"] == ["model", "input"]
    assert request["properties"]["encoding_format"]["anyOf"][0]["enum"] == ["float", "base64"]
