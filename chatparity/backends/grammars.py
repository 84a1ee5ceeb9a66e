"""GBNF grammars that make a small local model answer in the requested shape."""

from __future__ import annotations

import json
import re
from typing import Any

from ..protocol.errors import APIError
from ..protocol.request import ResponseFormat, Tool

TOOL_CALL_OPEN = '<tool_call>{"name": "'
TOOL_ARGUMENTS = ', "arguments": '
TOOL_CALL_CLOSE = "}</tool_call>"

_FREE_ANSWER = r"cp-answer ::= [^<\x00] [^\x00]*"


def json_schema_grammar(schema: dict[str, Any], *, param: str) -> str:
    """A grammar for JSON matching ``schema``; unsupported schemas are a 400 on ``param``."""
    from llama_cpp.llama_grammar import json_schema_to_gbnf

    try:
        return str(json_schema_to_gbnf(json.dumps(schema)))
    except Exception as exc:  # the converter raises bare exceptions of several kinds
        raise APIError(
            f"Invalid schema for {param}: {exc}", param=param, code="invalid_value"
        ) from exc


def response_grammar(response_format: ResponseFormat | None) -> str | None:
    """The grammar for the answer's text, or None for free text."""
    if response_format is None or response_format.type == "text":
        return None
    if response_format.type == "json_object":
        from llama_cpp.llama_grammar import JSON_GBNF

        return str(JSON_GBNF)
    return json_schema_grammar(
        response_format.schema or {"type": "object"}, param="response_format.json_schema"
    )


def arguments_grammar(tool: Tool) -> str:
    return json_schema_grammar(
        tool.parameters or {"type": "object"}, param="tools.function.parameters"
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
