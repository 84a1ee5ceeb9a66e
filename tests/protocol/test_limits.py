"""The server's caps on a request, refused in OpenAI's words for its own limits."""

from dataclasses import replace

import orjson
import pytest
from django.core.checks import run_checks
from django.test import override_settings

from chatparity.gateway.pipeline import body_limit
from chatparity.protocol.errors import APIError, invalid_json, request_too_large
from chatparity.protocol.request import (
    MAX_DEPTH,
    SCHEMA_BOUNDS,
    Limits,
    SchemaBounds,
    SchemaTooComplex,
    check_schema,
    decode_body,
    parse_chat_request,
)

LIMITS = Limits(max_messages=3, max_content_chars=5)
CALL = {"id": "call_1", "type": "function", "function": {"name": "f", "arguments": "{}"}}


def user(content):
    return {"role": "user", "content": content}


def parse(messages, limits=LIMITS):
    return parse_chat_request({"model": "m", "messages": messages}, limits)


def refusal(messages, limits=LIMITS):
    with pytest.raises(APIError) as raised:
        parse(messages, limits)
    assert raised.value.status == 400
    return raised.value.envelope()["error"]


# MAX_MESSAGES


def test_messages_up_to_the_limit_are_accepted():
    assert len(parse([user("Hi")] * 3).messages) == 3


def test_more_messages_is_openais_array_too_long():
    assert refusal([user("Hi")] * 4) == {
        "message": "Invalid 'messages': array too long. Expected an array with maximum length 3,"
        " but got an array with length 4 instead.",
        "type": "invalid_request_error",
        "param": "messages",
        "code": "array_above_max_length",
    }


# MAX_CONTENT_CHARS


def test_a_content_up_to_the_limit_is_accepted():
    assert parse([user("12345")]).messages[0].content == "12345"


def test_the_limit_is_per_string_so_parts_may_add_up_past_it():
    parts = [{"type": "text", "text": "12345"}, {"type": "text", "text": "67890"}]
    assert parse([user(parts)]).messages[0].content == "1234567890"


def test_a_longer_content_is_openais_string_too_long():
    assert refusal([user("Hi"), user("123456")]) == {
        "message": "Invalid 'messages[1].content': string too long. Expected a string with"
        " maximum length 5, but got a string with length 6 instead.",
        "type": "invalid_request_error",
        "param": "messages[1].content",
        "code": "string_above_max_length",
    }


def test_a_longer_text_part_names_its_text():
    parts = [{"type": "text", "text": "Hi"}, {"type": "text", "text": "123456"}]
    error = refusal([user(parts)])
    assert (error["param"], error["code"]) == (
        "messages[0].content[1].text",
        "string_above_max_length",
    )


@pytest.mark.parametrize(
    "messages",
    [
        [{"role": "system", "content": "123456"}],
        [{"role": "developer", "content": "123456"}],
        [{"role": "user", "content": "123456"}],
        [{"role": "assistant", "content": "123456"}],
        [{"role": "function", "name": "f", "content": "123456"}],
        [{"role": "assistant", "tool_calls": [CALL]}, {"role": "tool", "tool_call_id": "call_1"}],
    ],
    ids=["system", "developer", "user", "assistant", "function", "tool"],
)
def test_every_role_is_capped(messages):
    if messages[-1]["role"] == "tool":
        messages[-1]["content"] = "123456"
    error = refusal(messages)
    assert (error["param"], error["code"]) == (
        f"messages[{len(messages) - 1}].content",
        "string_above_max_length",
    )


def test_only_message_contents_are_capped():
    request = parse_chat_request(
        {"model": "m", "messages": [user("Hi")], "user": "a-long-user-id", "stop": "a-long-stop"},
        LIMITS,
    )
    assert (request.user, request.stop) == ("a-long-user-id", ["a-long-stop"])


def test_without_limits_nothing_is_capped():
    request = parse_chat_request({"model": "m", "messages": [user("x" * 2_000_000)] * 3000})
    assert len(request.messages) == 3000


# The body itself.


def test_a_body_too_large_is_a_413_in_openais_envelope():
    error = request_too_large(1024)
    assert error.status == 413
    assert error.envelope() == {
        "error": {
            "message": "Request too large: the request body exceeds the maximum size of 1024"
            " bytes.",
            "type": "invalid_request_error",
            "param": None,
            "code": "request_too_large",
        }
    }


@pytest.mark.parametrize(
    ("declared", "read"),
    [
        ("8388608", 8388609),
        ("08388608", 8388609),
        ("0" * 5000 + "1", 8388609),
        ("8388609", 0),
        ("9" * 5000, 0),
        ("nonsense", 8388609),
    ],
)
def test_a_declared_length_tells_how_much_body_to_read(declared, read):
    assert body_limit({"content-length": declared}) == read


def nested(depth, empty=b"[]"):
    """``depth`` levels of arrays, the innermost ``empty``."""
    return b"[" * (depth - 1) + empty + b"]" * (depth - 1)


def test_decoding_keeps_any_json_value_for_the_parser_to_judge():
    assert decode_body(b'{"model": "m", "n": 1}') == {"model": "m", "n": 1}
    assert decode_body(b"[1]") == [1]
    assert decode_body(b'"m"') == "m"


@pytest.mark.parametrize(
    "raw",
    [
        pytest.param(b"", id="empty"),
        pytest.param(b"{", id="truncated"),
        pytest.param(b'{"a": "\xff"}', id="invalid UTF-8"),
        pytest.param(b'{"a": "\xed\xa0\x80"}', id="an encoded surrogate"),
        pytest.param(b'{"a": "\\ud800"}', id="an escaped lone surrogate"),
        pytest.param(b'{"a": NaN}', id="NaN"),
        pytest.param(b'{"a": -Infinity}', id="Infinity"),
        pytest.param(b'\xef\xbb\xbf{"a": 1}', id="a byte order mark"),
        pytest.param(nested(MAX_DEPTH + 1), id="one level too deep"),
        pytest.param(nested(10_000), id="past the parser's own depth limit"),
    ],
)
def test_what_is_not_json_is_openais_invalid_json(raw):
    with pytest.raises(APIError) as raised:
        decode_body(raw)
    assert raised.value.envelope() == invalid_json().envelope()


def test_nesting_up_to_the_limit_is_decoded():
    assert decode_body(nested(MAX_DEPTH))


def test_objects_count_as_levels_and_siblings_do_not():
    too_deep = b'{"a": ' * MAX_DEPTH + b"{}" + b"}" * MAX_DEPTH
    with pytest.raises(APIError):
        decode_body(too_deep)
    wide = orjson.dumps([orjson.loads(nested(MAX_DEPTH - 1))] * 1000)
    assert len(decode_body(wide)) == 1000


# Regressions: bodies the fuzzing found the server accepted, though OpenAI refuses them.


@pytest.mark.parametrize(
    ("message", "param", "code"),
    [
        ({"function_call": 7}, "messages[0].function_call", "invalid_type"),
        ({"function_call": {}}, "messages[0].function_call.name", "missing_required_parameter"),
        ({"function_call": {"name": 1}}, "messages[0].function_call.name", "invalid_type"),
        (
            {"function_call": {"name": "f", "arguments": 1}},
            "messages[0].function_call.arguments",
            "invalid_type",
        ),
        ({"content": "Hi", "refusal": 1}, "messages[0].refusal", "invalid_type"),
    ],
)
def test_an_assistant_messages_function_call_and_refusal_are_checked(message, param, code):
    error = refusal([{"role": "assistant", **message}], Limits())
    assert (error["param"], error["code"]) == (param, code)


def test_an_assistant_message_with_a_well_formed_function_call_is_accepted():
    call = {"name": "f", "arguments": "{}"}
    request = parse([{"role": "assistant", "content": None, "function_call": call}])
    assert request.messages[0].content is None


# JSON Schemas: bounded before any backend builds anything from them.

SMALL = SchemaBounds(
    max_bytes=200,
    max_depth=3,
    max_properties=3,
    max_enum_values=3,
    max_branches=3,
    max_repetition=10,
    max_pattern_length=20,
    max_nested_repetition=20,
)


def too_complex(schema, bounds=SMALL):
    with pytest.raises(SchemaTooComplex) as raised:
        check_schema(schema, bounds)
    return str(raised.value)


def items(depth):
    """``depth`` array schemas, each the items of the one around it."""
    schema = {"type": "integer"}
    for _ in range(depth):
        schema = {"type": "array", "items": schema}
    return schema


@pytest.mark.parametrize(
    "schema",
    [
        pytest.param({"type": "string", "maxLength": 10, "pattern": "^(a{0,4}b){0,5}$"}, id="edge"),
        pytest.param(items(3), id="as deep as allowed"),
        pytest.param({"properties": {"a": {"enum": [1, 2, 3]}, "b": {}, "c": {}}}, id="totals"),
        pytest.param({"anyOf": [{"type": ["string", "null"]}]}, id="three branches"),
        pytest.param({"type": "string", "pattern": "^[{]+\\{99}$"}, id="braces, no counts"),
        pytest.param({"enum": [{"maxItems": 99}], "default": {"maxItems": 99}}, id="data"),
    ],
)
def test_a_schema_within_its_bounds_passes(schema):
    check_schema(schema, SMALL)


@pytest.mark.parametrize(
    ("schema", "reason"),
    [
        (
            {"description": "x" * 200},
            "the schema is 218 bytes long, more than the maximum of 200",
        ),
        (items(4), "In context=('items', 'items', 'items', 'items'), schemas nest more than 3"),
        (
            {"properties": {"a": {"properties": {"b": {}, "c": {}}}, "d": {}}},
            "the schema has more than 3 properties",
        ),
        (
            {"properties": {"a": {"enum": [1, 2]}, "b": {"enum": [3, 4]}}},
            "the schema has more than 3 enum values",
        ),
        (
            {"anyOf": [{"type": ["string", "null"]}, {"oneOf": [{}]}]},
            "the schema has more than 3 anyOf, oneOf, allOf and type members",
        ),
        (
            {"properties": {"a": {"maxItems": 11}}},
            "In context=('properties', 'a'), 'maxItems' is 11, more than the maximum of 10",
        ),
        ({"minLength": 1e30}, "'minLength' is 1e+30, more than the maximum of 10"),
        ({"pattern": "^" + "a" * 20 + "$"}, "'pattern' is 22 characters long"),
        ({"pattern": "^a{11}$"}, "'pattern' repeats more than the maximum of 10 times"),
        ({"pattern": "^a{2,11}$"}, "'pattern' repeats more than the maximum of 10 times"),
        ({"pattern": "^(a{5}){5}$"}, "'pattern' nests repetitions of more than the maximum of 20"),
        ({"pattern": "^a{3}{7}$"}, "'pattern' nests repetitions of more than the maximum of 20"),
        ({"pattern": "^((a{3})?b){7}$"}, "'pattern' nests repetitions"),
    ],
)
def test_a_schema_past_a_bound_is_too_complex(schema, reason):
    assert reason in too_complex(schema)


def test_a_count_of_thousands_of_digits_is_refused_without_converting_it():
    long_patterns = replace(SMALL, max_bytes=10**4, max_pattern_length=10**4)
    reason = too_complex({"pattern": "^a{" + "9" * 5000 + "}$"}, long_patterns)
    assert "'pattern' repeats more than the maximum of 10 times" in reason


def test_star_plus_and_optional_do_not_multiply_nested_counts():
    check_schema({"pattern": "^(a{0,9} ?)*(b{9})+$"}, SMALL)


def test_a_schema_of_any_depth_is_refused_not_recursed_into():
    assert "schemas nest more than 32 levels deep" in too_complex(items(120), SCHEMA_BOUNDS)
    assert "cannot be encoded as JSON" in too_complex(items(50_000), SCHEMA_BOUNDS)


def with_schema(schema, **changes):
    json_schema = {"name": "answer", "schema": schema, **changes}
    return {
        "model": "m",
        "messages": [user("Hi")],
        "response_format": {"type": "json_schema", "json_schema": json_schema},
    }


def function(name, parameters, strict=True):
    return {
        "type": "function",
        "function": {"name": name, "parameters": parameters, "strict": strict},
    }


BOMB = {"type": "array", "items": {"type": "integer"}, "maxItems": 2_000_000}


def test_a_response_format_schema_past_the_bounds_is_openais_invalid_schema():
    with pytest.raises(APIError) as raised:
        parse_chat_request(with_schema(BOMB))
    assert raised.value.status == 400
    assert raised.value.envelope()["error"] == {
        "message": "Invalid schema for response_format 'answer': In context=(), 'maxItems' is"
        " 2000000, more than the maximum of 100000.",
        "type": "invalid_request_error",
        "param": "response_format.json_schema.schema",
        "code": "invalid_json_schema",
    }


def test_a_strict_functions_parameters_past_the_bounds_are_openais_invalid_parameters():
    tools = [function("fine", {"type": "object"}), function("bomb", BOMB)]
    with pytest.raises(APIError) as raised:
        parse_chat_request({"model": "m", "messages": [user("Hi")], "tools": tools})
    assert raised.value.envelope()["error"] == {
        "message": "Invalid schema for function 'bomb': In context=(), 'maxItems' is 2000000,"
        " more than the maximum of 100000.",
        "type": "invalid_request_error",
        "param": "tools[1].function.parameters",
        "code": "invalid_function_parameters",
    }


def test_a_non_strict_functions_parameters_are_left_to_the_backend():
    tools = [function("loose", BOMB, strict=False)]
    request = parse_chat_request({"model": "m", "messages": [user("Hi")], "tools": tools})
    assert request.tools[0].parameters == BOMB


def test_the_default_bounds_take_openais_own_limits():
    assert (SCHEMA_BOUNDS.max_properties, SCHEMA_BOUNDS.max_enum_values) == (5000, 1000)
    parse_chat_request(with_schema({"enum": list(range(1000))}))
    with pytest.raises(APIError):
        parse_chat_request(with_schema({"enum": list(range(1001))}))


# The settings behind the limits.


@pytest.mark.parametrize("name", ["MAX_BODY_BYTES", "MAX_MESSAGES", "MAX_CONTENT_CHARS"])
@pytest.mark.parametrize("value", [0, -1, "8", 1.5, True, None])
def test_a_limit_that_is_not_a_positive_integer_is_reported(name, value):
    with override_settings(CHATPARITY={name: value}):
        errors = [message for message in run_checks() if message.id == "chatparity.E010"]
    assert [error.msg for error in errors] == [
        f"CHATPARITY[{name!r}] must be a positive integer, not {value!r}."
    ]


def test_the_default_limits_pass_the_checks():
    assert not [message for message in run_checks() if message.id == "chatparity.E010"]
