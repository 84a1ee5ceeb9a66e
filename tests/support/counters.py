"""The rate-limit counters in Redis for a test class."""

import pytest
from django.test import override_settings

from tests.scripted import SCRIPTED


class OnRedis:
    """Mixed into a test class: its tests with the counters in Redis, emptied first."""

    @pytest.fixture(autouse=True)
    def _on_redis(self, redis_url):
        from redis import Redis

        with Redis.from_url(redis_url) as client:
            client.flushdb()
        with override_settings(CHATPARITY={**SCRIPTED, "REDIS_URL": redis_url}):
            yield
