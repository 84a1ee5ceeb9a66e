"""GET /healthz: what a load balancer polls. No key; 200 when every dependency answers, else 503."""

import sys
import time
from unittest import mock

from channels.layers import BaseChannelLayer
from django.core.cache.backends.base import BaseCache
from django.db import connections
from django.test import TestCase, override_settings

from chatparity.transport import health

# What a driver's error message may carry; the response must never show it.
SECRET_DETAIL = "connection to server at db.internal failed for user chatparity password=hunter2"


class BrokenCache(BaseCache):
    """A cache whose server is down, as RedisCache is when Redis is."""

    def __init__(self, location, params):
        super().__init__(params)

    def set(self, key, value, timeout=None, version=None):
        raise ConnectionError(SECRET_DETAIL)

    def get(self, key, default=None, version=None):
        raise ConnectionError(SECRET_DETAIL)


class HungCache(BrokenCache):
    def set(self, key, value, timeout=None, version=None):
        time.sleep(0.5)


class BrokenLayer(BaseChannelLayer):
    async def group_send(self, group, message):
        raise ConnectionError(SECRET_DETAIL)


BROKEN_CACHE = {"default": {"BACKEND": "tests.transport.test_health.BrokenCache"}}
HUNG_CACHE = {"default": {"BACKEND": "tests.transport.test_health.HungCache"}}
DUMMY_CACHE = {"default": {"BACKEND": "django.core.cache.backends.dummy.DummyCache"}}
BROKEN_LAYER = {"default": {"BACKEND": "tests.transport.test_health.BrokenLayer"}}


# The class, not the instance: the view queries on the request's thread, whose
# connection object is not the one this test's event loop thread sees.
DatabaseWrapper = type(connections["default"])


def failing_cursor(*args, **kwargs):
    database = connections["default"].Database  # the driver's own error type
    raise database.OperationalError(SECRET_DETAIL)


class HealthTests(TestCase):
    def get(self, **headers):
        return self.async_client.get("/healthz", headers=headers)

    async def test_healthy_dependencies_answer_200_naming_each_check(self):
        response = await self.get()
        assert response.status_code == 200
        assert response["Content-Type"] == "application/json"
        assert response["Cache-Control"] == "no-store"
        assert response.json() == {
            "status": "ok",
            "checks": {"database": "ok", "cache": "ok", "channel_layer": "ok"},
        }

    async def test_needs_no_api_key_and_ignores_a_wrong_one(self):
        response = await self.get(Authorization="Bearer sk-cp-not-a-key")
        assert response.status_code == 200

    async def test_unreachable_database_is_503_naming_it_and_nothing_of_the_error(self):
        with (
            mock.patch.object(DatabaseWrapper, "create_cursor", failing_cursor),
            self.assertLogs("chatparity.transport.health", "WARNING") as logs,
        ):
            response = await self.get()
        assert response.status_code == 503
        assert response.json() == {
            "status": "fail",
            "checks": {"database": "fail", "cache": "ok", "channel_layer": "ok"},
        }
        assert b"db.internal" not in response.content
        assert b"hunter2" not in response.content
        assert "database failed" in logs.output[0]  # the details go to the log

    @override_settings(CACHES=BROKEN_CACHE)
    async def test_cache_that_raises_is_503_naming_it(self):
        response = await self.get()
        assert response.status_code == 503
        assert response.json()["status"] == "fail"
        assert response.json()["checks"] == {
            "database": "ok",
            "cache": "fail",
            "channel_layer": "ok",
        }
        assert b"hunter2" not in response.content

    @override_settings(CACHES=DUMMY_CACHE)
    async def test_cache_that_keeps_nothing_is_503(self):
        response = await self.get()
        assert response.status_code == 503
        assert response.json()["checks"]["cache"] == "fail"

    @override_settings(CHANNEL_LAYERS=BROKEN_LAYER)
    async def test_channel_layer_that_raises_is_503_naming_it(self):
        response = await self.get()
        assert response.status_code == 503
        assert response.json()["checks"] == {
            "database": "ok",
            "cache": "ok",
            "channel_layer": "fail",
        }

    @override_settings(CHANNEL_LAYERS={})
    async def test_without_a_channel_layer_there_is_nothing_to_check(self):
        response = await self.get()
        assert response.status_code == 200
        assert response.json()["checks"] == {"database": "ok", "cache": "ok"}

    async def test_a_channel_layer_configured_without_channels_installed_fails(self):
        with (
            mock.patch.dict(sys.modules, {"channels.layers": None}),  # as if not installed
            self.assertLogs("chatparity.transport.health", "WARNING") as logs,
        ):
            response = await self.get()
        assert response.status_code == 503
        assert response.json()["checks"]["channel_layer"] == "fail"
        assert "channel_layer failed" in logs.output[0]

    @override_settings(CACHES=HUNG_CACHE)
    async def test_hung_dependency_is_a_timeout_answered_in_time(self):
        started = time.perf_counter()
        with mock.patch.object(health, "CHECK_TIMEOUT", 0.05):
            response = await self.get()
        assert time.perf_counter() - started < 0.4  # HungCache sleeps 0.5 s
        assert response.status_code == 503
        assert response.json()["checks"]["cache"] == "timeout"

    async def test_hung_database_does_not_hold_up_the_other_checks(self):
        def hung_cursor(*args, **kwargs):
            time.sleep(0.5)
            failing_cursor()

        with (
            mock.patch.object(health, "CHECK_TIMEOUT", 0.2),
            mock.patch.object(DatabaseWrapper, "create_cursor", hung_cursor),
        ):
            response = await self.get()
        assert response.json()["checks"] == {
            "database": "timeout",
            "cache": "ok",
            "channel_layer": "ok",
        }

    async def test_head_answers_the_status_without_a_body(self):
        response = await self.async_client.head("/healthz")
        assert response.status_code == 200
        assert response.content == b""

    async def test_other_methods_are_not_allowed(self):
        response = await self.async_client.post("/healthz")
        assert response.status_code == 405
