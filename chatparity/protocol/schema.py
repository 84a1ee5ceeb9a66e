"""Schemas as tables of nodes: one declaration validates a request and documents it.

A schema is a tree of nodes (:class:`String`, :class:`Integer`, :class:`Object`,
:class:`Array`, ...). Each node checks a decoded JSON value and refuses it in
OpenAI's words (``parse``), and states itself as JSON Schema for the OpenAPI
document (``schema``), so the validator and the document cannot drift apart.
Bounds the server configures are :class:`Limit` placeholders, fixed by
:meth:`Node.bind`. A schema module may add nodes of its own (a token id, say)
by implementing the same three methods.

Errors name the offending value by its path in the body (``messages[0].content``),
as OpenAI does.
"""

from __future__ import annotations

import enum
import re
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, fields, is_dataclass, replace
from typing import Any, Self

from .errors import APIError

Schema = dict[str, Any]
Build = Callable[[dict[str, Any], str], Any]
"""Makes an object's value from its members as parsed (absent ones None) and its path."""
Check = Callable[[dict[str, Any], str], None]
"""A rule run once a member is parsed, given the members parsed so far and the object's path."""


# Errors, in OpenAI's words.


def missing_parameter(param: str) -> APIError:
    return APIError(
        f"Missing required parameter: '{param}'.", param=param, code="missing_required_parameter"
    )


def json_type(value: Any) -> str:
    """How OpenAI names the JSON type of a value it did not expect."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int):
        return "an integer"
    if isinstance(value, float):
        return "a decimal number"
    if isinstance(value, str):
        return "a string"
    return "an array" if isinstance(value, list) else "an object"


def wrong_type(param: str, expected: str, value: Any) -> APIError:
    return APIError(
        f"Invalid type for '{param}': expected {expected}, but got {json_type(value)} instead.",
        param=param,
        code="invalid_type",
    )


def listing(values: Sequence[str], conjunction: str) -> str:
    """``'a', 'b', and 'c'``, ``'a' or 'b'``, ``'a'``."""
    quoted = [f"'{value}'" for value in values]
    if len(quoted) < 3:
        return f" {conjunction} ".join(quoted)
    return f"{', '.join(quoted[:-1])}, {conjunction} {quoted[-1]}"


def _out_of_range(param: str, kind: str, value: float, bound: float, *, above: bool) -> APIError:
    beyond, side, sign = ("above", "max", "<=") if above else ("below", "min", ">=")
    return APIError(
        f"Invalid '{param}': {kind} {beyond} {side}imum value. Expected a value {sign} {bound},"
        f" but got {value} instead.",
        param=param,
        code=f"{kind}_{beyond}_{side}_value",
    )


def _too_long(param: str, kind: str, limit: int, length: int) -> APIError:
    article = "an" if kind == "array" else "a"
    return APIError(
        f"Invalid '{param}': {kind} too long. Expected {article} {kind} with maximum length"
        f" {limit}, but got {article} {kind} with length {length} instead.",
        param=param,
        code=f"{kind}_above_max_length",
    )


def _empty_array(param: str) -> APIError:
    return APIError(
        f"Invalid '{param}': empty array. Expected an array with minimum length 1, but got"
        " an empty array instead.",
        param=param,
        code="empty_array",
    )


# JSON Schema.


def ref(name: str) -> Schema:
    return {"$ref": f"#/components/schemas/{name}"}


def or_null(schema: Schema) -> Schema:
    """``schema`` or JSON null."""
    if isinstance(schema.get("type"), str) and not {"enum", "const"} & schema.keys():
        return {**schema, "type": [schema["type"], "null"]}
    return {"anyOf": [schema, {"type": "null"}]}


class Components:
    """The named schemas of one document, gathered as nodes describe themselves."""

    def __init__(self) -> None:
        self.schemas: dict[str, Schema] = {}

    def describe(self, node: Node) -> Schema:
        """``node`` as JSON Schema; a named node is added once and referred to."""
        if node.name is not None and node.name in self.schemas:
            return ref(node.name)
        schema = node.schema(self)
        if node.description is not None:
            schema["description"] = node.description
        if node.name is None:
            return schema
        self.schemas[node.name] = schema
        return ref(node.name)


# Nodes.


@dataclass(frozen=True, slots=True)
class Limit:
    """A bound the server configures: attribute ``name`` of the limits given to
    :meth:`Node.bind`. Unbound, or bound to None, it is no bound."""

    name: str


def _fixed(bound: int | Limit | None) -> int | None:
    return None if isinstance(bound, Limit) else bound


class Node(ABC):
    """One JSON value's schema: how it is checked, and how it is documented."""

    __slots__ = ()
    expected: str
    """How a wrong-type error names what was expected: ``a string``, ``an object``."""
    description: str | None
    name: str | None = None
    """A component name: the document states the node once and refers to it."""

    @abstractmethod
    def accepts(self, value: Any) -> bool:
        """Whether ``value`` has the JSON type this node reads; a union picks by it."""

    @abstractmethod
    def parse(self, value: Any, path: str) -> Any:
        """``value`` checked (and converted); :class:`APIError` as OpenAI would."""

    @abstractmethod
    def schema(self, components: Components) -> Schema:
        """This node as JSON Schema, nodes within it described through ``components``."""

    def bind(self, limits: object) -> Self:
        """This node with every :class:`Limit` in it replaced by its value in ``limits``."""
        bound: Self = _bind(self, limits)
        return bound


def _bind(value: Any, limits: object) -> Any:
    if isinstance(value, Limit):
        return getattr(limits, value.name)
    if is_dataclass(value) and not isinstance(value, type):  # a node, a member
        changes = {}
        for each in fields(value):
            if each.init:
                old = getattr(value, each.name)
                new = _bind(old, limits)
                if new is not old:
                    changes[each.name] = new
        return replace(value, **changes) if changes else value
    if isinstance(value, tuple):
        items = tuple(_bind(item, limits) for item in value)
        return items if any(a is not b for a, b in zip(items, value, strict=True)) else value
    if isinstance(value, Mapping):
        pairs = {key: _bind(item, limits) for key, item in value.items()}
        return pairs if any(pairs[key] is not item for key, item in value.items()) else value
    return value


@dataclass(frozen=True, slots=True, eq=False)
class Anything(Node):
    """Any JSON value, taken as sent."""

    expected: str = "a value"
    description: str | None = None

    def accepts(self, value: Any) -> bool:
        return True

    def parse(self, value: Any, path: str) -> Any:
        return value

    def schema(self, components: Components) -> Schema:
        return {}


ANYTHING = Anything()


@dataclass(frozen=True, slots=True, eq=False)
class String(Node):
    max_length: int | Limit | None = None
    pattern: str | None = None
    """A regular expression the whole string must match, anchored as OpenAI quotes it."""
    expected: str = "a string"
    description: str | None = None
    _max_length: int | None = field(init=False, default=None)
    _regex: re.Pattern[str] | None = field(init=False, default=None)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_max_length", _fixed(self.max_length))
        if self.pattern is not None:
            object.__setattr__(self, "_regex", re.compile(self.pattern))

    def accepts(self, value: Any) -> bool:
        return isinstance(value, str)

    def parse(self, value: Any, path: str) -> str:
        if not isinstance(value, str):
            raise wrong_type(path, self.expected, value)
        if self._max_length is not None and len(value) > self._max_length:
            raise _too_long(path, "string", self._max_length, len(value))
        if self._regex is not None and not self._regex.fullmatch(value):
            raise APIError(
                f"Invalid '{path}': string does not match pattern. Expected a string that matches"
                f" the pattern '{self.pattern}'.",
                param=path,
                code="invalid_value",
            )
        return value

    def schema(self, components: Components) -> Schema:
        schema: Schema = {"type": "string"}
        if self._max_length is not None:
            schema["maxLength"] = self._max_length
        if self.pattern is not None:
            schema["pattern"] = self.pattern
        return schema


def _check_range(node: Integer | Number, value: float, path: str) -> None:
    if node.minimum is not None and value < node.minimum:
        raise _out_of_range(path, node.kind, value, node.minimum, above=False)
    if node.maximum is not None and value > node.maximum:
        raise _out_of_range(path, node.kind, value, node.maximum, above=True)


def _range_schema(node: Integer | Number, kind: str) -> Schema:
    schema: Schema = {"type": kind}
    if node.minimum is not None:
        schema["minimum"] = node.minimum
    if node.maximum is not None:
        schema["maximum"] = node.maximum
    return schema


@dataclass(frozen=True, slots=True, eq=False)
class Integer(Node):
    """An integer: 2.0 and booleans are not."""

    minimum: int | None = None
    maximum: int | None = None
    expected: str = "an integer"
    description: str | None = None
    kind = "integer"

    def accepts(self, value: Any) -> bool:
        return isinstance(value, int) and not isinstance(value, bool)

    def parse(self, value: Any, path: str) -> int:
        if not isinstance(value, int) or isinstance(value, bool):
            raise wrong_type(path, self.expected, value)
        _check_range(self, value, path)
        return value

    def schema(self, components: Components) -> Schema:
        return _range_schema(self, "integer")


@dataclass(frozen=True, slots=True, eq=False)
class Number(Node):
    """A number, read as a float; OpenAI calls it a decimal."""

    minimum: int | None = None
    maximum: int | None = None
    expected: str = "a decimal"
    description: str | None = None
    kind = "decimal"

    def accepts(self, value: Any) -> bool:
        return isinstance(value, int | float) and not isinstance(value, bool)

    def parse(self, value: Any, path: str) -> float:
        if not isinstance(value, int | float) or isinstance(value, bool):
            raise wrong_type(path, self.expected, value)
        _check_range(self, value, path)
        return float(value)

    def schema(self, components: Components) -> Schema:
        return _range_schema(self, "number")


@dataclass(frozen=True, slots=True, eq=False)
class Boolean(Node):
    expected: str = "a boolean"
    description: str | None = None

    def accepts(self, value: Any) -> bool:
        return isinstance(value, bool)

    def parse(self, value: Any, path: str) -> bool:
        if not isinstance(value, bool):
            raise wrong_type(path, self.expected, value)
        return value

    def schema(self, components: Components) -> Schema:
        return {"type": "boolean"}


@dataclass(frozen=True, slots=True, eq=False)
class Enum(Node):
    """One of ``values``, strings listed in the order OpenAI's errors list them."""

    values: tuple[str, ...]
    description: str | None = None
    expected: str = field(init=False, default="")

    def __post_init__(self) -> None:
        object.__setattr__(self, "expected", f"one of {listing(self.values, 'or')}")

    def accepts(self, value: Any) -> bool:
        return isinstance(value, str)

    def parse(self, value: Any, path: str) -> str:
        if not isinstance(value, str):
            raise wrong_type(path, self.expected, value)
        if value not in self.values:
            raise APIError(
                f"Invalid value: '{value}'. Supported values are: {listing(self.values, 'and')}.",
                param=path,
                code="invalid_value",
            )
        return value

    def schema(self, components: Components) -> Schema:
        if len(self.values) == 1:
            return {"type": "string", "const": self.values[0]}
        return {"type": "string", "enum": list(self.values)}


@dataclass(frozen=True, slots=True, eq=False)
class Nullable(Node):
    """``node``, or null (read as None)."""

    node: Node
    description: str | None = None
    expected: str = field(init=False, default="")

    def __post_init__(self) -> None:
        object.__setattr__(self, "expected", self.node.expected)

    def accepts(self, value: Any) -> bool:
        return value is None or self.node.accepts(value)

    def parse(self, value: Any, path: str) -> Any:
        return None if value is None else self.node.parse(value, path)

    def schema(self, components: Components) -> Schema:
        return or_null(components.describe(self.node))


class Presence(enum.Enum):
    """Whether an object's member must be there, and what a null in it means."""

    REQUIRED = "required"
    """Absent: a missing parameter. Null: read by the node (a wrong type unless
    :class:`Nullable`)."""
    OPTIONAL = "optional"
    """Absent or null: not given (None); documented as nullable. OpenAI's rule
    for every optional request parameter."""
    NOT_NULL = "not null"
    """Absent or null: a missing parameter."""
    LATER = "later"
    """Absent or null: not given here, refused afterwards by a rule across the
    body (a message's content); documented as required."""
    OMITTABLE = "omittable"
    """Absent: not given. Null: read by the node. For what the server sends:
    a member only some answers carry."""


REQUIRED = Presence.REQUIRED
OPTIONAL = Presence.OPTIONAL
NOT_NULL = Presence.NOT_NULL
LATER = Presence.LATER
OMITTABLE = Presence.OMITTABLE
_DOCUMENTED_REQUIRED = frozenset({REQUIRED, NOT_NULL, LATER})


@dataclass(frozen=True, slots=True, eq=False)
class Member:
    """One key of an :class:`Object`."""

    name: str
    node: Node
    presence: Presence = OPTIONAL
    description: str | None = None
    check: Check | None = None
    """Run right after this member is parsed (even when not given)."""
    missing: Callable[[str], APIError] = missing_parameter
    """The error when the member is required and missing, given its path."""

    def property_schema(self, components: Components) -> Schema:
        schema = components.describe(self.node)
        if self.presence is OPTIONAL:
            schema = or_null(schema)
        if self.description is not None:
            schema = {**schema, "description": self.description}
        return schema


@dataclass(frozen=True, slots=True, eq=False)
class Object(Node):
    """A JSON object whose ``members`` are read in the order declared; other keys
    are allowed and ignored. ``build`` makes its value (default: the object as sent)."""

    members: tuple[Member, ...] = ()
    build: Build | None = None
    name: str | None = None
    expected: str = "an object"
    description: str | None = None

    def accepts(self, value: Any) -> bool:
        return isinstance(value, dict)

    def parse(self, value: Any, path: str) -> Any:
        if not isinstance(value, dict):
            raise wrong_type(path, self.expected, value)
        return self.read(value, path, {})

    def read(self, obj: dict[str, Any], path: str, parsed: dict[str, Any]) -> Any:
        """Read the members of ``obj``, known to be an object, into ``parsed``."""
        for member in self.members:
            key = member.name
            value = obj.get(key)
            presence = member.presence
            if value is not None:
                parsed[key] = member.node.parse(value, f"{path}.{key}")
            elif presence is OPTIONAL or presence is LATER:
                parsed[key] = None
            elif presence is NOT_NULL or (presence is REQUIRED and key not in obj):
                raise member.missing(f"{path}.{key}")
            elif key not in obj:  # OMITTABLE
                parsed[key] = None
            else:  # a null, for the node to read
                parsed[key] = member.node.parse(None, f"{path}.{key}")
            if member.check is not None:
                member.check(parsed, path)
        return obj if self.build is None else self.build(parsed, path)

    def schema(self, components: Components) -> Schema:
        return self.object_schema(components, self.members)

    @staticmethod
    def object_schema(components: Components, members: Sequence[Member]) -> Schema:
        schema: Schema = {"type": "object"}
        if members:
            schema["properties"] = {
                member.name: member.property_schema(components) for member in members
            }
        required = [member.name for member in members if member.presence in _DOCUMENTED_REQUIRED]
        if required:
            schema["required"] = required
        return schema


@dataclass(frozen=True, slots=True, eq=False)
class Array(Node):
    """A JSON array of ``items``, each checked at its path ``path[i]``; at least
    one item unless ``may_be_empty``."""

    items: Node = ANYTHING
    max_length: int | Limit | None = None
    may_be_empty: bool = False
    expected: str = ""
    """Default: ``an array of strings`` or ``an array of objects``, by the items."""
    description: str | None = None
    _max_length: int | None = field(init=False, default=None)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_max_length", _fixed(self.max_length))
        if not self.expected:
            strings = isinstance(self.items, String | Enum)
            object.__setattr__(
                self, "expected", f"an array of {'strings' if strings else 'objects'}"
            )

    def accepts(self, value: Any) -> bool:
        return isinstance(value, list)

    def parse(self, value: Any, path: str) -> list[Any]:
        if not isinstance(value, list):
            raise wrong_type(path, self.expected, value)
        if not value and not self.may_be_empty:
            raise _empty_array(path)
        if self._max_length is not None and len(value) > self._max_length:
            raise _too_long(path, "array", self._max_length, len(value))
        if self.items is ANYTHING:
            return value
        parse = self.items.parse
        return [parse(item, f"{path}[{i}]") for i, item in enumerate(value)]

    def schema(self, components: Components) -> Schema:
        schema: Schema = {"type": "array", "items": components.describe(self.items)}
        if not self.may_be_empty:
            schema["minItems"] = 1
        if self._max_length is not None:
            schema["maxItems"] = self._max_length
        return schema


@dataclass(frozen=True, slots=True, eq=False)
class Map(Node):
    """A JSON object of any keys (checked by ``keys``, given the map's path; at most
    ``max_key_length`` characters) and ``values`` (each at ``path.key``)."""

    values: Node = ANYTHING
    keys: Node | None = None
    max_properties: int | None = None
    max_key_length: int | None = None
    expected: str = "an object"
    description: str | None = None

    def accepts(self, value: Any) -> bool:
        return isinstance(value, dict)

    def parse(self, value: Any, path: str) -> dict[Any, Any]:
        if not isinstance(value, dict):
            raise wrong_type(path, self.expected, value)
        if self.max_properties is not None and len(value) > self.max_properties:
            raise APIError(
                f"Invalid '{path}': too many properties. Expected an object with at most"
                f" {self.max_properties} properties, but got an object with {len(value)}"
                " properties instead.",
                param=path,
                code="object_above_max_properties",
            )
        key_of = self.keys.parse if self.keys is not None else _same
        longest = self.max_key_length
        parsed = {}
        for key, item in value.items():
            if longest is not None and len(key) > longest:
                raise _long_property_name(path, key, longest)
            parsed[key_of(key, path)] = self.values.parse(item, f"{path}.{key}")
        return parsed

    def schema(self, components: Components) -> Schema:
        schema: Schema = {"type": "object"}
        if self.keys is not None:
            schema["propertyNames"] = components.describe(self.keys)
        elif self.max_key_length is not None:
            schema["propertyNames"] = {"maxLength": self.max_key_length}
        if self.values is not ANYTHING:
            schema["additionalProperties"] = components.describe(self.values)
        if self.max_properties is not None:
            schema["maxProperties"] = self.max_properties
        return schema


def _long_property_name(path: str, key: str, limit: int) -> APIError:
    """OpenAI's error for a key of an object longer than ``limit``: the key shown by
    its first and last three characters, ``param`` its path."""
    return APIError(
        f"Invalid property name in '{path}': '{key[:3]}...{key[-3:]}' is too long. Expected a"
        f" string with maximum length {limit}, but got a string with length {len(key)}"
        " instead.",
        param=f"{path}.{key}",
        code="property_name_above_max_length",
    )


def _same(key: str, path: str) -> str:
    return key


@dataclass(frozen=True, slots=True, eq=False)
class OneOf(Node):
    """One of ``alternatives``, picked by the JSON type of the value (the first
    that accepts it). OpenAI names a union by its first alternative with its
    article and the others without: ``one of a string or array of objects``."""

    alternatives: tuple[Node, ...]
    description: str | None = None
    expected: str = field(init=False, default="")

    def __post_init__(self) -> None:
        first, *others = (each.expected for each in self.alternatives)
        bare = [
            other.split(" ", 1)[1] if other.startswith(("a ", "an ")) else other for other in others
        ]
        object.__setattr__(self, "expected", " or ".join([f"one of {first}", *bare]))

    def accepts(self, value: Any) -> bool:
        return any(each.accepts(value) for each in self.alternatives)

    def parse(self, value: Any, path: str) -> Any:
        for each in self.alternatives:
            if each.accepts(value):
                return each.parse(value, path)
        raise wrong_type(path, self.expected, value)

    def schema(self, components: Components) -> Schema:
        return {"anyOf": [components.describe(each) for each in self.alternatives]}


@dataclass(frozen=True, slots=True, eq=False)
class Tagged(Node):
    """An object whose ``tag`` member, one of ``values``, picks the object schema
    its other members follow (a message's ``role``). A value with no variant is
    refused by ``refuse`` (given the value and the tag's path)."""

    tag: str
    values: tuple[str, ...]
    variants: Mapping[str, Object]
    refuse: Callable[[str, str], APIError] | None = None
    name: str | None = None
    expected: str = "an object"
    description: str | None = None
    _tag: Enum = field(init=False, default=Enum(()))

    def __post_init__(self) -> None:
        if self.refuse is None and set(self.values) != set(self.variants):
            raise ValueError(f"every {self.tag} needs a variant, or a refusal")
        object.__setattr__(self, "_tag", Enum(self.values))

    def accepts(self, value: Any) -> bool:
        return isinstance(value, dict)

    def parse(self, value: Any, path: str) -> Any:
        if not isinstance(value, dict):
            raise wrong_type(path, self.expected, value)
        where = f"{path}.{self.tag}"
        if self.tag not in value:
            raise missing_parameter(where)
        tag = self._tag.parse(value[self.tag], where)
        variant = self.variants.get(tag)
        if variant is None:
            assert self.refuse is not None  # checked in __post_init__
            raise self.refuse(tag, where)
        return variant.read(value, path, {self.tag: tag})

    def schema(self, components: Components) -> Schema:
        variants = {
            tag: components.describe(
                replace(
                    variant, members=(Member(self.tag, Enum((tag,)), REQUIRED), *variant.members)
                )
            )
            for tag, variant in self.variants.items()
        }
        if len(variants) == 1:
            (only,) = variants.values()
            return only
        schema: Schema = {"oneOf": list(variants.values())}
        if all(variant.name is not None for variant in self.variants.values()):
            schema["discriminator"] = {
                "propertyName": self.tag,
                "mapping": {tag: each["$ref"] for tag, each in variants.items()},
            }
        return schema


class Rule(ABC):
    """A check of a request body's parameters once each was read (see
    :class:`Parameters`), and what the document says of it."""

    __slots__ = ()
    parameter: str

    @abstractmethod
    def apply(self, body: Parameters, sent: dict[str, Any], given: dict[str, Any]) -> None:
        """Raise OpenAI's error if ``given`` (the parameters read from ``sent``) breaks
        the rule; a rule that reads a parameter adds it to ``given``."""

    def notes(self) -> dict[str, str]:
        """What the document adds to each parameter's description, by parameter."""
        return {}


@dataclass(frozen=True, slots=True)
class Requires(Rule):
    """Parameter ``parameter`` is refused with ``message`` unless ``needed`` is given and true."""

    parameter: str
    needed: str
    message: str

    def apply(self, body: Parameters, sent: dict[str, Any], given: dict[str, Any]) -> None:
        if self.parameter in given and not given.get(self.needed):
            raise APIError(self.message, param=self.parameter)

    def notes(self) -> dict[str, str]:
        return {self.parameter: f"Only with {self.needed}."}


@dataclass(frozen=True, slots=True)
class Excludes(Rule):
    """Parameters ``parameter`` and ``other`` are refused together with ``message``."""

    parameter: str
    other: str
    message: str

    def apply(self, body: Parameters, sent: dict[str, Any], given: dict[str, Any]) -> None:
        if self.parameter in given and self.other in given:
            raise APIError(self.message, param=self.parameter, code="invalid_parameter_combination")

    def notes(self) -> dict[str, str]:
        return {
            self.parameter: f"Not with {self.other}.",
            self.other: f"Not with {self.parameter}.",
        }


@dataclass(frozen=True, slots=True)
class Holds(Rule):
    """Parameter ``parameter``, once read, is refused with ``message`` (code
    ``invalid_value``) unless ``test`` holds of its value; ``note`` documents it."""

    parameter: str
    test: Callable[[Any], bool]
    message: str
    note: str

    def apply(self, body: Parameters, sent: dict[str, Any], given: dict[str, Any]) -> None:
        if self.parameter in given and not self.test(given[self.parameter]):
            raise APIError(self.message, param=self.parameter, code="invalid_value")

    def notes(self) -> dict[str, str]:
        return {self.parameter: self.note}


@dataclass(frozen=True, slots=True)
class Later(Rule):
    """Parameter ``parameter`` is read here, among the rules, rather than at its place
    in the body: OpenAI checks its type only once the other parameters were read."""

    parameter: str

    def apply(self, body: Parameters, sent: dict[str, Any], given: dict[str, Any]) -> None:
        value = sent.get(self.parameter)
        if value is not None:
            given[self.parameter] = body.member(self.parameter).node.parse(value, self.parameter)


def unrecognized(keys: list[str]) -> APIError:
    """OpenAI's error for body keys it does not know (Chat Completions)."""
    plural = "s" if len(keys) > 1 else ""
    return APIError(f"Unrecognized request argument{plural} supplied: {', '.join(keys)}")


@dataclass(frozen=True, slots=True, eq=False)
class Parameters(Object):
    """A request body: an object of parameters, read as OpenAI reads one.

    First the ``NOT_NULL`` ones must be there (in the order declared), then
    unknown keys are refused with ``unknown``, then each parameter is checked
    in the order the body lists them (null is always "not given"; a parameter a
    :class:`Later` rule reads is left to it), then the ``rules`` apply in their
    order (members' checks are not run: rules across parameters are these, or
    the caller's). Its value is the parameters given, parsed.
    """

    rules: tuple[Rule, ...] = ()
    unknown: Callable[[list[str]], APIError] = unrecognized
    _by_name: Mapping[str, Member] = field(init=False, default_factory=dict)
    _needed: tuple[Member, ...] = field(init=False, default=())
    _later: frozenset[str] = field(init=False, default=frozenset())

    def __post_init__(self) -> None:
        if any(member.presence not in (OPTIONAL, NOT_NULL) for member in self.members):
            raise ValueError("a parameter is OPTIONAL or NOT_NULL: null is not given")
        object.__setattr__(self, "_by_name", {member.name: member for member in self.members})
        needed = tuple(member for member in self.members if member.presence is NOT_NULL)
        object.__setattr__(self, "_needed", needed)
        later = frozenset(rule.parameter for rule in self.rules if isinstance(rule, Later))
        object.__setattr__(self, "_later", later)

    def member(self, name: str) -> Member:
        """The parameter called ``name``."""
        return self._by_name[name]

    def read(self, obj: dict[str, Any], path: str, parsed: dict[str, Any]) -> dict[str, Any]:
        for member in self._needed:
            if obj.get(member.name) is None:
                raise member.missing(member.name)
        by_name = self._by_name
        unknown = obj.keys() - by_name.keys()
        if unknown:
            raise self.unknown(sorted(unknown))
        later = self._later
        for key, value in obj.items():
            if value is not None and key not in later:
                parsed[key] = by_name[key].node.parse(value, key)
        for rule in self.rules:
            rule.apply(self, obj, parsed)
        return parsed

    def schema(self, components: Components) -> Schema:
        rules: dict[str, list[str]] = {}
        for rule in self.rules:
            for parameter, note in rule.notes().items():
                rules.setdefault(parameter, []).append(note)
        members = [
            replace(member, description=_with_rules(member.description, rules[member.name]))
            if member.name in rules
            else member
            for member in self.members
        ]
        return {**self.object_schema(components, members), "additionalProperties": False}


def _with_rules(description: str | None, rules: list[str]) -> str:
    return " ".join(rules if description is None else [*rules, description])
