"""The OpenAPI 3.1 document of the ``/v1`` API, as the server validates and answers.

The request schemas are :data:`~chatparity.protocol.request.CHAT_COMPLETION_REQUEST`
and :data:`~chatparity.protocol.responses.RESPONSES_REQUEST`, the very tables the
server validates with, so the two cannot disagree; rules
that span several fields (tool messages answer the calls just made, ...) are in
the descriptions and answered with a 400. The answers are declared here in the
same nodes. Event-stream responses are described one event at a time, as
OpenAPI before 3.2 reads them.
"""

from __future__ import annotations

from typing import Any

from .embeddings import embeddings_request
from .enums import FINISH_REASONS, REASONING_EFFORTS, SERVICE_TIERS, TOOL_TYPES
from .messages import ERROR_TYPES, STOP_REASONS, count_tokens_request, messages_request
from .messages_stream import EVENT_TYPES as MESSAGE_EVENT_TYPES
from .request import NO_LIMITS, TOOL_CALL, Limits, chat_completion_request
from .responses import ITEM_STATUSES, TRUNCATIONS, responses_request
from .responses_stream import EVENT_TYPES, RESPONSE_STATUSES
from .schema import (
    ANYTHING,
    OMITTABLE,
    REQUIRED,
    Array,
    Boolean,
    Components,
    Enum,
    Integer,
    Map,
    Member,
    Node,
    Nullable,
    Number,
    Object,
    OneOf,
    Schema,
    String,
    Tagged,
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


def _counts_always(*names: str) -> Object:
    return Object(tuple(_always(name, Integer()) for name in names))


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


# The Responses API's answers.

_OUTPUT_TEXT = Object(
    (
        _always("type", _const("output_text")),
        _always("text", String()),
        _always("annotations", _list(ANYTHING)),
        _sometimes("logprobs", _list(ANYTHING)),
    ),
    name="OutputText",
)
_ITEM = (_always("id", String()), _always("status", Enum(ITEM_STATUSES)))
_OUTPUT_ITEM = Tagged(
    "type",
    ("message", "function_call"),
    {
        "message": Object(
            (*_ITEM, _always("role", _const("assistant")), _always("content", _list(_OUTPUT_TEXT))),
            name="OutputMessage",
        ),
        "function_call": Object(
            (
                *_ITEM,
                _always("call_id", String()),
                _always("name", String()),
                _always("arguments", String(), "JSON, as the model wrote it."),
            ),
            name="FunctionCall",
        ),
    },
    name="OutputItem",
)
_INPUT_ITEM = Object(
    (
        *_ITEM,
        _always("type", Enum(("message", "function_call", "function_call_output"))),
        _sometimes("role", String()),
        _sometimes("content", _list(ANYTHING), "Text parts: input_text, output_text, refusal."),
        _sometimes("call_id", String()),
        _sometimes("name", String()),
        _sometimes("arguments", String()),
        _sometimes("output", String()),
    ),
    name="InputItem",
)
_RESPONSE = Object(
    (
        _always("id", String(), "resp_ and 50 hex digits."),
        _always("object", _const("response")),
        _always("created_at", Integer(), "Unix seconds."),
        _always("status", Enum(RESPONSE_STATUSES)),
        _always("background", Boolean()),
        _always(
            "error",
            Nullable(Object((_always("code", String()), _always("message", String())))),
            "Why a failed response failed.",
        ),
        _always(
            "incomplete_details",
            Nullable(Object((_always("reason", Enum(("max_output_tokens", "content_filter"))),))),
        ),
        _always("model", String(), "The model id as the client sent it."),
        _always("output", _list(_OUTPUT_ITEM)),
        _always("instructions", Nullable(String())),
        _always("max_output_tokens", Nullable(Integer())),
        _always("max_tool_calls", Nullable(Integer())),
        _always("metadata", Map(String())),
        _always("parallel_tool_calls", Boolean()),
        _always("previous_response_id", Nullable(String())),
        _always("prompt_cache_key", Nullable(String())),
        _always(
            "reasoning",
            Object(
                (
                    _always("effort", Nullable(Enum(REASONING_EFFORTS))),
                    _always("summary", Nullable(String())),
                )
            ),
        ),
        _always("safety_identifier", Nullable(String())),
        _always("service_tier", Enum(SERVICE_TIERS)),
        _always("store", Boolean()),
        _always("temperature", Number()),
        _always("text", Object((_always("format", ANYTHING), _always("verbosity", String())))),
        _always("tool_choice", ANYTHING, "As sent: a mode, or the function named."),
        _always("tools", _list(ANYTHING), "As sent, each with its strict setting."),
        _always("top_p", Number()),
        _always("truncation", Enum(TRUNCATIONS)),
        _always("user", Nullable(String())),
        _always(
            "usage",
            Nullable(
                Object(
                    (
                        _always("input_tokens", Integer()),
                        _always("input_tokens_details", _counts("cached_tokens")),
                        _always("output_tokens", Integer()),
                        _always("output_tokens_details", _counts("reasoning_tokens")),
                        _always("total_tokens", Integer()),
                    )
                )
            ),
            "Null until the response is complete.",
        ),
    ),
    name="Response",
)
_RESPONSE_EVENT = Object(
    (
        _always("type", Enum(EVENT_TYPES), "Also the event's `event:` line."),
        _always("sequence_number", Integer(), "0, 1, 2, ... in the order sent."),
        _sometimes("response", _RESPONSE, "response.created, .in_progress and the last event."),
        _sometimes("output_index", Integer()),
        _sometimes("item", _OUTPUT_ITEM),
        _sometimes("item_id", String()),
        _sometimes("content_index", Integer()),
        _sometimes("part", _OUTPUT_TEXT),
        _sometimes("delta", String()),
        _sometimes("text", String()),
        _sometimes("arguments", String()),
        _sometimes("name", String()),
        _sometimes("logprobs", _list(ANYTHING)),
    ),
    name="ResponseStreamEvent",
)
_DELETED_RESPONSE = Object(
    (
        _always("id", String()),
        _always("object", _const("response")),
        _always("deleted", Boolean()),
    ),
    name="DeletedResponse",
)
_INPUT_ITEM_LIST = Object(
    (
        _always("object", _const("list")),
        _always("data", _list(_INPUT_ITEM)),
        _always("first_id", Nullable(String())),
        _always("last_id", Nullable(String())),
        _always("has_more", Boolean()),
    ),
    name="InputItemList",
)

_EMBEDDING_LIST = Object(
    (
        _always("object", _const("list")),
        _always(
            "data",
            _list(
                Object(
                    (
                        _always("object", _const("embedding")),
                        _always("index", Integer()),
                        _always(
                            "embedding",
                            OneOf((_list(Number()), String())),
                            "Numbers, or with encoding_format base64 their little-endian"
                            " float32 bytes in base64.",
                        ),
                    )
                ),
                "One vector per input, in input order.",
            ),
        ),
        _always("model", String()),
        _always("usage", _counts_always("prompt_tokens", "total_tokens")),
    ),
    name="CreateEmbeddingResponse",
)

# Anthropic's Messages API's answers.

_CONTENT_BLOCK = Tagged(
    "type",
    ("text", "thinking", "tool_use"),
    {
        "text": Object((_always("text", String()),), name="TextContentBlock"),
        "thinking": Object(
            (_always("thinking", String()), _always("signature", String())),
            name="ThinkingContentBlock",
        ),
        "tool_use": Object(
            (
                _always("id", String()),
                _always("name", String()),
                _always("input", Map(), "The call's arguments (streamed: {} at its start)."),
            ),
            name="ToolUseContentBlock",
        ),
    },
    name="ContentBlock",
)
_MESSAGE_USAGE = (
    _sometimes(
        "input_tokens", Integer(), "Not counting those read from the cache or written to it."
    ),
    _sometimes("cache_creation_input_tokens", Integer(), "Written to the prompt cache."),
    _sometimes("cache_read_input_tokens", Integer(), "Read from the prompt cache."),
    _sometimes(
        "cache_creation",
        Object(
            (
                _always("ephemeral_5m_input_tokens", Integer()),
                _always("ephemeral_1h_input_tokens", Integer()),
            ),
            name="CacheCreation",
        ),
        "The cache writes by lifetime, when there are some.",
    ),
    _always("output_tokens", Integer()),
)
_MESSAGE = Object(
    (
        _always("id", String(), "msg_ and 50 hex digits."),
        _always("type", _const("message")),
        _always("role", _const("assistant")),
        _always("model", String(), "The model id as the client sent it."),
        _always("content", _list(_CONTENT_BLOCK)),
        _always("stop_reason", Nullable(Enum(STOP_REASONS)), "Null only in message_start."),
        _always("stop_sequence", Nullable(String())),
        _sometimes("stop_details", Nullable(ANYTHING)),
        _always(
            "usage",
            Object((*_MESSAGE_USAGE, _sometimes("service_tier", String())), name="MessageUsage"),
        ),
    ),
    name="Message",
)
_MESSAGE_DELTA = Object(
    (
        _sometimes("type", Enum(("text_delta", "input_json_delta", "thinking_delta"))),
        _sometimes("text", String()),
        _sometimes("partial_json", String()),
        _sometimes("thinking", String()),
        _sometimes("stop_reason", Nullable(Enum(STOP_REASONS))),
        _sometimes("stop_sequence", Nullable(String())),
    )
)
_ANTHROPIC_ERROR = Object(
    (
        _always("type", _const("error")),
        _always(
            "error",
            Object((_always("type", Enum(ERROR_TYPES)), _always("message", String()))),
        ),
        _sometimes("request_id", String(), "As the request-id header says."),
    ),
    name="AnthropicError",
)
_MESSAGE_EVENT = Object(
    (
        _always("type", Enum(MESSAGE_EVENT_TYPES), "Also the event's `event:` line."),
        _sometimes("message", _MESSAGE, "message_start: the message, its content empty."),
        _sometimes("index", Integer(), "The content block's index."),
        _sometimes("content_block", _CONTENT_BLOCK, "content_block_start: the block, empty."),
        _sometimes("delta", _MESSAGE_DELTA, "A block's fragment, or the stop reason."),
        _sometimes("usage", Object(_MESSAGE_USAGE), "message_delta: the cumulative usage."),
        _sometimes("error", ANYTHING, "error: as in an error answer."),
        _sometimes("request_id", String()),
    ),
    name="MessageStreamEvent",
)
_TOKEN_COUNT = Object((_always("input_tokens", Integer()),), name="MessageTokensCount")

_ERRORS = {
    "400": "Invalid request, in OpenAI's words; `param` names the offending field.",
    "401": "No API key, or an unknown, revoked or expired one.",
    "404": "No such model (or stored response), or the key may not use it.",
    "413": "The body is larger than the server accepts (`request_too_large`).",
    "429": "A rate limit or budget of the key was reached.",
    "500": "The server or its backend failed.",
    "502": "The backend answered with an error.",
    "503": "The backend is unavailable.",
    "504": "The backend did not answer in time.",
}
_ANTHROPIC_ERRORS = {
    "400": "Invalid request (`invalid_request_error`).",
    "401": "No API key, or an unknown, revoked or expired one (`authentication_error`).",
    "404": "No such model, or the key may not use it (`not_found_error`).",
    "413": "The body is larger than the server accepts (`request_too_large`).",
    "429": "A rate limit or budget of the key was reached (`rate_limit_error`, retry-after).",
    "500": "The server or its backend failed (`api_error`).",
    "502": "The backend answered with an error (`api_error`).",
    "504": "The backend did not answer in time (`timeout_error`).",
    "529": "Something the server needs is away for now (`overloaded_error`).",
}


def _answer(description: str, content: Schema, *, anthropic: bool = False) -> Schema:
    headers = {"x-request-id": {"$ref": "#/components/headers/RequestId"}}
    if anthropic:
        headers["request-id"] = {"$ref": "#/components/headers/RequestId"}
    return {"description": description, "headers": headers, "content": content}


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

    anthropic_error = components.describe(_ANTHROPIC_ERROR)

    def anthropic_errors(*statuses: str) -> dict[str, Schema]:
        return {
            status: _answer(_ANTHROPIC_ERRORS[status], _json(anthropic_error), anthropic=True)
            for status in statuses
        }

    components.schemas["MessageEvent"] = {
        "type": "object",
        "properties": {
            "event": {"type": "string", "description": "The event's type."},
            "data": {
                "type": "string",
                "contentMediaType": "application/json",
                "contentSchema": components.describe(_MESSAGE_EVENT),
            },
        },
        "required": ["event", "data"],
        "description": (
            "One named event; the last is message_stop, or error (a failure after the first"
            " byte). A ping may come at any time."
        ),
    }
    anthropic_security: list[dict[str, list[str]]] = [{"apiKey": []}, {"bearerAuth": []}]
    beta = {
        "name": "beta",
        "in": "query",
        "schema": {"type": "string"},
        "description": "Accepted (Claude Code sends beta=true); the same endpoint.",
    }

    components.schemas["ResponseEvent"] = {
        "type": "object",
        "properties": {
            "event": {"type": "string", "description": "The event's type."},
            "data": {
                "type": "string",
                "contentMediaType": "application/json",
                "contentSchema": components.describe(_RESPONSE_EVENT),
            },
        },
        "required": ["event", "data"],
        "description": (
            "One typed event; the last is response.completed, response.incomplete or"
            " response.failed (a failure after the first byte)."
        ),
    }
    response_id = {
        "name": "response_id",
        "in": "path",
        "required": True,
        "schema": {"type": "string", "minLength": 1},
    }
    stored = components.describe(_RESPONSE)
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
            "description": (
                "An OpenAI-compatible Chat Completions, Responses and Embeddings API, and"
                " Anthropic's Messages API."
            ),
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
            "/embeddings": {
                "post": {
                    "operationId": "createEmbedding",
                    "summary": "Embed one input or many, as numbers or base64.",
                    "requestBody": {
                        "required": True,
                        "description": f"A JSON object.{body_note}",
                        "content": _json(components.describe(embeddings_request(limits))),
                    },
                    "responses": {
                        "200": _answer(
                            "A list of embeddings, in input order.",
                            _json(components.describe(_EMBEDDING_LIST)),
                        ),
                        **errors("400", "401", "404", "413", "429", "500", "502", "503", "504"),
                    },
                }
            },
            "/responses": {
                "post": {
                    "operationId": "createResponse",
                    "summary": "Create a response, streamed or not; stored unless store is false.",
                    "requestBody": {
                        "required": True,
                        "description": f"A JSON object.{body_note}",
                        "content": _json(components.describe(responses_request(limits))),
                    },
                    "responses": {
                        "200": _answer(
                            "A response, or with stream: true an event stream of typed events.",
                            {
                                **_json(stored),
                                "text/event-stream": {"schema": ref("ResponseEvent")},
                            },
                        ),
                        **errors("400", "401", "404", "413", "429", "500", "502", "503", "504"),
                    },
                }
            },
            "/responses/{response_id}": {
                "get": {
                    "operationId": "getResponse",
                    "summary": "A stored response of the key, or of another key of its owner.",
                    "parameters": [response_id],
                    "responses": {
                        "200": _answer("The response, as it was answered.", _json(stored)),
                        **errors("401", "404", "503"),
                    },
                },
                "delete": {
                    "operationId": "deleteResponse",
                    "summary": "Forget a stored response.",
                    "parameters": [response_id],
                    "responses": {
                        "200": _answer(
                            "It was deleted.", _json(components.describe(_DELETED_RESPONSE))
                        ),
                        **errors("401", "404", "503"),
                    },
                },
            },
            "/responses/{response_id}/input_items": {
                "get": {
                    "operationId": "listInputItems",
                    "summary": "The input items of a stored response, a page at a time.",
                    "parameters": [
                        response_id,
                        {
                            "name": "limit",
                            "in": "query",
                            "schema": {"type": "integer", "minimum": 1, "maximum": 100},
                        },
                        {"name": "order", "in": "query", "schema": {"enum": ["asc", "desc"]}},
                        {
                            "name": "after",
                            "in": "query",
                            "schema": {"type": "string"},
                            "description": "The id of the item the page begins after.",
                        },
                    ],
                    "responses": {
                        "200": _answer(
                            "A page of items, newest first unless order is asc.",
                            _json(components.describe(_INPUT_ITEM_LIST)),
                        ),
                        **errors("400", "401", "404", "503"),
                    },
                }
            },
            "/messages": {
                "post": {
                    "operationId": "createMessage",
                    "summary": "Create a message (Anthropic's Messages API), streamed or not.",
                    "security": anthropic_security,
                    "parameters": [beta],
                    "requestBody": {
                        "required": True,
                        "description": f"A JSON object.{body_note}",
                        "content": _json(components.describe(messages_request(limits))),
                    },
                    "responses": {
                        "200": _answer(
                            "A message, or with stream: true an event stream of named events.",
                            {
                                **_json(components.describe(_MESSAGE)),
                                "text/event-stream": {"schema": ref("MessageEvent")},
                            },
                            anthropic=True,
                        ),
                        **anthropic_errors(
                            "400", "401", "404", "413", "429", "500", "502", "504", "529"
                        ),
                    },
                }
            },
            "/messages/count_tokens": {
                "post": {
                    "operationId": "countMessageTokens",
                    "summary": (
                        "The input tokens of a Messages request: by the backend's tokenizer"
                        " where it has one, else estimated as the limits estimate them."
                    ),
                    "security": anthropic_security,
                    "parameters": [beta],
                    "requestBody": {
                        "required": True,
                        "description": f"A JSON object.{body_note}",
                        "content": _json(components.describe(count_tokens_request(limits))),
                    },
                    "responses": {
                        "200": _answer(
                            "The count.",
                            _json(components.describe(_TOKEN_COUNT)),
                            anthropic=True,
                        ),
                        **anthropic_errors("400", "401", "404", "413", "429", "500", "529"),
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
                },
                "apiKey": {
                    "type": "apiKey",
                    "in": "header",
                    "name": "x-api-key",
                    "description": "An API key, as Anthropic's clients send it (/messages).",
                },
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
