"""Processes of a test's own: a test's function in a Python process, as another worker
would run it; a command as a user types it, in a terminal or serving until stopped."""

import os
import pty
import select
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path

import httpx


def in_a_process(module: str, call: str) -> subprocess.Popen:
    """``call`` (a function of ``module`` and its arguments) in a new Django process on
    the test settings; its result is printed as JSON on its stdout."""
    script = (
        f"import django, json; django.setup(); import {module} as m; print(json.dumps(m.{call}))"
    )
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "tests.settings"}
    return subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, env=env)


def answering_prompts(
    command: str, answers: list[str], *, cwd: Path, env: dict[str, str], timeout: float = 120
) -> tuple[int, str]:
    """``command`` run by a shell in a terminal of its own, each of ``answers`` typed once
    a prompt (output ending in ": ") asks; its exit status and what it showed."""
    pid, terminal = pty.fork()
    if pid == 0:  # the child: its controlling terminal is the new one
        os.chdir(cwd)
        os.execve("/bin/sh", ["sh", "-c", command], env)
    shown, asked_from, pending = b"", 0, list(answers)
    deadline = time.monotonic() + timeout
    try:
        while select.select([terminal], [], [], max(0, deadline - time.monotonic()))[0]:
            try:
                shown += os.read(terminal, 4096)
            except OSError:  # the command ended: its terminal is closed
                break
            if pending and shown[asked_from:].endswith(b": "):
                os.write(terminal, pending.pop(0).encode() + b"\n")
                asked_from = len(shown)
        else:
            os.kill(pid, signal.SIGKILL)
    finally:
        os.close(terminal)
        _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status), shown.decode(errors="replace")


@contextmanager
def serving(
    command: str, ready: str, *, cwd: Path, env: dict[str, str], timeout: float = 120
) -> Iterator[Path]:
    """``command`` run by a shell in a session of its own until ``ready`` (a URL) answers;
    yields the file of its output; stops it, and every process it started, on exit."""
    with tempfile.NamedTemporaryFile(prefix="serving-", suffix=".log", delete=False) as output:
        log = Path(output.name)
        server = subprocess.Popen(
            command, shell=True, cwd=cwd, env=env, stdout=output, stderr=subprocess.STDOUT,
            start_new_session=True,
        )  # fmt: skip
    try:
        deadline = time.monotonic() + timeout
        while True:
            if server.poll() is not None or time.monotonic() > deadline:
                raise AssertionError(f"{command} did not serve: {log.read_text()[-3000:]}")
            try:
                httpx.get(ready, timeout=1)
                break
            except httpx.TransportError:
                time.sleep(0.2)
        yield log
    finally:
        stop(server)
        log.unlink()


def stop(process: subprocess.Popen, timeout: float = 30) -> None:
    """Stop ``process`` and every process of its group (SIGTERM, then SIGKILL), and wait
    until they are gone."""
    deadline = time.monotonic() + timeout
    with suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGTERM)
        while time.monotonic() < deadline:
            process.poll()  # reaped, the leader leaves the group
            os.killpg(process.pid, 0)
            time.sleep(0.1)
        os.killpg(process.pid, signal.SIGKILL)
    process.wait()
