"""The portal's pages inside the site: its base template, the system checks that guard
its settings."""

import ast
import re
from pathlib import Path

import pytest
from django.contrib.staticfiles import finders
from django.core.checks import run_checks
from django.test import TestCase, override_settings

from chatparity.models import Plan
from tests.support.users import portal_user

ROOT = Path(__file__).resolve().parents[2]
SITE_TEMPLATES = ROOT / "tests" / "support" / "templates"
TEMPLATES = ROOT / "chatparity" / "portal" / "templates" / "chatparity" / "portal"
DOCS = ROOT / "docs" / "site-users.md"
PAGES = ("/portal/", "/portal/playground/", "/portal/usage/", "/portal/requests/")


def portal_errors():
    return {m.id: m.msg for m in run_checks() if m.id.startswith("chatparity_portal")}


@override_settings(
    TEMPLATES=[
        {
            "BACKEND": "django.template.backends.django.DjangoTemplates",
            "DIRS": [SITE_TEMPLATES],
            "APP_DIRS": True,
            "OPTIONS": {
                "context_processors": [
                    "django.template.context_processors.request",
                    "django.contrib.auth.context_processors.auth",
                    "django.contrib.messages.context_processors.messages",
                ]
            },
        }
    ],
    CHATPARITY={"PORTAL": {"BASE_TEMPLATE": "site_base.html"}},
)
class SiteBaseTemplateTests(TestCase):
    def test_every_page_extends_the_sites_base_template(self):
        self.client.force_login(portal_user("alice", Plan.objects.create(name="starter")))
        for page in PAGES:
            html = self.client.get(page).content.decode()
            assert '<header id="site-header">Example site</header>' in html
            assert "chatparity-portal-header" not in html  # the site's header alone
            assert "| Example site</title>" in html
            assert '<nav class="portal-nav">' in html


@pytest.mark.parametrize(
    ("portal", "error"),
    [
        ({"BASE_TEMPLATE": "no/such/base.html"}, "chatparity_portal.E002"),
        ({"MAX_KEYS": 0}, "chatparity_portal.E003"),
        ({"RECENT_REQUESTS": "100"}, "chatparity_portal.E003"),
        ({"PLAYGROUND_MINUTES": 0}, "chatparity_portal.E003"),
    ],
)
def test_a_setting_that_cannot_work_is_an_error(settings, portal, error):
    settings.CHATPARITY = {"PORTAL": portal}
    assert error in portal_errors()


def test_the_defaults_pass():
    assert portal_errors() == {}


def test_the_portal_needs_static_files(settings):
    settings.INSTALLED_APPS = [
        app for app in settings.INSTALLED_APPS if app != "django.contrib.staticfiles"
    ]
    assert "django.contrib.staticfiles" in portal_errors()["chatparity_portal.E001"]


def test_the_docs_settings_for_a_fresh_site_pass_the_checks(settings):
    """docs/site-users.md's settings, as a fresh site (no base template of its own) copies
    them, raise no error or warning of the portal's."""
    block = re.search(r"## Enable the portal\n+```python\n(.*?)```", DOCS.read_text(), re.S)[1]
    assigned = {
        node.targets[0].id: node.value
        for node in ast.parse(block.replace("...,", "")).body
        if isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name)
    }
    settings.CHATPARITY = ast.literal_eval(assigned["CHATPARITY"])
    settings.LOGIN_URL = ast.literal_eval(assigned["LOGIN_URL"])
    assert settings.LOGIN_URL == "chatparity-portal:login"
    assert {m.id for m in run_checks(include_deployment_checks=False)} & {
        "chatparity_portal.E002", "chatparity_portal.W001", "chatparity_portal.E003",
    } == set()  # fmt: skip


class OwnBaseTemplateTests(TestCase):
    """Without BASE_TEMPLATE the portal's pages stand on its own base: a header and its
    stylesheet, light and dark, with nothing fetched from elsewhere."""

    def test_every_page_has_the_portals_header_and_stylesheet(self):
        self.client.force_login(portal_user("alice", Plan.objects.create(name="starter")))
        for page in PAGES:
            html = self.client.get(page).content.decode()
            assert '<body class="chatparity-portal-page">' in html, page
            assert '<header class="chatparity-portal-header">' in html, page
            assert 'href="/static/chatparity_portal/portal.css"' in html, page

    def test_the_stylesheet_is_light_and_dark_and_scoped(self):
        css = Path(finders.find("chatparity_portal/portal.css")).read_text()
        assert "@media (prefers-color-scheme: dark)" in css
        assert "font: 15px/1.5 system-ui" in css
        rules = re.sub(r"/\*.*?\*/", "", css, flags=re.S)
        selectors = re.findall(r"(?:^|[{}])\s*([^{}@;]+?)\s*{", rules)
        for selector in selectors:
            for part in selector.split(","):
                assert part.strip().startswith((".chatparity-portal", "@")), part

    def test_nothing_is_fetched_from_another_host(self):
        for asset in ("portal.css", "playground.js", "copy.js"):
            text = Path(finders.find(f"chatparity_portal/{asset}")).read_text()
            assert not re.search(r"https?://|url\(|@import|//[a-z0-9.-]+\.[a-z]{2,}/", text), asset
        for template in Path(TEMPLATES).glob("*.html"):
            assert not re.search(r'(?:src|href)="(?:https?:)?//', template.read_text()), template
