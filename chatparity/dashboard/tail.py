"""The live tail: a compact summary of every finished request, sent to a channel layer group."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from channels.layers import InMemoryChannelLayer, get_channel_layer

from ..models import RequestLog

logger = logging.getLogger(__name__)

TAIL_PATH = "ws/chatparity/tail/"
GROUP = "chatparity.tail"
# The consumer method that receives it: LiveTailConsumer.tail_request.
MESSAGE_TYPE = "tail.request"
# A slow or unreachable layer (e.g. Redis down) must not hold up the request that finished.
PUBLISH_TIMEOUT = 1.0


def summary(row: RequestLog) -> dict[str, Any]:
    """What the tail shows of a request: no bodies, no key hash, no client details."""
    return {
        "time": row.created_at.isoformat() if row.created_at else None,
        "request_id": row.request_id,
        "key_prefix": row.key_prefix,
        "alias": row.alias,
        "status": row.status_code,
        "error_type": row.error_type,
        "stream": row.stream,
        "prompt_tokens": row.prompt_tokens,
        "completion_tokens": row.completion_tokens,
        "total_tokens": row.total_tokens,
        "duration_ms": round(row.duration_ms, 1),
        "ttft_ms": None
        if row.time_to_first_token_ms is None
        else round(row.time_to_first_token_ms, 1),
        "finish_reasons": list(row.finish_reasons),
        "cancelled": row.cancelled,
    }


def _nobody_watching(layer: Any) -> bool:
    """True when the layer is this process's memory and no tail is open on it: the
    summary would go nowhere. (Another layer's listeners cannot be seen from here.)"""
    return isinstance(layer, InMemoryChannelLayer) and not layer.groups.get(GROUP)


async def publish(row: RequestLog, **kwargs: Any) -> None:
    """Send ``row``'s summary to the tail's group; never raises, a no-op without a layer.

    A receiver of :data:`chatparity.signals.request_logged`, hence ``kwargs``."""
    try:
        layer = get_channel_layer()
        if layer is None or _nobody_watching(layer):
            return
        async with asyncio.timeout(PUBLISH_TIMEOUT):
            await layer.group_send(GROUP, {"type": MESSAGE_TYPE, "request": summary(row)})
    except Exception:
        logger.exception("Could not publish request %s to the live tail", row.request_id)
