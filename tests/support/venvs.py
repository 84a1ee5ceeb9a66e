"""Clients whose requirements cannot share the test environment (LlamaIndex pins
openai<3, the Agents SDK needs openai>=3): a virtualenv of their own under ``.cache/``,
made once per list of requirements."""

import hashlib
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
