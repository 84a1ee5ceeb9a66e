"""``manage.py chatparity_conformance`` against real servers on the same GGUF model:
chatparity itself, the example project as ``make run`` serves it, passes every check;
llama-cpp-python's own OpenAI server does not.
"""

import json
import subprocess
import sys
from io import StringIO
from pathlib import Path

import pytest
from django.core.management import call_command

from chatparity.conformance.messages import CHECKS as MESSAGES_CHECKS
from chatparity.conformance.responses import CHECKS as RESPONSES_CHECKS
from chatparity.conformance.suite import CHECKS

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]


def test_chatparity_passes_every_check(daphne_server):
    out = StringIO()
    # Named: other tests add aliases to the same live server (one that sorts first would
    # otherwise be the model under test).
    call_command(
        "chatparity_conformance",
        daphne_server.base_url,
        "--key",
        daphne_server.key,
        "--model",
        "smollm2",
        "--embedding-model",
        "embed-small",
        stdout=out,
    )  # returning at all means exit status 0; fmt: skip
    table = out.getvalue()
    print(table)
    assert table.splitlines()[-1] == f"{len(CHECKS)} checks: {len(CHECKS)} passed, 0 failed"
    assert "FAIL" not in table


# What llama-cpp-python 0.3.x's server really gets wrong, found by running it.
LLAMA_CPP_DEFECTS = {
    "models.list": ["data[0] lacks or mistypes created"],
    "nonstream.envelope": ["no system_fingerprint key"],
    "nonstream.message": ["message lacks refusal", "message lacks annotations"],
    "nonstream.usage": ["prompt_tokens_details is null", "completion_tokens_details is null"],
    "stream.envelope": ["no system_fingerprint key", "no service_tier key"],
    "stream.choices": ['does not open with a role chunk {"role":"assistant","content":"","refu'],
    "usage.stream": ["no usage key (must be null", "include_usage ignored"],
    "parity.stream-vs-nonstream": ["the stream has no usage chunk"],
    "length.stream": ["no usage to count completion tokens"],
    "n.nonstream": ["choice indices are [0], expected [0, 1]"],
    "n.stream": ["choice indices are [0], expected [0, 1]"],
    "tools.required.stream": ["no tool call was streamed", "expected 'tool_calls'"],
    "tools.named.stream": [
        'first delta of call 0 has function {"name":"get_weather","arguments":"{"}',
        "later deltas of call 0 carry more than index and function.arguments",
        "does not open with a role chunk",
        "expected just one of content, tool_calls, refusal",
        'has finish_reason "tool_calls" on a chunk with delta {"role":null',
        "finish_reason is \"tool_calls\", expected 'stop'",
    ],
    "tools.required.nonstream": [
        "message lacks refusal",
        "message.tool_calls is null",
        "expected 'tool_calls'",
    ],
    "errors.missing-messages": ["HTTP 200 (application/json), expected 400"],
    "errors.bad-key": ["HTTP 200 (application/json), expected 401"],
    "errors.unknown-model": ["HTTP 200 (application/json), expected 404"],
    "errors.stream-status": ["HTTP 200 (text/event-stream), expected 400"],
    "errors.unknown-argument": ["HTTP 200 (application/json), expected 400"],
    "errors.temperature": ["HTTP 200 (application/json), expected 400"],
    # It takes no response_format of type json_schema (a 500, from its request model).
    "schema.numeric-bounds": ["HTTP 500 (application/json), expected 200"],
    # The deprecated functions are answered as tools.
    "functions.named.nonstream": ["message.tool_calls is", "expected 'stop'"],
    "functions.named.stream": ["role chunk is", "expected just function_call"],
    "functions.auto.nonstream": ["message lacks refusal", "message lacks annotations"],
    "functions.none.nonstream": ["message lacks refusal", "message lacks annotations"],
    "stop.empty-list": ["no system_fingerprint key"],
    "errors.metadata-without-store": ["HTTP 200 (application/json), expected 400"],
    "errors.metadata-long-key": ["HTTP 200 (application/json), expected 400"],
    "errors.logit-bias-range": ["HTTP 200 (application/json), expected 400"],
    "errors.modalities": ["HTTP 200 (application/json), expected 400"],
    "errors.audio-format": ["HTTP 200 (application/json), expected 400"],
    "errors.max-tokens-combination": ["HTTP 200 (application/json), expected 400"],
    "errors.empty-model-first": ["HTTP 200 (application/json), expected 400"],
    "errors.unknown-model-first": ["HTTP 200 (application/json), expected 404"],
    "errors.check-order": ["HTTP 200 (application/json), expected 400"],
    "errors.refusal-part": ["HTTP 500 (application/json), expected 400"],
}
# It has no /v1/responses, and no /v1/messages (its 404 is not Anthropic's either).
LLAMA_CPP_DEFECTS |= {
    check.name: ["HTTP 404 (application/json)"] for check in (*RESPONSES_CHECKS, *MESSAGES_CHECKS)
}
LLAMA_CPP_DEFECTS["messages.error.model"] = [
    "no request-id header",
    'body is {"detail":"Not Found"}, expected {"type": "error"',
]


def test_chatparity_chained_through_its_messages_api_passes_the_messages_checks(daphne_server):
    """An alias whose upstream is chatparity itself spoken to on /v1/messages
    (``wire_api: messages``): Anthropic's API in front of Anthropic's API."""
    daphne_server.manage(
        "shell",
        "-c",
        "from chatparity.models import Backend, ModelAlias;"
        " backend = Backend.objects.create(name='chained-messages', kind='openai',"
        f" base_url='{daphne_server.base_url}', secret='{daphne_server.key}',"
        " options={'wire_api': 'messages', 'retries': 0});"
        " ModelAlias.objects.create(public_id='chained-messages', backend=backend,"
        " model='smollm2')",
    )
    daphne_server.wait_for_models("chained-messages")
    out = StringIO()
    call_command(
        "chatparity_conformance", daphne_server.base_url, "--key", daphne_server.key,
        "--model", "chained-messages", "--only", "messages.", stdout=out,
    )  # fmt: skip
    table = out.getvalue()
    print(table)
    checks = len(MESSAGES_CHECKS)
    assert table.splitlines()[-1] == f"{checks} checks: {checks} passed, 0 failed"


def test_llama_cpp_server_fails_with_its_real_defects(llama_cpp_server):
    command = [sys.executable, "manage.py", "chatparity_conformance", llama_cpp_server.base_url]
    done = subprocess.run(
        [*command, "--key", "unused", "--json"], cwd=ROOT, capture_output=True, text=True
    )
    assert done.returncode == 1, done.stderr
    report = json.loads(done.stdout)
    problems = {check["name"]: check["problems"] for check in report["checks"] if not check["ok"]}
    print(json.dumps(problems, indent=2))
    assert problems.keys() == LLAMA_CPP_DEFECTS.keys()
    for name, expected in LLAMA_CPP_DEFECTS.items():
        for words in expected:
            assert any(words in problem for problem in problems[name]), (name, words)
    passed = {check["name"] for check in report["checks"] if check["ok"]}
    assert passed == {
        "stream.framing",
        "stream.no-usage",
        "length.nonstream",
        "cors.preflight",  # it lets every origin's pages call it
        "cors.response",
    }


def test_every_check_passes_again_on_answers_from_the_response_cache(daphne_server):
    """The whole suite twice on an alias that keeps every answer (the example project's
    response cache, in its memory): the second run is answered from the cache, stream
    or object whichever form filled each entry, and passes every check."""
    daphne_server.manage(
        "shell",
        "-c",
        "from chatparity.models import Backend, ModelAlias;"
        " local = ModelAlias.objects.get(public_id='smollm2');"
        " ModelAlias.objects.create(public_id='smollm2-cached', backend=local.backend,"
        " model=local.model, response_cache={'enabled': True, 'nonreproducible': True,"
        " 'tool_calls': True})",
    )
    daphne_server.wait_for_models("smollm2-cached")
    arguments = [daphne_server.base_url, "--key", daphne_server.key, "--model", "smollm2-cached"]
    for _ in range(2):
        out = StringIO()
        call_command("chatparity_conformance", *arguments, "--skip", "embeddings", stdout=out)
    table = out.getvalue()
    print(table)
    assert table.splitlines()[-1].endswith(" passed, 0 failed")
    hits = daphne_server.written_rows(alias="smollm2-cached", cache="hit")
    rows = daphne_server.log_rows(alias="smollm2-cached")
    print(f"{len(hits)} of {len(rows)} rows of the two runs answered from the cache")
    assert len(hits) >= 20  # every answer the first run kept was read again
