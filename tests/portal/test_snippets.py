"""The snippets of the key-created page: each says the real base URL, the key and the
model, read back as its own language reads it (the shell, Python, TOML), whatever the
model's name holds."""

import ast
import json
import shlex
import tomllib

import pytest

from chatparity.portal.endpoints import ApiUrls
from chatparity.portal.snippets import snippets

URLS = ApiUrls(
    openai="https://example.com/llm/v1",
    anthropic="https://example.com/llm",
    chat_completions="/llm/v1/chat/completions",
)
KEY = "sk-cp-abcdefghijklmnopqrstuvwxyz_-0123456789"
NAMES = ["smollm2", 'it\'s "quoted" $HOME `x` \\ é 😀\x7f', "a b\nc"]


def texts(model):
    return {snippet.slug: snippet.text for snippet in snippets(URLS, KEY, model)}


def python_call(source, function):
    """The keyword arguments of the call to ``...function(...)`` in ``source``, read by
    Python."""
    calls = [
        node
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.Call) and ast.unparse(node.func).endswith(function)
    ]
    (call,) = calls
    return {keyword.arg: ast.literal_eval(keyword.value) for keyword in call.keywords}


def shell_exports(source):
    """The variables ``source`` exports, as the shell reads them."""
    words = shlex.split(source, comments=True)
    return dict(word.split("=", 1) for word in words if "=" in word)


def test_every_client_the_issue_names_has_one():
    assert list(texts("smollm2")) == [
        "curl", "openai-python", "anthropic-python", "claude-code", "codex",
    ]  # fmt: skip


@pytest.mark.parametrize("model", NAMES)
def test_curl_posts_the_model_with_the_key_to_the_openai_base_url(model):
    words = shlex.split(texts(model)["curl"].replace("\\\n", " "))
    assert words[:2] == ["curl", "https://example.com/llm/v1/chat/completions"]
    assert words[words.index("-H") + 1] == f"Authorization: Bearer {KEY}"
    body = json.loads(words[words.index("-d") + 1])
    assert body["model"] == model
    assert body["messages"][0]["role"] == "user"


@pytest.mark.parametrize("model", NAMES)
def test_the_openai_sdk_gets_the_v1_base_url(model):
    source = texts(model)["openai-python"]
    assert python_call(source, "OpenAI") == {"base_url": URLS.openai, "api_key": KEY}
    assert python_call(source, "completions.create")["model"] == model


@pytest.mark.parametrize("model", NAMES)
def test_the_anthropic_sdk_gets_the_mount_without_v1(model):
    source = texts(model)["anthropic-python"]
    assert python_call(source, "Anthropic") == {"base_url": URLS.anthropic, "api_key": KEY}
    assert python_call(source, "messages.create")["model"] == model


@pytest.mark.parametrize("model", NAMES)
def test_claude_code_gets_the_anthropic_base_url_the_key_and_the_model(model):
    exports = shell_exports(texts(model)["claude-code"])
    assert exports["ANTHROPIC_BASE_URL"] == URLS.anthropic
    assert exports["ANTHROPIC_AUTH_TOKEN"] == KEY
    assert exports["ANTHROPIC_MODEL"] == model


@pytest.mark.parametrize("model", NAMES)
def test_codex_gets_a_config_toml_on_the_responses_api(model):
    config = tomllib.loads(texts(model)["codex"])
    assert config["model"] == model
    assert config["model_provider"] == "chatparity"
    provider = config["model_providers"]["chatparity"]
    assert provider["base_url"] == URLS.openai
    assert provider["wire_api"] == "responses"
    assert provider["env_key"] == "CHATPARITY_API_KEY"
