"""GBNF grammars that make a small local model answer in the requested shape.

A schema is bounded (:data:`LOCAL_SCHEMA_BOUNDS`) before it is converted, and
the grammar made from it is compiled once by llama.cpp before any choice
starts: whatever a client sends is a 400, never a crashed process.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import replace
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
    from llama_cpp.llama_grammar import json_schema_to_gbnf

    try:
        check_schema(schema, LOCAL_SCHEMA_BOUNDS)
        grammar = str(json_schema_to_gbnf(json.dumps(schema)))
        llama_cpp.llama_sampler_free(grammar_sampler(vocab, grammar))
    except Exception as exc:  # the converter raises bare exceptions of several kinds
        raise error(str(exc)) from exc
    return grammar


def response_grammar(response_format: ResponseFormat | None, vocab: Any) -> str | None:
    """The grammar for the answer's text, or None for free text."""
    if response_format is None or response_format.type == "text":
        return None
    if response_format.type == "json_object":
        from llama_cpp.llama_grammar import JSON_GBNF

        return str(JSON_GBNF)
    return json_schema_grammar(
        response_format.schema or {"type": "object"},
        vocab,
        partial(response_schema_error, response_format.name or ""),
    )


def arguments_grammar(tool: Tool, index: int, vocab: Any) -> str:
    """The grammar for the arguments of ``tool``, the ``index``-th of the request's tools."""
    return json_schema_grammar(
        tool.parameters or {"type": "object"},
        vocab,
        partial(tool_schema_error, f"tools[{index}].function.parameters", tool.name),
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
