"""Backends by kind, resolved through ``CHATPARITY["BACKEND_CLASSES"]``."""

from __future__ import annotations

from typing import TYPE_CHECKING

from django.core.exceptions import ImproperlyConfigured

from ..kinds import backend_class, config_errors
from .base import BackendConfig, ChatBackend

if TYPE_CHECKING:
    from ..models import Backend

_instances: dict[tuple[int, object], ChatBackend] = {}


def get_backend(row: Backend) -> ChatBackend:
    """The live backend for a database row, reused until the row changes."""
    key = (row.pk, row.updated_at)
    backend = _instances.get(key)
    if backend is None:
        for stale in [k for k in _instances if k[0] == row.pk]:
            del _instances[stale]
        config = BackendConfig(
            name=row.name,
            kind=row.kind,
            base_url=row.base_url,
            secret=row.secret,
            options=dict(row.options),
            timeout=row.timeout,
        )
        try:
            backend = _instances[key] = backend_class(row.kind)(config)
        except ValueError as exc:  # its options, refused by check_options
            raise ImproperlyConfigured(f"backend {row.name!r}: {exc}") from None
    return backend


def serves_chat(row: Backend) -> bool:
    """Whether the backend of ``row`` serves the chat endpoints (it streams events)."""
    return hasattr(get_backend(row), "stream")


def serves_embeddings(row: Backend) -> bool:
    """Whether the backend of ``row`` serves ``/v1/embeddings`` (it embeds)."""
    return hasattr(get_backend(row), "embed")


__all__ = [
    "BackendConfig",
    "ChatBackend",
    "backend_class",
    "config_errors",
    "get_backend",
    "serves_chat",
    "serves_embeddings",
]
