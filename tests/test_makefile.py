"""The Makefile's installs, read from what ``make -n`` would run (nothing is run): ``make
run`` installs what serving needs and says so, ``make test`` and ``make lint`` the rest,
and stamp files keep either from installing again what the other installed.
``tests/e2e/test_make_run.py`` runs ``make run`` for real."""

import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def checkout(tmp_path):
    """The Makefile and pyproject.toml in a folder of their own, with a virtualenv that has
    a Python and nothing installed."""
    for name in ("Makefile", "pyproject.toml"):
        shutil.copy(ROOT / name, tmp_path / name)
    (tmp_path / ".venv" / "bin").mkdir(parents=True)
    (tmp_path / ".venv" / "bin" / "python").touch()
    return tmp_path


def would_run(checkout: Path, *arguments: str) -> list[str]:
    """The commands ``make arguments`` would run, in order."""
    env = {name: value for name, value in os.environ.items() if not name.startswith("MAKE")}
    done = subprocess.run(
        ["make", "-n", *arguments], cwd=checkout, env=env, capture_output=True, text=True,
        check=True,
    )  # fmt: skip
    return done.stdout.splitlines()


def installed(checkout: Path, *stamps: str) -> None:
    """As if make had installed what ``stamps`` mark, after pyproject.toml last changed."""
    later = time.time() + 10
    for stamp in stamps:
        (checkout / ".venv" / stamp).touch()
        os.utime(checkout / ".venv" / stamp, (later, later))


def pip_installs(commands: list[str]) -> list[str]:
    return [command for command in commands if "/pip install" in command]


def test_make_run_installs_the_example_projects_extra_and_no_test_tools(checkout):
    installs = pip_installs(would_run(checkout, "run"))
    assert installs == [
        ".venv/bin/pip install 'llama-cpp-python==0.3.36'",
        ".venv/bin/pip install -e '.[example]'",
    ]


def test_make_run_shows_pip_at_work_and_says_first_that_the_llama_build_takes_minutes(checkout):
    commands = would_run(checkout, "run")
    assert not [command for command in commands if "--quiet" in command or " -q " in command]
    build = commands.index(".venv/bin/pip install 'llama-cpp-python==0.3.36'")
    said = " ".join(commands[build - 2 : build])
    assert said.startswith('echo "==> llama-cpp-python==0.3.36:')
    assert "compiles" in said
    assert "several minutes" in said


def test_the_llama_build_is_the_one_the_local_extra_pins():
    pyproject = (ROOT / "pyproject.toml").read_text()
    assert 'local = ["llama-cpp-python==0.3.36",' in pyproject


@pytest.mark.parametrize("target", ["test", "lint"])
def test_make_test_and_lint_after_make_run_install_only_the_rest(checkout, target):
    installed(checkout, ".installed-run")
    assert pip_installs(would_run(checkout, target)) == [
        ".venv/bin/pip install -e '.[all,example]' --group dev"
    ]


@pytest.mark.parametrize("target", ["run", "test"])
def test_after_make_test_neither_installs_again(checkout, target):
    installed(checkout, ".installed-run", ".installed")
    assert pip_installs(would_run(checkout, target)) == []


def test_a_changed_pyproject_installs_again(checkout):
    installed(checkout, ".installed-run", ".installed")
    later = time.time() + 20
    os.utime(checkout / "pyproject.toml", (later, later))
    assert len(pip_installs(would_run(checkout, "run"))) == 2


def test_make_run_serves_on_the_port_it_is_given(checkout):
    installed(checkout, ".installed-run")
    assert would_run(checkout, "run", "PORT=8123")[-4:] == [
        ".venv/bin/python manage.py migrate --verbosity 0",
        ".venv/bin/python manage.py chatparity_bootstrap",
        ".venv/bin/python manage.py demo --host 127.0.0.1 --port 8123",
        ".venv/bin/uvicorn project.asgi:application --host 127.0.0.1 --port 8123 --lifespan off",
    ]
