"""The README's path for an existing site ("Add it to an existing Django site"), followed
to the letter on a fresh ``django-admin startproject`` site: its settings, urls and asgi
blocks applied as written, its commands run in its order, the site served as it says.
The site keeps a ``/v1/`` route of its own."""

import os
import re
import shlex
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import httpx
import pytest

from tests.e2e.conftest import ROOT, _free_port

pytestmark = pytest.mark.e2e

BIN = Path(sys.executable).parent
SITE_OWN_ROUTE = """
from django.http import JsonResponse

urlpatterns += [path("v1/things/", lambda request: JsonResponse({"things": "the site's own"}))]
"""
ADMIN = ("admin", "a-password-for-the-readme-test")


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


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    """The site, served: its URL and the API key step 5 printed."""
    folder = tmp_path_factory.mktemp("existing")
    env = {**os.environ, "PATH": f"{BIN}:{os.environ['PATH']}", "PYTHONPATH": str(folder)}
    env.pop("DJANGO_SETTINGS_MODULE", None)
    env |= {"DJANGO_SUPERUSER_USERNAME": ADMIN[0], "DJANGO_SUPERUSER_PASSWORD": ADMIN[1]}
    subprocess.run(["django-admin", "startproject", "mysite", folder], check=True, env=env)
    files, commands = readme_steps()
    assert set(files) == {"mysite/settings.py", "mysite/urls.py", "mysite/asgi.py"}
    with (folder / "mysite/settings.py").open("a") as settings:
        settings.write("\n" + files["mysite/settings.py"])
    (folder / "mysite/urls.py").write_text(files["mysite/urls.py"] + SITE_OWN_ROUTE)
    (folder / "mysite/asgi.py").write_text(files["mysite/asgi.py"])
    *setup, serve = commands
    key = ""
    for command in setup:
        argv = shlex.split(command)
        if argv[:3] == ["python", "manage.py", "createsuperuser"]:
            argv += ["--noinput", "--email", "admin@example.com"]  # what it would ask
        argv[0] = sys.executable if argv[0] == "python" else argv[0]
        done = subprocess.run(argv, cwd=folder, env=env, capture_output=True, text=True)
        assert done.returncode == 0, f"{command}: {done.stderr[-2000:]}"
        if "createapikey" in command:
            key = done.stdout.strip()
    port = _free_port()
    assert serve == "uvicorn mysite.asgi:application --lifespan off"
    argv = [str(BIN / "uvicorn"), *shlex.split(serve)[1:], "--port", str(port)]
    log = (folder / "uvicorn.log").open("wb")
    server = subprocess.Popen(argv, cwd=folder, env=env, stdout=log, stderr=log)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while server.poll() is None and time.monotonic() < deadline:
        try:
            httpx.get(f"{url}/llm/healthz", timeout=1)
            break
        except httpx.TransportError:
            time.sleep(0.2)
    else:
        raise AssertionError((folder / "uvicorn.log").read_text()[-2000:])
    yield url, key, folder, env
    server.terminate()
    server.wait(timeout=10)
    log.close()


def test_the_api_answers_under_its_prefix(site):
    url, key, _, _ = site
    models = httpx.get(f"{url}/llm/v1/models", headers={"Authorization": f"Bearer {key}"})
    assert models.status_code == 200
    assert "smollm2" in {model["id"] for model in models.json()["data"]}


def test_the_sites_own_v1_route_is_still_the_sites(site):
    url, *_ = site
    assert httpx.get(f"{url}/v1/things/").json() == {"things": "the site's own"}


def test_the_admin_is_styled_and_the_dashboards_tail_script_loads(site):
    url, *_ = site
    with httpx.Client(base_url=url, follow_redirects=True) as browser:
        login = browser.get("/admin/login/")
        css = re.findall(r'href="(/static/[^"]+\.css)"', login.text)
        assert css
        assert all(browser.get(href).status_code == 200 for href in css)
        browser.post(
            "/admin/login/?next=/admin/",
            data={
                "username": ADMIN[0],
                "password": ADMIN[1],
                "csrfmiddlewaretoken": browser.cookies["csrftoken"],
            },
        )
        dashboard = browser.get("/admin/chatparity_dashboard/usagedashboard/")
        assert dashboard.status_code == 200
        (script,) = re.findall(r'<script src="([^"]*tail\.js)"', dashboard.text)
        tail = browser.get(script)
    assert tail.status_code == 200
    assert "javascript" in tail.headers["content-type"]
    assert "WebSocket" in tail.text


def test_check_reports_nothing_on_the_site_as_set_up(site):
    _, _, folder, env = site
    done = subprocess.run(
        [sys.executable, "manage.py", "check"], cwd=folder, env=env, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    assert "System check identified no issues" in done.stdout, done.stdout + done.stderr
