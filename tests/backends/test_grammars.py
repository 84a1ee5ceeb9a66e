"""Grammars for the local model: a schema a client sends becomes a grammar llama.cpp
compiles, or a 400; never a crashed process."""

import asyncio
import ctypes
import json
import math
import os
import random
import re
import subprocess
import sys
from collections import Counter
from dataclasses import astuple
from decimal import Decimal
from pathlib import Path

import jsonschema
import pytest

from chatparity.backends import grammars
from chatparity.backends.local import smollm2_model_path
from chatparity.protocol.errors import APIError
from chatparity.protocol.request import SCHEMA_BOUNDS, ResponseFormat, Tool

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def tokenizer():
    from llama_cpp import Llama

    model = Llama(smollm2_model_path(), vocab_only=True, verbose=False)
    yield model
    model.close()


@pytest.fixture(scope="module")
def vocab(tokenizer):
    return tokenizer._model.vocab


def refusal(build):
    with pytest.raises(APIError) as raised:
        build()
    assert raised.value.status == 400
    return raised.value.envelope()["error"]


def answer_in(schema):
    return ResponseFormat("json_schema", schema, name="answer")


def test_the_local_bounds_are_nowhere_looser_than_a_requests():
    assert all(
        local <= anywhere
        for local, anywhere in zip(
            astuple(grammars.LOCAL_SCHEMA_BOUNDS), astuple(SCHEMA_BOUNDS), strict=True
        )
    )


def test_a_schema_up_to_the_bounds_becomes_a_grammar(vocab):
    schema = {"type": "array", "items": {"type": "integer"}, "maxItems": 1000}
    assert grammars.response_grammar(answer_in(schema), vocab).startswith("integer ::=")


def test_a_schema_a_request_may_carry_can_be_too_much_for_the_local_model(vocab):
    schema = {"type": "array", "items": {"type": "integer"}, "maxItems": 2500}
    assert refusal(lambda: grammars.response_grammar(answer_in(schema), vocab)) == {
        "message": "Invalid schema for response_format 'answer': In context=(), 'maxItems' is"
        " 2500, more than the maximum of 1000.",
        "type": "invalid_request_error",
        "param": "response_format.json_schema.schema",
        "code": "invalid_json_schema",
    }


@pytest.mark.parametrize("strict", [True, False])
def test_a_tools_parameters_are_bounded_whether_strict_or_not(vocab, strict):
    tool = Tool("pick", parameters={"type": "string", "maxLength": 2500}, strict=strict)
    error = refusal(lambda: grammars.arguments_grammar(tool, "tools[3].function.parameters", vocab))
    assert (error["param"], error["code"]) == (
        "tools[3].function.parameters",
        "invalid_function_parameters",
    )
    assert error["message"].startswith("Invalid schema for function 'pick': ")


def test_a_grammar_llama_cpp_refuses_is_a_400(vocab):
    schema = {"type": "string", "pattern": "^a**$"}  # the converter writes it as it is
    error = refusal(lambda: grammars.response_grammar(answer_in(schema), vocab))
    assert error["message"] == (
        "Invalid schema for response_format 'answer': llama.cpp cannot compile the grammar"
        " made from it."
    )


def test_a_schema_the_converter_cannot_read_is_a_400(vocab):
    schema = {"$ref": "https://example.com/schema.json"}
    error = refusal(lambda: grammars.response_grammar(answer_in(schema), vocab))
    assert "Fetching remote schemas is not allowed" in error["message"]


@pytest.mark.parametrize("text", ["root ::= (", "root ::= other", "root ::= root"])
def test_a_grammar_llama_cpp_refuses_never_reaches_a_sampler_chain(vocab, text):
    with pytest.raises(grammars.GrammarRefused):
        grammars.grammar_sampler(vocab, text)


# JSON text: whatever a grammar lets the model write is JSON (RFC 8259), read by llama.cpp's
# own grammar sampler, token by token, as it reads the model's.


def writes(tokenizer, grammar, text):
    """Whether llama.cpp's sampler for ``grammar`` lets the model write ``text``, then stop."""
    import llama_cpp

    sampler = grammars.grammar_sampler(tokenizer._model.vocab, grammar)
    try:
        for token in [*tokenizer.tokenize(text.encode(), add_bos=False), tokenizer.token_eos()]:
            candidate = (llama_cpp.llama_token_data * 1)(llama_cpp.llama_token_data(token, 0, 0))
            array = llama_cpp.llama_token_data_array(candidate, 1, -1, False)
            llama_cpp.llama_sampler_apply(sampler, ctypes.byref(array))
            if candidate[0].logit == -math.inf:
                return False
            if token != tokenizer.token_eos():
                llama_cpp.llama_sampler_accept(sampler, token)
    finally:
        llama_cpp.llama_sampler_free(sampler)
    return True


def grammar_for(schema, vocab):
    if schema == "json_object":
        return grammars.response_grammar(ResponseFormat("json_object"), vocab)
    return grammars.response_grammar(answer_in(schema), vocab)


STRING = {"type": "string"}
PATTERN_ANY = {"type": "string", "pattern": "^.*$"}
BACKSLASHED = "a\\b\nc\u0001"
NAMED = {"type": "object", "properties": {"a\\b": STRING}, "required": ["a\\b"]}
TEXTS = [
    # (schema, text, whether it is JSON of a value the schema admits)
    (STRING, '"a b é"', True),
    (STRING, '"a\nb"', False),  # a raw newline in a string
    (STRING, '"a\tb"', False),
    (STRING, '"a\x00b"', False),
    (STRING, '"a\x1fb"', False),
    (STRING, '"a\x7fb"', False),  # JSON allows it; llama.cpp's own converter does not
    (STRING, r'"a\nb\t\"\\\/\u00e9\b\f\r"', True),
    (STRING, r'"a\qb"', False),
    (STRING, r'"\u12g4"', False),
    ({"type": "string", "maxLength": 8}, '"a\nb"', False),
    ({"type": "string", "maxLength": 8}, r'"a\nb"', True),
    ("json_object", '{"a": "x\ny"}', False),
    ("json_object", r'{"a": ["x\ny", 1.5e-3, -0, true, null, {"b": {}}]}', True),
    ("json_object", "[1]", False),
    ({"type": "number"}, "01", False),
    ({"type": "number"}, "1.", False),
    ({"type": "number"}, ".5", False),
    ({"type": "number"}, "-", False),
    ({"type": "number"}, "-0.25E+2", True),
    ({"type": "integer"}, "+1", False),
    ({"const": BACKSLASHED}, json.dumps(BACKSLASHED), True),
    ({"const": BACKSLASHED}, '"a\\b\nc\u0001"', False),  # its JSON text read as escapes
    ({"enum": ["é", 'say "hi"']}, json.dumps('say "hi"'), True),
    ({"enum": ["é", 'say "hi"']}, json.dumps("é"), True),
    (NAMED, r'{"a\\b": "x"}', True),
    (NAMED, r'{"a\b": "x"}', False),
    (PATTERN_ANY, r'"a\"b\\c"', True),
    (PATTERN_ANY, '"a"b"', False),
    (PATTERN_ANY, '"a\u0001b"', False),
    (PATTERN_ANY, r'"a\u0001b"', True),
    (PATTERN_ANY, r'"a\u000ab"', False),  # "." is no line break
    ({"type": "string", "pattern": '^say "(hi|yo)"$'}, r'"say \"yo\""', True),
    ({"type": "string", "pattern": '^say "(hi|yo)"$'}, '"say "yo""', False),
    ({"type": "string", "pattern": "^\\d+\\.\\d$"}, '"12.5"', True),
]


@pytest.mark.parametrize(("schema", "text", "admitted"), TEXTS)
def test_a_grammar_lets_the_model_write_json_only(tokenizer, vocab, schema, text, admitted):
    assert writes(tokenizer, grammar_for(schema, vocab), text) is admitted
    if admitted:  # the table itself: what is admitted is JSON the schema takes
        value = json.loads(text)
        jsonschema.validate(value, {"type": "object"} if schema == "json_object" else schema)


def test_a_tools_arguments_are_json_only(tokenizer, vocab):
    tool = Tool("note", parameters={"type": "object", "properties": {"text": STRING}})
    arguments = grammars.arguments_grammar(tool, "tools[0].function.parameters", vocab)
    assert writes(tokenizer, arguments, r'{"text": "two\nlines"}')
    assert not writes(tokenizer, arguments, '{"text": "two\nlines"}')


PATTERNS = [
    "^.*$",
    "^.+$",
    "^[^a]*$",
    "^[ -~]*$",
    '^a"b$',
    "^a\\\\b$",
    "^\\d+(\\.\\d+)?$",
    "^\\w+$",
    "^\\W+$",
    "^[\\x00-\\x1f]+$",
    '^(a|"|\\\\)*$',
    "^[\\n\\t ]*x$",
]
VALUES = ["", "a", "ab", 'a"b', "a\\b", "a\nb", "\x01", "\t\n x", "é", "12.5", "12.", "x y",
          "\x7f", '"', 'a"\\a', "[]", "-_"]  # fmt: skip


def as_written(value):
    """The JSON text of ``value`` as a pattern's grammar writes it: '"' and '\\' after a
    backslash, the control characters (and U+007F) as \\u escapes."""

    def escaped(char):
        if char in '"\\':
            return "\\" + char
        return f"\\u{ord(char):04x}" if char < " " or char == "\x7f" else char

    return '"' + "".join(map(escaped, value)) + '"'


@pytest.mark.parametrize("pattern", PATTERNS)
def test_a_pattern_admits_the_json_text_of_exactly_the_strings_it_matches(
    tokenizer, vocab, pattern
):
    grammar = grammar_for({"type": "string", "pattern": pattern}, vocab)
    written = [value for value in VALUES if writes(tokenizer, grammar, as_written(value))]
    # ECMA's \d and \w are ASCII, as Python's under re.ASCII (no value is a Unicode space).
    assert written == [value for value in VALUES if re.fullmatch(pattern[1:-1], value, re.ASCII)]
    # The same characters unescaped are not JSON, and never written.
    assert not writes(tokenizer, grammar, '"a"b"')
    assert not writes(tokenizer, grammar, '"\x01"')


# Numbers within bounds: llama-cpp-python's converter ignores them; chatparity's grammar
# admits exactly the numbers within, or the schema is a 400 (never accepted and ignored).


def admits(expression, text):
    """Whether the GBNF ``expression`` (literals, classes, counts, groups) matches ``text``,
    read as the regular expression it is."""
    translated = re.sub(r'"([^"]*)"', lambda literal: re.escape(literal[1]), expression)
    return re.fullmatch(translated.replace(" ", ""), text) is not None


def within(value, schema):
    value = Decimal(value)
    return (
        value >= Decimal(str(schema.get("minimum", "-Infinity")))
        and value > Decimal(str(schema.get("exclusiveMinimum", "-Infinity")))
        and value <= Decimal(str(schema.get("maximum", "Infinity")))
        and value < Decimal(str(schema.get("exclusiveMaximum", "Infinity")))
    )


INTEGERS = [str(i) for i in range(-130, 131)]
DECIMALS = [f"{i}.{f}" for i in range(-13, 14) for f in ["0", "05", "1", "25", "5", "500", "99"]]
BOUNDS = [
    {"minimum": 1, "maximum": 9},
    {"minimum": -12, "maximum": 123},
    {"exclusiveMinimum": -1, "exclusiveMaximum": 100},
    {"minimum": 10},
    {"maximum": -10},
    {"exclusiveMaximum": 0},
    {"minimum": 0, "exclusiveMinimum": 0},
    {"minimum": 0.5, "maximum": 9.75},
    {"exclusiveMinimum": -2.75, "exclusiveMaximum": 0.25},
    {"minimum": 5, "maximum": 5},
    {"minimum": 0.25, "maximum": 0.5},
    {"exclusiveMinimum": 0.05, "maximum": 0.1},
]


@pytest.mark.parametrize("bounds", BOUNDS)
def test_an_integers_bounds_admit_exactly_the_integers_within(bounds):
    expected = [text for text in INTEGERS if within(text, bounds)]
    if not expected:
        with pytest.raises(ValueError, match="no integer lies within its bounds"):
            grammars.bounded_number({"type": "integer", **bounds})
        return
    expression = grammars.bounded_number({"type": "integer", **bounds})
    assert [text for text in INTEGERS + DECIMALS if admits(expression, text)] == expected


@pytest.mark.parametrize("bounds", BOUNDS)
def test_a_numbers_bounds_admit_exactly_the_numbers_within(bounds):
    expression = grammars.bounded_number({"type": "number", **bounds})
    # A negative zero is zero: "-0" is admitted where zero is, as JSON allows it.
    texts = [text for text in INTEGERS + DECIMALS if not re.fullmatch(r"-0(\.0+)?", text)]
    admitted = [text for text in texts if admits(expression, text)]
    assert admitted == [text for text in texts if within(text, bounds)]


@pytest.mark.parametrize(
    ("kind", "bounds"),
    [
        ("integer", {"minimum": -20, "maximum": 100, "multipleOf": 5}),
        ("integer", {"exclusiveMinimum": 0, "exclusiveMaximum": 10, "multipleOf": 2.5}),
        ("number", {"minimum": -2, "exclusiveMaximum": 3, "multipleOf": 0.25}),
        ("number", {"exclusiveMinimum": 0.05, "maximum": 1, "multipleOf": 0.05}),
    ],
)
def test_multiples_within_bounds_are_admitted_as_json_writes_them(kind, bounds):
    expression = grammars.bounded_number({"type": kind, **bounds})
    step = Decimal(str(bounds["multipleOf"]))
    texts = [text for text in INTEGERS + DECIMALS if text != "-0"]
    as_json = re.compile(r"-?(0|[1-9][0-9]*)" + ("" if kind == "integer" else r"(\.[0-9]*[1-9])?"))
    expected = [
        text
        for text in texts
        if as_json.fullmatch(text) and within(text, bounds) and Decimal(text) % step == 0
    ]
    assert expected
    assert [text for text in texts if admits(expression, text)] == expected


def test_bounded_numbers_are_written_without_an_exponent_or_leading_zeros():
    expression = grammars.bounded_number({"type": "number", "minimum": 0, "maximum": 1000})
    assert admits(expression, "999.5")
    assert not admits(expression, "1e2")
    assert not admits(expression, "0999")


def test_bounds_make_a_grammar_for_the_real_model(vocab):
    schema = {
        "type": "object",
        "properties": {
            "qty": {"type": "integer", "minimum": 1, "maximum": 9},
            "price": {"type": "number", "exclusiveMinimum": 0, "maximum": 2.5},
            "delta": {"type": ["integer", "null"], "minimum": -5, "maximum": -2},
        },
    }
    grammar = grammars.response_grammar(answer_in(schema), vocab)
    assert "qty ::= [1-9] space" in grammar
    assert 'delta-0 ::= "-" ([2-5]) space' in grammar


@pytest.mark.parametrize(
    ("bounds", "reason"),
    [
        ({"multipleOf": 5}, "'multipleOf' needs a minimum and a maximum on this model"),
        ({"minimum": 0, "maximum": 10, "multipleOf": 0}, "'multipleOf' must be greater than 0"),
        (
            {"minimum": 0, "maximum": 2000, "multipleOf": 5},
            "'multipleOf' allows more than 256 numbers within the bounds, more than this"
            " model takes",
        ),
        ({"minimum": 1, "maximum": 4, "multipleOf": 5}, "no integer lies within its bounds"),
        ({"minimum": 10, "maximum": 1}, "no integer lies within its bounds"),
        ({"exclusiveMinimum": 1, "exclusiveMaximum": 2}, "no integer lies within its bounds"),
        ({"minimum": "1"}, "'minimum' must be a number, not \"1\""),
        ({"maximum": True}, "'maximum' must be a number, not true"),
        (
            {"maximum": 1e41},
            "'maximum' has more than the 40 digits before or after its point this model takes",
        ),
    ],
)
def test_bounds_no_grammar_is_made_from_are_a_400(vocab, bounds, reason):
    schema = {"type": "object", "properties": {"qty": {"type": "integer", **bounds}}}
    assert refusal(lambda: grammars.response_grammar(answer_in(schema), vocab)) == {
        "message": f"Invalid schema for response_format 'answer': {reason}.",
        "type": "invalid_request_error",
        "param": "response_format.json_schema.schema",
        "code": "invalid_json_schema",
    }


def test_the_longest_bounds_keep_the_grammar_small(vocab):
    longest = {
        "type": "number",
        "minimum": -1234567890123456.7,  # digits on both sides of the point
        "exclusiveMaximum": 9.876543210987654e39,  # 40 digits
    }
    grammar = grammars.response_grammar(answer_in(longest), vocab)
    assert len(grammar) < 16 * 1024
    fraction = {"type": "number", "minimum": float("1e-40"), "maximum": 0.123456789}
    assert len(grammars.response_grammar(answer_in(fraction), vocab)) < 16 * 1024


# Whatever a client sends: the bombs found so far and a fuzzed set, each through the
# parser and the local backend to its first token, in a process of its own.

BOMBS = [
    # llama.cpp refuses more than 1,000 optional copies; llama-cpp-python crashed on that.
    {"type": "array", "items": {"type": "integer"}, "maxItems": 2500},
    {"type": "string", "maxLength": 1500},
    {"type": "string", "pattern": "^a{0,1500}$"},
    {"type": "string", "pattern": "^([a-z]{1,5}\\.){0,10}[a-z]{2,6}$"},
    {"$defs": {"a": {"$ref": "#/$defs/a"}}, "$ref": "#/$defs/a"},  # left recursion
    # Gigabytes of grammar.
    {"type": "array", "items": {"type": "integer"}, "minItems": 10**9},
    {"type": "string", "pattern": "^(ab){1000000000}$"},
    # Minutes of sampling for each token.
    {"type": "string", "pattern": "^((a{0,30}){0,30}){0,30}$"},
    {"type": "string", "pattern": "^([a-z]{0,20}){0,20}$"},
    {"type": "object", "properties": {f"p{i}": {"type": "string"} for i in range(1000)}},
    {"anyOf": [{"const": i} for i in range(1000)]},
    # Unbounded recursion in the converter.
    {"type": "array", "items": {}, "maxItems": -1},
    {"type": "array", "items": {}, "minItems": 5, "maxItems": 2},
    # A grammar growing with the square of a bound's digits.
    {"type": "number", "minimum": -1e300, "maximum": 1e-300},
]

COUNTS = [0, 1, 2, 3, 8, 20, 64, 999, 1000, 1001, 2500, 100_001, 10**9, -1, 2.5, 1e30, True, "5"]
NUMERIC_KEYWORDS = ["minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf"]
NUMERIC_BOUNDS = [0, 1, -1, 9, 2.5, -0.125, 10**18, -(10**19), 1e39, 1e300, 1e-300, True, "5"]
QUANTIFIED = [0, 1, 2, 4, 8, 30, 65, 999, 1000, 1001, 2500, 10**6]


def fuzzed_pattern(rng, depth=0):
    parts = []
    for _ in range(rng.randint(1, 3)):
        if depth < 2 and rng.random() < 0.4:
            atom = f"({fuzzed_pattern(rng, depth + 1)})"
        else:
            atom = rng.choice(["a", "[a-z]", "\\d", ".", "\\.", "x|y", "[^\\]]", "{"])
        low, high = rng.choice(QUANTIFIED), rng.choice(QUANTIFIED)
        counted = rng.choice([f"{{{low}}}", f"{{{low},}}", f"{{{low},{high}}}"])
        parts.append(atom + rng.choice(["", "", "*", "+", "?", counted, counted]))
    return "".join(parts)


def fuzzed_schema(rng, depth=0):
    """A schema, valid or not, from what grammar builders have trouble with."""
    kinds = ["string", "integer", "number", "boolean", "null", "enum", "const"]
    if depth < 3:
        kinds += ["object", "object", "array", "array", "union", "types", "ref", "wide"]
    kind = rng.choice(kinds)
    if kind == "object":
        names = [rng.choice(["a", "b c", 'q"', "\n", "é", "-"]) + str(i) for i in range(4)]
        schema = {
            "type": "object",
            "properties": {
                name: fuzzed_schema(rng, depth + 1) for name in names[: rng.randint(0, 4)]
            },
        }
        if rng.random() < 0.5:
            schema["required"] = rng.choice([names[:2], names, "a", [1]])
        if rng.random() < 0.4:
            schema["additionalProperties"] = rng.choice(
                [True, False, fuzzed_schema(rng, depth + 1)]
            )
        return schema
    if kind == "array":
        schema = {"type": "array", "items": fuzzed_schema(rng, depth + 1)}
        if rng.random() < 0.2:
            schema["items"] = [fuzzed_schema(rng, depth + 1) for _ in range(rng.randint(0, 3))]
        for key in ("minItems", "maxItems"):
            if rng.random() < 0.6:
                schema[key] = rng.choice(COUNTS)
        return schema
    if kind == "string":
        schema = {"type": "string"}
        for key in ("minLength", "maxLength"):
            if rng.random() < 0.4:
                schema[key] = rng.choice(COUNTS)
        if rng.random() < 0.6:
            anchored = rng.random() < 0.9
            pattern = fuzzed_pattern(rng)
            schema["pattern"] = f"^{pattern}$" if anchored else pattern
        if rng.random() < 0.2:
            schema["format"] = rng.choice(["date", "time", "date-time", "uuid", "email"])
        return schema
    if kind == "enum":
        return {
            "enum": [
                rng.choice([1, "x", None, [1], {"a": 1}]) for _ in range(rng.choice([0, 1, 3, 300]))
            ]
        }
    if kind == "const":
        return {"const": rng.choice([1, 'x"y', None, [1, {"a": []}]])}
    if kind == "union":
        key = rng.choice(["anyOf", "oneOf", "allOf"])
        return {key: [fuzzed_schema(rng, depth + 1) for _ in range(rng.choice([0, 1, 2, 4]))]}
    if kind == "types":
        return {"type": rng.sample(["string", "integer", "null", "object", "array", "bogus"], 2)}
    if kind in ("integer", "number") and rng.random() < 0.5:
        schema = {"type": kind}
        for key in rng.sample(NUMERIC_KEYWORDS, rng.randint(1, 3)):
            schema[key] = rng.choice(NUMERIC_BOUNDS)
        return schema
    if kind == "ref":
        target = rng.choice(["#/$defs/a", "#/$defs/missing", "#", "other.json", "#/$defs/a/b"])
        inner = rng.choice([fuzzed_schema(rng, depth + 1), {"$ref": "#/$defs/a"}])
        return {"$defs": {"a": inner}, "$ref": target}
    if kind == "wide":
        count = rng.choice([10, 300, 600])
        return {
            "type": "object",
            "properties": {f"p{i}": {"type": "integer"} for i in range(count)},
        }
    return {"type": kind}


def fuzzed_bodies(count, seed=11):
    """Request bodies carrying the bombs, then ``count`` fuzzed schemas: each as a
    response_format, and every fifth also as a tool's parameters (with tool_choice
    "none", its grammar is built and compiled all the same, and the prompt does not
    carry the schema to evaluate)."""
    rng = random.Random(seed)
    schemas = BOMBS + [fuzzed_schema(rng) for _ in range(count)]
    for i, schema in enumerate(schemas):
        body = {
            "model": "smollm2",
            "messages": [{"role": "user", "content": "Answer in JSON."}],
            "max_tokens": 1,
            "response_format": {
                "type": "json_schema",
                "json_schema": {"name": "answer", "schema": schema, "strict": i % 2 == 0},
            },
        }
        yield body
        if i % 5 == 0:
            function = {"name": "act", "parameters": schema, "strict": i % 2 == 0}
            yield {
                "model": "smollm2",
                "messages": [{"role": "user", "content": "Act."}],
                "max_tokens": 1,
                "tools": [{"type": "function", "function": function}],
                "tool_choice": "none",
            }


async def serve(backend, body):
    """What a client sent ``body`` gets: "answered", or "refused" and a status."""
    from chatparity.protocol.request import parse_chat_request

    try:
        request = parse_chat_request(body)
        async for _ in backend.stream(request, "smollm2"):
            pass
    except APIError as error:
        if error.status != 400:
            print(f"{error!r} for {json.dumps(body)[:500]}", file=sys.stderr)
        return f"refused {error.status}"
    return "answered"


def main(count):
    """The child process: every body through the parser and the local backend."""
    import django

    django.setup()
    from chatparity.backends.base import BackendConfig
    from chatparity.backends.local import LocalBackend

    backend = LocalBackend(BackendConfig(name="local", kind="local"))

    async def serve_all():
        return Counter([await serve(backend, body) for body in fuzzed_bodies(count)])

    print(json.dumps(asyncio.run(serve_all())))


def test_no_schema_a_client_sends_crashes_the_process():
    child = subprocess.run(
        [sys.executable, "-c", "from tests.backends.test_grammars import main; main(300)"],
        cwd=ROOT,
        env={**os.environ, "DJANGO_SETTINGS_MODULE": "project.settings"},
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert child.returncode == 0, f"exit {child.returncode}: {child.stderr[-1000:]}"
    outcomes = json.loads(child.stdout.splitlines()[-1])
    assert set(outcomes) == {"answered", "refused 400"}, child.stderr[-1000:]
    assert min(outcomes.values()) > 50  # both kinds, plenty of each
