"""The portal in a real headless Chromium against the real daphne, as the demo project
serves it: a user signs in from the landing page, creates a key, uses it with the
OpenAI SDK on the embedded model, finds the request on their page, and revokes the key,
which is refused at once; each change is in the audit trail, from the portal.

Set ``CHATPARITY_SCREENSHOTS=<folder>`` to save screenshots of the pages on the way.
"""

import json
import time

import openai
import pytest
from openai import OpenAI

from tests.e2e.conftest import screenshot

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


def ask(server, plaintext):
    with OpenAI(base_url=server.base_url, api_key=plaintext, max_retries=0) as sdk:
        return sdk.chat.completions.create(
            model="smollm2", messages=[{"role": "user", "content": "Say hi"}], max_tokens=5
        )


def test_a_user_creates_uses_and_revokes_a_key(page, daphne_server, user):
    url = daphne_server.url
    name, password = user

    page.goto(f"{url}/")
    page.click("text=Your API keys")
    page.wait_for_url(f"{url}/accounts/login/?next=/portal/")
    page.fill("#id_username", name)
    page.fill("#id_password", password)
    page.click("button[type=submit]")
    page.wait_for_url(f"{url}/portal/")
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
