"""LlamaIndex's OpenAI-compatible LLM (``OpenAILike``) against a real daphne serving the
embedded model, in a virtualenv of its own (LlamaIndex pins openai<3)."""

import json

import pytest

from tests.support.venvs import python_with, run_script

pytestmark = pytest.mark.e2e

REQUIREMENTS = ["llama-index-llms-openai-like>=0.4"]

CHAT = """
import json, sys
from llama_index.core.llms import ChatMessage
from llama_index.llms.openai_like import OpenAILike

llm = OpenAILike(
    api_base=sys.argv[1], api_key=sys.argv[2], model="smollm2", is_chat_model=True,
    temperature=0, max_tokens=12, max_retries=0,
)
question = [ChatMessage(role="user", content="Name a color.")]
answer = llm.chat(question)
streamed = "".join(piece.delta or "" for piece in llm.stream_chat(question))
print(json.dumps({
    "content": answer.message.content,
    "id": answer.raw.id,
    "usage": answer.raw.usage.model_dump(),
    "streamed": streamed,
}))
"""


@pytest.fixture(scope="module")
def llamaindex_python():
    return python_with("llamaindex", REQUIREMENTS)


def test_chat_and_stream_chat_give_the_same_answer(llamaindex_python, daphne_server):
    out = run_script(llamaindex_python, CHAT, daphne_server.base_url, daphne_server.key)
    result = json.loads(out)
    assert result["content"].strip()
    assert result["streamed"] == result["content"]
    (row,) = daphne_server.written_rows(completion_id=result["id"])
    assert row["completion_tokens"] == result["usage"]["completion_tokens"] > 0
