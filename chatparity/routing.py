"""WebSocket routes; ``project.asgi`` mounts them behind AuthMiddlewareStack."""

from django.urls import path

from .consumers import LiveTailConsumer
from .tail import TAIL_PATH

websocket_urlpatterns = [
    path(TAIL_PATH, LiveTailConsumer.as_asgi(), name="chatparity-tail"),
]
