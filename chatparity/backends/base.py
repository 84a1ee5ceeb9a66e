"""The one small protocol every backend implements."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any, Protocol

from ..protocol.events import Event
from ..protocol.request import ChatRequest


@dataclass(frozen=True, slots=True)
class BackendConfig:
    """A backend's settings, detached from the database row they came from."""

    name: str
    kind: str
    base_url: str = ""
    secret: str = field(default="", repr=False)  # never in tracebacks or debug pages
    options: dict[str, Any] = field(default_factory=dict)
    timeout: float = 600.0


class ChatBackend(Protocol):
    """Produces normalized events for a validated request.

    ``stream`` is an async generator. Anything wrong that can be known before
    the first event (a prompt too long, an upstream refusing) is raised as
    :class:`~chatparity.protocol.errors.APIError` before the first event, so
    the client gets a real HTTP status. Closing or cancelling the generator
    must stop the work behind it at once.

    ``model`` is the serving alias's model. A backend that passes parameters on
    to another server passes the client's sampling and format parameters from
    ``request.body`` and others only when named in ``request.forwarded_params``
    (the alias's choice, never the client's).
    """

    config: BackendConfig

    def __init__(self, config: BackendConfig) -> None: ...

    @property
    def system_fingerprint(self) -> str: ...

    def stream(self, request: ChatRequest, model: str) -> AsyncIterator[Event]: ...
