"""GBNF grammars that make a small local model answer in the requested shape.

A schema is bounded (:data:`LOCAL_SCHEMA_BOUNDS`) before it is converted, and
the grammar made from it is compiled once by llama.cpp before any choice
starts: whatever a client sends is a 400, never a crashed process.
"""

from __future__ import annotations

import json
import re
import string
from collections.abc import Callable
from dataclasses import dataclass, replace
from decimal import ROUND_CEILING, ROUND_FLOOR, Decimal, localcontext
from functools import partial
from typing import Any

from ..protocol.errors import APIError
from ..protocol.request import (
    SCHEMA_BOUNDS,
    ResponseFormat,
    Tool,
    check_schema,
    response_schema_error,
    tool_schema_error,
)

TOOL_CALL_OPEN = '<tool_call>{"name": "'
TOOL_ARGUMENTS = ', "arguments": '
TOOL_CALL_CLOSE = "}</tool_call>"

_FREE_ANSWER = r"cp-answer ::= [^<\x00] [^\x00]*"

# Measured with llama-cpp-python 0.3.36 on SmolLM2-135M (2 cores), each in a subprocess:
# - llama.cpp refuses a run of more than 1,000 optional copies (maxItems, maxLength or a
#   pattern's {0,n} minus its minimum: 1,000 compiles, 1,001 does not), and llama-cpp-python
#   then crashed the process. Flat runs are cheap (minItems 100,000: 1.8 MB, built in 0.03 s)
#   but no answer that long fits a context.
# - Nested counts multiply the positions a sampler tracks at once: ([a-z]{0,8}){0,8} 0.9 s
#   for 40 tokens, (([a-z]{0,4}){0,4}){0,4} 11 s, ([a-z]{0,20}){0,20} 6 s per token,
#   ((a{0,30}){0,30}){0,30} not one token in 300 s.
# - 400 optional properties in one object take 0.22 s to convert (it is quadratic); 1,000
#   overflow Python's recursion limit.
# - anyOf over 1,000 objects (85 KB): 0.4 s a token instead of 0.06 s; an enum of 1,000 values
#   0.16 s a token.
LOCAL_SCHEMA_BOUNDS = replace(
    SCHEMA_BOUNDS,
    max_bytes=64 * 1024,
    max_properties=500,
    max_branches=256,
    max_repetition=1000,
    max_pattern_length=1000,
    max_nested_repetition=64,
)
"""What the local model accepts in a schema: stricter than any request's bounds."""


class GrammarRefused(ValueError):
    """llama.cpp would not compile a grammar."""


def grammar_sampler(vocab: Any, grammar: str) -> Any:
    """llama.cpp's sampler for ``grammar``, freed by the chain it joins (or by
    ``llama_sampler_free``); :class:`GrammarRefused` if llama.cpp refuses it.

    llama.cpp answers a grammar it cannot take (a syntax error, left recursion,
    too many repetitions) with NULL, which llama-cpp-python adds to a sampler
    chain as it is: the next token then crashes the process.
    """
    import llama_cpp

    sampler = llama_cpp.llama_sampler_init_grammar(vocab, grammar.encode(), b"root")
    if not sampler:
        raise GrammarRefused("llama.cpp cannot compile the grammar made from it")
    return sampler


def json_schema_grammar(
    schema: dict[str, Any], vocab: Any, error: Callable[[str], APIError]
) -> str:
    """A grammar for JSON matching ``schema``, compiled once against ``vocab``; a
    schema past :data:`LOCAL_SCHEMA_BOUNDS` or that cannot be used is ``error``."""
    import llama_cpp

    try:
        check_schema(schema, LOCAL_SCHEMA_BOUNDS)
        grammar = _schema_to_gbnf(schema)
        llama_cpp.llama_sampler_free(grammar_sampler(vocab, grammar))
    except Exception as exc:  # the converter raises bare exceptions of several kinds
        raise error(str(exc)) from exc
    return grammar


def _schema_to_gbnf(schema: dict[str, Any]) -> str:
    """llama-cpp-python's conversion of ``schema``, with the bounds of its numbers
    (which that converter ignores) made part of the grammar."""
    from llama_cpp import llama_grammar

    converter_class: Any = llama_grammar.SchemaConverter  # its methods are not annotated

    class Converter(converter_class):  # type: ignore[misc]
        def _add_primitive(self, name: str, rule: Any) -> str:
            if name == "char":
                rule = llama_grammar.BuiltinRule(JSON_CHAR, [])
            return str(super()._add_primitive(name, rule))

        def _format_literal(self, literal: str) -> str:
            return gbnf_literal(literal)

        def _visit_pattern(self, pattern: str, name: str) -> str:
            return str(super()._visit_pattern(json_pattern(pattern), name))

        def visit(self, node: Any, name: str) -> str:
            if isinstance(node, dict) and not _DECIDED_ELSEWHERE.intersection(node):
                kind = node.get("type")
                numeric = {key: node[key] for key in _NUMERIC_KEYWORDS if key in node}
                reserved = name in llama_grammar.RESERVED_NAMES
                rule_name = name + "-" if reserved else name or "root"
                if numeric and isinstance(kind, list):
                    # Each member of the union keeps the bounds that apply to it.
                    members = [{**numeric, "type": member} for member in kind]
                    rule = self._generate_union_rule(name, members)
                    return str(self._add_rule(rule_name, rule))
                if numeric and kind in ("integer", "number"):
                    return str(self._add_rule(rule_name, f"{bounded_number(node)} space"))
            return str(super().visit(node, name))

    converter = Converter(prop_order={}, allow_fetch=False, dotall=False, raw_pattern=False)
    converter.visit(converter.resolve_refs(schema, "stdin"), "")
    return str(converter.format_grammar())


# Numbers within bounds ----------------------------------------------------------------
#
# A bounded number is written without an exponent, as its sign, its whole part and its
# fraction; a bound splits the numbers of each sign into those whose whole part lies
# strictly inside (any fraction) and those sharing the bound's whole part, whose fraction
# is then compared digit by digit with the bound's.

_NUMERIC_KEYWORDS = ("minimum", "exclusiveMinimum", "maximum", "exclusiveMaximum", "multipleOf")
# Keywords the converter decides on before a type (a reference, a union, fixed values).
_DECIDED_ELSEWHERE = frozenset({"$ref", "anyOf", "oneOf", "const", "enum"})
# Digits a bound may have before or after its point: a grammar grows with their square.
MAX_BOUND_DIGITS = 40
# Multiples of a multipleOf a grammar may list (as many as an anyOf's members).
MAX_MULTIPLES = LOCAL_SCHEMA_BOUNDS.max_branches
_ANY_FRACTION = '("." [0-9]+)?'

# One side of the range of a fraction's digits: the bound's digits still to compare
# (no trailing zeros) and whether the bound is excluded; None: no bound left.
_Side = tuple[str, bool] | None


@dataclass(frozen=True)
class _Bound:
    """A bound on a number's magnitude (its absolute value)."""

    whole: int
    fraction: str  # the digits after the point, without trailing zeros
    exclusive: bool

    @property
    def as_lower(self) -> _Side:
        """The lower side of the fraction's range, once the whole part equals this bound."""
        return None if not self.fraction and not self.exclusive else (self.fraction, self.exclusive)

    @property
    def as_upper(self) -> _Side:
        """The upper side of the fraction's range, once the whole part equals this bound."""
        return self.fraction, self.exclusive


def bounded_number(schema: dict[str, Any]) -> str:
    """The GBNF expression (without the space after it) for the JSON numbers, or integers,
    ``schema`` admits within its ``minimum``, ``maximum``, ``exclusiveMinimum`` and
    ``exclusiveMaximum``, and multiples of its ``multipleOf``; :class:`ValueError` for
    bounds no grammar is made from."""
    low = _tightest(schema, "minimum", "exclusiveMinimum", max)
    high = _tightest(schema, "maximum", "exclusiveMaximum", min)
    integer = schema["type"] == "integer"
    if "multipleOf" in schema:
        alternatives = _multiples(_decimal("multipleOf", schema["multipleOf"]), low, high, integer)
    else:
        alternatives = _integers(low, high) if integer else _numbers(low, high)
    if not alternatives:
        raise ValueError(f"no {schema['type']} lies within its bounds")
    return " | ".join(alternatives)


def _tightest(
    schema: dict[str, Any], inclusive: str, exclusive: str, pick: Callable[..., Any]
) -> tuple[Decimal, bool] | None:
    """The tighter of ``schema``'s ``inclusive`` and ``exclusive`` bounds, as (value, is it
    excluded), ``pick`` choosing the tighter value (an excluded one on a tie)."""
    bounds = [
        (_decimal(keyword, schema[keyword]), keyword == exclusive)
        for keyword in (inclusive, exclusive)
        if keyword in schema
    ]
    if not bounds:
        return None
    value = pick(value for value, _ in bounds)
    return value, any(excluded for bound, excluded in bounds if bound == value)


def _decimal(keyword: str, value: Any) -> Decimal:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"'{keyword}' must be a number, not {json.dumps(value)}")
    number = Decimal(str(value)) if isinstance(value, float) else Decimal(value)
    whole, _, fraction = format(abs(number), "f").partition(".")
    if len(whole) > MAX_BOUND_DIGITS or len(fraction.rstrip("0")) > MAX_BOUND_DIGITS:
        raise ValueError(
            f"'{keyword}' has more than the {MAX_BOUND_DIGITS} digits before or after its point"
            " this model takes"
        )
    return number


def _multiples(
    step: Decimal,
    low: tuple[Decimal, bool] | None,
    high: tuple[Decimal, bool] | None,
    integer: bool,
) -> list[str]:
    """The multiples of ``step`` within ``low`` and ``high``, each written out: a grammar
    takes them as alternatives, so both bounds are needed and at most
    :data:`MAX_MULTIPLES` of them."""
    if step <= 0:
        raise ValueError("'multipleOf' must be greater than 0")
    if low is None or high is None:
        raise ValueError("'multipleOf' needs a minimum and a maximum on this model")
    with localcontext() as exact:
        exact.prec = 4 * MAX_BOUND_DIGITS  # the bounds' digits, and a step's, exactly
        first = (low[0] / step).to_integral_value(ROUND_CEILING)
        if low[1] and first * step == low[0]:
            first += 1
        last = (high[0] / step).to_integral_value(ROUND_FLOOR)
        if high[1] and last * step == high[0]:
            last -= 1
        if last - first >= MAX_MULTIPLES:
            raise ValueError(
                f"'multipleOf' allows more than {MAX_MULTIPLES} numbers within the bounds,"
                " more than this model takes"
            )
        values = [count * step for count in range(int(first), int(last) + 1)]
    if integer:
        values = [value for value in values if value == value.to_integral_value()]
    return [f'"{_json_number(value)}"' for value in values]


def _json_number(value: Decimal) -> str:
    """``value`` as JSON writes it: no exponent, no trailing zeros after the point."""
    if value == value.to_integral_value():
        return str(int(value))
    return format(value.normalize(), "f")


def _integers(low: tuple[Decimal, bool] | None, high: tuple[Decimal, bool] | None) -> list[str]:
    """Alternatives for the integers within ``low`` and ``high``."""
    least = None if low is None else int(low[0].to_integral_value(ROUND_FLOOR)) + 1
    if low is not None and not low[1] and low[0] == int(low[0]):
        least = int(low[0])
    most = None if high is None else int(high[0].to_integral_value(ROUND_CEILING)) - 1
    if high is not None and not high[1] and high[0] == int(high[0]):
        most = int(high[0])
    if least is not None and most is not None and least > most:
        return []
    alternatives = []
    if most is None or most >= 0:
        alternatives.append(_whole_numbers(max(least or 0, 0), most))
    if least is None or least < 0:
        negative = _whole_numbers(1 if most is None or most >= 0 else -most, _negated(least))
        alternatives.append(f'"-" ({negative})')
    return alternatives


def _negated(value: int | None) -> int | None:
    return None if value is None else -value


def _numbers(low: tuple[Decimal, bool] | None, high: tuple[Decimal, bool] | None) -> list[str]:
    """Alternatives for the numbers within ``low`` and ``high``."""
    alternatives = []
    # Zero and above: bounded by ``low`` only if it is not negative, impossible under
    # a negative ``high``.
    if high is None or high[0] >= 0:
        least = None if low is None or low[0] < 0 else _magnitude(*low)
        most = None if high is None else _magnitude(*high)
        alternatives.extend(_magnitudes(least, most))
    # Below zero: the magnitude is at least what ``high`` is below zero, and at most
    # what ``low`` is.
    if low is None or low[0] <= 0:
        least = None if high is None or high[0] > 0 else _magnitude(-high[0], high[1])
        most = None if low is None else _magnitude(-low[0], low[1])
        negative = _magnitudes(least, most)
        if negative:
            alternatives.append(f'"-" ({" | ".join(negative)})')
    return alternatives


def _magnitude(value: Decimal, exclusive: bool) -> _Bound:
    whole, _, fraction = format(value, "f").partition(".")
    return _Bound(int(whole), fraction.rstrip("0"), exclusive)


def _magnitudes(least: _Bound | None, most: _Bound | None) -> list[str]:
    """Alternatives for the unsigned numbers between ``least`` and ``most``."""
    bottom = 0 if least is None else least.whole
    low_side = None if least is None else least.as_lower
    if most is not None and most.whole < bottom:
        return []
    if most is not None and most.whole == bottom:
        fraction = _fraction(low_side, most.as_upper)
        return [] if fraction is None else [f'"{bottom}" {fraction}']
    alternatives = []
    fraction = _fraction(low_side, None)
    if fraction is not None:
        alternatives.append(f'"{bottom}" {fraction}')
    top = None if most is None else most.whole - 1
    if top is None or top > bottom:
        alternatives.append(f"({_whole_numbers(bottom + 1, top)}) {_ANY_FRACTION}")
    if most is not None:
        fraction = _fraction(None, most.as_upper)
        if fraction is not None:
            alternatives.append(f'"{most.whole}" {fraction}')
    return alternatives


def _fraction(low: _Side, high: _Side) -> str | None:
    """The optional ``.digits`` after a whole part equal to the bounds' (``low`` and
    ``high``: what is left of each to compare): an expression, or None if none fits."""
    ending, steps = _fraction_steps(low, high)
    if not steps:
        return "" if ending else None
    digits = f'"." {_choice(steps)}'
    return f"({digits})?" if ending else digits


def _fraction_digits(low: _Side, high: _Side) -> list[str]:
    """Alternatives for the rest of a fraction's digits within ``low`` and ``high`` ("":
    it may end here)."""
    if high == ("", True):
        return []
    if low is None and high is None:
        return ["[0-9]*"]
    if low == ("", True) and high is None:
        return ['"0"* [1-9] [0-9]*']
    if low is None and high == ("", False):
        return ['"0"*']
    if low == ("", True) and high == ("", False):
        return []
    ending, steps = _fraction_steps(low, high)
    return [""] * ending + steps


def _fraction_steps(low: _Side, high: _Side) -> tuple[bool, list[str]]:
    """Whether a fraction may end before its next digit, and the alternatives that go on
    with one: each class of digits leading to the same sides, then what may follow."""
    ending = low is None and high != ("", True)
    steps: list[str] = []
    by_next: dict[tuple[_Side, _Side], list[int]] = {}
    for digit in range(10):
        following = _next_side(low, digit, lower=True), _next_side(high, digit, lower=False)
        if _DEAD not in following:
            by_next.setdefault(following, []).append(digit)
    for (next_low, next_high), digits in by_next.items():
        rest = _fraction_digits(next_low, next_high)
        if rest:
            steps.append(f"{_digit_class(digits[0], digits[-1])} {_choice(rest)}".rstrip())
    return ending, steps


_DEAD = ("dead", True)  # a side no digit string can satisfy any more


def _next_side(side: _Side, digit: int, *, lower: bool) -> _Side | tuple[str, bool]:
    """What is left of ``side`` once ``digit`` is written: the bound's later digits, None
    once it is passed on the right side, or :data:`_DEAD` once on the wrong one."""
    if side is None:
        return None
    digits, exclusive = side
    bound = int(digits[0]) if digits else 0
    if digit == bound:
        if not digits:  # as many digits as the bound, then zeros: equal to it so far
            return side
        rest = digits[1:]
        if not rest and lower and not exclusive:
            return None
        return _DEAD if not rest and not lower and exclusive else (rest, exclusive)
    passed = digit > bound if lower else digit < bound
    return None if passed else _DEAD


def _digit_class(first: int, last: int) -> str:
    return f'"{first}"' if first == last else f"[{first}-{last}]"


def _choice(alternatives: list[str]) -> str:
    """One expression for ``alternatives`` ("" among them: nothing at all)."""
    present = [alternative for alternative in alternatives if alternative]
    joined = " | ".join(present)
    grouped = f"({joined})" if len(present) > 1 else joined
    if len(present) < len(alternatives):
        return f"{grouped}?" if len(present) == 1 and " " not in joined else f"({joined})?"
    return grouped


def _whole_numbers(least: int, most: int | None) -> str:
    """An expression for the whole numbers from ``least`` to ``most`` (None: no end),
    written without leading zeros; ``least <= most``."""
    alternatives = []
    length = len(str(least))
    while most is None or length <= len(str(most)):
        start = max(least, 10 ** (length - 1) if length > 1 else 0)
        if most is None and length > 1 and start == 10 ** (length - 1):
            alternatives.append(f"[1-9] [0-9]{{{length - 1},}}")
            break
        end = 10**length - 1 if most is None or length < len(str(most)) else most
        alternatives.append(_same_length(str(start), str(end)))
        length += 1
    return " | ".join(alternatives)


def _same_length(low: str, high: str) -> str:
    """An expression for the digit strings of ``low``'s length from ``low`` to ``high``."""
    if low == high:
        return f'"{low}"'
    if low[0] == high[0]:
        return f'"{low[0]}" ({_same_length(low[1:], high[1:])})'
    rest = len(low) - 1
    lowest, highest = "0" * rest, "9" * rest
    first, last = int(low[0]), int(high[0])
    alternatives = []
    if low[1:] != lowest:
        alternatives.append(f'"{low[0]}" ({_same_length(low[1:], highest)})')
        first += 1
    upper = None
    if high[1:] != highest:
        upper = f'"{high[0]}" ({_same_length(lowest, high[1:])})'
        last -= 1
    if first <= last:
        alternatives.append(_digit_class(first, last) + (f" [0-9]{{{rest}}}" if rest else ""))
    if upper is not None:
        alternatives.append(upper)
    return " | ".join(alternatives)


def response_grammar(response_format: ResponseFormat | None, vocab: Any) -> str | None:
    """The grammar for the answer's text, or None for free text."""
    if response_format is None or response_format.type == "text":
        return None
    if response_format.type == "json_object":
        return _schema_to_gbnf({"type": "object"})
    return json_schema_grammar(
        response_format.schema or {"type": "object"},
        vocab,
        partial(response_schema_error, response_format.name or ""),
    )


def arguments_grammar(tool: Tool, param: str, vocab: Any) -> str:
    """The grammar for the arguments of ``tool``, whose parameters the request sent at
    ``param``."""
    return json_schema_grammar(
        tool.parameters or {"type": "object"},
        vocab,
        partial(tool_schema_error, param, tool.name),
    )


def tool_name_grammar(names: list[str], *, auto: bool, answer: str | None) -> str:
    """The opening of a call to one of ``names``; when ``auto``, or else an answer
    (in the ``answer`` grammar, or free text) that cannot be mistaken for a call."""
    alternatives = " | ".join(json.dumps(name) for name in names)
    call = f"cp-call ::= {json.dumps(TOOL_CALL_OPEN)} ({alternatives}) {json.dumps(chr(34))}"
    if not auto:
        return f"root ::= cp-call\n{call}"
    # JSON answers open with "{", so only free text needs the "<" excluded.
    answer_rules = _rename_root(answer, "cp-answer") if answer else _FREE_ANSWER
    return f"root ::= cp-call | cp-answer\n{call}\n{answer_rules}"


def _rename_root(grammar: str, name: str) -> str:
    return re.sub(r"^root(\s*::=)", rf"{name}\1", grammar, flags=re.MULTILINE)


def tools_system_prompt(tools: list[Tool]) -> str:
    specs = "\n".join(
        json.dumps(
            {"name": tool.name, "description": tool.description, "parameters": tool.parameters},
            ensure_ascii=False,
        )
        for tool in tools
    )
    return (
        "You can call these tools:\n<tools>\n"
        f"{specs}\n</tools>\n"
        f"To call one, reply only with {TOOL_CALL_OPEN}<name>{chr(34)}{TOOL_ARGUMENTS}"
        f"<arguments as JSON>{TOOL_CALL_CLOSE}"
    )


# JSON text (RFC 8259) -----------------------------------------------------------------
#
# llama-cpp-python's converter lets a string hold any character but '"' and '\', raw
# control characters included (no JSON parser takes them); it writes the backslashes of
# a constant's or a property name's JSON text as grammar escapes (a const "a\nb" came out
# with a raw newline, "a\\b" as the escape \b); and a pattern's '.', classes and literals
# write any character unescaped. Here a string's unescaped characters are those RFC 8259
# allows less U+007F, and its escapes are the RFC's, as in llama.cpp's own converter
# (common/json-schema-to-grammar.cpp); whitespace (one optional space) and numbers (no
# leading zeros, at most 16 digits a part) are the converter's, and are JSON's.

JSON_CHAR = r'[^"\\\x7F\x00-\x1F] | [\\] (["\\/bfnrt] | "u" [0-9a-fA-F]{4})'
"""One character of a JSON string's text: unescaped, or an escape."""

_GBNF_LITERAL_ESCAPES = {"\\": "\\\\", '"': '\\"', "\r": "\\r", "\n": "\\n"}


def gbnf_literal(text: str) -> str:
    """The grammar literal that writes ``text`` as it is."""
    return '"' + "".join(_GBNF_LITERAL_ESCAPES.get(char, char) for char in text) + '"'


# A pattern is rewritten, as a regular expression the converter reads, into one for the
# text of a JSON string whose value it matches: a character JSON must escape is written
# escaped, and '.', a class or a shorthand (\d, \w, \s and their complements) admits the
# rest of what it matches.

_Ranges = list[tuple[int, int]]  # inclusive ranges of code points
_LAST_CODE_POINT = 0x10FFFF
_MUST_ESCAPE: _Ranges = [(0x00, 0x1F), (0x22, 0x22), (0x5C, 0x5C), (0x7F, 0x7F)]
_LINE_BREAKS: _Ranges = [(0x0A, 0x0A), (0x0D, 0x0D)]  # what '.' does not match
_DIGITS: _Ranges = [(0x30, 0x39)]
_WORD: _Ranges = [(0x30, 0x39), (0x41, 0x5A), (0x5F, 0x5F), (0x61, 0x7A)]
_SPACES: _Ranges = [(0x09, 0x0D), (0x20, 0x20), (0xA0, 0xA0), (0x1680, 0x1680),
                    (0x2000, 0x200A), (0x2028, 0x2029), (0x202F, 0x202F), (0x205F, 0x205F),
                    (0x3000, 0x3000), (0xFEFF, 0xFEFF)]  # fmt: skip
_SHORTHANDS = {"d": _DIGITS, "w": _WORD, "s": _SPACES}
_CONTROL_ESCAPES = {"t": 0x09, "n": 0x0A, "v": 0x0B, "f": 0x0C, "r": 0x0D, "0": 0x00}
_UNSUPPORTED_ESCAPES = frozenset("bBckpP123456789")


def json_pattern(pattern: str) -> str:
    """``pattern``, an anchored regular expression a string's value matches, as one for
    the JSON text of that string (the converter refuses a pattern that is not anchored)."""
    if not (pattern.startswith("^") and pattern.endswith("$") and len(pattern) > 1):
        return pattern
    body, parts, at = pattern[1:-1], [], 0
    while at < len(body):
        char = body[at]
        if char == "[":
            ranges, at = _read_class(body, at + 1)
            parts.append(_admitting(ranges))
        elif char == ".":
            parts.append(_admitting(_complement(_LINE_BREAKS)))
            at += 1
        elif char == "\\" and at + 1 < len(body):
            escaped, at = _read_escape(body, at + 1, in_class=False)
            # A metacharacter's escape stays as it is; anything else is written as a set.
            parts.append(body[at - 2 : at] if escaped is None else _admitting(escaped))
        else:
            code = ord(char)
            parts.append(_admitting(_single(code)) if _overlap(_single(code)) else char)
            at += 1
    return "^" + "".join(parts) + "$"


def _read_escape(body: str, at: int, *, in_class: bool) -> tuple[_Ranges | None, int]:
    """What the escape whose letter is at ``at`` matches (None: a metacharacter left as it
    is, outside a class), and where what follows it starts."""
    letter = body[at]
    if letter.lower() in _SHORTHANDS:
        ranges = _SHORTHANDS[letter.lower()]
        return (_complement(ranges) if letter.isupper() else ranges), at + 1
    if letter in _CONTROL_ESCAPES:
        return _single(_CONTROL_ESCAPES[letter]), at + 1
    if in_class and letter == "b":
        return _single(0x08), at + 1
    if letter in "xu":
        digits = body[at + 1 : at + (3 if letter == "x" else 5)]
        if len(digits) != (2 if letter == "x" else 4) or not all(
            digit in string.hexdigits for digit in digits
        ):
            raise ValueError(f"'\\{letter}{digits}' in a pattern is not an escape")
        return _single(int(digits, 16)), at + 1 + len(digits)
    if letter in _UNSUPPORTED_ESCAPES:
        raise ValueError(f"'\\{letter}' in a pattern is not supported on this model")
    if not in_class and letter in "[]()|{}*+?":
        return None, at + 1
    return _single(ord(letter)), at + 1


def _read_class(body: str, at: int) -> tuple[_Ranges, int]:
    """What the class opened just before ``at`` matches, and where what follows it starts."""
    negated = body.startswith("^", at)
    at += negated
    ranges: _Ranges = []
    while at < len(body) and body[at] != "]":
        low, at = _class_atom(body, at)
        if body.startswith("-", at) and at + 1 < len(body) and body[at + 1] != "]":
            high, at = _class_atom(body, at + 1)
            if not (_is_single(low) and _is_single(high) and low[0][0] <= high[0][0]):
                raise ValueError("a range in a pattern's class is not from one character up")
            low = [(low[0][0], high[0][0])]
        ranges.extend(low)
    if at == len(body):
        raise ValueError("a class in the pattern is not closed")
    return (_complement(ranges) if negated else _merged(ranges)), at + 1


def _class_atom(body: str, at: int) -> tuple[_Ranges, int]:
    if body[at] == "\\" and at + 1 < len(body):
        ranges, at = _read_escape(body, at + 1, in_class=True)
        return ranges or [], at
    return _single(ord(body[at])), at + 1


def _single(code: int) -> _Ranges:
    return [(code, code)]


def _is_single(ranges: _Ranges) -> bool:
    return len(ranges) == 1 and ranges[0][0] == ranges[0][1]


def _merged(ranges: _Ranges) -> _Ranges:
    merged: _Ranges = []
    for low, high in sorted(ranges):
        if merged and low <= merged[-1][1] + 1:
            merged[-1] = (merged[-1][0], max(merged[-1][1], high))
        else:
            merged.append((low, high))
    return merged


def _complement(ranges: _Ranges) -> _Ranges:
    complement, start = [], 0
    for low, high in _merged(ranges):
        if low > start:
            complement.append((start, low - 1))
        start = high + 1
    if start <= _LAST_CODE_POINT:
        complement.append((start, _LAST_CODE_POINT))
    return complement


def _overlap(ranges: _Ranges) -> list[int]:
    """The code points of ``ranges`` that JSON must escape."""
    return [
        code
        for low, high in _MUST_ESCAPE
        for code in range(low, high + 1)
        if any(start <= code <= end for start, end in ranges)
    ]


def _admitting(ranges: _Ranges) -> str:
    """A regular expression for the JSON text of one character of ``ranges``: a class of
    those written as they are, or the escape of one that must be escaped."""
    plain = _complement(_complement(ranges) + _MUST_ESCAPE)
    alternatives = []
    if plain:
        alternatives.append("[" + "".join(_class_range(low, high) for low, high in plain) + "]")
    escaped = _overlap(ranges)
    # The converter writes an escaped backslash as one; what follows it is the escape's.
    alternatives += ["\\\\" + _ESCAPE_AFTER_BACKSLASH[code] for code in escaped if code > 0x1F]
    for high in (0, 1):  # control characters, as \u00 and two hex digits
        lows = "".join(f"{code & 0xF:x}" for code in escaped if code >> 4 == high)
        if lows:
            alternatives.append(f"\\\\u00{high}" + (f"[{lows}]" if len(lows) > 1 else lows))
    if not alternatives:
        raise ValueError("a class in the pattern matches no character")
    return alternatives[0] if len(alternatives) == 1 else "(" + "|".join(alternatives) + ")"


_ESCAPE_AFTER_BACKSLASH = {0x22: '"', 0x5C: "\\\\", 0x7F: "u007f"}


def _class_range(low: int, high: int) -> str:
    return _code(low) if low == high else f"{_code(low)}-{_code(high)}"


def _code(code: int) -> str:
    if code < 0x100:
        return f"\\x{code:02X}"
    return f"\\u{code:04X}" if code < 0x10000 else f"\\U{code:08X}"
