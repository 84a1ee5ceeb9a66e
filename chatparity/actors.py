"""Who is changing things right now: the request being served, or the management
command running, as the audit trail (``chatparity.audit``) records it.

A request is declared by ``chatparity.audit``'s middleware, a command by
:class:`chatparity.management.base.ChangingCommand`; code of a site's own (a
script, a task queue's worker) declares itself with :func:`acting_as_command`.
What the request says is read when a change is recorded, not when it arrives: by
then the user is known, whether signed in by session, token or SSO.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from django.db import models
from django.http import HttpRequest


class Source(models.TextChoices):
    """Where a change came from."""

    ADMIN = "admin", "admin"
    API = "api", "management API"
    PORTAL = "portal", "self-service portal"
    COMMAND = "command", "management command"
    WEB = "web", "another page of the site"
    CODE = "code", "code (nothing declared)"


# The URL namespaces (app names) of the parts that change keys, aliases, backends, plans.
SOURCES_BY_APP = {
    "admin": Source.ADMIN,
    "chatparity-api": Source.API,
    "chatparity-portal": Source.PORTAL,
}
# How manage.py, django-admin and python -m django appear as a process's first argument.
MANAGE = ("manage.py", "django-admin", "django/__main__.py")


@dataclass(frozen=True)
class Actor:
    """Who made a change, from where: ``user`` (a user instance) or ``name`` (a
    command's), ``ip`` for a request."""

    source: Source
    user: Any = None
    name: str = ""
    ip: str | None = None


_acting: ContextVar[HttpRequest | str | None] = ContextVar("chatparity_acting", default=None)


@contextmanager
def acting_for(request: HttpRequest) -> Iterator[None]:
    """Changes made within are ``request``'s."""
    token = _acting.set(request)
    try:
        yield
    finally:
        _acting.reset(token)


@contextmanager
def acting_as_command(name: str) -> Iterator[None]:
    """Changes made within are the command (or script) ``name``'s."""
    token = _acting.set(name)
    try:
        yield
    finally:
        _acting.reset(token)


def current() -> Actor:
    """Who is acting now: the declared request or command; else, in a process that
    ``manage.py`` started, its command (``shell``, ``loaddata``...); else code."""
    acting = _acting.get()
    if isinstance(acting, HttpRequest):
        return _of_request(acting)
    if isinstance(acting, str):
        return Actor(Source.COMMAND, name=acting)
    if len(sys.argv) > 1 and Path(sys.argv[0]).as_posix().endswith(MANAGE):
        return Actor(Source.COMMAND, name=sys.argv[1])
    return Actor(Source.CODE)


def _of_request(request: HttpRequest) -> Actor:
    match = request.resolver_match
    apps = match.app_names if match is not None else []
    source = next((SOURCES_BY_APP[app] for app in apps if app in SOURCES_BY_APP), Source.WEB)
    user = getattr(request, "user", None)
    if user is None or not user.is_authenticated:
        user = None
    name = user.get_username() if user is not None else ""
    return Actor(source, user, name, request.META.get("REMOTE_ADDR") or None)
