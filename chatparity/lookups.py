"""What every request reads from the database, kept in process memory for at most
``CHATPARITY["CACHE_SECONDS"]``: the key presented and the aliases it may use.

A save or delete of a key, an alias or a backend in this process empties the
cache at once (see :func:`forget`, connected to the model signals). Changes
made by another process, and queryset ``update()`` calls, which send no
signal, take effect within ``CACHE_SECONDS``: that is how long a revoked key
may still be accepted by a worker that saw it just before.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from asgiref.sync import sync_to_async

from .conf import app_settings
from .db import reconnecting
from .models import ApiKey, ModelAlias

# Time as the cache sees it; tests move it forward.
clock = time.monotonic

# Distinct keys remembered at most (presented keys, found or not): a client
# trying random keys must not grow the cache without bound.
MAX_KEYS = 10_000


@dataclass(frozen=True, slots=True)
class Grant:
    """An active key and the aliases it may use (None: all of them)."""

    key: ApiKey
    allowed: frozenset[int] | None

    def may_use(self, alias: ModelAlias) -> bool:
        return self.allowed is None or alias.pk in self.allowed


@dataclass(frozen=True, slots=True)
class Aliases:
    """The enabled aliases, by lower-cased public id, each with its backend."""

    by_id: dict[str, ModelAlias]

    def find(self, model: str, grant: Grant, *, servable: bool = True) -> ModelAlias | None:
        """The alias ``model`` names (case-insensitively), if ``grant`` may use it
        and, when ``servable``, its backend is enabled."""
        alias = self.by_id.get(model.lower())
        if alias is None or not grant.may_use(alias):
            return None
        if servable and not alias.backend.enabled:
            return None
        return alias

    def listed(self, grant: Grant) -> list[ModelAlias]:
        """What ``/v1/models`` shows ``grant``, by public id."""
        shown = [a for a in self.by_id.values() if a.listed and grant.may_use(a)]
        return sorted(shown, key=lambda alias: alias.public_id)


_keys: dict[str, tuple[float, Grant | None]] = {}
_aliases: list[tuple[float, Aliases]] = []


def forget(*args: Any, **kwargs: Any) -> None:
    """Empty the cache (a signal receiver, hence the arguments it ignores)."""
    _keys.clear()
    _aliases.clear()


async def grant(hashed_key: str) -> Grant | None:
    """The active key whose SHA-256 is ``hashed_key``, or None."""
    now = clock()
    cached = _keys.get(hashed_key)
    if cached is not None and cached[0] > now:
        return cached[1]
    found = await sync_to_async(_load_grant)(hashed_key)
    if len(_keys) >= MAX_KEYS:
        _keys.clear()
    _keys[hashed_key] = (now + app_settings.CACHE_SECONDS, found)
    return found


@reconnecting
def _load_grant(hashed_key: str) -> Grant | None:
    key = ApiKey.objects.filter(hashed_key=hashed_key, is_active=True).first()
    if key is None:
        return None
    allowed = frozenset(key.allowed_aliases.values_list("pk", flat=True))
    return Grant(key, allowed or None)


async def aliases() -> Aliases:
    """The enabled aliases as of at most ``CACHE_SECONDS`` ago."""
    now = clock()
    if _aliases and _aliases[0][0] > now:
        return _aliases[0][1]
    loaded = await sync_to_async(_load_aliases)()
    _aliases[:] = [(now + app_settings.CACHE_SECONDS, loaded)]
    return loaded


@reconnecting
def _load_aliases() -> Aliases:
    rows = ModelAlias.objects.filter(enabled=True).select_related("backend")
    return Aliases({alias.public_id.lower(): alias for alias in rows})
