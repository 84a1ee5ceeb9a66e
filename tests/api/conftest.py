import pytest

from chatparity.models import Backend, ModelAlias


@pytest.fixture
def backend(db):
    return Backend.objects.create(name="local", kind="local")


@pytest.fixture
def alias(backend):
    return ModelAlias.objects.create(public_id="smollm2", backend=backend, model="SmolLM2")
