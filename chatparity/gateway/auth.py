"""API keys: presented as bearer tokens (or, to Anthropic's API, in ``x-api-key``)."""

from __future__ import annotations

from ..accounting import keys
from ..accounting.keys import Grant
from ..models import hash_key
from ..protocol import errors


async def authenticate(authorization: str) -> Grant:
    """The active key an ``Authorization: Bearer <key>`` header presents, or a 401."""
    scheme, _, presented = authorization.partition(" ")
    presented = presented.strip()
    if scheme.lower() != "bearer" or not presented:
        raise errors.missing_api_key()
    return await authenticate_key(presented)


async def authenticate_key(presented: str) -> Grant:
    """The active key ``presented`` (however it was sent), or a 401."""
    grant = await keys.grant(hash_key(presented))
    if grant is None or grant.key.is_expired:
        raise errors.invalid_api_key(presented)
    return grant
