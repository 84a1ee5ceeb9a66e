"""The live tail: who may connect and from which origin, what a finished request publishes,
that it never breaks one."""

import asyncio
import json
import logging
from unittest import mock

import pytest
from channels.layers import get_channel_layer
from channels.routing import URLRouter
from channels.testing import WebsocketCommunicator
from django.conf import settings
from django.contrib.auth.models import AnonymousUser, Permission, User
from django.test import Client, TransactionTestCase, override_settings

from chatparity.accounting.ledger import Accounting
from chatparity.accounting.record import UsageRecord
from chatparity.dashboard import tail
from chatparity.dashboard.routing import same_origin, websocket_urlpatterns
from chatparity.models import ApiKey, RequestLog

PATH = "/ws/chatparity/tail/"
# What a browser sends from the admin's page at http://localhost:8000.
SAME_ORIGIN = {"host": "localhost:8000", "origin": "http://localhost:8000"}


def communicator_for(app, headers=SAME_ORIGIN, scheme="ws"):
    communicator = WebsocketCommunicator(
        app, PATH, headers=[(name.encode(), value.encode()) for name, value in headers.items()]
    )
    communicator.scope["scheme"] = scheme
    return communicator


def as_user(user):
    """The routes as project.asgi serves them, with AuthMiddlewareStack's ``user`` already set."""
    router = URLRouter(websocket_urlpatterns)

    async def app(scope, receive, send):
        return await router({**scope, "user": user}, receive, send)

    return app


IN_MEMORY = {"default": {"BACKEND": "channels.layers.InMemoryChannelLayer"}}


# The consumer's side, on the in-memory layer, whichever layer the suite runs on: a
# Redis layer's connections belong to one event loop, and each test has its own.
# RedisLayerTests below sends through Redis.
@override_settings(CHANNEL_LAYERS=IN_MEMORY)
class LiveTailTests(TransactionTestCase):
    def setUp(self):
        self.admin = User.objects.create_superuser("admin")
        self.key, _ = ApiKey.objects.create_key("tests")

    async def connect(self, user, headers=SAME_ORIGIN):
        await get_channel_layer().flush()  # the in-memory layer outlives each test's event loop
        communicator = communicator_for(as_user(user), headers)
        connected, _ = await communicator.connect()
        return communicator, connected

    async def row(self, **fields):
        fields = {"status_code": 200, "duration_ms": 1234.56, **fields}
        return await RequestLog.objects.acreate(
            request_id="req-1", api_key=self.key, key_prefix=self.key.prefix, **fields
        )

    async def test_staff_receive_a_summary_of_each_published_request(self):
        communicator, connected = await self.connect(self.admin)
        assert connected
        row = await self.row(
            endpoint="responses",
            alias="smollm2",
            stream=True,
            prompt_tokens=5,
            completion_tokens=7,
            total_tokens=12,
            time_to_first_token_ms=87.654,
            finish_reasons=["stop", "length"],
            request_body={"messages": [{"role": "user", "content": "secret prompt"}]},
            response_body='{"choices": "secret reply"}',
        )
        await tail.publish(row)
        message = await communicator.receive_json_from(timeout=2)
        assert message == {
            "type": "request",
            "request": {
                "time": row.created_at.isoformat(),
                "request_id": "req-1",
                "endpoint": "responses",
                "key_prefix": self.key.prefix,
                "alias": "smollm2",
                "status": 200,
                "error_type": "",
                "stream": True,
                "prompt_tokens": 5,
                "completion_tokens": 7,
                "total_tokens": 12,
                "duration_ms": 1234.6,
                "ttft_ms": 87.7,
                "finish_reasons": ["stop", "length"],
                "cancelled": False,
            },
        }
        text = json.dumps(message)
        assert "secret" not in text
        assert self.key.hashed_key not in text
        await communicator.disconnect()

    async def test_a_logged_request_publishes_the_row_it_saved(self):
        communicator, connected = await self.connect(self.admin)
        assert connected
        record = UsageRecord(request_id="req-42", api_key=self.key, alias="smollm2")
        record.status_code = 499
        record.cancelled = True
        row = await Accounting(record).close()
        message = (await communicator.receive_json_from(timeout=2))["request"]
        assert (message["request_id"], message["key_prefix"]) == ("req-42", self.key.prefix)
        assert (message["status"], message["cancelled"]) == (499, True)
        assert message["endpoint"] == "chat.completions"
        assert message["time"] == row.created_at.isoformat()
        await communicator.disconnect()

    async def test_anonymous_users_are_refused(self):
        _, connected = await self.connect(AnonymousUser())
        assert not connected

    async def test_a_scope_without_a_user_is_refused(self):
        await get_channel_layer().flush()
        communicator = communicator_for(URLRouter(websocket_urlpatterns))
        connected, _ = await communicator.connect()
        assert not connected

    async def test_a_superuser_is_refused_from_another_origin(self):
        for origin in ("http://localhost:8001", "https://localhost:8000", "http://127.0.0.1:8000"):
            with (
                self.subTest(origin=origin),
                self.assertLogs("chatparity.dashboard.routing", "WARNING"),
            ):
                _, connected = await self.connect(self.admin, {**SAME_ORIGIN, "origin": origin})
                assert not connected
        _, connected = await self.connect(self.admin, {"host": SAME_ORIGIN["host"]})
        assert not connected

    async def test_non_staff_are_refused_even_with_permission(self):
        user = await User.objects.acreate(username="visitor")
        await user.user_permissions.aadd(await Permission.objects.aget(codename="view_requestlog"))
        _, connected = await self.connect(user)
        assert not connected

    async def test_staff_need_the_dashboards_view_permission(self):
        staff = await User.objects.acreate(username="staff", is_staff=True)
        _, connected = await self.connect(staff)
        assert not connected
        await staff.user_permissions.aadd(await Permission.objects.aget(codename="view_requestlog"))
        staff = await User.objects.aget(pk=staff.pk)  # a fresh permission cache
        communicator, connected = await self.connect(staff)
        assert connected
        await communicator.disconnect()

    async def test_inactive_staff_are_refused(self):
        self.admin.is_active = False
        _, connected = await self.connect(self.admin)
        assert not connected

    async def test_whatever_the_client_sends_is_ignored(self):
        communicator, connected = await self.connect(self.admin)
        assert connected
        await communicator.send_to(text_data="not json")
        await communicator.send_json_to({"type": "tail.requests", "requests": ["spoofed"]})
        assert await communicator.receive_nothing(timeout=0.2)
        await tail.publish(await self.row())
        assert (await communicator.receive_json_from(timeout=2))["type"] == "request"
        await communicator.disconnect()

    async def test_disconnected_clients_leave_the_group(self):
        communicator, connected = await self.connect(self.admin)
        assert connected
        layer = get_channel_layer()
        assert layer.groups.get(tail.GROUP)
        await communicator.disconnect()
        assert not layer.groups.get(tail.GROUP)


@override_settings(CHANNEL_LAYERS=IN_MEMORY)
class ProjectApplicationTests(TransactionTestCase):
    """project.asgi as served: the session cookie, AuthMiddlewareStack, the origin check."""

    async def test_a_logged_in_superuser_connects_from_the_same_origin_only(self):
        from project.asgi import application

        client = Client()
        await client.aforce_login(await User.objects.acreate_superuser("admin"))
        cookie = (
            f"{settings.SESSION_COOKIE_NAME}={client.cookies[settings.SESSION_COOKIE_NAME].value}"
        )
        await get_channel_layer().flush()
        for origin, accepted in [("http://localhost:8000", True), ("http://localhost:8080", False)]:
            with self.subTest(origin=origin):
                headers = {**SAME_ORIGIN, "origin": origin, "cookie": cookie}
                communicator = communicator_for(application, headers)
                connected, _ = await communicator.connect()
                assert connected is accepted
                await communicator.disconnect()


def handshake(headers, scheme="ws"):
    return {
        "type": "websocket",
        "scheme": scheme,
        "path": PATH,
        "headers": [(name.encode(), value.encode()) for name, value in headers.items()],
        "server": ("127.0.0.1", 8000),
    }


@pytest.fixture
def site(settings):
    settings.ALLOWED_HOSTS = ["localhost", "127.0.0.1", "chat.example.com"]
    settings.CSRF_TRUSTED_ORIGINS = []
    return settings


@pytest.mark.parametrize(
    ("scheme", "host", "origin"),
    [
        ("ws", "localhost:8000", "http://localhost:8000"),
        ("wss", "chat.example.com", "https://chat.example.com"),
        ("wss", "chat.example.com:8443", "https://chat.example.com:8443"),
    ],
)
def test_the_origin_the_socket_was_opened_on_is_accepted(site, scheme, host, origin):
    assert same_origin(handshake({"host": host, "origin": origin}, scheme))


@pytest.mark.parametrize(
    ("scheme", "host", "origin"),
    [
        ("ws", "localhost:8000", "http://localhost:8001"),  # another port
        ("ws", "localhost:8000", "http://localhost"),
        ("ws", "localhost:8000", "https://localhost:8000"),  # another scheme
        ("wss", "chat.example.com", "http://chat.example.com"),
        ("ws", "localhost:8000", "http://127.0.0.1:8000"),  # another allowed host
        ("ws", "localhost:8000", "http://localhost.evil.example:8000"),
        ("ws", "evil.example:8000", "http://evil.example:8000"),  # a host not allowed
        ("ws", "localhost:8000", "null"),
        ("ws", "localhost:8000", "http://localhost:8000, http://localhost:8000"),
    ],
)
def test_any_other_origin_is_refused(site, scheme, host, origin):
    assert not same_origin(handshake({"host": host, "origin": origin}, scheme))


def test_no_origin_is_refused(site):
    assert not same_origin(handshake({"host": "localhost:8000"}))


def test_two_origin_headers_are_refused(site):
    scope = handshake({"host": "localhost:8000"})
    scope["headers"] += [(b"origin", b"http://localhost:8000")] * 2
    assert not same_origin(scope)


def test_behind_a_tls_proxy_the_forwarded_scheme_counts(site):
    site.SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
    forwarded = {"host": "chat.example.com", "x-forwarded-proto": "https"}
    assert same_origin(handshake({**forwarded, "origin": "https://chat.example.com"}))
    assert not same_origin(handshake({**forwarded, "origin": "http://chat.example.com"}))
    plain = {"host": "chat.example.com", "x-forwarded-proto": "http"}
    assert not same_origin(handshake({**plain, "origin": "https://chat.example.com"}, "wss"))


def test_the_forwarded_host_counts_only_with_use_x_forwarded_host(site):
    headers = {
        "host": "127.0.0.1:8000",
        "x-forwarded-host": "chat.example.com",
        "origin": "http://chat.example.com",
    }
    assert not same_origin(handshake(headers))
    site.USE_X_FORWARDED_HOST = True
    assert same_origin(handshake(headers))


def test_csrf_trusted_origins_are_accepted_exactly(site):
    site.CSRF_TRUSTED_ORIGINS = ["https://admin.example.org", "https://*.example.net"]
    host = {"host": "localhost:8000"}
    for origin in ("https://admin.example.org", "https://ops.example.net", "https://example.net"):
        assert same_origin(handshake({**host, "origin": origin})), origin
    for origin in (
        "http://admin.example.org",
        "https://admin.example.org:8443",
        "https://other.example.org",
        "http://ops.example.net",
        "https://ops.example.net:8443",
    ):
        assert not same_origin(handshake({**host, "origin": origin})), origin


def failing_layer(exc):
    return mock.Mock(group_send=mock.AsyncMock(side_effect=exc))


class PublishNeverBreaksARequestTests(TransactionTestCase):
    def setUp(self):
        self.key, _ = ApiKey.objects.create_key("tests")
        self.row = RequestLog.objects.create(
            request_id="req-1", key_prefix=self.key.prefix, status_code=200, duration_ms=1.0
        )
        self.publisher = tail.Publisher()
        patcher = mock.patch.object(tail, "publisher", self.publisher)
        patcher.start()
        self.addCleanup(patcher.stop)

    def published_to(self, layer):
        return mock.patch.object(tail, "get_channel_layer", return_value=layer)

    @override_settings(CHANNEL_LAYERS={})
    async def test_without_a_channel_layer_publish_does_nothing(self):
        assert get_channel_layer() is None
        with self.assertNoLogs("chatparity.dashboard.tail"):
            await tail.publish(self.row)
            await self.publisher.drained()
        assert (self.publisher.sent, self.publisher.dropped) == (0, 0)

    async def test_publishing_waits_for_nothing(self):
        sending = asyncio.Event()

        async def slow(group, message):
            sending.set()
            await asyncio.sleep(60)

        with self.published_to(mock.Mock(group_send=slow)):
            coroutine = tail.publish(self.row)
            with pytest.raises(StopIteration):  # done without giving the event loop a turn
                coroutine.send(None)
            await asyncio.wait_for(sending.wait(), timeout=5)  # sent in the background

    async def test_failures_are_dropped_counted_and_logged_once_per_interval(self):
        with (
            self.published_to(failing_layer(ConnectionError("redis down"))),
            self.assertLogs("chatparity.dashboard.tail", logging.WARNING) as logs,
        ):
            for _ in range(5):
                await tail.publish(self.row)
            await self.publisher.drained()
        assert (self.publisher.sent, self.publisher.dropped) == (0, 5)
        assert len(logs.output) == 1
        assert "redis down" in logs.output[0]

    async def test_the_next_interval_logs_what_was_dropped_since(self):
        with (
            self.published_to(failing_layer(ConnectionError("redis down"))),
            mock.patch.object(tail, "LOG_INTERVAL", 0),
            self.assertLogs("chatparity.dashboard.tail", logging.WARNING) as logs,
        ):
            await tail.publish(self.row)
            await self.publisher.drained()
            await tail.publish(self.row)
            await self.publisher.drained()
        assert len(logs.output) == 2

    async def test_a_hanging_layer_is_given_up_on(self):
        async def hang(group, message):
            await asyncio.sleep(60)

        with (
            self.published_to(mock.Mock(group_send=hang)),
            mock.patch.object(tail, "PUBLISH_TIMEOUT", 0.05),
            self.assertLogs("chatparity.dashboard.tail", logging.WARNING),
        ):
            await tail.publish(self.row)
            await asyncio.wait_for(self.publisher.drained(), timeout=5)
        assert self.publisher.dropped == 1

    async def test_the_queue_is_bounded(self):
        async def hang(group, message):
            await asyncio.sleep(60)

        with (
            self.published_to(mock.Mock(group_send=hang)),
            mock.patch.object(tail, "MAX_QUEUED", 3),
            mock.patch.object(tail, "PUBLISH_TIMEOUT", 0.05),
            self.assertLogs("chatparity.dashboard.tail", logging.WARNING) as logs,
        ):
            for _ in range(10):
                await tail.publish(self.row)
            assert self.publisher.dropped == 7  # three queued, the rest at once
            await self.publisher.drained()
        assert "the queue is full" in logs.output[0]
        assert (self.publisher.sent, self.publisher.dropped) == (0, 10)

    async def test_a_logged_request_survives_a_failing_layer(self):
        with self.published_to(failing_layer(RuntimeError("boom"))):
            row = await Accounting(UsageRecord(request_id="req-2", api_key=self.key)).close()
            await self.publisher.drained()
        assert await RequestLog.objects.filter(request_id=row.request_id).aexists()
        await self.key.arefresh_from_db()
        assert self.key.last_used_at is not None
        assert self.publisher.dropped == 1


# The layer's connections are named so that CLIENT LIST tells them from any other client.
CLIENT_NAME = "chatparity-tail-test"


class RedisLayerTests(TransactionTestCase):
    def setUp(self):
        from channels_redis.core import RedisChannelLayer

        self.layer = RedisChannelLayer(
            hosts=[{"address": self.redis_url, "client_name": CLIENT_NAME}], capacity=1000
        )
        self.publisher = tail.Publisher()
        for patcher in (
            mock.patch.object(tail, "publisher", self.publisher),
            mock.patch.object(tail, "get_channel_layer", return_value=self.layer),
        ):
            patcher.start()
            self.addCleanup(patcher.stop)

    async def row(self, request_id):
        key = await ApiKey.objects.acreate(name="k", prefix="sk-cp-abcd", hashed_key="x" * 64)
        return await RequestLog.objects.acreate(
            request_id=request_id, api_key=key, key_prefix=key.prefix, status_code=200,
            duration_ms=1.0,
        )  # fmt: skip

    async def test_a_published_row_reaches_the_group_through_redis(self):
        channel = await self.layer.new_channel()
        await self.layer.group_add(tail.GROUP, channel)
        await tail.publish(await self.row("req-redis"))
        message = await asyncio.wait_for(self.layer.receive(channel), timeout=5)
        assert [request["request_id"] for request in message["requests"]] == ["req-redis"]
        await self.layer.flush()

    async def test_500_requests_ending_at_once_wait_for_nothing_and_take_one_connection(self):
        import redis.asyncio

        channel = await self.layer.new_channel()
        await self.layer.group_add(tail.GROUP, channel)
        row = await self.row("req-burst")
        for _ in range(500):  # what 500 requests ending at once do, each in its own task
            with pytest.raises(StopIteration):  # none of them waits for Redis
                tail.publish(row).send(None)

        observer = redis.asyncio.Redis.from_url(self.redis_url)
        most = 0
        async with asyncio.timeout(30):
            while self.publisher.sent + self.publisher.dropped < 500:
                clients = await observer.client_list()
                most = max(most, sum(client["name"] == CLIENT_NAME for client in clients))
                await asyncio.sleep(0.001)
        await observer.aclose()
        assert (self.publisher.sent, self.publisher.dropped) == (500, 0)
        assert most == 1
        received = []
        while len(received) < 500:
            message = await asyncio.wait_for(self.layer.receive(channel), 5)
            received += message["requests"]
        assert len(received) == 500
        assert {request["request_id"] for request in received} == {"req-burst"}
        await self.layer.flush()

    async def test_requests_ending_together_cost_the_layer_one_message(self):
        channel = await self.layer.new_channel()
        await self.layer.group_add(tail.GROUP, channel)
        row = await self.row("req-batch")
        with mock.patch.object(self.layer, "group_send", wraps=self.layer.group_send) as group_send:
            for _ in range(tail.MAX_BATCH + 1):  # the rows of one log batch, announced at once
                await tail.publish(row)
            await self.publisher.drained()
        assert group_send.await_count == 2  # the most one message takes, then the rest
        first = await asyncio.wait_for(self.layer.receive(channel), 5)
        second = await asyncio.wait_for(self.layer.receive(channel), 5)
        assert (len(first["requests"]), len(second["requests"])) == (tail.MAX_BATCH, 1)
        await self.layer.flush()


@pytest.fixture(autouse=True)
def _redis_for(request):
    if request.cls is RedisLayerTests:
        request.cls.redis_url = request.getfixturevalue("redis_url")
