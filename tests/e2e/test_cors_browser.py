"""CORS in a real headless Chromium: a page served from another origin calls /v1 on the
real daphne with ``fetch`` and with openai-node's browser build. The allowed origin
gets its answers, streamed or not; another origin is refused by the browser itself.

openai-node is the e2e conftest's (installed with npm into ``var/npm`` the first time).
"""

import json
import threading
from functools import partial
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer

import pytest

from tests.e2e.conftest import serving_with_cors

pytestmark = pytest.mark.e2e

PAGE = """<!doctype html>
<meta charset="utf-8">
<title>A page of another origin</title>
<script type="module">
window.openaiNode = import("/openai/index.mjs").then((module) => module.default);
</script>
"""

# Calls made from the page: fetch resolves to {status, headers, text}, or to
# {refused: message} when the browser blocks the request.
FETCH = """async ([url, key, body]) => {
  try {
    const response = await fetch(url, {
      method: "POST",
      headers: {"Authorization": `Bearer ${key}`, "Content-Type": "application/json"},
      body: JSON.stringify(body),
    });
    return {
      status: response.status,
      requestId: response.headers.get("x-request-id"),
      text: await response.text(),
    };
  } catch (error) {
    return {refused: String(error)};
  }
}"""

SDK = """async ([baseURL, key, stream]) => {
  const OpenAI = await window.openaiNode;
  const client = new OpenAI({baseURL, apiKey: key, dangerouslyAllowBrowser: true, maxRetries: 0});
  const request = {
    model: "smollm2", messages: [{role: "user", content: "Say hi"}], max_tokens: 5,
  };
  try {
    if (!stream) {
      const {data, response} = await client.chat.completions.create(request).withResponse();
      const requestId = response.headers.get("x-request-id");
      return {content: data.choices[0].message.content, requestId};
    }
    const chunks = await client.chat.completions.create({...request, stream: true});
    let content = "";
    for await (const chunk of chunks) content += chunk.choices[0]?.delta?.content ?? "";
    return {content};
  } catch (error) {
    return {refused: `${error.constructor.name}: ${error.message}`};
  }
}"""


@pytest.fixture(scope="module")
def pages(tmp_path_factory, openai_node):
    """A static server of the page (and openai-node at /openai/) on a port of its own:
    http://localhost:<port> and http://127.0.0.1:<port> are two origins."""
    root = tmp_path_factory.mktemp("pages")
    (root / "index.html").write_text(PAGE)
    (root / "openai").symlink_to(openai_node)

    class Quiet(SimpleHTTPRequestHandler):
        extensions_map = {**SimpleHTTPRequestHandler.extensions_map, ".mjs": "text/javascript"}

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), partial(Quiet, directory=str(root)))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield server.server_address[1]
    server.shutdown()
    server.server_close()


@pytest.fixture(scope="module")
def cors_server(daphne_server, pages, tmp_path_factory):
    """The live server allowing one origin: the page served from localhost."""
    folder = tmp_path_factory.mktemp("cors_settings")
    with serving_with_cors(daphne_server, [f"http://localhost:{pages}"], folder) as url:
        yield url


def page_at(browser, origin):
    context = browser.new_context()
    page = context.new_page()
    page.set_default_timeout(30_000)
    page.goto(f"{origin}/index.html")
    return page


@pytest.fixture(scope="module")
def allowed_page(browser, pages):
    page = page_at(browser, f"http://localhost:{pages}")
    yield page
    page.context.close()


@pytest.fixture(scope="module")
def other_page(browser, pages):
    page = page_at(browser, f"http://127.0.0.1:{pages}")
    yield page
    page.context.close()


def completion_body(**extra):
    return {
        "model": "smollm2",
        "messages": [{"role": "user", "content": "Say hi"}],
        "max_tokens": 5,
        **extra,
    }


def test_fetch_from_the_allowed_origin_reads_a_completion(allowed_page, cors_server, daphne_server):
    url = f"{cors_server}/v1/chat/completions"
    result = allowed_page.evaluate(FETCH, [url, daphne_server.key, completion_body()])
    assert result["status"] == 200, result
    assert result["requestId"].startswith("req_")  # exposed to the page
    assert json.loads(result["text"])["object"] == "chat.completion"


def test_fetch_from_the_allowed_origin_reads_a_stream(allowed_page, cors_server, daphne_server):
    url = f"{cors_server}/v1/chat/completions"
    body = completion_body(stream=True)
    result = allowed_page.evaluate(FETCH, [url, daphne_server.key, body])
    assert result["status"] == 200, result
    assert result["text"].startswith("data: {")
    assert result["text"].endswith("data: [DONE]\n\n")


def test_fetch_from_the_allowed_origin_reads_an_error(allowed_page, cors_server):
    url = f"{cors_server}/v1/chat/completions"
    result = allowed_page.evaluate(FETCH, [url, "sk-cp-wrong", completion_body()])
    assert result["status"] == 401, result
    assert json.loads(result["text"])["error"]["code"] == "invalid_api_key"


def test_fetch_from_another_origin_is_refused_by_the_browser(
    other_page, cors_server, daphne_server
):
    url = f"{cors_server}/v1/chat/completions"
    result = other_page.evaluate(FETCH, [url, daphne_server.key, completion_body()])
    assert result == {"refused": "TypeError: Failed to fetch"}


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
def test_openai_node_in_the_browser(allowed_page, cors_server, daphne_server, stream):
    result = allowed_page.evaluate(SDK, [f"{cors_server}/v1", daphne_server.key, stream])
    assert "refused" not in result, result
    assert result["content"]
    if not stream:
        assert result["requestId"].startswith("req_")


def test_openai_node_from_another_origin_cannot_connect(other_page, cors_server, daphne_server):
    result = other_page.evaluate(SDK, [f"{cors_server}/v1", daphne_server.key, False])
    assert result["refused"].startswith("APIConnectionError")
