"""OpenAI's Codex CLI (npm ``@openai/codex``), which speaks only the Responses API to a
provider, finishing a task on an alias of a real daphne serving the embedded model,
offline. The CLI is installed from the npm registry into ``.cache/codex`` on first use."""

import os
import shutil
import subprocess

import pytest

from tests.e2e.conftest import ROOT

pytestmark = pytest.mark.e2e

CODEX_VERSION = "0.169.0"
CACHE = ROOT / ".cache" / "codex"
ALIAS = "codex-smollm2"


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


@pytest.fixture(scope="session")
def codex_alias(daphne_server):
    """An alias of the embedded model that answers greedily: Codex sends no temperature."""
    daphne_server.manage(
        "shell",
        "-c",
        "from chatparity.models import Backend, ModelAlias;"
        f" ModelAlias.objects.get_or_create(public_id='{ALIAS}',"
        " defaults={'backend': Backend.objects.get(kind='local'), 'model': '',"
        " 'default_params': {'temperature': 0}})",
    )
    daphne_server.wait_for_models(ALIAS)
    return ALIAS


def provider_config(base_url: str, instructions: str) -> str:
    """docs/responses.md's Codex configuration: chatparity as a provider on the Responses API."""
    return f"""\
model = "{ALIAS}"
model_provider = "chatparity"
# Codex's own instructions and hosted tools are made for far larger models.
model_instructions_file = "{instructions}"
web_search = "disabled"

[features]
multi_agent = false
goals = false

[model_providers.chatparity]
name = "chatparity"
base_url = "{base_url}"
env_key = "CHATPARITY_API_KEY"
wire_api = "responses"
"""


def test_codex_exec_finishes_a_task_on_an_alias(codex, codex_alias, daphne_server, tmp_path):
    home = tmp_path / "codex-home"
    home.mkdir()
    instructions = home / "instructions.md"
    instructions.write_text("You are a coding agent. Answer briefly.\n")
    (home / "config.toml").write_text(provider_config(daphne_server.base_url, str(instructions)))
    work = tmp_path / "work"
    work.mkdir()
    env = {
        "PATH": os.environ["PATH"],
        "HOME": str(tmp_path),
        "CODEX_HOME": str(home),
        "CHATPARITY_API_KEY": daphne_server.key,
    }
    finished = subprocess.run(
        [str(codex), "exec", "--skip-git-repo-check", "Say hello."],
        cwd=work, env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert finished.returncode == 0, finished.stderr
    assert finished.stdout.strip()  # the agent's last message
    rows = daphne_server.written_rows(alias=codex_alias)
    assert rows
    assert {(row["endpoint"], row["status_code"], row["stream"]) for row in rows} == {
        ("responses", 200, 1)
    }
    assert "codex" in rows[-1]["user_agent"].lower()
    assert rows[-1]["prompt_tokens"] < 4000  # the short instructions, not Codex's own
