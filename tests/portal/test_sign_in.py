"""The portal's own sign-in and sign-out pages, for a site that has none: a fresh
``startproject`` site (no ``registration/login.html``, no login URLs) sends visitors to
them with ``LOGIN_URL = "chatparity-portal:login"``."""

from django.core.checks import run_checks
from django.test import Client, TestCase, override_settings

from chatparity.models import Plan
from tests.support.users import PASSWORD, portal_user

LOGIN = "/portal/login/"


@override_settings(ROOT_URLCONF="tests.support.bare_site_urls", LOGIN_URL="chatparity-portal:login")
class SignInTests(TestCase):
    @classmethod
    def setUpTestData(cls):
        cls.alice = portal_user("alice", Plan.objects.create(name="starter"))

    def test_a_visitor_is_sent_to_the_portals_sign_in_page_and_back(self):
        sent = self.client.get("/portal/usage/")
        assert sent.status_code == 302
        assert sent["Location"] == f"{LOGIN}?next=/portal/usage/"
        page = self.client.get(sent["Location"])
        assert page.status_code == 200
        html = page.content.decode()
        assert 'id="sign-in"' in html
        assert "chatparity_portal/portal.css" in html  # finished, on the portal's own base
        assert 'name="next" value="/portal/usage/"' in html
        assert 'class="portal-nav"' not in html  # no one is signed in yet
        signed_in = self.client.post(
            LOGIN, {"username": "alice", "password": PASSWORD, "next": "/portal/usage/"}
        )
        assert signed_in.status_code == 302
        assert signed_in["Location"] == "/portal/usage/"
        assert self.client.get("/portal/usage/").status_code == 200

    def test_without_a_page_to_go_back_to_the_user_lands_on_their_keys(self):
        signed_in = self.client.post(LOGIN, {"username": "alice", "password": PASSWORD})
        assert signed_in["Location"] == "/portal/"

    def test_a_page_of_another_site_is_not_where_the_user_is_sent(self):
        signed_in = self.client.post(
            LOGIN, {"username": "alice", "password": PASSWORD, "next": "https://evil.example/"}
        )
        assert signed_in["Location"] == "/portal/"

    def test_a_wrong_password_is_said_on_the_page(self):
        refused = self.client.post(LOGIN, {"username": "alice", "password": "wrong"})
        assert refused.status_code == 200
        assert "errorlist" in refused.content.decode()
        assert "_auth_user_id" not in self.client.session

    def test_signing_in_needs_the_csrf_token(self):
        strict = Client(enforce_csrf_checks=True)
        assert strict.post(LOGIN, {"username": "alice", "password": PASSWORD}).status_code == 403

    def test_signing_out_is_a_post_that_ends_the_session(self):
        self.client.force_login(self.alice)
        assert self.client.get("/logout/").status_code == 404  # no such URL on this site
        assert self.client.get("/portal/logout/").status_code == 405
        signed_out = self.client.post("/portal/logout/")
        assert signed_out.status_code == 302
        assert signed_out["Location"] == LOGIN
        assert self.client.get("/portal/")["Location"] == f"{LOGIN}?next=/portal/"

    def test_the_pages_of_a_signed_in_user_offer_to_sign_out(self):
        self.client.force_login(self.alice)
        html = self.client.get("/portal/").content.decode()
        assert 'action="/portal/logout/"' in html
        assert "Signed in as alice" in html


def warnings_of(ids):
    return {message.id: message.msg for message in run_checks() if message.id in ids}


@override_settings(ROOT_URLCONF="tests.support.bare_site_urls")
class LoginUrlCheckTests(TestCase):
    def test_a_login_url_no_page_serves_is_a_warning(self):
        # Django's default, on a site without Django's login views.
        with override_settings(LOGIN_URL="/accounts/login/"):
            warning = warnings_of({"chatparity_portal.W001"})["chatparity_portal.W001"]
        assert "'/accounts/login/'" in warning
        with override_settings(LOGIN_URL="login"):  # a name no URL has
            assert "chatparity_portal.W001" in warnings_of({"chatparity_portal.W001"})

    def test_the_portals_page_a_sites_page_or_another_hosts_pass(self):
        for login_url in (
            "chatparity-portal:login",
            "/portal/login/",
            "https://sso.example.com/login",
        ):
            with override_settings(LOGIN_URL=login_url):
                assert warnings_of({"chatparity_portal.W001"}) == {}, login_url
