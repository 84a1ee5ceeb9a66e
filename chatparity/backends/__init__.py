"""Backends by kind, resolved through ``CHATPARITY["BACKEND_CLASSES"]``."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, cast

from django.core.exceptions import ImproperlyConfigured
from django.utils.module_loading import import_string

from ..conf import app_settings
from .base import BackendConfig, ChatBackend

if TYPE_CHECKING:
    from ..models import Backend

_instances: dict[tuple[int, object], ChatBackend] = {}


def backend_class(kind: str) -> type[ChatBackend]:
    return cast("type[ChatBackend]", import_string(app_settings.BACKEND_CLASSES[kind]))


def config_errors(kind: str, base_url: str, options: Any) -> dict[str, str]:
    """What is wrong with a Backend row of ``kind``, by field (none: nothing), as the
    kind's class checks it (``check_base_url`` and ``check_options``, see
    :class:`~.base.ChatBackend`)."""
    if kind not in app_settings.BACKEND_CLASSES:
        kinds = ", ".join(sorted(app_settings.BACKEND_CLASSES))
        return {"kind": f'{kind!r} is not a kind in CHATPARITY["BACKEND_CLASSES"] ({kinds}).'}
    try:
        cls = backend_class(kind)
    except ImportError as exc:
        return {"kind": f"The class serving {kind!r} backends cannot be imported: {exc}"}
    if not isinstance(options, dict):
        return {"options": "Options must be a JSON object."}
    errors = {}
    for field, value in (("base_url", base_url), ("options", options)):
        check: Callable[[Any], None] | None = getattr(cls, f"check_{field}", None)
        try:
            if check is not None:
                check(value)
        except ValueError as exc:
            errors[field] = str(exc)
    return errors


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


__all__ = ["BackendConfig", "ChatBackend", "backend_class", "config_errors", "get_backend"]
