"""WebSocket consumers: the usage dashboard's live tail of requests."""

from __future__ import annotations

from typing import Any

from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncJsonWebsocketConsumer

from .admin import can_view_usage
from .tail import GROUP


class LiveTailConsumer(AsyncJsonWebsocketConsumer):  # type: ignore[misc]
    """Streams a summary of every finished request to staff who may see the usage dashboard."""

    joined = False

    async def connect(self) -> None:
        user = self.scope.get("user")
        allowed = user is not None and await database_sync_to_async(can_view_usage)(user)
        if not allowed or self.channel_layer is None:
            # Closing before accepting rejects the handshake (HTTP 403).
            await self.close()
            return
        await self.channel_layer.group_add(GROUP, self.channel_name)
        self.joined = True
        await self.accept()

    async def disconnect(self, code: int) -> None:
        if self.joined:
            await self.channel_layer.group_discard(GROUP, self.channel_name)

    async def receive(self, text_data: str | None = None, bytes_data: bytes | None = None) -> None:
        """The tail only talks; whatever the client sends is ignored."""

    async def tail_requests(self, event: dict[str, Any]) -> None:
        """Requests finished (``tail.publish``): forward each one's summary."""
        for request in event["requests"]:
            await self.send_json({"type": "request", "request": request})
