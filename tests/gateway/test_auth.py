"""API keys presented in the Authorization header: the Bearer scheme only."""

import pytest
from django.test import TestCase

from chatparity.gateway.auth import authenticate
from chatparity.models import ApiKey
from chatparity.protocol.errors import APIError


class BearerSchemeTests(TestCase):
    @classmethod
    def setUpTestData(cls):
        cls.key, cls.plaintext = ApiKey.objects.create_key("tests")

    async def test_a_bearer_key_is_the_keys_grant(self):
        for scheme in ("Bearer", "bearer", "BEARER"):  # schemes are case-insensitive (RFC 9110)
            grant = await authenticate(f"{scheme} {self.plaintext}")
            assert grant.key.pk == self.key.pk

    async def test_a_valid_key_under_another_scheme_is_refused(self):
        for header in (f"Basic {self.plaintext}", f"Token {self.plaintext}", self.plaintext):
            with pytest.raises(APIError) as refused:
                await authenticate(header)
            assert refused.value.status == 401
            assert refused.value.message.startswith("You didn't provide an API key")

    async def test_a_scheme_without_a_key_is_refused(self):
        for header in ("Bearer", "Bearer ", "Bearer    "):
            with pytest.raises(APIError) as refused:
                await authenticate(header)
            assert refused.value.status == 401
