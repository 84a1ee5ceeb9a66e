"""The OpenAPI 3.1 document of the ``/v1`` API, as the server validates and answers.

The request schema says what :func:`~chatparity.protocol.request.parse_chat_request`
accepts (the same keys, types, ranges and enums as its ``_PARAMETERS``); rules that
span several fields (``stream_options`` needs ``stream``, tool messages answer the
calls just made, ...) are in the descriptions and answered with a 400. Event-stream
responses are described one event at a time, as OpenAPI before 3.2 reads them.
"""

from __future__ import annotations

from typing import Any

from .request import NO_LIMITS, Limits

Schema = dict[str, Any]

OPENAPI_VERSION = "3.1.0"


def _ref(name: str) -> Schema:
    return {"$ref": f"#/components/schemas/{name}"}


def _or_null(schema: Schema) -> Schema:
    """``schema`` or JSON null; for optional parameters, null means "not given"."""
    if isinstance(schema.get("type"), str) and not {"enum", "const"} & schema.keys():
        return {**schema, "type": [schema["type"], "null"]}
    return {"anyOf": [schema, {"type": "null"}]}


def _object(properties: Schema, *required: str, **keywords: Any) -> Schema:
    schema: Schema = {"type": "object", "properties": properties, **keywords}
    if required:
        schema["required"] = list(required)
    return schema


def _array(items: Schema, **keywords: Any) -> Schema:
    return {"type": "array", "items": items, **keywords}


_STRING: Schema = {"type": "string"}
_INTEGER: Schema = {"type": "integer"}
_BOOLEAN: Schema = {"type": "boolean"}
_ANY_OBJECT: Schema = {"type": "object"}
_FUNCTION_TYPE: Schema = {"type": "string", "enum": ["function"]}
_NAME: Schema = {"type": "string", "minLength": 1, "maxLength": 64, "pattern": "^[a-zA-Z0-9_-]+$"}
_FINISH_REASONS = ["stop", "length", "tool_calls", "content_filter", "function_call"]


def _number(lo: int, hi: int) -> Schema:
    return {"type": "number", "minimum": lo, "maximum": hi}


def _const(value: str) -> Schema:
    return {"type": "string", "const": value}


def _enum(*values: str) -> Schema:
    return {"type": "string", "enum": list(values)}


# Requests.


def _message_schemas(limits: Limits) -> dict[str, Schema]:
    text: Schema = {"type": "string"}
    if limits.max_content_chars is not None:
        text["maxLength"] = limits.max_content_chars
    content: Schema = {
        "anyOf": [text, _array(_ref("TextContentPart"), minItems=1)],
        "description": "A string, or text parts whose texts are joined.",
    }

    def role(name: str, description: str, properties: Schema, *required: str) -> Schema:
        return _object(
            {"role": _const(name), **properties},
            "role",
            *required,
            description=description,
        )

    return {
        "TextContentPart": _object(
            {"type": _const("text"), "text": text},
            "type",
            "text",
            description="Only text parts are served; other part types are a 400.",
        ),
        "SystemMessage": role(
            "system", "Instructions.", {"content": content, "name": _or_null(_NAME)}, "content"
        ),
        "DeveloperMessage": role(
            "developer", "Instructions.", {"content": content, "name": _or_null(_NAME)}, "content"
        ),
        "UserMessage": role(
            "user", "The user's turn.", {"content": content, "name": _or_null(_NAME)}, "content"
        ),
        "AssistantMessage": role(
            "assistant",
            "An earlier answer: content, tool calls, or both (not neither).",
            {
                "content": _or_null(content),
                "name": _or_null(_NAME),
                "refusal": _or_null(_STRING),
                "tool_calls": _or_null(_array(_ref("ToolCall"), minItems=1)),
                "function_call": _or_null(
                    _object({"name": _STRING, "arguments": _or_null(_STRING)}, "name")
                ),
            },
        ),
        "ToolMessage": role(
            "tool",
            "A tool's result; it answers a call of the assistant message just before.",
            {"content": content, "tool_call_id": _STRING},
            "content",
            "tool_call_id",
        ),
        "FunctionMessage": role(
            "function",
            "Deprecated: a function's result.",
            {"content": content, "name": _NAME},
            "content",
            "name",
        ),
    }


_ROLES = {
    "system": "SystemMessage",
    "developer": "DeveloperMessage",
    "user": "UserMessage",
    "assistant": "AssistantMessage",
    "tool": "ToolMessage",
    "function": "FunctionMessage",
}


def _request_schemas(limits: Limits) -> dict[str, Schema]:
    messages = _array(
        {
            "oneOf": [_ref(name) for name in _ROLES.values()],
            "discriminator": {
                "propertyName": "role",
                "mapping": {role: f"#/components/schemas/{name}" for role, name in _ROLES.items()},
            },
        },
        minItems=1,
    )
    if limits.max_messages is not None:
        messages["maxItems"] = limits.max_messages
    json_schema = _object(
        {
            "name": _NAME,
            "description": _or_null(_STRING),
            "schema": _or_null(_ANY_OBJECT),
            "strict": _or_null(_BOOLEAN),
        },
        "name",
    )
    parameters: Schema = {
        "model": {"type": "string", "description": "A model id from GET /models."},
        "messages": messages,
        "audio": _or_null(_ANY_OBJECT),
        "frequency_penalty": _or_null(_number(-2, 2)),
        "function_call": _or_null(
            {"anyOf": [_STRING, _ANY_OBJECT], "description": "Deprecated: see tool_choice."}
        ),
        "functions": _or_null(_array({}, minItems=1, description="Deprecated: see tools.")),
        "logit_bias": _or_null(
            {
                "type": "object",
                "propertyNames": {"pattern": "^[0-9]+$"},
                "additionalProperties": _number(-100, 100),
                "description": "Token ids, as strings, mapped to a bias.",
            }
        ),
        "logprobs": _or_null(_BOOLEAN),
        "max_completion_tokens": _or_null({"type": "integer", "minimum": 1}),
        "max_tokens": _or_null(
            {"type": "integer", "minimum": 1, "description": "max_completion_tokens wins."}
        ),
        "metadata": _or_null(
            {
                "type": "object",
                "maxProperties": 16,
                "additionalProperties": {"type": "string", "maxLength": 512},
            }
        ),
        "modalities": _or_null(_array({}, minItems=1)),
        "n": _or_null({"type": "integer", "minimum": 1, "maximum": 128}),
        "parallel_tool_calls": _or_null({**_BOOLEAN, "description": "Only with tools."}),
        "prediction": _or_null(_ANY_OBJECT),
        "presence_penalty": _or_null(_number(-2, 2)),
        "prompt_cache_key": _or_null(_STRING),
        "reasoning_effort": _or_null(_enum("none", "minimal", "low", "medium", "high")),
        "response_format": _or_null(_ref("ResponseFormat")),
        "safety_identifier": _or_null(_STRING),
        "seed": _or_null(_INTEGER),
        "service_tier": _or_null(_enum("auto", "default", "flex", "scale", "priority")),
        "stop": _or_null(
            {"anyOf": [_STRING, _array(_STRING, minItems=1, maxItems=4)]},
        ),
        "store": _or_null(_BOOLEAN),
        "stream": _or_null(_BOOLEAN),
        "stream_options": _or_null(
            _object(
                {"include_usage": _or_null(_BOOLEAN)},
                description="Only with stream: true.",
            )
        ),
        "temperature": _or_null(_number(0, 2)),
        "tool_choice": _or_null(
            {
                "anyOf": [
                    _enum("none", "auto", "required"),
                    _object(
                        {
                            "type": _FUNCTION_TYPE,
                            "function": _object({"name": _STRING}, "name"),
                        },
                        "type",
                        "function",
                    ),
                ],
                "description": "Only with tools; a named function must be one of them.",
            }
        ),
        "tools": _or_null(_array(_ref("Tool"), minItems=1, maxItems=128)),
        "top_logprobs": _or_null(
            {"type": "integer", "minimum": 0, "maximum": 20, "description": "Only with logprobs."}
        ),
        "top_p": _or_null(_number(0, 1)),
        "user": _or_null(_STRING),
        "verbosity": _or_null(_enum("low", "medium", "high")),
        "web_search_options": _or_null(_ANY_OBJECT),
    }
    return {
        "CreateChatCompletionRequest": _object(
            parameters,
            "model",
            "messages",
            additionalProperties=False,
            description=(
                "OpenAI's Chat Completions request. Unknown keys are a 400"
                " (`Unrecognized request argument supplied`); a response_format of"
                " json_object needs the word 'json' in some message."
            ),
        ),
        **_message_schemas(limits),
        "ToolCall": _object(
            {
                "id": _STRING,
                "type": _FUNCTION_TYPE,
                "function": _object({"name": _STRING, "arguments": _STRING}, "name", "arguments"),
            },
            "id",
            "type",
            "function",
        ),
        "Tool": _object(
            {
                "type": _FUNCTION_TYPE,
                "function": _object(
                    {
                        "name": _NAME,
                        "description": _or_null(_STRING),
                        "parameters": _or_null({**_ANY_OBJECT, "description": "A JSON Schema."}),
                        "strict": _or_null(_BOOLEAN),
                    },
                    "name",
                ),
            },
            "type",
            "function",
        ),
        "ResponseFormat": {
            "oneOf": [
                _object({"type": _const("text")}, "type"),
                _object({"type": _const("json_object")}, "type"),
                _object(
                    {"type": _const("json_schema"), "json_schema": json_schema},
                    "type",
                    "json_schema",
                ),
            ]
        },
    }


# Responses.


def _response_schemas() -> dict[str, Schema]:
    top_logprob = _object(
        {"token": _STRING, "logprob": {"type": "number"}, "bytes": _or_null(_array(_INTEGER))},
        "token",
        "logprob",
        "bytes",
    )
    token_logprob = _object(
        {**top_logprob["properties"], "top_logprobs": _array(top_logprob)},
        "token",
        "logprob",
        "bytes",
        "top_logprobs",
    )
    envelope = {
        "id": _STRING,
        "created": {"type": "integer", "description": "Unix seconds."},
        "model": {"type": "string", "description": "The model id as the client sent it."},
        "service_tier": _or_null(_STRING),
        "system_fingerprint": _or_null(_STRING),
    }
    finish_reason = _enum(*_FINISH_REASONS)
    return {
        "Error": _object(
            {
                "error": _object(
                    {
                        "message": _STRING,
                        "type": _STRING,
                        "param": _or_null(_STRING),
                        "code": _or_null(_STRING),
                    },
                    "message",
                    "type",
                    "param",
                    "code",
                    additionalProperties=False,
                )
            },
            "error",
            additionalProperties=False,
        ),
        "Logprobs": _object(
            {"content": _or_null(_array(token_logprob)), "refusal": _or_null(_array({}))},
            "content",
            "refusal",
        ),
        "CompletionUsage": _object(
            {
                "prompt_tokens": _INTEGER,
                "completion_tokens": _INTEGER,
                "total_tokens": _INTEGER,
                "prompt_tokens_details": _object(
                    {"cached_tokens": _INTEGER, "audio_tokens": _INTEGER}
                ),
                "completion_tokens_details": _object(
                    {
                        "reasoning_tokens": _INTEGER,
                        "audio_tokens": _INTEGER,
                        "accepted_prediction_tokens": _INTEGER,
                        "rejected_prediction_tokens": _INTEGER,
                    }
                ),
            },
            "prompt_tokens",
            "completion_tokens",
            "total_tokens",
        ),
        "ChatCompletion": _object(
            {
                **envelope,
                "object": _const("chat.completion"),
                "choices": _array(
                    _object(
                        {
                            "index": _INTEGER,
                            "message": _object(
                                {
                                    "role": _const("assistant"),
                                    "content": _or_null(_STRING),
                                    "refusal": _or_null(_STRING),
                                    "annotations": _array({}),
                                    "tool_calls": _array(_ref("ToolCall")),
                                },
                                "role",
                                "content",
                                "refusal",
                            ),
                            "logprobs": _or_null(_ref("Logprobs")),
                            "finish_reason": finish_reason,
                        },
                        "index",
                        "message",
                        "logprobs",
                        "finish_reason",
                    )
                ),
                "usage": _ref("CompletionUsage"),
            },
            *envelope,
            "object",
            "choices",
            "usage",
        ),
        "ChatCompletionChunk": _object(
            {
                **envelope,
                "object": _const("chat.completion.chunk"),
                "choices": _array(
                    _object(
                        {
                            "index": _INTEGER,
                            "delta": _object(
                                {
                                    "role": _const("assistant"),
                                    "content": _or_null(_STRING),
                                    "refusal": _or_null(_STRING),
                                    "tool_calls": _array(
                                        _object(
                                            {
                                                "index": _INTEGER,
                                                "id": _STRING,
                                                "type": _FUNCTION_TYPE,
                                                "function": _object(
                                                    {"name": _STRING, "arguments": _STRING}
                                                ),
                                            },
                                            "index",
                                        )
                                    ),
                                }
                            ),
                            "logprobs": _or_null(_ref("Logprobs")),
                            "finish_reason": _or_null(finish_reason),
                        },
                        "index",
                        "delta",
                        "logprobs",
                        "finish_reason",
                    ),
                    description="Empty in the final usage chunk.",
                ),
                "usage": _or_null(
                    {**_ref("CompletionUsage"), "description": "Only with include_usage."}
                ),
            },
            *envelope,
            "object",
            "choices",
        ),
        "ChatCompletionEvent": _object(
            {
                "data": {
                    "type": "string",
                    "if": {"const": "[DONE]"},
                    "else": {
                        "contentMediaType": "application/json",
                        "contentSchema": {
                            "anyOf": [_ref("ChatCompletionChunk"), _ref("Error")],
                        },
                    },
                }
            },
            "data",
            description=(
                "One event: a chunk, or one error after streaming began; the last is"
                " `data: [DONE]`."
            ),
        ),
        "Model": _object(
            {
                "id": _STRING,
                "object": _const("model"),
                "created": _INTEGER,
                "owned_by": _STRING,
            },
            "id",
            "object",
            "created",
            "owned_by",
        ),
        "ModelList": _object(
            {"object": _const("list"), "data": _array(_ref("Model"))},
            "object",
            "data",
        ),
    }


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


def _error_response(description: str) -> Schema:
    return {
        "description": description,
        "headers": {"x-request-id": {"$ref": "#/components/headers/RequestId"}},
        "content": {"application/json": {"schema": _ref("Error")}},
    }


def _ok(description: str, content: Schema) -> Schema:
    return {
        "description": description,
        "headers": {"x-request-id": {"$ref": "#/components/headers/RequestId"}},
        "content": content,
    }


def _errors(*statuses: str) -> dict[str, Schema]:
    return {status: _error_response(_ERRORS[status]) for status in statuses}


def openapi_document(
    *, server_url: str = "/v1", limits: Limits = NO_LIMITS, max_body_bytes: int | None = None
) -> dict[str, Any]:
    """The OpenAPI 3.1 document of the API served at ``server_url``.

    ``limits`` and ``max_body_bytes`` are the server's configured caps, so the
    document states the lengths it enforces.
    """
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
                        "content": {
                            "application/json": {"schema": _ref("CreateChatCompletionRequest")}
                        },
                    },
                    "responses": {
                        "200": _ok(
                            "A chat.completion, or with stream: true an event stream of"
                            " chat.completion.chunk objects ending with `data: [DONE]`.",
                            {
                                "application/json": {"schema": _ref("ChatCompletion")},
                                "text/event-stream": {"schema": _ref("ChatCompletionEvent")},
                            },
                        ),
                        **_errors("400", "401", "404", "413", "429", "500", "502", "503", "504"),
                    },
                }
            },
            "/models": {
                "get": {
                    "operationId": "listModels",
                    "summary": "The models the key may use.",
                    "responses": {
                        "200": _ok(
                            "The listed models.",
                            {"application/json": {"schema": _ref("ModelList")}},
                        ),
                        **_errors("401"),
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
                        "200": _ok("The model.", {"application/json": {"schema": _ref("Model")}}),
                        **_errors("401", "404"),
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
                    "schema": _STRING,
                }
            },
            "schemas": {**_request_schemas(limits), **_response_schemas()},
        },
    }
