"""The documented import path of the ASGI fast path: ``chatparity.asgi.FastPath``."""

from .transport.fastpath import FastPath

__all__ = ["FastPath"]
