"""The portal in a real headless Chromium against the real daphne.

As the demo project serves it: a user signs in from the landing page, creates a key,
uses it with the OpenAI SDK on the embedded model, finds the request on their page, and
revokes the key, which is refused at once; each change is in the audit trail, from the
portal.

On a bare site (no sign-in page, no base template, chatparity mounted under ``llm/``):
the portal signs the user in itself, looks finished in light and dark, tells the API's
real base URLs, its snippets run as copied, and its playground streams an answer with
its tokens and cost.

Set ``CHATPARITY_SCREENSHOTS=<folder>`` to save screenshots of the pages on the way.
"""

import json
import re
import subprocess
import sys
import time
from contextlib import contextmanager
from decimal import Decimal

import httpx
import openai
import pytest
from openai import OpenAI

from tests.e2e.conftest import screenshot, serving_with_settings

pytestmark = pytest.mark.e2e

USER = ("portal-user", "a-portal-password-for-e2e")


@pytest.fixture(scope="module")
def user(daphne_server):
    """A plain user of the demo site (not staff): the demo gives every user the portal."""
    name, password = USER
    create = "from django.contrib.auth.models import User;"
    create += f" User.objects.create_user({name!r}, password={password!r})"
    daphne_server.manage("shell", "-c", create)
    return USER


@pytest.fixture
def page(browser, daphne_server):
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    page = context.new_page()
    page.set_default_timeout(15_000)
    yield page
    context.close()


def audit_entries(server, prefix):
    """The audit trail's (source, actor, action) of the key with ``prefix``, oldest first."""
    read = (
        "import json; from chatparity.audit.models import AuditEntry;"
        f" entries = AuditEntry.objects.filter(object_repr__endswith={f'({prefix}…)'!r});"
        " print(json.dumps(list(entries.order_by('pk').values_list('source', 'actor_name',"
        " 'action'))))"
    )
    printed = server.manage("shell", "-c", read).splitlines()[-1]
    return [tuple(entry) for entry in json.loads(printed)]


def sign_in(page, url, user, path):
    """Sign ``user`` (name, password) in on the portal's own page, where ``page`` was sent
    from ``path``, and wait to be back there."""
    name, password = user
    page.wait_for_url(f"{url}/portal/login/?next={path}")
    page.fill("#id_username", name)
    page.fill("#id_password", password)
    page.click("#sign-in button[type=submit]")
    page.wait_for_url(f"{url}{path}")


def ask(server, plaintext):
    with OpenAI(base_url=server.base_url, api_key=plaintext, max_retries=0) as sdk:
        return sdk.chat.completions.create(
            model="smollm2", messages=[{"role": "user", "content": "Say hi"}], max_tokens=5
        )


def test_a_user_creates_uses_and_revokes_a_key(page, daphne_server, user):
    url = daphne_server.url
    name, _ = user

    page.goto(f"{url}/")
    page.click("text=Your API keys")
    sign_in(page, url, user, "/portal/")
    assert "Plan Starter" in page.inner_text("body")

    page.fill("#id_name", "browser-portal-key")
    page.click("#new-key button[type=submit]")
    plaintext = page.input_value("#plaintext-key")
    assert plaintext.startswith("sk-cp-")
    screenshot(page, "portal-key-created")

    completion = ask(daphne_server, plaintext)
    assert completion.choices[0].message.content

    deadline = time.monotonic() + 10
    page.goto(f"{url}/portal/requests/")
    while completion.model not in page.inner_text("#requests"):  # its row, once written
        assert time.monotonic() < deadline, "the request never reached the portal's page"
        time.sleep(0.2)
        page.reload()
    assert plaintext[:10] in page.inner_text("#requests")
    screenshot(page, "portal-requests")

    page.goto(f"{url}/portal/")
    row = page.locator("#keys tr", has_text="browser-portal-key")
    assert plaintext not in page.content()
    row.locator("button.revoke").click()
    page.wait_for_url(f"{url}/portal/")
    assert row.locator(".status").inner_text() == "revoked"

    with pytest.raises(openai.AuthenticationError):
        ask(daphne_server, plaintext)
    entries = audit_entries(daphne_server, plaintext[:10])
    assert ("portal", name, "create") in entries
    assert entries[-1] == ("portal", name, "update")


# A site as ``django-admin startproject`` makes it, with the portal added as
# docs/site-users.md says: no login views, no base template of its own, /v1 under llm/.
BARE_SETTINGS = """\
ROOT_URLCONF = "tests.support.bare_site_urls"
LOGIN_URL = "chatparity-portal:login"
CHATPARITY = {**CHATPARITY, "PORTAL": {}}  # noqa: F405
"""
BARE_USER = ("bare-site-user", "a-bare-site-password-for-e2e")


@pytest.fixture(scope="module")
def bare_site(daphne_server, tmp_path_factory):
    """The URL of a bare site on the demo's database, and a user of it (in the demo's
    portal group, under the plan "Starter")."""
    name, password = BARE_USER
    create = "from django.contrib.auth.models import User;"
    create += f" User.objects.create_user({name!r}, password={password!r})"
    daphne_server.manage("shell", "-c", create)
    folder = tmp_path_factory.mktemp("bare-site")
    with serving_with_settings(daphne_server, folder, BARE_SETTINGS) as url:
        yield url


@contextmanager
def signed_in(browser, url, path="/portal/", **options):
    """A page in a browser context of its own (``options``), where the bare site's user
    has signed in on the portal's own page, sent there from ``path``."""
    context = browser.new_context(viewport={"width": 1280, "height": 900}, **options)
    try:
        page = context.new_page()
        page.set_default_timeout(60_000)
        page.goto(f"{url}{path}")
        sign_in(page, url, BARE_USER, path)
        yield page
    finally:
        context.close()


def copied(page, snippet):
    """The text the copy button of ``snippet`` puts on the clipboard."""
    page.click(f"#snippet-{snippet} button.copy")
    page.wait_for_selector(f"#snippet-{snippet} button.copy:has-text('Copied')")
    return page.evaluate("navigator.clipboard.readText()")


def run(command, **kwargs):
    finished = subprocess.run(command, capture_output=True, text=True, timeout=300, **kwargs)
    assert finished.returncode == 0, finished.stderr
    return finished.stdout


def test_a_bare_site_signs_in_tells_the_real_urls_and_its_snippets_run(browser, bare_site):
    with signed_in(browser, bare_site, permissions=["clipboard-read", "clipboard-write"]) as page:
        snippets_run_as_copied(page, bare_site)


def snippets_run_as_copied(page, bare_site):
    assert "Plan Starter" in page.inner_text("body")
    font = page.evaluate("getComputedStyle(document.body).fontFamily")
    assert "system-ui" in font  # the portal's stylesheet, not the browser's serif

    page.fill("#id_name", "snippets")
    page.click("#new-key button[type=submit]")
    plaintext = page.input_value("#plaintext-key")
    assert page.inner_text("#openai-base-url") == f"{bare_site}/llm/v1"
    assert page.inner_text("#anthropic-base-url") == f"{bare_site}/llm"
    assert "smollm2" in page.inner_text("#models")
    assert "embed-small" not in page.inner_text("#models")  # it does not chat
    screenshot(page, "bare-portal-key-created")
    # Other tests' aliases on this database (upstreams that only embed) may come first.
    if page.locator("#snippet-model").count():
        page.select_option("#snippet-model", "smollm2")

    python = copied(page, "openai-python")
    assert plaintext in python
    assert run([sys.executable, "-c", python]).strip()
    anthropic = copied(page, "anthropic-python")
    assert run([sys.executable, "-c", anthropic]).strip()
    curl = copied(page, "curl")
    answer = json.loads(run(["bash", "-c", curl]))
    assert answer["choices"][0]["message"]["content"]
    claude_code = copied(page, "claude-code")
    assert f"export ANTHROPIC_BASE_URL={bare_site}/llm\n" in claude_code
    assert f"export ANTHROPIC_AUTH_TOKEN={plaintext}\n" in claude_code
    assert "export ANTHROPIC_MODEL=smollm2\n" in claude_code
    codex = copied(page, "codex")
    assert f'base_url = "{bare_site}/llm/v1"' in codex
    assert 'model = "smollm2"' in codex

    page.goto(f"{bare_site}/portal/")
    row = page.locator("#keys tr", has_text="snippets")
    limits = row.locator(".limits").inner_text()
    assert re.search(r"requests this minute: \d+ of 60\n", limits)
    assert "tokens this month (all your keys):" in limits  # the plan's shared budget
    assert "of 1,000,000" in limits
    screenshot(page, "bare-portal-keys")

    page.click("text=Sign out")
    page.wait_for_url(f"{bare_site}/portal/login/")
    page.goto(f"{bare_site}/portal/")
    page.wait_for_url(f"{bare_site}/portal/login/?next=/portal/")


@pytest.mark.parametrize(("scheme", "dark"), [("light", False), ("dark", True)])
def test_the_portal_follows_the_systems_light_or_dark(browser, bare_site, scheme, dark):
    with signed_in(browser, bare_site, "/portal/usage/", color_scheme=scheme) as page:
        background = page.evaluate("getComputedStyle(document.body).backgroundColor")
        screenshot(page, f"bare-portal-usage-{scheme}")
    red, green, blue = (int(part) for part in background[4:-1].split(","))
    assert (red + green + blue < 3 * 128) is dark, background


@pytest.fixture
def playground(browser, bare_site):
    """The playground's page, the bare site's user signed in, on the model smollm2."""
    with signed_in(browser, bare_site, "/portal/playground/") as page:
        models = page.locator("#playground-model option").all_inner_texts()
        assert "smollm2" in models
        assert "embed-small" not in models  # it does not chat
        page.select_option("#playground-model", "smollm2")
        yield page


def test_the_playground_streams_an_answer_with_its_tokens_and_cost(
    playground, bare_site, daphne_server
):
    page = playground

    # Each change of the answer as it arrives, counted in the page.
    page.evaluate(
        """() => {
            window.answerChanges = 0;
            new MutationObserver(() => { window.answerChanges++; }).observe(
                document.getElementById("playground-transcript"),
                {subtree: true, characterData: true, childList: true});
        }"""
    )
    page.fill("#playground-max-tokens", "24")
    page.fill("#playground-temperature", "0")
    page.fill("#playground-prompt", "Name three colours.")
    page.keyboard.press("Enter")
    stats = page.locator(".turn.assistant .stats[data-cost]")
    stats.wait_for()
    answer = page.inner_text(".turn.assistant .text")
    assert answer
    assert page.evaluate("window.answerChanges") > 5  # streamed, not shown at once
    completion_tokens = int(stats.get_attribute("data-completion-tokens"))
    assert 0 < completion_tokens <= 24
    shown = stats.inner_text()
    screenshot(page, "bare-portal-playground")

    stored = json.loads(page.evaluate("sessionStorage.getItem('chatparity-playground-key')"))
    assert stored["key"] not in page.content()  # in the tab's storage, not in the page
    (row,) = daphne_server.written_rows(key_prefix=stored["prefix"])
    assert row["stream"]
    assert row["completion_tokens"] == completion_tokens
    assert Decimal(stats.get_attribute("data-cost")) == Decimal(str(row["cost"]))
    assert f"{completion_tokens} completion" in shown

    page.goto(f"{bare_site}/portal/requests/")
    assert f"playground {stored['prefix']}…" in page.inner_text("#requests")

    # Signing out ends the playground's key with the session.
    page.goto(f"{bare_site}/portal/")
    page.click("text=Sign out")
    page.wait_for_url(f"{bare_site}/portal/login/")
    refused = httpx.get(
        f"{bare_site}/llm/v1/models", headers={"Authorization": f"Bearer {stored['key']}"}
    )
    assert refused.status_code == 401


def test_the_playground_replaces_a_dead_key_keeps_the_conversation_and_stops(
    playground, daphne_server
):
    page = playground
    dead = {"key": "sk-cp-revoked-long-ago", "prefix": "sk-cp-revo", "expires_at": "2999-01-01"}
    page.evaluate(
        f"sessionStorage.setItem('chatparity-playground-key', {json.dumps(json.dumps(dead))})"
    )
    page.fill("#playground-max-tokens", "8")
    page.fill("#playground-prompt", "Hi")
    page.click("#playground-send")
    page.locator(".turn.assistant .stats[data-cost]").nth(0).wait_for()  # answered all the same
    stored = json.loads(page.evaluate("sessionStorage.getItem('chatparity-playground-key')"))
    assert stored["key"] != dead["key"]

    page.fill("#playground-prompt", "And again")
    page.click("#playground-send")
    page.locator(".turn.assistant .stats[data-cost]").nth(1).wait_for()
    first, second = daphne_server.written_rows(key_prefix=stored["prefix"])
    # The second request carried the first exchange.
    assert second["prompt_tokens"] > first["prompt_tokens"] + first["completion_tokens"]

    page.fill("#playground-max-tokens", "1000")
    page.fill("#playground-prompt", "Write a long story about a lighthouse.")
    page.click("#playground-send")
    page.wait_for_function(
        "document.querySelectorAll('.turn.assistant .text')[2]?.textContent.length > 0"
    )
    page.click("#playground-stop")
    stopped = page.locator(".turn.assistant.stopped")
    stopped.wait_for()
    assert stopped.locator(".stats").inner_text() == "Stopped."
    assert not page.is_disabled("#playground-send")
    assert daphne_server.written_rows(key_prefix=stored["prefix"], cancelled=True)
