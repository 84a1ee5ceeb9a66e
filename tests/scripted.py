"""A backend that replays a script from its options: the test double for failure paths.

Real backends are tested against the real model and real upstreams; this one
makes a backend fail at an exact point, which real programs cannot be asked to.
"""

import asyncio
from collections.abc import AsyncIterator

from chatparity.backends.base import BackendConfig
from chatparity.protocol.errors import APIError
from chatparity.protocol.events import Event, Finish, TextDelta, Usage
from chatparity.protocol.request import ChatRequest

# CHATPARITY settings that add the "scripted" backend kind.
SCRIPTED = {"BACKEND_CLASSES": {"scripted": "tests.scripted.ScriptedBackend"}}


class ScriptedBackend:
    """``options["script"]``: a list of text pieces, ``"<fail>"``, ``"<error>"`` or ``"<hang>"``."""

    system_fingerprint = "fp_scripted"

    def __init__(self, config: BackendConfig) -> None:
        self.config = config

    async def stream(self, request: ChatRequest, model: str) -> AsyncIterator[Event]:
        sent = 0
        for step in self.config.options.get("script", []):
            if step == "<fail>":
                raise RuntimeError("backend crashed")
            if step == "<error>":
                raise APIError("upstream refused", status=502, type="server_error", code="bad")
            if step == "<hang>":
                await asyncio.Event().wait()
            sent += 1
            yield TextDelta(0, step)
        yield Finish(0, "stop")
        yield Usage(prompt_tokens=1, completion_tokens=sent)
