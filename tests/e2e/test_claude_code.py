"""Claude Code (npm ``@anthropic-ai/claude-code``) in print mode, set up as the README
says (a base URL, a key and a model: nothing else), finishing a task with its own
tools on an alias of a real daphne, offline. The alias's upstream plays the model's
part from a script (:class:`tests.scripted.ScriptedUpstream`, in chat completions),
so that the model calls what the task needs: Claude Code's ``Read``. The CLI is
installed from the npm registry into ``.cache/claude-code`` on first use."""

import os
import shutil
import subprocess

import pytest

from tests.e2e.conftest import ROOT
from tests.scripted import Call, ScriptedUpstream
from tests.support.prompt_cache import CachingUpstream, markers

pytestmark = pytest.mark.e2e

CLAUDE_CODE_VERSION = "2.1.328"
CACHE = ROOT / ".cache" / "claude-code"
ALIAS = "claude-scripted"
PACKAGE = CACHE / "node_modules" / "@anthropic-ai" / "claude-code"


@pytest.fixture(scope="session")
def claude():
    """The ``claude`` program, installed with npm once per version. npm runs no install
    script of a dependency unless told: the package's own wrapper finds the binary of
    this platform's package."""
    installed = PACKAGE / "package.json"
    if not installed.exists() or f'"version": "{CLAUDE_CODE_VERSION}"' not in installed.read_text():
        if shutil.which("npm") is None:
            pytest.fail("npm is needed to install Claude Code")
        CACHE.mkdir(parents=True, exist_ok=True)
        subprocess.run(
            ["npm", "install", "--no-audit", "--no-fund",
             f"@anthropic-ai/claude-code@{CLAUDE_CODE_VERSION}"],
            cwd=CACHE, check=True, capture_output=True, timeout=600,
        )  # fmt: skip
    return ["node", str(PACKAGE / "cli-wrapper.cjs")]


@pytest.fixture
def task(tmp_path):
    work = tmp_path / "work"
    work.mkdir()
    (work / "task.txt").write_text("water the plants\n")
    return work


@pytest.fixture
def upstream(task):
    scripted = ScriptedUpstream(
        {
            "scripted-model": [
                Call("Read", {"file_path": str(task / "task.txt")}),
                "The task says: water the plants.",
            ]
        }
    )
    yield scripted
    scripted.close()


def scripted_alias(daphne_server, upstream, wire_api):
    """The alias, its backend the scripted upstream spoken to in ``wire_api``."""
    daphne_server.manage(
        "shell",
        "-c",
        "from chatparity.models import Backend, ModelAlias;"
        f" ModelAlias.objects.filter(public_id='{ALIAS}').delete();"
        " Backend.objects.filter(name='claude-upstream').delete();"
        " backend = Backend.objects.create(name='claude-upstream', kind='openai',"
        f" base_url='{upstream.base_url}', options={{'retries': 0, 'wire_api': '{wire_api}'}});"
        f" ModelAlias.objects.create(public_id='{ALIAS}', backend=backend,"
        " model='scripted-model')",
    )
    daphne_server.wait_for_models(ALIAS)


def print_mode(claude, daphne_server, task, home):
    """``claude -p`` set up as the README says; its finished process."""
    env = {
        "PATH": os.environ["PATH"],
        "HOME": str(home),
        "ANTHROPIC_BASE_URL": daphne_server.url,
        "ANTHROPIC_AUTH_TOKEN": daphne_server.key,
        "ANTHROPIC_MODEL": ALIAS,
        "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
    }
    finished = subprocess.run(
        [*claude, "-p", "What does task.txt ask for?"],
        cwd=task, env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert finished.returncode == 0, finished.stderr or finished.stdout
    return finished


def assert_logged(daphne_server, user_agent="claude-cli/"):
    rows = daphne_server.written_rows(alias=ALIAS)
    assert [(row["endpoint"], row["status_code"], row["stream"]) for row in rows[-2:]] == [
        ("messages", 200, 1)
    ] * 2
    assert rows[-1]["user_agent"].startswith(user_agent)


def test_claude_code_print_mode_finishes_a_task_with_its_tools(
    claude, daphne_server, upstream, task, tmp_path
):
    scripted_alias(daphne_server, upstream, "chat")
    finished = print_mode(claude, daphne_server, task, tmp_path)
    assert finished.stdout.strip() == "The task says: water the plants."

    first, last = upstream.requests
    offered = {tool["function"]["name"] for tool in first["tools"]}
    assert {"Read", "Bash", "Edit", "Write"} <= offered
    assert first["messages"][0]["role"] == "system"  # Claude Code's system blocks
    assert first["stream"] is True
    # The Read call reached Claude Code's tool, whose result went back to the model.
    result = last["messages"][-1]
    while result["role"] != "tool":  # Claude Code may add a reminder after it
        result = last["messages"][last["messages"].index(result) - 1]
    assert "water the plants" in result["content"]
    assert_logged(daphne_server)


def test_claude_code_through_an_upstream_that_speaks_the_messages_api(
    claude, daphne_server, upstream, task, tmp_path
):
    """Anthropic's API on both sides (``wire_api: messages``), as in front of Claude."""
    scripted_alias(daphne_server, upstream, "messages")
    finished = print_mode(claude, daphne_server, task, tmp_path)
    assert finished.stdout.strip() == "The task says: water the plants."

    (path, headers), _ = upstream.heads
    assert (path, headers["anthropic-version"]) == ("/v1/messages", "2023-06-01")
    first, last = upstream.requests
    assert {"Read", "Bash"} <= {tool["name"] for tool in first["tools"]}
    assert any("cache_control" in block for block in first["system"]), "its markers, as sent"
    results = [
        block
        for turn in last["messages"]
        if turn["role"] == "user"
        for block in turn["content"]
        if block["type"] == "tool_result"
    ]
    assert "water the plants" in results[-1]["content"]
    assert_logged(daphne_server)


def test_claude_codes_second_turn_reads_the_prompt_cache(claude, daphne_server, task, tmp_path):
    """Through chatparity to an upstream that caches prompts as Anthropic does: Claude
    Code's markers reach it, and its second request reads what the first wrote."""
    caching = CachingUpstream(
        {
            "scripted-model": [
                Call("Read", {"file_path": str(task / "task.txt")}),
                "The task says: water the plants.",
            ]
        }
    )
    try:
        scripted_alias(daphne_server, caching, "messages")
        finished = print_mode(claude, daphne_server, task, tmp_path)
    finally:
        caching.close()
    assert finished.stdout.strip() == "The task says: water the plants."
    first, second = caching.requests
    assert list(markers(first)), "Claude Code marks its prompt"
    assert list(markers(second)), "and moves its marker on"
    wrote, read = caching.reported
    assert wrote["cache_creation_input_tokens"] > 0
    assert read["cache_read_input_tokens"] >= wrote["cache_creation_input_tokens"] // 2
    rows = daphne_server.written_rows(alias=ALIAS)[-2:]
    assert [row["cached_tokens"] for row in rows] == [0, read["cache_read_input_tokens"]]
    assert_logged(daphne_server)
