"""Declares each request as the actor of the changes it makes (see :mod:`chatparity.actors`)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from asgiref.sync import iscoroutinefunction, markcoroutinefunction
from django.http import HttpRequest, HttpResponseBase

from ..actors import acting_for


class AuditMiddleware:
    """Changes made while a request is served are that request's: its user (read when a
    change is recorded, so its place among the middleware does not matter), address,
    and the part of the site it reached (the admin, the management API, the portal)."""

    sync_capable = True
    async_capable = True

    def __init__(self, get_response: Callable[[HttpRequest], Any]) -> None:
        self.get_response = get_response
        self.is_async = iscoroutinefunction(get_response)
        if self.is_async:
            markcoroutinefunction(self)

    def __call__(self, request: HttpRequest) -> Any:
        if self.is_async:
            return self._serve_async(request)
        with acting_for(request):
            return self.get_response(request)

    async def _serve_async(self, request: HttpRequest) -> HttpResponseBase:
        get_response: Callable[[HttpRequest], Awaitable[HttpResponseBase]] = self.get_response
        with acting_for(request):
            return await get_response(request)
