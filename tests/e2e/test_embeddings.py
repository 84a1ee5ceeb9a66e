"""/v1/embeddings on a real daphne serving the embedded model (``embed-small``, made by
``chatparity_bootstrap``), with each client set up with a base URL, a key and a model
only: openai-python (its base64 default and floats, lists, token ids), openai-node,
LangChain's ``OpenAIEmbeddings`` and LlamaIndex's ``OpenAIEmbedding``."""

import json
import math
import subprocess

import pytest
from langchain_openai import OpenAIEmbeddings

from tests.support.venvs import python_with, run_script

pytestmark = pytest.mark.e2e

MODEL = "embed-small"


def cosine(a, b):
    return sum(x * y for x, y in zip(a, b, strict=True))


def test_openai_python_decodes_its_base64_default(client, daphne_server):
    answer = client.embeddings.create(model=MODEL, input=["The cat sleeps.", "A kitten naps."])
    vectors = [item.embedding for item in answer.data]
    assert [len(vector) for vector in vectors] == [384, 384]
    assert math.isclose(cosine(vectors[0], vectors[0]), 1.0, abs_tol=1e-5)
    as_floats = client.embeddings.create(
        model=MODEL, input=["The cat sleeps.", "A kitten naps."], encoding_format="float"
    )
    assert [item.embedding for item in as_floats.data] == vectors
    assert answer.model == MODEL
    assert answer.usage.prompt_tokens == answer.usage.total_tokens == 9
    rows = daphne_server.written_rows(endpoint="embeddings", alias=MODEL)
    assert rows[-1]["prompt_tokens"] == 9
    assert rows[-1]["response_body"] == ""


def test_openai_python_sends_token_ids(client):
    by_ids = client.embeddings.create(model=MODEL, input=[[7592, 2088], [7592]])
    by_text = client.embeddings.create(model=MODEL, input=["hello world", "hello"])
    for ids, text in zip(by_ids.data, by_text.data, strict=True):
        assert cosine(ids.embedding, text.embedding) > 0.9999
    assert by_ids.usage.prompt_tokens == 3


def test_openai_python_gets_openais_errors(client):
    from openai import BadRequestError, NotFoundError

    with pytest.raises(BadRequestError, match=r"'\$\.input' is invalid"):
        client.embeddings.create(model=MODEL, input="")
    with pytest.raises(BadRequestError, match="does not serve embeddings"):
        client.embeddings.create(model="smollm2", input="hello")
    with pytest.raises(NotFoundError):
        client.embeddings.create(model="no-such-model", input="hello")


NODE_SCRIPT = """
const {default: OpenAI} = await import(process.argv[1]);
const client = new OpenAI({baseURL: process.argv[2], apiKey: process.argv[3], maxRetries: 0});
const byDefault = await client.embeddings.create({model: "embed-small", input: ["a dog", "a cat"]});
const asFloats = await client.embeddings.create(
  {model: "embed-small", input: ["a dog", "a cat"], encoding_format: "float"});
console.log(JSON.stringify({
  byDefault: byDefault.data.map((item) => item.embedding),
  asFloats: asFloats.data.map((item) => item.embedding),
  usage: byDefault.usage,
}));
"""


def test_openai_node(openai_node, daphne_server):
    done = subprocess.run(
        ["node", "--input-type=module", "-e", NODE_SCRIPT, "--",
         (openai_node / "index.mjs").as_uri(), daphne_server.base_url, daphne_server.key],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    answer = json.loads(done.stdout)
    assert [len(vector) for vector in answer["byDefault"]] == [384, 384]
    for decoded, floats in zip(answer["byDefault"], answer["asFloats"], strict=True):
        assert decoded == pytest.approx(floats, abs=1e-7)
    assert answer["usage"] == {"prompt_tokens": 4, "total_tokens": 4}


def test_langchain_ranks_the_related_document_first(daphne_server):
    embeddings = OpenAIEmbeddings(
        base_url=daphne_server.base_url, api_key=daphne_server.key, model=MODEL,
        check_embedding_ctx_length=False, max_retries=0,
    )  # fmt: skip
    documents = [
        "The invoice is due at the end of the month.",
        "Kittens love to nap in warm places.",
        "The train to Berlin leaves at noon.",
    ]
    vectors = embeddings.embed_documents(documents)
    query = embeddings.embed_query("Where do cats like to sleep?")
    scores = [cosine(query, vector) for vector in vectors]
    assert max(range(3), key=scores.__getitem__) == 1


LLAMAINDEX = """
import json, sys
from llama_index.embeddings.openai import OpenAIEmbedding

model = OpenAIEmbedding(
    model_name="text-embedding-3-small", api_base=sys.argv[1], api_key=sys.argv[2],
    max_retries=0,
)
texts = model.get_text_embedding_batch(["Kittens love to nap.", "The train leaves at noon."])
query = model.get_query_embedding("Where do cats sleep?")
print(json.dumps({"texts": texts, "query": query}))
"""


def test_llamaindex_on_an_alias_named_as_openais_model(daphne_server):
    """LlamaIndex's OpenAIEmbedding takes OpenAI's model names only: the site names an
    alias of the embedded model so."""
    daphne_server.manage(
        "shell", "-c",
        "from chatparity.models import Backend, ModelAlias;"
        " ModelAlias.objects.get_or_create(public_id='text-embedding-3-small',"
        " defaults={'backend': Backend.objects.get(name='embedder')})",
    )  # fmt: skip
    daphne_server.wait_for_models("text-embedding-3-small")
    python = python_with("llamaindex-embeddings", ["llama-index-embeddings-openai>=0.3"])
    answer = json.loads(run_script(python, LLAMAINDEX, daphne_server.base_url, daphne_server.key))
    related, unrelated = (cosine(answer["query"], text) for text in answer["texts"])
    assert len(answer["query"]) == 384
    assert related > unrelated + 0.3
