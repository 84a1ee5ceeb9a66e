"""What a user pastes to use a new key: curl, openai-python, the Anthropic SDK, Claude
Code and Codex, with this site's real base URLs and the user's own model names.

Values are quoted for the language they land in (``shlex`` for the shell, JSON string
literals for Python and TOML), so no model name can break a snippet.
"""

from __future__ import annotations

import json
import shlex
from dataclasses import dataclass

from .endpoints import ApiUrls

PROMPT = "Say hi in five words."
MAX_TOKENS = 256


@dataclass(frozen=True)
class Snippet:
    slug: str
    title: str
    text: str
    note: str = ""


def snippets(urls: ApiUrls, key: str, model: str) -> list[Snippet]:
    """Snippets that use ``key`` on ``model`` at ``urls``."""
    body = {
        "model": model,
        "max_tokens": MAX_TOKENS,
        "messages": [{"role": "user", "content": PROMPT}],
    }
    curl = (
        f"curl {shlex.quote(urls.openai + '/chat/completions')} \\\n"
        f"  -H {shlex.quote('Authorization: Bearer ' + key)} \\\n"
        "  -H 'Content-Type: application/json' \\\n"
        f"  -d {shlex.quote(json.dumps(body))}\n"
    )
    openai = (
        "from openai import OpenAI\n\n"
        "client = OpenAI(\n"
        f"    base_url={literal(urls.openai)}, api_key={literal(key)}\n"
        ")\n"
        "completion = client.chat.completions.create(\n"
        f"    model={literal(model)},\n"
        f"    max_tokens={MAX_TOKENS},\n"
        f'    messages=[{{"role": "user", "content": {literal(PROMPT)}}}],\n'
        ")\n"
        "print(completion.choices[0].message.content)\n"
    )
    anthropic = (
        "import anthropic\n\n"
        "client = anthropic.Anthropic(\n"
        f"    base_url={literal(urls.anthropic)}, api_key={literal(key)}\n"
        ")\n"
        "message = client.messages.create(\n"
        f"    model={literal(model)},\n"
        f"    max_tokens={MAX_TOKENS},\n"
        f'    messages=[{{"role": "user", "content": {literal(PROMPT)}}}],\n'
        ")\n"
        "print(message.content[0].text)\n"
    )
    claude_code = (
        f"export ANTHROPIC_BASE_URL={shlex.quote(urls.anthropic)}\n"
        f"export ANTHROPIC_AUTH_TOKEN={shlex.quote(key)}\n"
        f"export ANTHROPIC_MODEL={shlex.quote(model)}\n"
        "export CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC=1\n"
        "claude\n"
    )
    codex = (
        "# ~/.codex/config.toml\n"
        f"model = {literal(model)}\n"
        'model_provider = "chatparity"\n\n'
        "[model_providers.chatparity]\n"
        'name = "chatparity"\n'
        f"base_url = {literal(urls.openai)}\n"
        'env_key = "CHATPARITY_API_KEY"\n'
        'wire_api = "responses"\n'
    )
    agents = "Needs a model with room for its prompt and tools (some 12,000 to 15,000 tokens)."
    return [
        Snippet("curl", "curl", curl),
        Snippet("openai-python", "OpenAI Python SDK (pip install openai)", openai),
        Snippet("anthropic-python", "Anthropic Python SDK (pip install anthropic)", anthropic),
        Snippet("claude-code", "Claude Code", claude_code, agents),
        Snippet(
            "codex",
            "Codex",
            codex,
            f"Then: export CHATPARITY_API_KEY={shlex.quote(key)} and run codex. {agents}",
        ),
    ]


def literal(value: str) -> str:
    """``value`` as a double-quoted string literal, which Python and TOML read alike
    (TOML takes no raw DEL, nor surrogates, which ``ensure_ascii`` would write)."""
    return json.dumps(value, ensure_ascii=False).replace("\x7f", "\\u007f")
