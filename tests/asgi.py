"""An HTTP request as an ASGI server hands it to the application."""

import orjson
from asgiref.testing import ApplicationCommunicator
from django.core.asgi import get_asgi_application

from chatparity.transport.fastpath import FastPath


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


async def ask_fast_path(plaintext):
    """POST a chat completion of model ``echo`` through the ASGI fast path; its status and
    body, once the application returned (its row written, or spooled)."""
    headers = [("authorization", f"Bearer {plaintext}"), ("content-type", "application/json")]
    communicator = ApplicationCommunicator(
        FastPath(get_asgi_application()), http_scope("POST", "/v1/chat/completions", headers)
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
