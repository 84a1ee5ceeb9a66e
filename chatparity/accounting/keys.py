"""What every request reads from the database, kept in process memory for at most
``CHATPARITY["CACHE_SECONDS"]``: the key presented, its owner's plan, and the
aliases it may use (those of the key that its owner's plan allows).

A key serves while it is active and so is its owner (``is_active``, as Django's
logins read it): deactivating a user stops their keys too. A key that needs a plan
(``ApiKey.needs_plan``: those made in the portal) serves only while its owner has one,
never wider once the plan is gone.

A save or delete of a key, an alias, a backend or a plan, or a change of who is in
a group, in this process empties the cache at once (see :func:`forget`, connected to
the model signals). Changes made by another process, and queryset ``update()``
calls, which send no signal, take effect within ``CACHE_SECONDS``: that is how long
a revoked key may still be accepted by a worker that saw it just before.

While the database is unreachable, what a worker last read is served for up to
``CHATPARITY["STALE_SECONDS"]`` (the database asked again about once a second),
so known keys keep working; anything it never read gets a 503.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from asgiref.sync import sync_to_async
from django.contrib.auth import get_user_model
from django.core.exceptions import FieldDoesNotExist
from django.db import DatabaseError
from django.db.models import Prefetch, Q

from .. import signals
from ..conf import app_settings
from ..models import ApiKey, Deployment, ModelAlias, Plan
from ..protocol import errors
from . import deployments
from .batching import OncePerInterval, PerLoop, detached, reconnecting

logger = logging.getLogger(__name__)

# Time as the cache sees it; tests move it forward.
clock = time.monotonic

# Distinct keys remembered at most, of those found and apart of those not found, the
# least recently used forgotten first: a client trying random keys neither grows the
# cache without bound nor pushes out the keys that are in use.
MAX_KEYS = 10_000

# Seconds between two tries of an unreachable database by the requests of one entry.
RETRY_SECONDS = 1.0

_outage_log = OncePerInterval(logger)


@dataclass(frozen=True, slots=True)
class Grant:
    """An active key (with its owner's plan) and the aliases it may use: those of the key
    that the plan allows (None: all of them; an empty set: none)."""

    key: ApiKey
    allowed: frozenset[int] | None

    def may_use(self, alias: ModelAlias) -> bool:
        return self.allowed is None or alias.pk in self.allowed


@dataclass(frozen=True, slots=True)
class Aliases:
    """The enabled aliases, by lower-cased public id, each with its backend and its
    deployments."""

    by_id: dict[str, ModelAlias]

    def find(self, model: str, grant: Grant | None, *, servable: bool = True) -> ModelAlias | None:
        """The alias ``model`` names (case-insensitively), if ``grant`` may use it (no
        grant: an admin's trial, which may use every alias) and, when ``servable``,
        a deployment of it may serve (enabled, on an enabled backend)."""
        alias = self.by_id.get(model.lower())
        if alias is None or (grant is not None and not grant.may_use(alias)):
            return None
        if servable and not deployments.serving(alias):
            return None
        return alias

    def listed(self, grant: Grant) -> list[ModelAlias]:
        """What ``/v1/models`` shows ``grant``, by public id."""
        shown = [a for a in self.by_id.values() if a.listed and grant.may_use(a)]
        return sorted(shown, key=lambda alias: alias.public_id)


Entry = tuple[float, float, Any]
"""(fresh until, loaded at, value): a key's grant under its hash, the aliases under ""."""
# What was found, and apart what was not (a key that is no key: None), least recently
# used first.
_entries: OrderedDict[str, Entry] = OrderedDict()
_missing: OrderedDict[str, Entry] = OrderedDict()
# Loads in progress, per event loop: the requests that find an entry expired at
# the same moment wait for one database query, not one each.
_loading: PerLoop[dict[str, asyncio.Task[Any]]] = PerLoop(dict)
_ALIASES = ""
# Bumped by forget(): a load that began before a change must not store what it read.
_generation = [0]


def forget(*args: Any, **kwargs: Any) -> None:
    """Empty the cache (a signal receiver, hence the arguments it ignores)."""
    _generation[0] += 1
    _entries.clear()
    _missing.clear()


def _entry(name: str) -> Entry | None:
    """What is remembered under ``name``, marked as just used."""
    for entries in (_entries, _missing):
        entry = entries.get(name)
        if entry is not None:
            entries.move_to_end(name)
            return entry
    return None


def _remember(name: str, entry: Entry) -> None:
    """Remember ``entry`` under ``name``, forgetting the least recently used of its kind
    (found or not) past :data:`MAX_KEYS`."""
    entries, other = (_missing, _entries) if entry[2] is None else (_entries, _missing)
    other.pop(name, None)
    entries[name] = entry
    entries.move_to_end(name)
    if len(entries) > MAX_KEYS:
        entries.popitem(last=False)


async def grant(hashed_key: str) -> Grant | None:
    """The active key whose SHA-256 is ``hashed_key``, or None."""
    found: Grant | None = await _cached("key", hashed_key, _load_grant, hashed_key)
    return found


async def aliases() -> Aliases:
    """The enabled aliases as of at most ``CACHE_SECONDS`` ago."""
    found: Aliases = await _cached("aliases", _ALIASES, _load_aliases)
    return found


async def _cached(cache: str, name: str, load: Callable[..., Any], *args: Any) -> Any:
    """What ``load(*args)`` read under ``name``, at most ``CACHE_SECONDS`` ago; ``cache``
    names what it is to the observers (``key``, ``aliases``)."""
    entry = _entry(name)
    hit = entry is not None and entry[0] > clock()
    for observer in signals.observers:
        observer.lookup(cache, hit)
    if entry is not None and hit:
        return entry[2]
    loading = _loading.get()
    task = loading.get(name)
    if task is None:
        task = loading[name] = detached(_load(name, load, *args))
        task.add_done_callback(lambda _: loading.pop(name, None))
    return await asyncio.shield(task)


async def _load(name: str, load: Callable[..., Any], *args: Any) -> Any:
    loaded_at, generation = clock(), _generation[0]
    try:
        value = await sync_to_async(load)(*args)
    except DatabaseError as exc:
        return _stale(name, exc)
    if generation == _generation[0]:
        _remember(name, (loaded_at + app_settings.CACHE_SECONDS, loaded_at, value))
    return value


def _stale(name: str, cause: DatabaseError) -> Any:
    """What was last read under ``name``, while it is at most ``STALE_SECONDS`` old;
    else a 503."""
    entry, now = _entry(name), clock()
    if entry is None or entry[1] + app_settings.STALE_SECONDS < now:
        _outage_log.error(
            "chatparity: the database is unreachable (%s), nothing to serve in its place",
            cause,
            exc_info=cause,
        )
        raise errors.service_unavailable(
            "The server cannot check your request right now. Please retry shortly."
        ) from cause
    _outage_log.error(
        "chatparity: the database is unreachable (%s); keys and aliases served as last read",
        cause,
        exc_info=cause,
    )
    _remember(name, (now + RETRY_SECONDS, entry[1], entry[2]))
    return entry[2]


def _owner_active() -> Q:
    """A key's owner is active, or it has none (a user model without ``is_active``:
    every owner is, as Django's ``ModelBackend`` reads it)."""
    try:
        get_user_model()._meta.get_field("is_active")
    except FieldDoesNotExist:
        return Q()
    return Q(owner__isnull=True) | Q(owner__is_active=True)


@reconnecting
def _load_grant(hashed_key: str) -> Grant | None:
    key = ApiKey.objects.filter(_owner_active(), hashed_key=hashed_key, is_active=True).first()
    if key is None:
        return None
    allowed = (
        None if key.all_aliases else frozenset(key.allowed_aliases.values_list("pk", flat=True))
    )
    key.owner_plan = Plan.objects.for_owner(key.owner_id)
    if key.owner_plan is None and key.needs_plan:
        return None  # made under a plan its owner no longer has (or owner deleted)
    if key.owner_plan is not None and (planned := key.owner_plan.alias_ids()) is not None:
        allowed = planned if allowed is None else allowed & planned
    return Grant(key, allowed)


@reconnecting
def _load_aliases() -> Aliases:
    deployed = Deployment.objects.select_related("backend")
    rows = (
        ModelAlias.objects.filter(enabled=True)
        .select_related("backend")
        .prefetch_related(Prefetch("deployments", queryset=deployed))
    )
    return Aliases({alias.public_id.lower(): alias for alias in rows})
