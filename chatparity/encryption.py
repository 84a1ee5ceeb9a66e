"""Backend secrets encrypted at rest with Fernet (``cryptography``).

The keys come from ``CHATPARITY["SECRET_KEYS"]``: a list of Fernet keys, the
first encrypts, all of them decrypt. After them come keys derived from Django's
``SECRET_KEY`` and each of ``SECRET_KEY_FALLBACKS``, which encrypt only when
``SECRET_KEYS`` is empty. So rotating Django's secret the documented way, or
moving from derived keys to keys of one's own, keeps old secrets readable until
``manage.py chatparity_rotate_secrets`` re-encrypts them under the first key.
"""

from __future__ import annotations

import base64
import hashlib
from functools import cache
from typing import Any

from cryptography.fernet import Fernet, InvalidToken, MultiFernet
from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.db import models

from .conf import app_settings

# Stored values start with this, so a row written before encryption (or by hand)
# is told apart from a token and is never decrypted by mistake.
PREFIX = "fernet:"


def _derived(secret: str) -> bytes:
    digest = hashlib.sha256(b"chatparity.backend-secret:" + secret.encode()).digest()
    return base64.urlsafe_b64encode(digest)


def _key_material() -> tuple[bytes, ...]:
    configured: Any = app_settings.SECRET_KEYS
    if isinstance(configured, str | bytes):
        # A lone key would otherwise be read as a list of one-character keys.
        raise ImproperlyConfigured('CHATPARITY["SECRET_KEYS"] must be a list of keys, not one key')
    own = tuple(k.encode() if isinstance(k, str) else bytes(k) for k in configured)
    django_keys = [settings.SECRET_KEY, *getattr(settings, "SECRET_KEY_FALLBACKS", [])]
    return own + tuple(_derived(str(key)) for key in django_keys)


@cache
def _fernet(material: tuple[bytes, ...]) -> MultiFernet:
    try:
        return MultiFernet([Fernet(key) for key in material])
    except (ValueError, TypeError) as exc:
        raise ImproperlyConfigured(
            'CHATPARITY["SECRET_KEYS"] must list Fernet keys (Fernet.generate_key().decode())'
        ) from exc


def fernet() -> MultiFernet:
    """The keys in force now (read on each call, so ``override_settings`` works).

    Raises ImproperlyConfigured when ``SECRET_KEYS`` holds something else than Fernet keys.
    """
    return _fernet(_key_material())


def _undecryptable() -> ImproperlyConfigured:
    return ImproperlyConfigured(
        "A backend secret cannot be decrypted with the configured keys: keep the"
        ' old key in CHATPARITY["SECRET_KEYS"] (or SECRET_KEY_FALLBACKS) until'
        " chatparity_rotate_secrets has run."
    )


def encrypt(plaintext: str) -> str:
    """``plaintext`` as stored: a prefixed Fernet token under the first key ("" stays "")."""
    if not plaintext:
        return ""
    return PREFIX + fernet().encrypt(plaintext.encode()).decode()


def decrypt(stored: str) -> str:
    """The plaintext of a stored value; a value stored before encryption is returned as is."""
    if not stored.startswith(PREFIX):
        return stored
    try:
        return fernet().decrypt(stored[len(PREFIX) :].encode()).decode()
    except InvalidToken:
        raise _undecryptable() from None


def rotate(stored: str) -> str:
    """``stored`` re-encrypted under the first key (plaintext rows get encrypted)."""
    if not stored:
        return ""
    if not stored.startswith(PREFIX):
        return encrypt(stored)
    try:
        return PREFIX + fernet().rotate(stored[len(PREFIX) :].encode()).decode()
    except InvalidToken:
        raise _undecryptable() from None


def stored(field: str) -> models.ExpressionWrapper:  # type: ignore[type-arg]
    """The column of an encrypted ``field`` as stored, for queries that must not decrypt:
    ``Backend.objects.annotate(token=stored("secret"))``."""
    return models.ExpressionWrapper(models.F(field), output_field=models.TextField())


class EncryptedTextField(models.TextField):  # type: ignore[type-arg]
    """A text column holding a Fernet token; Python code only sees the plaintext.

    It cannot be filtered on (each encryption of one value differs), except for "".
    """

    def from_db_value(self, value: str | None, expression: Any, connection: Any) -> str | None:
        return None if value is None else decrypt(value)

    def get_prep_value(self, value: Any) -> Any:
        value = super().get_prep_value(value)
        return value if value is None else encrypt(str(value))
