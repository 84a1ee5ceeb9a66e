"""Short completions run from the admin: "try it" on an alias, "test connection" on a backend.

They take the same path as an API request (validation, alias defaults, the
backend's events, the chunk encoder and accumulator) but are not API requests,
so they leave no RequestLog row.
"""

from __future__ import annotations

import json
import time
from contextlib import aclosing
from dataclasses import dataclass
from typing import Any

from .backends import get_backend
from .models import Backend, ModelAlias
from .protocol.completion import CompletionAccumulator
from .protocol.errors import APIError, as_api_error
from .protocol.events import TextDelta, ToolCallDelta
from .protocol.request import parse_chat_request
from .protocol.stream import ChunkEncoder

TRY_PROMPT = "Say hello in one short sentence."


@dataclass(frozen=True)
class Trial:
    """What one short completion did."""

    label: str
    ok: bool
    reply: str = ""
    finish_reason: str = ""
    prompt_tokens: int = 0
    completion_tokens: int = 0
    time_to_first_token_ms: float | None = None
    duration_ms: float = 0.0
    error: str = ""


async def try_alias(alias: ModelAlias, prompt: str = TRY_PROMPT, max_tokens: int = 64) -> Trial:
    """Send ``prompt`` through ``alias`` (with its default parameters)."""
    body = {
        **alias.default_params,
        "model": alias.public_id,
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": max_tokens,
    }
    body.pop("max_completion_tokens", None)
    return await _complete(alias.public_id, alias.backend, alias.model, body)


async def check_connection(backend: Backend) -> Trial:
    """A one-token completion on ``backend``, with the model of its first alias."""
    alias = await backend.aliases.order_by("pk").afirst()
    model = alias.model if alias else ""
    body = {"model": model or backend.name, "messages": [{"role": "user", "content": "Hi"}]}
    return await _complete(backend.name, backend, model, {**body, "max_tokens": 1})


async def _complete(label: str, row: Backend, model: str, body: dict[str, Any]) -> Trial:
    started = time.perf_counter()
    first_token: float | None = None
    try:
        request = parse_chat_request(body)
        backend = get_backend(row)
        accumulator = CompletionAccumulator()
        encoder: ChunkEncoder | None = None
        async with aclosing(backend.stream(request, model)) as events:  # type: ignore[type-var]
            async for event in events:
                if first_token is None and isinstance(event, TextDelta | ToolCallDelta):
                    first_token = time.perf_counter()
                if encoder is None:
                    encoder = ChunkEncoder(
                        completion_id="chatcmpl-try",
                        created=int(time.time()),
                        model=request.model,
                        system_fingerprint=backend.system_fingerprint,
                        include_usage=True,
                    )
                for chunk in encoder.encode(event):
                    accumulator.add(chunk)
    except Exception as exc:
        error: APIError = as_api_error(exc)
        return Trial(label, ok=False, duration_ms=_since(started), error=error.message)
    completion = accumulator.completion()
    choice = completion["choices"][0] if completion["choices"] else {}
    message = choice.get("message", {})
    usage = completion.get("usage") or {}
    return Trial(
        label,
        ok=True,
        reply=message.get("content") or json.dumps(message.get("tool_calls") or []),
        finish_reason=choice.get("finish_reason") or "",
        prompt_tokens=usage.get("prompt_tokens", 0),
        completion_tokens=usage.get("completion_tokens", 0),
        time_to_first_token_ms=None if first_token is None else _since(started, first_token),
        duration_ms=_since(started),
    )


def _since(started: float, until: float | None = None) -> float:
    return round(((until or time.perf_counter()) - started) * 1000, 1)
