"""HTTP/1.1 servers on loopback that tests script by hand, each in a thread of its own."""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
from collections.abc import Awaitable, Callable
from typing import Any

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


class Loopback:
    """A server on 127.0.0.1 that gives each connection to ``handle``: its :attr:`port`,
    and :meth:`stop`."""

    def __init__(self, handle: Handler) -> None:
        self.port = 0
        self._handle = handle
        started = threading.Event()
        threading.Thread(target=asyncio.run, args=(self._serve(started),), daemon=True).start()
        started.wait(5)

    async def _serve(self, started: threading.Event) -> None:
        server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        self.port = server.sockets[0].getsockname()[1]
        loop = asyncio.get_running_loop()
        self.stop = lambda: loop.call_soon_threadsafe(server.close)
        started.set()
        with contextlib.suppress(asyncio.CancelledError):
            async with server:
                await server.serve_forever()


async def read_request(reader: asyncio.StreamReader) -> tuple[str, Any]:
    """The path and the JSON body of the next request on a connection."""
    head = (await reader.readuntil(b"\r\n\r\n")).decode()
    length = next(
        int(line.split(":", 1)[1])
        for line in head.split("\r\n")
        if line.lower().startswith("content-length:")
    )
    return head.split(" ")[1], json.loads(await reader.readexactly(length))
