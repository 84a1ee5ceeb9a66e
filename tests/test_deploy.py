"""The example project's two modes: development with no environment at all, and
``DJANGO_ENV=production``, which must pass ``check --deploy`` without a single issue."""

import json
import os
import runpy
import subprocess
import sys
from pathlib import Path
from unittest import mock

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.test import TestCase, override_settings

from tests.support import spools

ROOT = Path(__file__).resolve().parent.parent
SETTINGS = ROOT / "project" / "settings.py"
ENV_TEMPLATE = ROOT / "project" / "deploy" / "chatparity.env"

PRODUCTION = {
    "DJANGO_ENV": "production",
    "SECRET_KEY": "x7Kq2-vN9pL4mR8tW1yZ5bC3dF6gH0jS_aE2uI9oP4lK7nM1qT8rV3wX6zY5",
    "ALLOWED_HOSTS": "chat.example.com",
    "CSRF_TRUSTED_ORIGINS": "https://chat.example.com",
    "SECURE_PROXY_SSL_HEADER": "X-Forwarded-Proto:https",
    "DATABASE_URL": "postgres://chatparity:secret@db.internal:5432/chatparity",
    "REDIS_URL": "redis://redis.internal:6379/0",
}


def template_value(name: str) -> str:
    """``name``'s value in the production environment template."""
    for line in ENV_TEMPLATE.read_text().splitlines():
        if line.startswith(f"{name}="):
            return line.partition("=")[2]
    raise LookupError(name)


def load_settings(**env: str) -> dict[str, object]:
    """The settings module's names, read with exactly ``env`` as the environment."""
    with mock.patch.dict(os.environ, env, clear=True):
        return runpy.run_path(str(SETTINGS))


def python(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """``python args`` in the project's folder, with exactly ``env`` (and PATH)."""
    return subprocess.run(
        [sys.executable, *args],
        cwd=ROOT,
        env={"PATH": os.environ["PATH"], **env},
        capture_output=True,
        text=True,
        timeout=120,
    )


def manage(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return python("manage.py", *args, env=env)


def test_development_is_the_default_and_needs_no_environment():
    settings = load_settings()
    assert settings["DEBUG"] is True
    assert settings["SECRET_KEY"] == settings["DEV_SECRET_KEY"]
    assert settings["ALLOWED_HOSTS"] == ["localhost", "127.0.0.1", "[::1]"]
    assert settings["DATABASES"]["default"]["ENGINE"] == "django.db.backends.sqlite3"
    layer = settings["CHANNEL_LAYERS"]["default"]["BACKEND"]
    assert layer == "channels.layers.InMemoryChannelLayer"
    assert settings["SECURE_PROXY_SSL_HEADER"] is None
    for production_only in ("SESSION_COOKIE_SECURE", "SECURE_SSL_REDIRECT", "LOGGING"):
        assert production_only not in settings


def test_development_check_passes_with_no_environment_at_all():
    result = manage("check", env={})
    assert result.returncode == 0, result.stderr
    assert "System check identified no issues" in result.stdout


def test_production_check_deploy_reports_nothing():
    result = manage("check", "--deploy", "--fail-level", "DEBUG", env=PRODUCTION)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "System check identified no issues" in result.stdout
    assert "WARNINGS" not in result.stdout + result.stderr


def test_production_refuses_to_start_without_a_secret_key():
    env = {name: value for name, value in PRODUCTION.items() if name != "SECRET_KEY"}
    result = manage("check", env=env)
    assert result.returncode != 0
    assert "ImproperlyConfigured" in result.stderr
    assert "SECRET_KEY" in result.stderr


@pytest.mark.parametrize(
    ("change", "named"),
    [
        ({"SECRET_KEY": "chatparity-dev-only-not-secret"}, "SECRET_KEY"),
        ({"SECRET_KEY": ""}, "SECRET_KEY"),
        ({"SECRET_KEY": template_value("SECRET_KEY")}, "SECRET_KEY"),
        ({"SECRET_KEY": "x7Kq2-vN9pL4mR8tW1yZ5bC3dF6gH0jS_aE2uI9oP4lK7nM1q"}, "SECRET_KEY"),
        ({"SECRET_KEY": "abcd" * 20}, "SECRET_KEY"),
        (
            {"SECRET_KEY": "django-insecure-x7Kq2-vN9pL4mR8tW1yZ5bC3dF6gH0jS_aE2uI9oP4l"},
            "SECRET_KEY",
        ),
        ({"DEBUG": "1"}, "DEBUG"),
        ({"ALLOWED_HOSTS": ""}, "ALLOWED_HOSTS"),
        ({"DJANGO_ENV": "prod"}, "DJANGO_ENV"),
        ({"SECURE_SSL_REDIRECT": "ture"}, "SECURE_SSL_REDIRECT"),
        ({"SECURE_HSTS_SECONDS": "1y"}, "SECURE_HSTS_SECONDS"),
        ({"SECURE_PROXY_SSL_HEADER": "X-Forwarded-Proto"}, "SECURE_PROXY_SSL_HEADER"),
        ({"SECURE_PROXY_SSL_HEADER": '"X-Forwarded-Proto:https"'}, "SECURE_PROXY_SSL_HEADER"),
    ],
)
def test_production_refuses_a_missing_or_malformed_setting(change, named):
    with pytest.raises(ImproperlyConfigured, match=named):
        load_settings(**{**PRODUCTION, **change})


def test_production_defaults_are_strict():
    settings = load_settings(**PRODUCTION)
    assert settings["DEBUG"] is False
    assert settings["SESSION_COOKIE_SECURE"] is True
    assert settings["CSRF_COOKIE_SECURE"] is True
    assert settings["SECURE_SSL_REDIRECT"] is True
    assert settings["SECURE_HSTS_SECONDS"] == 365 * 24 * 3600
    assert settings["SECURE_HSTS_INCLUDE_SUBDOMAINS"] is True
    assert settings["SECURE_HSTS_PRELOAD"] is False
    assert settings["ALLOWED_HOSTS"] == ["chat.example.com"]
    assert settings["CSRF_TRUSTED_ORIGINS"] == ["https://chat.example.com"]
    assert settings["SECURE_PROXY_SSL_HEADER"] == ("HTTP_X_FORWARDED_PROTO", "https")
    assert settings["DATABASES"]["default"]["ENGINE"] == "django.db.backends.postgresql"
    assert settings["CACHES"]["default"]["LOCATION"] == "redis://redis.internal:6379/0"
    assert settings["CHANNEL_LAYERS"]["default"]["CONFIG"]["hosts"] == [
        "redis://redis.internal:6379/0"
    ]


def test_production_knobs_come_from_the_environment():
    settings = load_settings(
        **{
            **PRODUCTION,
            "DEBUG": "0",
            "SECURE_SSL_REDIRECT": "0",
            "SECURE_HSTS_SECONDS": "3600",
            "SECURE_HSTS_INCLUDE_SUBDOMAINS": "no",
            "SECURE_HSTS_PRELOAD": "yes",
            "ALLOWED_HOSTS": "chat.example.com, .chat.example.net",
            "LOG_LEVEL": "warning",
        }
    )
    assert settings["DEBUG"] is False
    assert settings["SECURE_SSL_REDIRECT"] is False
    assert settings["SECURE_HSTS_SECONDS"] == 3600
    assert settings["SECURE_HSTS_INCLUDE_SUBDOMAINS"] is False
    assert settings["SECURE_HSTS_PRELOAD"] is True
    assert "SILENCED_SYSTEM_CHECKS" not in settings  # W021 is only moot while preload is off
    assert settings["ALLOWED_HOSTS"] == ["chat.example.com", ".chat.example.net"]
    assert settings["LOGGING"]["root"]["level"] == "WARNING"


def test_production_logs_to_stdout():
    result = manage(
        "shell",
        "-c",
        "import logging; logging.getLogger('chatparity').warning('upstream down')",
        env=PRODUCTION,
    )
    assert result.returncode == 0, result.stderr
    assert "WARNING chatparity" in result.stdout
    assert "upstream down" in result.stdout


# Requests through the example project's ASGI application (the /v1 fast path in
# front of Django), in a process started with the production environment.
FAST_PATH_REQUESTS = """
import asyncio, json
from asgiref.testing import ApplicationCommunicator
from project.asgi import application
from tests.asgi import http_scope

async def get(headers):
    communicator = ApplicationCommunicator(application, http_scope("GET", "/v1/models", headers))
    await communicator.send_input({"type": "http.request", "body": b""})
    start = await communicator.receive_output(timeout=10)
    await communicator.wait(timeout=10)
    headers = {name.decode(): value.decode() for name, value in start["headers"]}
    return {"status": start["status"], "headers": headers}

async def main():
    host = ("host", "chat.example.com")
    print(json.dumps({
        "bad host": await get([("host", "evil.example.com"), ("x-forwarded-proto", "https")]),
        "http": await get([host]),
        "https": await get([host, ("x-forwarded-proto", "https")]),
    }))

asyncio.run(main())
"""


def test_production_fast_path_refuses_bad_hosts_redirects_http_and_sends_hsts():
    result = python("-c", FAST_PATH_REQUESTS, env=PRODUCTION)
    assert result.returncode == 0, result.stderr
    *logged, last = result.stdout.splitlines()
    replies = json.loads(last)
    assert replies["bad host"]["status"] == 400
    assert any("Invalid HTTP_HOST header: 'evil.example.com'" in line for line in logged)
    assert replies["http"]["status"] == 301
    assert replies["http"]["headers"]["location"] == "https://chat.example.com/v1/models"
    assert "strict-transport-security" not in replies["http"]["headers"]
    assert replies["https"]["status"] == 401  # reached the endpoint: no key
    hsts = replies["https"]["headers"]["strict-transport-security"]
    assert hsts == "max-age=31536000; includeSubDomains"


_production = load_settings(**PRODUCTION)


@override_settings(
    SECURE_SSL_REDIRECT=True,
    SECURE_REDIRECT_EXEMPT=_production["SECURE_REDIRECT_EXEMPT"],
    SECURE_PROXY_SSL_HEADER=_production["SECURE_PROXY_SSL_HEADER"],
)
class HttpsRedirectTests(TestCase):
    def test_plain_http_is_redirected_to_https(self):
        response = self.client.get("/v1/models")
        assert response.status_code == 301
        assert response["Location"] == "https://testserver/v1/models"

    def test_the_proxy_header_marks_a_request_secure(self):
        response = self.client.get("/v1/models", headers={"X-Forwarded-Proto": "https"})
        assert response.status_code == 401  # reached the view: no key

    def test_the_health_check_is_answered_over_plain_http(self):
        response = self.client.get("/healthz")
        assert response.status_code == 200


LOGINS = """
import django
django.setup()
from django.core.management import call_command
from django.contrib.auth.models import User
from django.test import Client
call_command("migrate", verbosity=0)
User.objects.create_superuser("staff", password="the-right-one")
for address, path in (("192.0.2.1", "/portal/login/"), ("192.0.2.2", "/admin/login/")):
    client = Client(HTTP_HOST="localhost", REMOTE_ADDR=address)
    wrong = [client.post(path, {"username": "staff", "password": f"guess-{i}"}).status_code
             for i in range(5)]
    right = client.post(path, {"username": "staff", "password": "the-right-one"}).status_code
    other = Client(HTTP_HOST="localhost", REMOTE_ADDR="192.0.2.9")  # the user, elsewhere
    print(path, wrong, right, other.post(path, {"username": "staff",
          "password": "the-right-one"}).status_code)
"""


def test_the_example_projects_logins_are_throttled(tmp_path):
    # Security round 4: /portal/login/ and /admin/ took password guesses without end.
    result = subprocess.run(
        [sys.executable, "-c", LOGINS],
        cwd=ROOT,
        env={
            "PATH": os.environ["PATH"],
            "DJANGO_SETTINGS_MODULE": "project.settings",
            "DATABASE_URL": f"sqlite:///{tmp_path / 'logins.sqlite3'}",
        },
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr
    # The fifth wrong password locks that user out from that address (429), the right
    # one too, while it still logs in from another.
    assert result.stdout.splitlines() == [
        "/portal/login/ [200, 200, 200, 200, 429] 429 302",
        "/admin/login/ [200, 200, 200, 200, 429] 429 302",
    ]


def start_worker(env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """What a worker does as it starts, load the ASGI application (``project.asgi``); then
    print the folder it spools in."""
    started = "import project.asgi, chatparity.accounting.spool as s; print(s.real_path())"
    return python("-c", started, env=env)


def test_a_spool_folder_linked_to_a_private_folder_passes_and_is_resolved_at_start(tmp_path):
    configured, real = spools.a_link_to_a_private_folder(tmp_path)
    env = {"CHATPARITY_SPOOL_DIR": str(configured)}
    assert load_settings(**env)["CHATPARITY"]["SPOOL_DIR"] == str(configured)
    checked = manage("check", env=env)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    started = start_worker(env)
    assert started.returncode == 0, started.stderr
    assert started.stdout == f"{real}\n"


def test_a_spool_folder_linked_into_a_shared_folder_stops_the_site_at_start(tmp_path):
    configured, said = spools.a_link_into_a_shared_folder(tmp_path)
    env = {"CHATPARITY_SPOOL_DIR": str(configured)}
    checked = manage("check", env=env)
    assert checked.returncode != 0
    assert "chatparity.E071" in checked.stderr
    assert said in checked.stderr
    started = start_worker(env)
    assert started.returncode != 0
    assert "ImproperlyConfigured" in started.stderr
    assert f"CHATPARITY['SPOOL_DIR'] ({configured}) cannot be used" in started.stderr
