"""Short completions run from the admin: "try it" on an alias, "test connection" on a backend.

They go through the gateway's pipeline as an API request does
(:func:`chatparity.gateway.pipeline.start`: validation with the alias's defaults,
admission under the alias's limits, the backend and its fallbacks, the chunks)
and, since they may spend money upstream, each leaves a RequestLog row: with no
API key, the key prefix :data:`KEY_PREFIX` and the admin user named in the user
agent. No key's limits count them; the alias's own do, as for one more key.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from ..accounting.ledger import Accounting
from ..accounting.record import UsageRecord
from ..models import Backend, ModelAlias
from ..protocol.ids import request_id
from . import pipeline

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
    accounting = Accounting(
        UsageRecord(
            request_id=request_id(),
            key_prefix=KEY_PREFIX,
            user_agent=f"chatparity admin ({operator})",
        )
    )
    body: dict[str, Any] = {
        "model": alias.public_id or alias.backend.name,
        "messages": [{"role": "user", "content": prompt}],
        # Not max_tokens: an alias's default max_completion_tokens would win over it.
        "max_completion_tokens": max_tokens,
    }
    try:
        answer = await pipeline.start(body, accounting, alias=alias)
        completion = await answer.whole()
    except Exception as exc:
        error = accounting.fail(exc)
        row = await accounting.close()
        return Trial(label, ok=False, duration_ms=row.duration_ms, error=error.message)
    row = await accounting.close()
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
