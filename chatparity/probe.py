"""Short completions run from the admin: "try it" on an alias, "test connection" on a backend.

They take the gateway's path from the parsed request on (the alias's defaults,
limits and fallbacks, the backend's events, the chunk encoder) and, since they
may spend money upstream, each leaves a RequestLog row as an API request does:
with no API key, the key prefix :data:`KEY_PREFIX` and the admin user named in
the user agent.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import Any

from . import gateway
from .lookups import Grant
from .models import ApiKey, Backend, ModelAlias
from .protocol.completion import CompletionAccumulator
from .protocol.errors import APIError, as_api_error
from .protocol.request import parse_chat_request
from .protocol.stream import ChunkEncoder
from .usage import UsageRecord, record_usage

TRY_PROMPT = "Say hello in one short sentence."
# In the log's key_prefix column, where an API request has its key's prefix.
KEY_PREFIX = "admin"


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


async def try_alias(
    alias: ModelAlias, operator: str, prompt: str = TRY_PROMPT, max_tokens: int = 64
) -> Trial:
    """Send ``prompt`` through ``alias`` (its default parameters and fallbacks) for
    the admin user named ``operator``."""
    return await _complete(alias.public_id, alias, operator, prompt, max_tokens)


async def check_connection(backend: Backend, operator: str) -> Trial:
    """A one-token completion on ``backend`` alone, with the model of its first alias."""
    alias = await backend.aliases.order_by("pk").afirst() or ModelAlias()
    alias.backend, alias.fallbacks = backend, []  # this backend, not the alias's fallbacks
    return await _complete(backend.name, alias, operator, "Hi", 1)


async def _complete(
    label: str, alias: ModelAlias, operator: str, prompt: str, max_tokens: int
) -> Trial:
    key = _operator_key(operator)
    record = UsageRecord(
        request_id=gateway.request_id(), api_key=key, user_agent=f"chatparity admin ({operator})"
    )
    body: dict[str, Any] = {
        "model": alias.public_id or alias.backend.name,
        "messages": [{"role": "user", "content": prompt}],
        # Not max_tokens: an alias's default max_completion_tokens would win over it.
        "max_completion_tokens": max_tokens,
    }
    accumulator = CompletionAccumulator()
    error: APIError | None = None
    try:
        chat = parse_chat_request(body)
        chat, backend, events, first = await gateway._start(
            chat, body, alias, Grant(key, None), record
        )
        record.completion_id = gateway.completion_id()
        encoder = ChunkEncoder(
            completion_id=record.completion_id,
            created=int(time.time()),
            model=chat.model,
            system_fingerprint=backend.system_fingerprint,
            include_usage=True,
        )
        async for chunk in gateway._chunks(first, events, encoder, record):
            accumulator.add(chunk)
    except Exception as exc:
        error = as_api_error(exc)
        record.fail(error)
    row = await record_usage(record)
    if error is not None:
        return Trial(label, ok=False, duration_ms=row.duration_ms, error=error.message)
    completion = accumulator.completion()
    choice = completion["choices"][0] if completion["choices"] else {}
    message = choice.get("message", {})
    return Trial(
        label,
        ok=True,
        reply=message.get("content") or json.dumps(message.get("tool_calls") or []),
        finish_reason=choice.get("finish_reason") or "",
        prompt_tokens=row.prompt_tokens,
        completion_tokens=row.completion_tokens,
        time_to_first_token_ms=row.time_to_first_token_ms,
        duration_ms=row.duration_ms,
    )


def _operator_key(operator: str) -> ApiKey:
    """What the log row takes for its key: never saved, so the row's api_key is null."""
    return ApiKey(name=f"admin user {operator}", prefix=KEY_PREFIX)
