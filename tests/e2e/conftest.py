"""A real daphne server on loopback, with its own SQLite database, for e2e tests."""

import os
import socket
import sqlite3
import subprocess
import sys
import time
from contextlib import closing
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from openai import OpenAI

ROOT = Path(__file__).resolve().parents[2]


ADMIN = ("admin", "admin-password-for-e2e")


@dataclass
class LiveServer:
    url: str
    key: str
    database: Path
    process: subprocess.Popen
    admin: tuple[str, str] = ADMIN

    @property
    def base_url(self) -> str:
        return f"{self.url}/v1"

    def log_rows(self, **where):
        """RequestLog rows as dicts, read straight from the server's database."""
        clause = " AND ".join(f"{column} = ?" for column in where) or "1"
        with closing(sqlite3.connect(self.database)) as db:
            db.row_factory = sqlite3.Row
            query = f"SELECT * FROM chatparity_requestlog WHERE {clause} ORDER BY id"
            return [dict(row) for row in db.execute(query, tuple(where.values()))]

    def cpu_seconds(self) -> float:
        """User + system CPU time the server process has used so far."""
        fields = Path(f"/proc/{self.process.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _free_port() -> int:
    with closing(socket.socket()) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _manage(env, *args) -> str:
    command = [sys.executable, "manage.py", *args]
    return subprocess.run(
        command, cwd=ROOT, env=env, check=True, capture_output=True, text=True
    ).stdout


@pytest.fixture(scope="session")
def daphne_server(tmp_path_factory):
    database = tmp_path_factory.mktemp("live") / "db.sqlite3"
    env = {**os.environ, "DATABASE_URL": f"sqlite:///{database}", "DEBUG": "0"}
    _manage(env, "migrate", "--verbosity", "0")
    _manage(env, "chatparity_bootstrap")
    key = _manage(env, "createapikey", "e2e").strip()
    username, password = ADMIN
    superuser = {**env, "DJANGO_SUPERUSER_PASSWORD": password}
    _manage(superuser, "createsuperuser", "--noinput", "--username", username, "--email", "admin@example.com")
    port = _free_port()
    log = (database.parent / "daphne.log").open("wb")
    command = [sys.executable, "-m", "daphne", "-b", "127.0.0.1", "-p", str(port)]
    process = subprocess.Popen(
        [*command, "project.asgi:application"], cwd=ROOT, env=env, stdout=log, stderr=log
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    while True:
        try:
            httpx.get(f"{url}/v1/models", timeout=1)
            break
        except httpx.TransportError:
            if process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"daphne did not start: {log.name}") from None
            time.sleep(0.1)
    yield LiveServer(url, key, database, process)
    process.terminate()
    process.wait(timeout=10)
    log.close()


@pytest.fixture
def client(daphne_server):
    with OpenAI(base_url=daphne_server.base_url, api_key=daphne_server.key, max_retries=0) as sdk:
        yield sdk


@pytest.fixture
def http(daphne_server):
    headers = {"Authorization": f"Bearer {daphne_server.key}"}
    with httpx.Client(base_url=daphne_server.url, headers=headers, timeout=60) as session:
        yield session
