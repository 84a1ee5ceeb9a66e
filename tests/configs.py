"""Backend and alias rows the admin and the management API refuse, and some they save:
the tables the model, admin and API tests run through.

Each refusal is ``(fields, field, words)``: the row's fields over a valid row, the
field the error is shown on, words of its message. Aliases are checked beside an
alias ``spare`` on a ``local`` backend.
"""

import pytest

UPSTREAM = {"kind": "openai", "base_url": "https://api.example.com/v1"}


def cases(table):
    """``table`` (id -> case) as pytest parameters."""
    return [pytest.param(*case, id=name) for name, case in table.items()]


BAD_BACKENDS = cases(
    {
        "openai without a URL": ({"kind": "openai"}, "base_url", "needs the URL of its server"),
        "openai on ftp": (
            {**UPSTREAM, "base_url": "ftp://example.com/v1"},
            "base_url",
            "Use an http:// or https:// URL",
        ),
        "credentials in the URL": (
            {**UPSTREAM, "base_url": "https://user:sk-x@example.com/v1"},
            "base_url",
            "Put no credentials in the URL",
        ),
        "a query in the URL": (
            {**UPSTREAM, "base_url": "https://example.com/v1?key=x"},
            "base_url",
            "no query or fragment",
        ),
        "a bare ? ending the URL": (
            {**UPSTREAM, "base_url": "https://example.com/v1?"},
            "base_url",
            "no query or fragment",
        ),
        "a bare # ending the URL": (
            {**UPSTREAM, "base_url": "https://example.com/v1#"},
            "base_url",
            "no query or fragment",
        ),
        "local with a URL": (
            {"kind": "local", "base_url": "https://example.com/v1"},
            "base_url",
            "leave the base URL blank",
        ),
        "options not an object": ({"options": ["n_ctx"]}, "options", "must be a JSON object"),
        "unknown openai option": (
            {**UPSTREAM, "options": {"retry": 3}},
            "options",
            "Unknown option(s) 'retry'",
        ),
        "retries as text": (
            {**UPSTREAM, "options": {"retries": "3"}},
            "options",
            "'retries' must be an integer from 0 to 10, not '3'",
        ),
        "retries as a boolean": (
            {**UPSTREAM, "options": {"retries": True}},
            "options",
            "'retries' must be an integer",
        ),
        "negative retries": (
            {**UPSTREAM, "options": {"retries": -1}},
            "options",
            "'retries' must be an integer from 0 to 10",
        ),
        "backoff of minutes": (
            {**UPSTREAM, "options": {"backoff": 61}},
            "options",
            "'backoff' must be a number from 0 to 60",
        ),
        "no connect timeout": (
            {**UPSTREAM, "options": {"connect_timeout": 0}},
            "options",
            "'connect_timeout' must be a number",
        ),
        "pass_error_text as text": (
            {**UPSTREAM, "options": {"pass_error_text": "yes"}},
            "options",
            "'pass_error_text' must be true or false",
        ),
        "headers as a list": (
            {**UPSTREAM, "options": {"headers": ["X-Team: a"]}},
            "options",
            "'headers' must map header names to values",
        ),
        "a header name with a space": (
            {**UPSTREAM, "options": {"headers": {"X Team": "a"}}},
            "options",
            "'X Team' is not a header a backend may set",
        ),
        "a framing header": (
            {**UPSTREAM, "options": {"headers": {"Content-Length": "5"}}},
            "options",
            "'Content-Length' is not a header a backend may set",
        ),
        "a header value on two lines": (
            {**UPSTREAM, "options": {"headers": {"X-Team": "a\r\nX-Admin: 1"}}},
            "options",
            "the value of 'X-Team' must be text without control characters",
        ),
        "unknown local option": (
            {"options": {"n_gpu_layers": 10}},
            "options",
            "Unknown option(s) 'n_gpu_layers'",
        ),
        "no context": ({"options": {"n_ctx": 0}}, "options", "'n_ctx' must be an integer"),
        "contexts as text": ({"options": {"contexts": "2"}}, "options", "'contexts' must be"),
        "half a thread": ({"options": {"n_threads": 2.5}}, "options", "'n_threads' must be"),
        "a prompt cache below nothing": (
            {"options": {"prompt_cache_bytes": -1}},
            "options",
            "'prompt_cache_bytes' must be an integer from 0",
        ),
        "model_path a number": (
            {"options": {"model_path": 5}},
            "options",
            "'model_path' must be the path of a GGUF file",
        ),
        "no timeout": ({"timeout": 0}, "timeout", "more than 0"),
    }
)

GOOD_BACKENDS = [
    pytest.param({"kind": "local"}, id="local"),
    pytest.param(
        {
            "kind": "local",
            "options": {
                "model_path": "/models/a.gguf",
                "n_ctx": 4096,
                "contexts": 1,
                "prompt_cache_bytes": 0,
            },
        },
        id="local with options",
    ),
    pytest.param({"kind": "local", "options": {"n_threads": None}}, id="local, threads unset"),
    pytest.param({**UPSTREAM}, id="openai"),
    pytest.param({**UPSTREAM, "base_url": "http://127.0.0.1:8080/v1"}, id="openai on loopback"),
    pytest.param(
        {
            **UPSTREAM,
            "options": {
                "retries": 0,
                "backoff": 0.5,
                "connect_timeout": 3,
                "pass_error_text": True,
                "headers": {"OpenAI-Organization": "org-1"},
            },
        },
        id="openai with options",
    ),
]

BAD_ALIASES = cases(
    {
        "a default out of range": (
            {"default_params": {"temperature": 3}},
            "default_params",
            "Invalid 'temperature': decimal above maximum value. Expected a value <= 2",
        ),
        "a misspelt default": (
            {"default_params": {"max_tokns": 5}},
            "default_params",
            "Unrecognized request argument supplied: max_tokns",
        ),
        "a default that needs another": (
            {"default_params": {"top_logprobs": 2}},
            "default_params",
            "only allowed when 'logprobs' is enabled",
        ),
        "stream as a default": (
            {"default_params": {"stream": True}},
            "default_params",
            "'stream': the request's own, never a default",
        ),
        "a default model": ({"default_params": {"model": "x"}}, "default_params", "'model'"),
        "default messages": ({"default_params": {"messages": []}}, "default_params", "'messages'"),
        "defaults as a list": (
            {"default_params": ["max_tokens"]},
            "default_params",
            "Give an object of request parameters",
        ),
        "a fallback that does not exist": (
            {"fallbacks": ["spare", "nowhere"]},
            "fallbacks",
            "No alias is named 'nowhere'",
        ),
        "falling back to itself": (
            {"fallbacks": ["NEW"]},
            "fallbacks",
            "'NEW' is this alias: it cannot fall back to itself",
        ),
        "a fallback twice": (
            {"fallbacks": ["spare", "Spare"]},
            "fallbacks",
            "'spare' is listed twice",
        ),
        "fallbacks as text": ({"fallbacks": "spare"}, "fallbacks", "List the public ids"),
        "forwarding what always is": (
            {"forwarded_params": ["service_tier", "temperature"]},
            "forwarded_params",
            "'temperature' is always forwarded",
        ),
        "forwarding the backend's own": (
            {"forwarded_params": ["stream"]},
            "forwarded_params",
            "'stream' is set by the backend itself",
        ),
        "forwarding a misspelt parameter": (
            {"forwarded_params": ["servce_tier"]},
            "forwarded_params",
            "'servce_tier' is not a Chat Completions request parameter",
        ),
        "forwarded as text": (
            {"forwarded_params": "store"},
            "forwarded_params",
            "List the names of request parameters",
        ),
        "no choices": ({"max_n": 0}, "max_n", "from 1 to 128"),
        "more choices than OpenAI's": ({"max_n": 129}, "max_n", "from 1 to 128"),
        "a cache kept longer than MAX_TTL": (
            {"response_cache": {"enabled": True, "ttl": 7 * 24 * 3600 + 1}},
            "response_cache",
            "'ttl' is a whole number of seconds from 1 to 604800",
        ),
        "a misspelt cache option": (
            {"response_cache": {"enabled": True, "tool_call": True}},
            "response_cache",
            "Unknown option 'tool_call'",
        ),
        "a semantic cache embedded by no alias": (
            {"response_cache": {"enabled": True, "semantic": {"embeddings": "nowhere"}}},
            "response_cache",
            "No alias is named 'nowhere' (semantic.embeddings)",
        ),
    }
)

GOOD_ALIAS = {
    "default_params": {
        "max_tokens": 256,
        "reasoning_effort": "high",
        "response_format": {"type": "json_object"},
    },
    "fallbacks": ["SPARE"],
    "forwarded_params": ["service_tier", "store", "metadata"],
    "max_n": 128,
    "response_cache": {
        "enabled": True,
        "ttl": 600,
        "scope": "key",
        "semantic": {"threshold": 0.95, "embeddings": "spare"},
    },
}
