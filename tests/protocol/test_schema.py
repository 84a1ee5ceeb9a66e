"""The schema vocabulary: each node checks a value with OpenAI's errors and documents itself
as JSON Schema that agrees with the check."""

from dataclasses import dataclass

import jsonschema_rs
import pytest

from chatparity.protocol.errors import APIError
from chatparity.protocol.request import NO_LIMITS, Limits, chat_completion_request
from chatparity.protocol.schema import (
    LATER,
    NOT_NULL,
    OMITTABLE,
    OPTIONAL,
    REQUIRED,
    Array,
    Boolean,
    Components,
    Enum,
    Excludes,
    Holds,
    Integer,
    Later,
    Limit,
    Map,
    Member,
    Nullable,
    Number,
    Object,
    OneOf,
    Parameters,
    Requires,
    String,
    Tagged,
)


def refusal(node, value, path="p"):
    with pytest.raises(APIError) as raised:
        node.parse(value, path)
    return raised.value


def document(node):
    """``node``'s JSON Schema, with the components it names, ready to validate with."""
    components = Components()
    root = components.describe(node)
    return {**root, "components": {"schemas": components.schemas}}


def valid_by_the_document(node, value):
    return jsonschema_rs.Draft202012Validator(document(node)).is_valid(value)


# Members: whether they must be there, and what null means.

ABSENT, NULL = {}, {"x": None}
PRESENCES = [
    pytest.param(REQUIRED, ABSENT, "missing_required_parameter", id="required, absent"),
    pytest.param(REQUIRED, NULL, "invalid_type", id="required, null"),
    pytest.param(OPTIONAL, ABSENT, None, id="optional, absent"),
    pytest.param(OPTIONAL, NULL, None, id="optional, null"),
    pytest.param(NOT_NULL, ABSENT, "missing_required_parameter", id="not null, absent"),
    pytest.param(NOT_NULL, NULL, "missing_required_parameter", id="not null, null"),
    pytest.param(LATER, ABSENT, None, id="later, absent"),
    pytest.param(LATER, NULL, None, id="later, null"),
    pytest.param(OMITTABLE, ABSENT, None, id="omittable, absent"),
    pytest.param(OMITTABLE, NULL, "invalid_type", id="omittable, null"),
]


@pytest.mark.parametrize(("presence", "sent", "code"), PRESENCES)
def test_what_a_presence_makes_of_an_absent_or_null_member(presence, sent, code):
    node = Object((Member("x", String(), presence),), build=lambda members, path: members)
    if code is None:
        assert node.parse(sent, "p") == {"x": None}
    else:
        assert (refusal(node, sent).param, refusal(node, sent).code) == ("p.x", code)


@pytest.mark.parametrize(
    ("presence", "required", "nullable"),
    [
        (REQUIRED, True, False),
        (OPTIONAL, False, True),
        (NOT_NULL, True, False),
        (LATER, True, False),
        (OMITTABLE, False, False),
    ],
)
def test_how_a_presence_is_documented(presence, required, nullable):
    node = Object((Member("x", String(), presence),))
    assert valid_by_the_document(node, {}) is not required
    assert valid_by_the_document(node, {"x": None}) is nullable
    assert valid_by_the_document(node, {"x": "a"})


def test_a_nullable_node_reads_null_as_none():
    node = Object((Member("x", Nullable(Integer()), REQUIRED),), build=lambda m, path: m["x"])
    assert node.parse({"x": None}, "p") is None
    assert node.parse({"x": 7}, "p") == 7
    assert refusal(node, {"x": "7"}).message.endswith(
        "expected an integer, but got a string instead."
    )
    assert valid_by_the_document(node, {"x": None})


def test_members_are_checked_in_the_order_declared_whatever_the_body_order():
    node = Object((Member("a", Integer()), Member("b", Integer())))
    assert refusal(node, {"b": "x", "a": "y"}).param == "p.a"


def test_a_members_check_runs_right_after_it_with_the_members_read_so_far():
    seen = []

    def check(members, path):
        seen.append((dict(members), path))
        raise APIError("checked", param=path)

    node = Object(
        (Member("a", Integer()), Member("b", Integer(), check=check), Member("c", Integer()))
    )
    assert refusal(node, {"a": 1, "b": 2, "c": "not reached"}).message == "checked"
    assert seen == [({"a": 1, "b": 2}, "p")]


def test_an_object_is_kept_as_sent_unless_built():
    sent = {"a": 1, "other": [True]}
    assert Object((Member("a", Integer()),)).parse(sent, "p") is sent


# Values.


@pytest.mark.parametrize(
    ("node", "expected"),
    [
        (String(), "a string"),
        (Integer(), "an integer"),
        (Number(), "a decimal"),
        (Boolean(), "a boolean"),
        (Object(), "an object"),
        (Array(Object()), "an array of objects"),
        (Array(String()), "an array of strings"),
        (Enum(("none", "auto", "required")), "one of 'none', 'auto', or 'required'"),
        (OneOf((String(), Array(Object()))), "one of a string or array of objects"),
        (OneOf((String(), Array(String()))), "one of a string or array of strings"),
        (
            OneOf((Enum(("none", "auto", "required")), Object())),
            "one of one of 'none', 'auto', or 'required' or object",
        ),
    ],
    ids=repr,
)
def test_a_wrong_type_is_named_as_openai_names_it(node, expected):
    refused = refusal(node, None)
    assert refused.message == f"Invalid type for 'p': expected {expected}, but got null instead."
    assert (refused.param, refused.code) == ("p", "invalid_type")


@pytest.mark.parametrize(
    ("node", "value", "message", "code"),
    [
        (
            Integer(1, 128),
            0,
            "Invalid 'p': integer below minimum value. Expected a value >= 1, but got 0 instead.",
            "integer_below_min_value",
        ),
        (
            Number(0, 2),
            2.5,
            "Invalid 'p': decimal above maximum value. Expected a value <= 2, but got 2.5 instead.",
            "decimal_above_max_value",
        ),
        (
            String(max_length=3),
            "abcd",
            "Invalid 'p': string too long. Expected a string with maximum length 3, but got a"
            " string with length 4 instead.",
            "string_above_max_length",
        ),
        (
            String(pattern="^[a-z]+$"),
            "a1",
            "Invalid 'p': string does not match pattern. Expected a string that matches the"
            " pattern '^[a-z]+$'.",
            "invalid_value",
        ),
        (
            Array(String(), max_length=1),
            ["a", "b"],
            "Invalid 'p': array too long. Expected an array with maximum length 1, but got an"
            " array with length 2 instead.",
            "array_above_max_length",
        ),
        (
            Array(String()),
            [],
            "Invalid 'p': empty array. Expected an array with minimum length 1, but got an empty"
            " array instead.",
            "empty_array",
        ),
        (
            Enum(("a", "b")),
            "c",
            "Invalid value: 'c'. Supported values are: 'a' and 'b'.",
            "invalid_value",
        ),
        (
            Map(max_properties=1),
            {"a": 1, "b": 2},
            "Invalid 'p': too many properties. Expected an object with at most 1 properties, but"
            " got an object with 2 properties instead.",
            "object_above_max_properties",
        ),
    ],
    ids=lambda each: each if isinstance(each, str) and len(each) < 30 else None,
)
def test_a_value_past_its_bounds_is_refused_in_openais_words_and_by_the_document(
    node, value, message, code
):
    refused = refusal(node, value)
    assert (refused.message, refused.param, refused.code) == (message, "p", code)
    assert not valid_by_the_document(node, value)


def test_integers_and_decimals_are_told_apart_as_openai_does():
    assert Number().parse(1, "p") == 1.0
    assert isinstance(Number().parse(1, "p"), float)
    assert refusal(Integer(), 2.0).message.endswith("but got a decimal number instead.")
    assert refusal(Integer(), True).message.endswith("but got a boolean instead.")
    assert refusal(Number(), False).message.endswith("but got a boolean instead.")


def test_a_map_key_past_its_length_is_refused_shortened_by_its_path():
    node = Map(String(), max_key_length=4)
    refused = refusal(node, {"abcd": "x", "abcdefg": "x"})
    assert (refused.param, refused.code) == ("p.abcdefg", "property_name_above_max_length")
    assert refused.message == (
        "Invalid property name in 'p': 'abc...efg' is too long. Expected a string with maximum"
        " length 4, but got a string with length 7 instead."
    )
    assert node.parse({"abcd": "x"}, "p") == {"abcd": "x"}
    assert valid_by_the_document(node, {"abcd": "x"})
    assert not valid_by_the_document(node, {"abcde": "x"})


def test_array_items_and_map_values_are_checked_at_their_paths():
    assert refusal(Array(Integer()), [1, "x"]).param == "p[1]"
    assert refusal(Map(Integer()), {"k": "x"}).param == "p.k"
    assert Array(String(), may_be_empty=True).parse([], "p") == []


def test_a_union_reads_a_value_by_its_first_alternative_of_that_json_type():
    node = OneOf((String(max_length=2), Array(Integer())))
    assert node.parse("ab", "p") == "ab"
    assert node.parse([1], "p") == [1]
    assert refusal(node, "abc").code == "string_above_max_length"
    assert refusal(node, ["x"]).param == "p[0]"


# Tagged objects.


def _refuse(kind, path):
    return APIError(f"{kind} is not served", param=path)


PET = Tagged(
    "kind",
    ("cat", "dog", "fish"),
    {
        "cat": Object((Member("lives", Integer(0, 9), REQUIRED),), name="Cat"),
        "dog": Object((Member("good", Boolean()),), name="Dog"),
    },
    refuse=_refuse,
)


def test_a_tagged_object_follows_its_tags_schema():
    assert PET.parse({"kind": "cat", "lives": 9}, "p") == {"kind": "cat", "lives": 9}
    assert refusal(PET, {"kind": "cat"}).param == "p.lives"
    assert refusal(PET, {"lives": 9}).param == "p.kind"
    unknown = refusal(PET, {"kind": "cow"})
    assert (
        unknown.message == "Invalid value: 'cow'. Supported values are: 'cat', 'dog', and 'fish'."
    )
    assert refusal(PET, {"kind": "fish"}).message == "fish is not served"


def test_a_tagged_object_is_documented_as_its_variants_with_a_discriminator():
    schema = document(PET)
    assert schema["discriminator"] == {
        "propertyName": "kind",
        "mapping": {"cat": "#/components/schemas/Cat", "dog": "#/components/schemas/Dog"},
    }
    cat = schema["components"]["schemas"]["Cat"]
    assert cat["properties"]["kind"] == {"type": "string", "const": "cat"}
    assert cat["required"] == ["kind", "lives"]
    assert valid_by_the_document(PET, {"kind": "dog"})
    assert not valid_by_the_document(PET, {"kind": "fish"})


def test_every_tag_needs_a_variant_or_a_refusal():
    with pytest.raises(ValueError, match="needs a variant"):
        Tagged("kind", ("cat", "dog"), {"cat": Object()})


# Request bodies.

BODY = Parameters(
    (
        Member("model", String(), NOT_NULL),
        Member("n", Integer(1)),
        Member("stream", Boolean()),
        Member("stream_options", Object()),
    ),
    rules=(Requires("stream_options", "stream", "needs stream"),),
)


def test_a_body_is_checked_required_keys_first_then_unknown_keys_then_in_body_order():
    assert refusal(BODY, {"foo": 1}).param == "model"
    assert refusal(BODY, {"model": "m", "n": "x", "foo": 1}).message == (
        "Unrecognized request argument supplied: foo"
    )
    assert refusal(BODY, {"stream": "x", "model": 7}).param == "stream"
    assert refusal(BODY, {"model": 7, "stream": "x"}).param == "model"


def test_a_body_is_the_parameters_given_and_null_is_not_given():
    assert BODY.read({"model": "m", "n": None, "stream": True}, "", {}) == {
        "model": "m",
        "stream": True,
    }


def test_a_parameter_that_needs_another_is_refused_without_it():
    refused = refusal(BODY, {"model": "m", "stream": False, "stream_options": {}})
    assert (refused.message, refused.param) == ("needs stream", "stream_options")
    assert document(BODY)["properties"]["stream_options"]["description"] == "Only with stream."


RULED = Parameters(
    (
        Member("model", String(), NOT_NULL),
        Member("n", Integer(1)),
        Member("best_of", Integer(1)),
        Member("echo", Boolean()),
        Member("stream", Boolean()),
        Member("stream_options", Object()),
    ),
    rules=(
        Holds("n", lambda n: n % 2 == 1, "n is odd", "An odd number."),
        Later("echo"),
        Requires("stream_options", "stream", "needs stream"),
        Excludes("n", "best_of", "not both"),
    ),
)


def test_rules_apply_in_their_order_once_every_parameter_was_read():
    sent = {"model": "m", "stream_options": {}, "n": 2, "best_of": "x"}
    assert refusal(RULED, sent).param == "best_of"  # every parameter first
    del sent["best_of"]
    assert refusal(RULED, sent).message == "n is odd"
    sent["n"] = 1
    assert refusal(RULED, sent).message == "needs stream"
    assert refusal(RULED, {"model": "m", "n": 1, "best_of": 1}).code == (
        "invalid_parameter_combination"
    )


def test_a_value_that_breaks_a_holds_rule_is_an_invalid_value():
    refused = refusal(RULED, {"n": 4, "model": "m"})
    assert (refused.message, refused.param, refused.code) == ("n is odd", "n", "invalid_value")
    assert RULED.read({"model": "m", "n": 3}, "", {}) == {"model": "m", "n": 3}


def test_a_parameter_read_later_is_checked_at_its_rules_place_not_the_bodys():
    sent = {"echo": "x", "model": "m", "n": 2, "stream_options": {}}
    assert refusal(RULED, sent).message == "n is odd"  # though echo came first
    sent["n"] = 1
    assert refusal(RULED, sent).message.startswith("Invalid type for 'echo'")
    assert RULED.read({"model": "m", "echo": True}, "", {}) == {"model": "m", "echo": True}


def test_every_rule_is_documented_on_its_parameters():
    properties = document(RULED)["properties"]
    assert properties["n"]["description"] == "An odd number. Not with best_of."
    assert properties["best_of"]["description"] == "Not with n."
    assert "description" not in properties["echo"]


def test_a_body_is_documented_closed():
    assert not valid_by_the_document(BODY, {"model": "m", "foo": 1})
    assert valid_by_the_document(BODY, {"model": "m", "n": None})


def test_a_body_parameter_is_either_optional_or_not_null():
    with pytest.raises(ValueError, match="OPTIONAL or NOT_NULL"):
        Parameters((Member("model", String(), REQUIRED),))


# Bounds the server configures.


@dataclass(frozen=True)
class Caps:
    chars: int | None


def test_a_limit_is_bound_into_checks_and_document_alike():
    node = Object((Member("text", String(max_length=Limit("chars"))),))
    assert node.parse({"text": "x" * 1000}, "p")
    assert valid_by_the_document(node, {"text": "x" * 1000})
    capped = node.bind(Caps(3))
    assert refusal(capped, {"text": "abcd"}).code == "string_above_max_length"
    assert not valid_by_the_document(capped, {"text": "abcd"})
    assert node.bind(Caps(None)).parse({"text": "x" * 1000}, "p")


def test_binding_copies_only_what_holds_a_limit():
    fixed = Member("n", Integer(1))
    node = Object((fixed, Member("text", String(max_length=Limit("chars")))))
    bound = node.bind(Caps(3))
    assert bound is not node
    assert bound.members[0] is fixed
    assert Object((fixed,)).bind(Caps(3)).members[0] is fixed


def test_the_chat_schema_is_bound_once_per_limits():
    assert chat_completion_request(Limits(3, 5)) is chat_completion_request(Limits(3, 5))
    assert chat_completion_request(NO_LIMITS) is not chat_completion_request(Limits(3, 5))


def test_a_named_node_is_documented_once_and_referred_to():
    point = Object((Member("x", Integer(), REQUIRED),), name="Point")
    node = Object((Member("a", Array(point), REQUIRED), Member("b", point, REQUIRED)))
    schema = document(node)
    assert schema["properties"]["a"]["items"] == {"$ref": "#/components/schemas/Point"}
    assert schema["properties"]["b"] == {"$ref": "#/components/schemas/Point"}
    assert schema["components"]["schemas"] == {
        "Point": {"type": "object", "properties": {"x": {"type": "integer"}}, "required": ["x"]}
    }
