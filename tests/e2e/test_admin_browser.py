"""The admin in a real headless Chromium against the real daphne: a key's life from
creation to the request log, the dashboard's charts and its live tail.

Set ``CHATPARITY_SCREENSHOTS=<folder>`` to save screenshots of the pages on the way.
"""

import pytest
from openai import OpenAI

from tests.e2e.conftest import screenshot

pytestmark = pytest.mark.e2e


@pytest.fixture
def admin_page(browser, daphne_server):
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    page = context.new_page()
    page.set_default_timeout(15_000)
    username, password = daphne_server.admin
    page.goto(f"{daphne_server.url}/admin/login/")
    page.fill("#id_username", username)
    page.fill("#id_password", password)
    page.click("input[type=submit]")
    page.wait_for_url(f"{daphne_server.url}/admin/")
    yield page
    context.close()


def test_a_key_from_creation_to_the_log_the_dashboard_and_the_live_tail(admin_page, daphne_server):
    page, url = admin_page, daphne_server.url

    page.goto(f"{url}/admin/chatparity/apikey/add/")
    page.fill("#id_name", "browser-key")
    page.click("input[name=_save]")
    plaintext = page.input_value("#plaintext-key")
    assert plaintext.startswith("sk-cp-")
    screenshot(page, "key-created")

    page.goto(f"{url}/admin/chatparity/apikey/")
    listing = page.content()
    assert plaintext not in listing
    assert f"{plaintext[:10]}…" in listing

    page.goto(f"{url}/admin/chatparity_dashboard/usagedashboard/")
    page.wait_for_selector("[data-tail-status=live]")

    with OpenAI(base_url=daphne_server.base_url, api_key=plaintext, max_retries=0) as sdk:
        stream = sdk.chat.completions.create(
            model="smollm2",
            messages=[{"role": "user", "content": "Say hi"}],
            max_tokens=5,
            stream=True,
        )
        chunks = list(stream)
    completion_id = chunks[0].id

    row = page.wait_for_selector(f"#live-tail .tail-row:has-text('{plaintext[:10]}')")
    assert "smollm2" in row.inner_text()

    page.goto(f"{url}/admin/chatparity/requestlog/?q={completion_id}")
    logged = page.inner_text("#result_list")
    assert plaintext[:10] in logged
    assert "smollm2" in logged

    page.goto(f"{url}/admin/chatparity_dashboard/usagedashboard/")
    bars = page.locator("svg[data-chart=requests-per-day] rect.bar")
    assert bars.count() >= 1
    assert float(bars.first.get_attribute("height")) > 0
    screenshot(page, "dashboard")
