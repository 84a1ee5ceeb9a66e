"""The README's path for an existing site ("Add it to an existing Django site"), followed
to the letter on a fresh ``django-admin startproject`` site: its settings, urls and asgi
blocks applied as written, its commands run as written by a shell in a fresh virtualenv
that holds only what they install (chatparity from a checkout beside the site), the site
served as it says. The site keeps a ``/v1/`` route of its own.

Slow (a virtualenv and pip, from pip's cache or the package registry; llama-cpp-python
compiles for minutes unless pip's wheel cache has it)."""

import re
import shutil
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest

from tests.e2e.conftest import ROOT, _free_port
from tests.support.processes import answering_prompts, serving
from tests.support.venvs import fresh_venv

pytestmark = [pytest.mark.e2e, pytest.mark.fresh_venv]

SITE_OWN_ROUTE = """
from django.http import JsonResponse

urlpatterns += [path("v1/things/", lambda request: JsonResponse({"things": "the site's own"}))]
"""
ADMIN = ("admin", "a-password-for-the-readme-test")
# What createsuperuser asks, in order, and what the test types.
SUPERUSER_ANSWERS = [ADMIN[0], "admin@example.com", ADMIN[1], ADMIN[1]]
# What a user's checkout holds that pip builds the package from.
CHECKOUT = ("chatparity", "pyproject.toml", "README.md")


def readme_steps() -> tuple[dict[str, str], list[str]]:
    """The section's Python blocks by the file their first line names, and its shell
    commands in order."""
    readme = (ROOT / "README.md").read_text()
    section = readme.split("## Add it to an existing Django site", 1)[1].split("\n## ", 1)[0]
    section = section.split("The other opt-in apps:", 1)[0]
    files, commands = {}, []
    for language, body in re.findall(r"^ *```(\w+)\n(.*?)^ *```", section, re.M | re.S):
        body = textwrap.dedent(body)
        if language == "python":
            first, _, rest = body.partition("\n")
            files[first.removeprefix("# ").strip()] = rest
        else:
            commands += [line.split("  #", 1)[0].strip() for line in body.splitlines()]
    return files, [command for command in commands if command]


def run_as_written(command: str, site: Path, env: dict[str, str]) -> str:
    """``command`` run by a shell in the site's folder, as a user types it; its stdout."""
    if command.split()[-1] == "createsuperuser":  # it asks its questions on a terminal
        status, output = answering_prompts(command, SUPERUSER_ANSWERS, cwd=site, env=env)
        assert status == 0, output[-2000:]
        return output
    done = subprocess.run(
        command, shell=True, cwd=site, env=env, capture_output=True, text=True, timeout=1800
    )
    assert done.returncode == 0, f"{command}: {done.stdout[-2000:]}{done.stderr[-2000:]}"
    return done.stdout


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    """The site, served: its URL, the API key step 5 printed, its folder and environment."""
    base = tmp_path_factory.mktemp("existing")
    for name in CHECKOUT:  # a copy of the checkout: pip builds in it
        source, copy = ROOT / name, base / "chatparity" / name
        if source.is_dir():
            shutil.copytree(source, copy, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy(source, copy)
    django_admin = Path(sys.executable).with_name("django-admin")
    subprocess.run([django_admin, "startproject", "mysite"], cwd=base, check=True)
    folder = base / "mysite"
    files, commands = readme_steps()
    assert set(files) == {"mysite/settings.py", "mysite/urls.py", "mysite/asgi.py"}
    with (folder / "mysite/settings.py").open("a") as settings:
        settings.write("\n" + files["mysite/settings.py"])
    (folder / "mysite/urls.py").write_text(files["mysite/urls.py"] + SITE_OWN_ROUTE)
    (folder / "mysite/asgi.py").write_text(files["mysite/asgi.py"])
    env = fresh_venv(base / "venv")
    *setup, serve = commands
    key = ""
    for command in setup:
        printed = run_as_written(command, folder, env)
        if "createapikey" in command:
            key = printed.strip()
    port = _free_port()
    assert serve == "uvicorn mysite.asgi:application --lifespan off"
    url = f"http://127.0.0.1:{port}"
    # The port of a test's own; else uvicorn's default, 8000, as the README says.
    with serving(serve, f"{url}/llm/healthz", cwd=folder, env={**env, "UVICORN_PORT": str(port)}):
        yield url, key, folder, env


def test_the_virtualenv_holds_only_what_the_readme_installs(site):
    *_, folder, env = site
    script = (
        "import importlib.util, chatparity;"
        "print(chatparity.__file__);"
        "print([name for name in ('pytest', 'mypy', 'rest_framework', 'redis', 'psycopg')"
        " if importlib.util.find_spec(name)])"
    )
    done = subprocess.run(
        ["python", "-c", script], cwd=folder.parent, env=env, capture_output=True, text=True
    )
    installed_at, others = done.stdout.splitlines()
    assert "/venv/lib/" in installed_at
    assert others == "[]"


def test_the_api_answers_under_its_prefix(site):
    url, key, _, _ = site
    models = httpx.get(f"{url}/llm/v1/models", headers={"Authorization": f"Bearer {key}"})
    assert models.status_code == 200
    assert {"smollm2", "embed-small"} <= {model["id"] for model in models.json()["data"]}


def test_the_local_model_answers_a_completion(site):
    url, key, _, _ = site
    completion = httpx.post(
        f"{url}/llm/v1/chat/completions",
        headers={"Authorization": f"Bearer {key}"},
        json={
            "model": "smollm2",
            "messages": [{"role": "user", "content": "Name three colors."}],
            "temperature": 0,
            "max_tokens": 16,
        },
        timeout=120,
    )
    assert completion.status_code == 200, completion.text
    assert completion.json()["choices"][0]["message"]["content"]


def test_embeddings_answer_on_the_alias_the_bootstrap_made(site):
    url, key, _, _ = site
    answer = httpx.post(
        f"{url}/llm/v1/embeddings",
        headers={"Authorization": f"Bearer {key}"},
        json={"model": "embed-small", "input": ["a first text", "a second"]},
        timeout=60,
    )
    assert answer.status_code == 200, answer.text
    assert [len(item["embedding"]) for item in answer.json()["data"]] == [384, 384]


def test_the_sites_own_v1_route_is_still_the_sites(site):
    url, *_ = site
    assert httpx.get(f"{url}/v1/things/").json() == {"things": "the site's own"}


@contextmanager
def signed_in_as_the_superuser(
    url: str, page: str = "/admin/login/?next=/admin/"
) -> Iterator[httpx.Client]:
    """A client signed in on ``page`` (the admin's or the portal's sign-in page) as the
    superuser step 5 made."""
    with httpx.Client(base_url=url, follow_redirects=True) as browser:
        form = browser.get(page)
        assert form.status_code == 200
        signed_in = browser.post(
            page,
            data={
                "username": ADMIN[0],
                "password": ADMIN[1],
                "csrfmiddlewaretoken": browser.cookies["csrftoken"],
            },
        )
        assert signed_in.status_code == 200
        assert "sessionid" in browser.cookies
        yield browser


def test_the_admin_is_styled_and_the_dashboards_tail_script_loads(site):
    url, *_ = site
    with signed_in_as_the_superuser(url) as browser:
        login = httpx.get(f"{url}/admin/login/")
        css = re.findall(r'href="(/static/[^"]+\.css)"', login.text)
        assert css
        assert all(browser.get(href).status_code == 200 for href in css)
        dashboard = browser.get("/admin/chatparity_dashboard/usagedashboard/")
        assert dashboard.status_code == 200
        (script,) = re.findall(r'<script src="([^"]*tail\.js)"', dashboard.text)
        tail = browser.get(script)
    assert tail.status_code == 200
    assert "javascript" in tail.headers["content-type"]
    assert "WebSocket" in tail.text


def test_the_portal_sends_a_visitor_to_its_sign_in_page_and_back(site):
    url, *_ = site
    visitor = httpx.get(f"{url}/portal/")
    assert visitor.status_code == 302
    assert visitor.headers["location"] == "/portal/login/?next=/portal/"
    sign_in = httpx.get(f"{url}{visitor.headers['location']}")
    assert sign_in.status_code == 200
    (stylesheet,) = re.findall(r'href="(/static/chatparity_portal/[^"]+\.css)"', sign_in.text)
    assert httpx.get(f"{url}{stylesheet}").status_code == 200
    with signed_in_as_the_superuser(url, visitor.headers["location"]) as browser:
        keys = browser.get("/portal/")
    assert keys.status_code == 200
    assert "Your API keys" in keys.text


def test_check_reports_nothing_on_the_site_as_set_up(site):
    _, _, folder, env = site
    done = subprocess.run(
        ["python", "manage.py", "check"], cwd=folder, env=env, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    assert "System check identified no issues" in done.stdout, done.stdout + done.stderr
