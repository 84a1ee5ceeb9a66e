"""Where the portal says the API is: read from where the site's URLconf mounts
``chatparity.urls``, with the request's scheme and host; and which of a user's aliases
chat."""

from django.test import RequestFactory, TestCase, override_settings
from django.urls import set_script_prefix

from chatparity.models import Backend, ModelAlias
from chatparity.portal.endpoints import api_urls, chat_aliases


def request(secure=False, host="example.com"):
    return RequestFactory().get("/portal/", secure=secure, headers={"host": host})


@override_settings(ALLOWED_HOSTS=["example.com", "api.example.com"])
class ApiUrlsTests(TestCase):
    def test_mounted_at_the_root_the_openai_base_url_ends_in_v1(self):
        urls = api_urls(request())
        assert (urls.openai, urls.anthropic) == ("http://example.com/v1", "http://example.com")
        assert urls.chat_completions == "/v1/chat/completions"

    @override_settings(ROOT_URLCONF="tests.support.bare_site_urls")
    def test_mounted_under_a_path_both_base_urls_carry_it(self):
        urls = api_urls(request(secure=True, host="api.example.com:8443"))
        assert urls.openai == "https://api.example.com:8443/llm/v1"
        assert urls.anthropic == "https://api.example.com:8443/llm"
        assert urls.chat_completions == "/llm/v1/chat/completions"

    @override_settings(FORCE_SCRIPT_NAME="/site/")
    def test_a_site_served_under_a_script_prefix_is_told_with_it(self):
        set_script_prefix("/site/")
        self.addCleanup(set_script_prefix, "/")
        urls = api_urls(request())
        assert (urls.openai, urls.anthropic) == (
            "http://example.com/site/v1",
            "http://example.com/site",
        )

    @override_settings(ROOT_URLCONF="tests.support.portal_only_urls")
    def test_nothing_is_told_when_the_api_is_not_mounted(self):
        assert api_urls(request()) is None


class ChatAliasesTests(TestCase):
    def test_only_aliases_that_chat_on_an_enabled_backend_by_name(self):
        local = Backend.objects.create(name="local", kind="local")
        embedder = Backend.objects.create(name="embedder", kind="embedder")
        off = Backend.objects.create(name="off", kind="local", enabled=False)
        broken = Backend.objects.create(name="broken", kind="local")
        Backend.objects.filter(pk=broken.pk).update(kind="gone")  # a kind no longer configured
        for public_id, backend in [
            ("Zeta", local), ("alpha", local), ("embed-small", embedder), ("old", off),
            ("lost", broken),
        ]:  # fmt: skip
            ModelAlias.objects.create(public_id=public_id, backend=backend)
        assert chat_aliases(ModelAlias.objects.all()) == ["alpha", "Zeta"]
