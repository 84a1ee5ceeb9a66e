"""Whatever a client sends to /v1/embeddings, the answer is never a 5xx, it is in
OpenAI's envelope, and it is what the OpenAPI document says: schemathesis's cases from
the served document, on the embedded model, as tests/gateway/test_fuzz.py sends them
for chat completions."""

from collections import Counter

import schemathesis
from django.test import override_settings
from hypothesis import given
from hypothesis import strategies as st

from chatparity.models import Backend, ModelAlias
from project.asgi import application
from tests.support.fuzz import CHECKS, FUZZ_SETTINGS, MODES, bounded

RANDOM_EXAMPLES = 100  # per generation mode
EMBEDDING_ALIAS = "embed-fuzz"


def assert_embeddings_answer(response):
    assert response.status_code < 500, response.text
    body = response.json()
    if response.status_code >= 400:
        assert set(body) == {"error"}, body
        assert set(body["error"]) == {"message", "type", "param", "code"}, body
    else:
        assert body["object"] == "list"
        assert [item["index"] for item in body["data"]] == list(range(len(body["data"])))


# Few inputs a request, so that generated breaches of the bound stay small requests.
SETTINGS = {**FUZZ_SETTINGS, "MAX_EMBEDDING_INPUTS": 16}


def test_embeddings_never_answer_a_5xx(api):
    _, client = api
    ModelAlias.objects.create(
        public_id=EMBEDDING_ALIAS, backend=Backend.objects.create(name="e", kind="embedder")
    )
    statuses = Counter()
    with override_settings(CHATPARITY=SETTINGS):
        schema = schemathesis.openapi.from_asgi("/v1/openapi.json", application)
        for mode in MODES:
            fuzz(schema["/embeddings"]["POST"], mode, client, statuses)
    print(f"\n{sum(statuses.values())} cases for POST /embeddings:", dict(statuses))
    assert statuses[200]  # not only validation: some were answered


def fuzz(operation, mode, client, statuses):
    """RANDOM_EXAMPLES cases in ``mode``: as generated, or naming the embedding alias."""

    @bounded(RANDOM_EXAMPLES)
    @given(case=operation.as_strategy(generation_mode=mode), named=st.booleans())
    def run(case, named):
        if named and isinstance(case.body, dict) and isinstance(case.body.get("model"), str):
            case.body["model"] = EMBEDDING_ALIAS
        response = case.call(session=client)
        assert_embeddings_answer(response)
        case.validate_response(response, checks=CHECKS)
        statuses[response.status_code] += 1

    run()
