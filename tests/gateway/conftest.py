"""The fixture of the fuzz tests (schemathesis against the served OpenAPI document)."""

import asyncio

import pytest
import schemathesis
from asgiref.sync import sync_to_async
from django.db import connections
from django.test import override_settings
from schemathesis.python import asgi

from chatparity.models import ApiKey, Backend, ModelAlias
from project.asgi import application
from tests.support.fuzz import ALIAS, FUZZ_SETTINGS


@pytest.fixture
def api(transactional_db):
    """The loaded schema and a client with a valid key.

    The data is committed, as the application answers on another thread.
    """
    with override_settings(CHATPARITY=FUZZ_SETTINGS):
        _, plaintext = ApiKey.objects.create_key("fuzz")
        backend = Backend.objects.create(
            name="scripted", kind="scripted", options={"script": ["Hel", "lo"]}
        )
        ModelAlias.objects.create(public_id=ALIAS, backend=backend)
        schema = schemathesis.openapi.from_asgi("/v1/openapi.json", application)
        # Whole streams, however many events: the last one must be [DONE].
        with asgi.get_client(application, max_stream_events=100_000) as client:
            client.headers["Authorization"] = f"Bearer {plaintext}"
            yield schema, client
    # With no request context on the client's event loop, the application's database
    # calls ran in asgiref's shared thread: close its connection, which would keep
    # PostgreSQL from dropping the test database.
    asyncio.run(sync_to_async(connections.close_all)())
