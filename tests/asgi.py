"""An HTTP request as an ASGI server hands it to the application, and the test case of
requests through the ASGI fast path."""

import orjson
from asgiref.testing import ApplicationCommunicator
from django.core.asgi import get_asgi_application
from django.core.signals import request_finished, request_started
from django.db import close_old_connections
from django.test import TestCase, override_settings

from chatparity.models import ApiKey, Backend, ModelAlias
from chatparity.transport.fastpath import FastPath
from tests.scripted import SCRIPTED


def http_scope(
    method, path, headers=(), *, query_string="", root_path="", client=("127.0.0.1", 50000)
):
    """The scope of ``method path?query_string`` with ``headers`` (name, value) as text."""
    return {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": method,
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "query_string": query_string.encode(),
        "root_path": root_path,
        "headers": [(name.encode(), value.encode()) for name, value in headers],
        "client": client,
        "server": ("testserver", 80),
    }


def completion_scope(plaintext):
    """The scope of a chat completion asked with the key ``plaintext``."""
    headers = [("authorization", f"Bearer {plaintext}"), ("content-type", "application/json")]
    return http_scope("POST", "/v1/chat/completions", headers)


def keep_test_connection(test):
    """As Django's test client does: keep the test database connection open."""
    request_started.disconnect(close_old_connections)
    request_finished.disconnect(close_old_connections)
    test.addCleanup(request_started.connect, close_old_connections)
    test.addCleanup(request_finished.connect, close_old_connections)


async def ask_fast_path(plaintext, application=None):
    """POST a chat completion of model ``echo`` through the ASGI fast path (``application``,
    else one made now); its status and body, once the application returned (its row
    written, or spooled)."""
    headers = [("authorization", f"Bearer {plaintext}"), ("content-type", "application/json")]
    communicator = ApplicationCommunicator(
        application or FastPath(get_asgi_application()),
        http_scope("POST", "/v1/chat/completions", headers),
    )
    body = {"model": "echo", "messages": [{"role": "user", "content": "Hi"}]}
    await communicator.send_input({"type": "http.request", "body": orjson.dumps(body)})
    start = await communicator.receive_output(timeout=10)
    answer = await communicator.receive_output(timeout=10)
    await communicator.wait(timeout=10)
    return start["status"], orjson.loads(answer["body"])


async def reply_body(communicator):
    """The body messages of a reply whose start was received, joined."""
    parts = []
    while True:
        message = await communicator.receive_output(timeout=10)
        parts.append(message["body"])
        if not message.get("more_body"):
            return b"".join(parts)


@override_settings(CHATPARITY=SCRIPTED)
class FastPathTestCase(TestCase):
    @classmethod
    def setUpTestData(cls):
        cls.key, cls.plaintext = ApiKey.objects.create_key("tests")
        backend = Backend.objects.create(
            name="scripted", kind="scripted", options={"script": ["Hello", " there"]}
        )
        ModelAlias.objects.create(public_id="echo", backend=backend)

    def setUp(self):
        self.application = FastPath(get_asgi_application())

    def headers(self, **extra):
        return [
            ("authorization", f"Bearer {self.plaintext}"),
            ("content-type", "application/json"),
            ("user-agent", "fast-path-test/1.0"),
            *extra.items(),
        ]

    def communicator(self, method, path, headers=None, query_string="", root_path=""):
        headers = self.headers() if headers is None else headers
        scope = http_scope(
            method,
            path,
            headers,
            query_string=query_string,
            root_path=root_path,
            client=("10.1.2.3", 50000),
        )
        return ApplicationCommunicator(self.application, scope)

    async def exchange(self, method, path, body=b"", headers=None, query_string="", root_path=""):
        """The response start, its body, and the communicator (still running)."""
        communicator = self.communicator(method, path, headers, query_string, root_path)
        await communicator.send_input({"type": "http.request", "body": body})
        start = await communicator.receive_output(timeout=10)
        return start, await reply_body(communicator), communicator

    async def ask(self, **body):
        request = {"model": "echo", "messages": [{"role": "user", "content": "Hi"}], **body}
        start, content, communicator = await self.exchange(
            "POST", "/v1/chat/completions", orjson.dumps(request)
        )
        await communicator.wait(timeout=10)
        return start, content
