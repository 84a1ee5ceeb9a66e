"""The portal's pages inside the site: its base template, the system checks that guard
its settings."""

from pathlib import Path

import pytest
from django.core.checks import run_checks
from django.test import TestCase, override_settings

from chatparity.models import Plan
from tests.support.users import portal_user

SITE_TEMPLATES = Path(__file__).resolve().parent.parent / "support" / "templates"


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
        for page in ("/portal/", "/portal/usage/", "/portal/requests/"):
            html = self.client.get(page).content.decode()
            assert '<header id="site-header">Example site</header>' in html
            assert "| Example site</title>" in html
            assert '<nav class="portal-nav">' in html


@pytest.mark.parametrize(
    ("portal", "error"),
    [
        ({"BASE_TEMPLATE": "no/such/base.html"}, "chatparity_portal.E002"),
        ({"MAX_KEYS": 0}, "chatparity_portal.E003"),
        ({"RECENT_REQUESTS": "100"}, "chatparity_portal.E003"),
    ],
)
def test_a_setting_that_cannot_work_is_an_error(settings, portal, error):
    settings.CHATPARITY = {"PORTAL": portal}
    assert error in portal_errors()


def test_the_defaults_pass():
    assert portal_errors() == {}
