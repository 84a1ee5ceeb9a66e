"""The live tail: a compact summary of every finished request, sent to a channel layer group.

A finished request only queues its summary: one task per event loop sends the
queue to the layer, what it holds at a time as one message, so a worker holds one of
the layer's connections for the tail however many requests end at once (a burst of
500 concurrent sends took 200 connections per worker and failed most of them), and
the requests of a busy worker cost the layer a message per batch, not one each (on
Redis a group send is two commands, even with no tail open). What the queue or the
layer cannot take is dropped and counted (:data:`publisher`), and logged at most
once per ``LOG_INTERVAL``.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections import deque
from typing import Any

from channels.layers import InMemoryChannelLayer, get_channel_layer

from ..models import RequestLog

logger = logging.getLogger(__name__)

TAIL_PATH = "ws/chatparity/tail/"
GROUP = "chatparity.tail"
# The consumer method that receives it: LiveTailConsumer.tail_requests.
MESSAGE_TYPE = "tail.requests"
# Seconds one summary may take to send: a slow or unreachable layer (e.g. Redis
# down) drops it rather than holding up the ones behind it.
PUBLISH_TIMEOUT = 1.0
# Summaries waiting to be sent, per event loop: past this many, new ones are dropped.
MAX_QUEUED = 1000
# Summaries in one message at most.
MAX_BATCH = 100
# Seconds between two log lines about dropped summaries.
LOG_INTERVAL = 60.0


def summary(row: RequestLog) -> dict[str, Any]:
    """What the tail shows of a request: no bodies, no key hash, no client details."""
    return {
        "time": row.created_at.isoformat() if row.created_at else None,
        "request_id": row.request_id,
        "endpoint": row.endpoint,
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


class Publisher:
    """Sends the tail's summaries to the channel layer in the background: a bounded
    queue per event loop, drained by one task while it has any, what is queued at a time
    sent as one message (of at most ``MAX_BATCH``)."""

    def __init__(self) -> None:
        self.sent = 0
        """Summaries the layer took."""
        self.dropped = 0
        """Summaries lost: the queue was full, or the layer failed or was too slow."""
        self._queues: dict[asyncio.AbstractEventLoop, deque[dict[str, Any]]] = {}
        self._drains: dict[asyncio.AbstractEventLoop, asyncio.Task[None]] = {}
        self._unlogged = 0  # dropped since the last log line
        self._logged_at = -math.inf

    def put(self, summary: dict[str, Any]) -> None:
        """Queue a request's ``summary`` for the group; at once, without waiting."""
        loop = asyncio.get_running_loop()
        queue = self._queues.get(loop)
        if queue is None:
            queue = self._queues[loop] = deque()
            self._drains[loop] = loop.create_task(self._drain(loop, queue))
        if len(queue) >= MAX_QUEUED:
            self._drop("the queue is full")
        else:
            queue.append(summary)

    async def drained(self) -> None:
        """Wait until what this event loop queued is sent or dropped."""
        drain = self._drains.get(asyncio.get_running_loop())
        if drain is not None:
            await asyncio.shield(drain)

    async def _drain(self, loop: asyncio.AbstractEventLoop, queue: deque[dict[str, Any]]) -> None:
        try:
            while queue:
                batch = [queue.popleft() for _ in range(min(len(queue), MAX_BATCH))]
                message = {"type": MESSAGE_TYPE, "requests": batch}
                try:
                    async with asyncio.timeout(PUBLISH_TIMEOUT):
                        await get_channel_layer().group_send(GROUP, message)
                except Exception as exc:
                    self._drop(repr(exc), len(batch))
                else:
                    self.sent += len(batch)
        finally:  # the loop is empty (no await since the last check), or it is closing
            self.dropped += len(queue)
            del self._queues[loop], self._drains[loop]

    def _drop(self, reason: str, count: int = 1) -> None:
        self.dropped += count
        self._unlogged += count
        now = time.monotonic()
        if now - self._logged_at >= LOG_INTERVAL:
            logger.warning(
                "chatparity: %d live tail message(s) dropped (%s; %d in all)",
                self._unlogged,
                reason,
                self.dropped,
            )
            self._unlogged, self._logged_at = 0, now


publisher = Publisher()
"""This process's publisher of the live tail."""


async def publish(row: RequestLog, **kwargs: Any) -> None:
    """Queue ``row``'s summary for the tail's group, without waiting for the layer; a
    no-op without a layer or, on an in-memory layer, without a tail open.

    A receiver of :data:`chatparity.signals.request_logged`, hence ``kwargs``."""
    layer = get_channel_layer()
    if layer is None or _nobody_watching(layer):
        return
    publisher.put(summary(row))
