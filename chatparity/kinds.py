"""Backend kinds: ``CHATPARITY["BACKEND_CLASSES"]`` resolved by dotted path, and what
a Backend row of a kind must hold, as the kind's class checks it."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, cast

from django.utils.module_loading import import_string

from .conf import app_settings

if TYPE_CHECKING:
    from .backends.base import ChatBackend


def kinds() -> list[str]:
    """The configured kinds, sorted."""
    return sorted(app_settings.BACKEND_CLASSES)


def backend_class(kind: str) -> type[ChatBackend]:
    return cast("type[ChatBackend]", import_string(app_settings.BACKEND_CLASSES[kind]))


def config_errors(kind: str, base_url: str, options: Any) -> dict[str, str]:
    """What is wrong with a Backend row of ``kind``, by field (none: nothing), as the
    kind's class checks it (``check_base_url`` and ``check_options``, see
    :class:`~chatparity.backends.base.ChatBackend`)."""
    if kind not in app_settings.BACKEND_CLASSES:
        configured = ", ".join(kinds())
        return {"kind": f'{kind!r} is not a kind in CHATPARITY["BACKEND_CLASSES"] ({configured}).'}
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


def price_provider(kind: str, options: Any) -> str | None:
    """The provider whose prices a Backend row of ``kind`` with ``options`` bills by
    (``"anthropic"``, ``"openai"``), as the kind's class says (``price_provider(options)``,
    see :class:`~chatparity.backends.base.ChatBackend`); None for a kind that says none
    or is not configured."""
    try:
        cls = backend_class(kind)
    except (KeyError, ImportError):
        return None
    provider: Callable[[Any], str | None] | None = getattr(cls, "price_provider", None)
    return provider(options) if provider is not None and isinstance(options, dict) else None
