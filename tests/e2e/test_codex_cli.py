"""OpenAI's Codex CLI (npm ``@openai/codex``), which speaks only the Responses API to a
provider, finishing a task with its default configuration (a provider and a model,
nothing switched off) on an alias of a real daphne, offline. The alias's upstream
plays the model's part from a script (:class:`tests.scripted.ScriptedUpstream`), so
that the model calls what the task needs: a function of Codex's ``multi_agent_v1``
namespace, then its ``exec_command``. The CLI is installed from the npm registry into
``.cache/codex`` on first use."""

import os
import shutil
import subprocess

import pytest

from tests.e2e.conftest import ROOT
from tests.scripted import Call, ScriptedUpstream

pytestmark = pytest.mark.e2e

CODEX_VERSION = "0.169.0"
CACHE = ROOT / ".cache" / "codex"
ALIAS = "codex-scripted"
SCRIPT = [
    Call("multi_agent_v1__close_agent", {"target": "nobody"}),  # a namespace's function
    Call("exec_command", {"cmd": "cat task.txt"}),
    "The task says: water the plants.",
]


@pytest.fixture(scope="session")
def codex():
    """The ``codex`` program, installed with npm once per version."""
    program = CACHE / "node_modules" / ".bin" / "codex"
    installed = CACHE / "node_modules" / "@openai" / "codex" / "package.json"
    if not installed.exists() or f'"version": "{CODEX_VERSION}"' not in installed.read_text():
        if shutil.which("npm") is None:
            pytest.fail("npm is needed to install the Codex CLI")
        CACHE.mkdir(parents=True, exist_ok=True)
        subprocess.run(
            ["npm", "install", "--no-audit", "--no-fund", f"@openai/codex@{CODEX_VERSION}"],
            cwd=CACHE, check=True, capture_output=True, timeout=600,
        )  # fmt: skip
    return program


@pytest.fixture(scope="module")
def upstream():
    scripted = ScriptedUpstream({"scripted-model": SCRIPT})
    yield scripted
    scripted.close()


@pytest.fixture(scope="module")
def codex_alias(daphne_server, upstream):
    """An alias whose backend is the scripted upstream, in chat completions."""
    daphne_server.manage(
        "shell",
        "-c",
        "from chatparity.models import Backend, ModelAlias;"
        " backend = Backend.objects.create(name='scripted-upstream', kind='openai',"
        f" base_url='{upstream.base_url}', options={{'retries': 0}});"
        f" ModelAlias.objects.create(public_id='{ALIAS}', backend=backend,"
        " model='scripted-model')",
    )
    daphne_server.wait_for_models(ALIAS)
    return ALIAS


def default_config(base_url: str) -> str:
    """Codex's configuration as the README gives it: a model and chatparity as the
    provider on the Responses API, and nothing else."""
    return f"""\
model = "{ALIAS}"
model_provider = "chatparity"

[model_providers.chatparity]
name = "chatparity"
base_url = "{base_url}"
env_key = "CHATPARITY_API_KEY"
wire_api = "responses"
"""


def test_codex_exec_with_its_default_configuration_finishes_a_task_with_its_tools(
    codex, codex_alias, daphne_server, upstream, tmp_path
):
    home = tmp_path / "codex-home"
    home.mkdir()
    (home / "config.toml").write_text(default_config(daphne_server.base_url))
    work = tmp_path / "work"
    work.mkdir()
    (work / "task.txt").write_text("water the plants\n")
    env = {
        "PATH": os.environ["PATH"],
        "HOME": str(tmp_path),
        "CODEX_HOME": str(home),
        "CHATPARITY_API_KEY": daphne_server.key,
    }
    finished = subprocess.run(
        [str(codex), "exec", "--skip-git-repo-check", "What does task.txt ask for?"],
        cwd=work, env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert finished.returncode == 0, finished.stderr
    assert finished.stdout.strip() == "The task says: water the plants."

    first, second, last = upstream.requests
    offered = {tool["function"]["name"] for tool in first["tools"]}
    # Codex's functions, its multi_agent_v1 namespace's flat, its hosted web_search not.
    assert {"exec_command", "multi_agent_v1__close_agent", "multi_agent_v1__spawn_agent"} <= offered
    assert all(tool["type"] == "function" for tool in first["tools"])
    # Each call reached the Codex tool it names: the namespace's (no such agent), then
    # the shell's, whose output went back to the model.
    close_output = second["messages"][-1]
    assert close_output["role"] == "tool"
    assert "invalid agent id nobody" in close_output["content"]
    assert "water the plants" in last["messages"][-1]["content"]

    rows = daphne_server.written_rows(alias=codex_alias)
    assert [(row["endpoint"], row["status_code"], row["stream"]) for row in rows] == [
        ("responses", 200, 1)
    ] * 3
    assert "codex" in rows[-1]["user_agent"].lower()
