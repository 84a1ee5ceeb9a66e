"""Virtualenvs other than the test environment: for clients whose requirements cannot
share it (LlamaIndex pins openai<3, the Agents SDK needs openai>=3), one of their own
under ``.cache/``, made once per list of requirements; and fresh ones, for what a user
installs by hand."""

import hashlib
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def python_with(name: str, requirements: list[str]) -> Path:
    """The Python of ``.cache/venv-<name>`` holding ``requirements``, made if needed."""
    folder = ROOT / ".cache" / f"venv-{name}"
    python = folder / "bin" / "python"
    stamp = folder / "requirements.sha256"
    wanted = hashlib.sha256("\n".join(sorted(requirements)).encode()).hexdigest()
    if not (python.exists() and stamp.exists() and stamp.read_text() == wanted):
        subprocess.run([sys.executable, "-m", "venv", "--clear", folder], check=True)
        subprocess.run(
            [python, "-m", "pip", "install", "--quiet", *requirements],
            check=True, capture_output=True, timeout=900,
        )  # fmt: skip
        stamp.write_text(wanted)
    return python


def run_script(python: Path, script: str, *arguments: str, timeout: float = 300) -> str:
    """Run ``script`` with ``python``; its stdout (a failure shows its stderr)."""
    done = subprocess.run(
        [python, "-c", script, *arguments], capture_output=True, text=True, timeout=timeout
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


# What of the test's environment a user's shell would not have.
NOT_THE_USERS = ("PYTHONPATH", "DJANGO_SETTINGS_MODULE", "DATABASE_URL", "REDIS_URL")


def users_shell() -> dict[str, str]:
    """The environment of a user's shell: the test environment's own left out (its
    virtualenv's ``bin`` on PATH, PYTHONPATH, the settings module, the databases)."""
    own = str(Path(sys.executable).parent)
    path = [entry for entry in os.environ["PATH"].split(os.pathsep) if entry != own]
    env = {name: value for name, value in os.environ.items() if name not in NOT_THE_USERS}
    return env | {"PATH": os.pathsep.join(path)}


def fresh_venv(folder: Path) -> dict[str, str]:
    """A new virtualenv at ``folder`` (pip alone), and the environment of a user's shell
    that activated it."""
    subprocess.run([sys.executable, "-m", "venv", folder], check=True)
    env = users_shell()
    return env | {"PATH": f"{folder / 'bin'}{os.pathsep}{env['PATH']}", "VIRTUAL_ENV": str(folder)}
