"""Bearer API keys."""

from __future__ import annotations

from django.http import HttpRequest

from .models import ApiKey, hash_key
from .protocol import errors


async def authenticate(request: HttpRequest) -> ApiKey:
    """The active key presented as ``Authorization: Bearer <key>``, or a 401."""
    scheme, _, presented = request.headers.get("Authorization", "").partition(" ")
    presented = presented.strip()
    if scheme.lower() != "bearer" or not presented:
        raise errors.missing_api_key()
    key = await ApiKey.objects.filter(hashed_key=hash_key(presented), is_active=True).afirst()
    if key is None or key.is_expired:
        raise errors.invalid_api_key(presented)
    return key


async def allowed_alias_ids(key: ApiKey) -> set[int] | None:
    """The aliases ``key`` is scoped to, or None when it may use them all."""
    ids = {pk async for pk in key.allowed_aliases.values_list("pk", flat=True)}
    return ids or None
