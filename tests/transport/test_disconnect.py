"""A client hanging up, the way Django's own tests do it: ApplicationCommunicator
sends ``http.disconnect`` mid-stream; generation must stop and the row must stay.
The same through Django's handler and through the ASGI fast path in front of it."""

import asyncio

import orjson
from asgiref.sync import sync_to_async
from asgiref.testing import ApplicationCommunicator
from django.core.asgi import get_asgi_application
from django.test import TransactionTestCase

from chatparity.backends import local
from chatparity.models import ApiKey, Backend, ModelAlias, RequestLog
from chatparity.transport.fastpath import FastPath
from tests.asgi import completion_scope, keep_test_connection
from tests.scripted import SCRIPTED, ScriptedBackend
from tests.support.waiting import until


class DisconnectTests(TransactionTestCase):
    def setUp(self):
        keep_test_connection(self)

    application = staticmethod(get_asgi_application)

    async def hang_up_after(self, body, frames):
        _, plaintext = await sync_to_async(ApiKey.objects.create_key)("hang-up")
        backend = await Backend.objects.acreate(name="local", kind="local")
        await ModelAlias.objects.acreate(public_id="smollm2", backend=backend)
        communicator = ApplicationCommunicator(self.application(), completion_scope(plaintext))
        await communicator.send_input({"type": "http.request", "body": orjson.dumps(body)})
        start = await communicator.receive_output(timeout=60)
        assert start["status"] == 200
        received = 0
        while received < frames:
            message = await communicator.receive_output(timeout=30)
            received += message["body"].count(b"data: ")
        await communicator.send_input({"type": "http.disconnect"})
        await communicator.wait(timeout=10)
        return await RequestLog.objects.aget()

    async def test_hang_up_stops_the_model_and_logs_a_cancelled_row(self):
        body = {
            "model": "smollm2",
            "messages": [{"role": "user", "content": "Tell me a long story."}],
            "stream": True,
            "max_tokens": 1000,
        }
        row = await self.hang_up_after(body, frames=4)
        assert row.cancelled
        assert row.status_code == 200
        assert 0 < row.completion_tokens < 1000
        for _ in range(100):  # every context returns to the pool within a second
            if all(model.busy_contexts == 0 for model in local._models.values()):
                break
            await asyncio.sleep(0.01)
        assert all(model.busy_contexts == 0 for model in local._models.values())

    async def test_hang_up_while_waiting_for_a_whole_answer_logs_a_cancelled_row(self):
        # A backend that hangs after its first piece: the client leaves mid-answer, always.
        with self.settings(CHATPARITY=SCRIPTED):
            _, plaintext = await sync_to_async(ApiKey.objects.create_key)("hang-up")
            backend = await Backend.objects.acreate(
                name="hangs", kind="scripted", options={"script": ["Once", "<hang>"]}
            )
            await ModelAlias.objects.acreate(public_id="smollm2", backend=backend)
            communicator = ApplicationCommunicator(self.application(), completion_scope(plaintext))
            body = {"model": "smollm2", "messages": [{"role": "user", "content": "A story."}]}
            await communicator.send_input({"type": "http.request", "body": orjson.dumps(body)})
            await until(lambda: ScriptedBackend.hanging)  # waiting for the rest of the answer
            await communicator.send_input({"type": "http.disconnect"})
            await communicator.wait(timeout=10)
        row = await RequestLog.objects.aget()
        assert row.cancelled
        assert row.completion_tokens == 1  # what the backend had produced


class FastPathDisconnectTests(DisconnectTests):
    @staticmethod
    def application():
        return FastPath(get_asgi_application())
