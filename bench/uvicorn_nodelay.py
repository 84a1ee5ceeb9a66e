"""uvicorn with its multi-worker TCP_NODELAY bug worked around (bench variant only).

With ``--workers N`` uvicorn binds the listening socket itself with ``proto``
0, so asyncio never sets TCP_NODELAY on accepted connections and each
keep-alive response written in two parts waits for the client's delayed ACK
(~40 ms on Linux; https://github.com/Kludex/uvicorn/issues/3149). This
wrapper re-wraps that socket as IPPROTO_TCP, then runs uvicorn's CLI:

    python bench/uvicorn_nodelay.py project.asgi:application --workers 2 ...
"""

from __future__ import annotations

import socket
import sys

import uvicorn.config
from uvicorn.main import main

_bind_socket = uvicorn.config.Config.bind_socket


def bind_socket(self: uvicorn.config.Config) -> socket.socket:
    """uvicorn's socket, marked as TCP so that asyncio sets TCP_NODELAY on connections."""
    sock = _bind_socket(self)
    if sock.family in (socket.AF_INET, socket.AF_INET6) and sock.proto == 0:
        sock = socket.socket(sock.family, sock.type, socket.IPPROTO_TCP, fileno=sock.detach())
        sock.set_inheritable(True)
    return sock


uvicorn.config.Config.bind_socket = bind_socket  # type: ignore[method-assign]

if __name__ == "__main__":
    sys.exit(main())
