"""The OpenAPI 3.1 document of the ``/v1`` API, as the server validates and answers.

The request schema is :data:`~chatparity.protocol.request.CHAT_COMPLETION_REQUEST`,
the very table the server validates with, so the two cannot disagree; rules
that span several fields (tool messages answer the calls just made, ...) are in
the descriptions and answered with a 400. The answers are declared here in the
same nodes. Event-stream responses are described one event at a time, as
OpenAPI before 3.2 reads them.
"""

from __future__ import annotations

from typing import Any

from .enums import FINISH_REASONS, SERVICE_TIERS, TOOL_TYPES
from .request import NO_LIMITS, TOOL_CALL, Limits, chat_completion_request
from .schema import (
    ANYTHING,
    OMITTABLE,
    REQUIRED,
    Array,
    Components,
    Enum,
    Integer,
    Member,
    Node,
    Nullable,
    Number,
    Object,
    Schema,
    String,
    ref,
)

OPENAPI_VERSION = "3.1.0"


def _always(name: str, node: Node, description: str | None = None) -> Member:
    """A member every answer carries."""
    return Member(name, node, REQUIRED, description)


def _sometimes(name: str, node: Node, description: str | None = None) -> Member:
    """A member only some answers carry."""
    return Member(name, node, OMITTABLE, description)


def _const(value: str) -> Enum:
    return Enum((value,))


def _list(items: Node, description: str | None = None) -> Array:
    return Array(items, may_be_empty=True, description=description)


def _counts(*names: str) -> Object:
    return Object(tuple(_sometimes(name, Integer()) for name in names))


_TOP_LOGPROB = (
    _always("token", String()),
    _always("logprob", Number()),
    _always("bytes", Nullable(_list(Integer()))),
)
_LOGPROBS = Object(
    (
        _always(
            "content",
            Nullable(
                _list(Object((*_TOP_LOGPROB, _always("top_logprobs", _list(Object(_TOP_LOGPROB))))))
            ),
        ),
        _always("refusal", Nullable(_list(ANYTHING))),
    ),
    name="Logprobs",
)
_USAGE = Object(
    (
        _always("prompt_tokens", Integer()),
        _always("completion_tokens", Integer()),
        _always("total_tokens", Integer()),
        _sometimes("prompt_tokens_details", _counts("cached_tokens", "audio_tokens")),
        _sometimes(
            "completion_tokens_details",
            _counts(
                "reasoning_tokens",
                "audio_tokens",
                "accepted_prediction_tokens",
                "rejected_prediction_tokens",
            ),
        ),
    ),
    name="CompletionUsage",
)
_ENVELOPE = (
    _always("id", String()),
    _always("created", Integer(), "Unix seconds."),
    _always("model", String(), "The model id as the client sent it."),
    _always("service_tier", Nullable(Enum(SERVICE_TIERS))),
    _always("system_fingerprint", Nullable(String())),
)
_CHAT_COMPLETION = Object(
    (
        *_ENVELOPE,
        _always("object", _const("chat.completion")),
        _always(
            "choices",
            _list(
                Object(
                    (
                        _always("index", Integer()),
                        _always(
                            "message",
                            Object(
                                (
                                    _always("role", _const("assistant")),
                                    _always("content", Nullable(String())),
                                    _always("refusal", Nullable(String())),
                                    _sometimes("annotations", _list(ANYTHING)),
                                    _sometimes("tool_calls", _list(TOOL_CALL)),
                                )
                            ),
                        ),
                        _always("logprobs", Nullable(_LOGPROBS)),
                        _always("finish_reason", Enum(FINISH_REASONS)),
                    )
                )
            ),
        ),
        _always("usage", _USAGE),
    ),
    name="ChatCompletion",
)
_TOOL_CALL_DELTA = Object(
    (
        _always("index", Integer()),
        _sometimes("id", String()),
        _sometimes("type", Enum(TOOL_TYPES)),
        _sometimes(
            "function", Object((_sometimes("name", String()), _sometimes("arguments", String())))
        ),
    )
)
_CHUNK = Object(
    (
        *_ENVELOPE,
        _always("object", _const("chat.completion.chunk")),
        _always(
            "choices",
            _list(
                Object(
                    (
                        _always("index", Integer()),
                        _always(
                            "delta",
                            Object(
                                (
                                    _sometimes("role", _const("assistant")),
                                    _sometimes("content", Nullable(String())),
                                    _sometimes("refusal", Nullable(String())),
                                    _sometimes("tool_calls", _list(_TOOL_CALL_DELTA)),
                                )
                            ),
                        ),
                        _always("logprobs", Nullable(_LOGPROBS)),
                        _always("finish_reason", Nullable(Enum(FINISH_REASONS))),
                    )
                ),
                "Empty in the final usage chunk.",
            ),
        ),
        _sometimes("usage", Nullable(_USAGE), "Only with include_usage."),
    ),
    name="ChatCompletionChunk",
)
_ERROR = Object(
    (
        _always(
            "error",
            Object(
                (
                    _always("message", String()),
                    _always("type", String()),
                    _always("param", Nullable(String())),
                    _always("code", Nullable(String())),
                )
            ),
        ),
    ),
    name="Error",
)
_MODEL = Object(
    (
        _always("id", String()),
        _always("object", _const("model")),
        _always("created", Integer()),
        _always("owned_by", String()),
    ),
    name="Model",
)
_MODEL_LIST = Object(
    (_always("object", _const("list")), _always("data", _list(_MODEL))), name="ModelList"
)

_ERRORS = {
    "400": "Invalid request, in OpenAI's words; `param` names the offending field.",
    "401": "No API key, or an unknown, revoked or expired one.",
    "404": "No such model, or the key may not use it.",
    "413": "The body is larger than the server accepts (`request_too_large`).",
    "429": "A rate limit or budget of the key was reached.",
    "500": "The server or its backend failed.",
    "502": "The backend answered with an error.",
    "503": "The backend is unavailable.",
    "504": "The backend did not answer in time.",
}


def _answer(description: str, content: Schema) -> Schema:
    return {
        "description": description,
        "headers": {"x-request-id": {"$ref": "#/components/headers/RequestId"}},
        "content": content,
    }


def _json(schema: Schema) -> Schema:
    return {"application/json": {"schema": schema}}


def openapi_document(
    *, server_url: str = "/v1", limits: Limits = NO_LIMITS, max_body_bytes: int | None = None
) -> dict[str, Any]:
    """The OpenAPI 3.1 document of the API served at ``server_url``.

    ``limits`` and ``max_body_bytes`` are the server's configured caps, so the
    document states the lengths it enforces.
    """
    components = Components()
    error = components.describe(_ERROR)

    def errors(*statuses: str) -> dict[str, Schema]:
        return {status: _answer(_ERRORS[status], _json(error)) for status in statuses}

    components.schemas["ChatCompletionEvent"] = {
        "type": "object",
        "properties": {
            "data": {
                "type": "string",
                "if": {"const": "[DONE]"},
                "else": {
                    "contentMediaType": "application/json",
                    "contentSchema": {"anyOf": [components.describe(_CHUNK), error]},
                },
            }
        },
        "required": ["data"],
        "description": (
            "One event: a chunk, or one error after streaming began; the last is `data: [DONE]`."
        ),
    }
    body_note = "" if max_body_bytes is None else f" At most {max_body_bytes} bytes."
    return {
        "openapi": OPENAPI_VERSION,
        "info": {
            "title": "chatparity",
            "version": "1",
            "description": "An OpenAI-compatible Chat Completions API.",
        },
        "servers": [{"url": server_url}],
        "security": [{"bearerAuth": []}],
        "paths": {
            "/chat/completions": {
                "post": {
                    "operationId": "createChatCompletion",
                    "summary": "Create a chat completion, streamed or not.",
                    "requestBody": {
                        "required": True,
                        "description": f"A JSON object.{body_note}",
                        "content": _json(components.describe(chat_completion_request(limits))),
                    },
                    "responses": {
                        "200": _answer(
                            "A chat.completion, or with stream: true an event stream of"
                            " chat.completion.chunk objects ending with `data: [DONE]`.",
                            {
                                **_json(components.describe(_CHAT_COMPLETION)),
                                "text/event-stream": {"schema": ref("ChatCompletionEvent")},
                            },
                        ),
                        **errors("400", "401", "404", "413", "429", "500", "502", "503", "504"),
                    },
                }
            },
            "/models": {
                "get": {
                    "operationId": "listModels",
                    "summary": "The models the key may use.",
                    "responses": {
                        "200": _answer(
                            "The listed models.", _json(components.describe(_MODEL_LIST))
                        ),
                        **errors("401"),
                    },
                }
            },
            "/models/{model}": {
                "get": {
                    "operationId": "retrieveModel",
                    "summary": "One model, by id (case-insensitive).",
                    "parameters": [
                        {
                            "name": "model",
                            "in": "path",
                            "required": True,
                            "schema": {"type": "string", "minLength": 1},
                        }
                    ],
                    "responses": {
                        "200": _answer("The model.", _json(components.describe(_MODEL))),
                        **errors("401", "404"),
                    },
                }
            },
        },
        "components": {
            "securitySchemes": {
                "bearerAuth": {
                    "type": "http",
                    "scheme": "bearer",
                    "description": "An API key: `Authorization: Bearer <key>`.",
                }
            },
            "headers": {
                "RequestId": {
                    "description": "This request's id, as in the request log.",
                    "required": True,
                    "schema": {"type": "string"},
                }
            },
            "schemas": components.schemas,
        },
    }
