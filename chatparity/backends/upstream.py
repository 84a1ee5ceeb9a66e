"""The ``openai`` backend: any OpenAI-compatible upstream, over :mod:`._http1`'s pooled
keep-alive connections.

It asks the upstream for a stream with usage when the client streams, else for
a whole completion, and re-reads either through
:class:`~chatparity.protocol.upstream.ChunkReader`, so clients see OpenAI's
canonical stream (or its accumulation) whatever the upstream sent.

Upstreams are not trusted. An answer is read as its content type says: an event
stream (also one not asked for) or a whole JSON completion (also for a stream
request); any other type, an answer without any choice, or a line above
``CHATPARITY["MAX_UPSTREAM_LINE_BYTES"]`` is a 502 (an error frame once the
client has its first byte), never an empty 200; a line too long also closes
its connection. Usage
numbers that cannot be believed (see
:func:`~chatparity.protocol.upstream.believable_usage`) give way to the tokens
counted from what arrived, and the log row says so (``usage_counted``).

Before the first event, refused or reset connections and 5xx answers are
retried with backoff (unless another deployment of the alias may serve: see
:data:`~chatparity.backends.base.asks_again`); the view then falls over to the
alias's other deployments, then its fallbacks. An error answer's ``Retry-After``
(or ``retry-after-ms``) is kept on the error (``UpstreamError.retry_after``): the
deployment cools down for that long.

Each call is noted in :data:`~.base.upstream_calls` as it is sent (and taken back
when the upstream refuses it), with the prompt the upstream says it read as soon as
it says it (a Messages upstream, in ``message_start``): a request the client leaves
is charged what its upstream was sent. A usage it reports none of is counted at the
prompt's bound (:func:`~chatparity.protocol.tokens.prompt_bound`).

Only the conversation and the parameters that shape sampling and format
(:data:`chatparity.protocol.upstream.FORWARDED`) reach the upstream; others, those
that cost money or store data upstream (``service_tier``, ``store``, ``metadata``,
``web_search_options``, ``audio``, ``prediction``, ...), only when the alias
lists them in ``ModelAlias.forwarded_params``.

An upstream's error reaches clients as its status, type and code with a
generic message; its own text (which may name internal hosts or show a masked
key) is logged, and passed on only when the backend opts in.

Options (``Backend.options``): ``retries`` (2), ``backoff`` (seconds, 0.2,
doubled per retry), ``headers`` (extra request headers), ``connect_timeout``
(seconds, 10), ``pass_error_text`` (false: pass the upstream's own error
messages on to clients), ``wire_api`` (``"chat"``: ``/chat/completions``;
``"responses"``: the upstream is asked on ``/responses``, streamed and not
stored there, whichever endpoint the client called, and its typed events read
back with the same repairs and distrust, see
:mod:`~chatparity.protocol.responses_upstream`; ``"messages"``: Anthropic's
Messages API, ``/messages`` with the secret in ``x-api-key`` and
``anthropic-version``, streamed, its named events read back the same way, see
:mod:`~chatparity.protocol.messages_upstream`; so a chat client reaches a Claude
model, and Claude Code any model), ``cache_ttl`` (true; false: a Messages upstream
is sent each cache marker without its ``ttl``, for upstreams that refuse one).
``Backend.timeout`` bounds the whole request.

Cache markers (``cache_control``) reach a Messages upstream where the client put
them; a chat upstream gets those a chat client sent (OpenRouter's form) and none
that the gateway wrote from another API's request, which strict servers refuse.

After ``[DONE]`` the rest of the upstream's body (its last, empty chunk) is
awaited in the background, so that the connection goes back to the pool; a
stream left early (the client hung up) closes its connection at once.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import re
from collections.abc import AsyncGenerator, AsyncIterator
from contextlib import aclosing, asynccontextmanager
from functools import cached_property, partial
from typing import Any

import orjson

from .. import signals
from ..conf import app_settings
from ..protocol import errors, messages_upstream, responses_upstream
from ..protocol.embeddings import (
    MAX_ANSWER_BYTES_PER_INPUT,
    Embeddings,
    EmbeddingsRequest,
    upstream_embeddings,
)
from ..protocol.errors import APIError
from ..protocol.events import Event, UpstreamCalls, Usage
from ..protocol.request import ChatRequest, functions_as_tools, without_cache_markers
from ..protocol.tokens import prompt_bound
from ..protocol.upstream import (
    FORWARDED,
    ChunkReader,
    SSEReader,
    UpstreamError,
    excerpt,
    malformed,
    retry_after,
    upstream_error,
)
from . import _http1
from .base import (
    BackendConfig,
    asks_again,
    http_base_url,
    known_options,
    number_option,
    upstream_calls,
)

logger = logging.getLogger(__name__)

_RETRYABLE_STATUS = frozenset({500, 502, 503, 504, 529})  # 529: Anthropic's overloaded

MAX_ANSWER_BYTES = 64 * 1024 * 1024
"""The largest whole completion read from an upstream (many choices' logprobs are large)."""
MAX_EMBEDDINGS_ANSWER_BYTES = 1024 * 1024
"""What an embeddings answer may weigh besides its vectors (``MAX_ANSWER_BYTES_PER_INPUT``
each)."""
MAX_ERROR_BYTES = 64 * 1024
"""The most of an upstream's error answer read: only its start is logged."""

OPTIONS = frozenset(
    {"retries", "backoff", "headers", "connect_timeout", "pass_error_text", "wire_api", "cache_ttl"}
)
"""What an ``openai`` Backend row's ``options`` may set (see the module docstring)."""

# A header's name (RFC 9110's token) and value (visible text, spaces and tabs).
_HEADER_NAME = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")
_HEADER_VALUE = re.compile(r"[\t\x20-\x7e\x80-\xff]*")
# The request's framing, which the HTTP client sets whatever the headers say.
_FRAMING_HEADERS = frozenset({"content-length", "transfer-encoding"})


def _is_stream(content_type: str, asked: bool) -> bool:
    """Whether an answer of ``content_type`` is an event stream (else a whole JSON
    completion), ``asked``: whether a stream was asked for, the answer's when it names
    no type; an :class:`UpstreamError` for any other type (an HTML page, plain text)."""
    media_type = content_type.partition(";")[0].strip().lower()
    if media_type == "text/event-stream":
        return True
    if media_type == "application/json" or media_type.endswith("+json"):
        return False
    if not media_type:
        return asked
    raise malformed("the answer is neither JSON nor an event stream", media_type)


def timeout_error() -> APIError:
    return errors.timed_out("The upstream did not answer in time.")


def _announce(reader: ChunkReader, calls: UpstreamCalls, announced: Usage | None) -> Usage | None:
    """Note in ``calls`` the prompt of the usage ``reader`` believes now, if it is not
    ``announced`` already; the usage it believes."""
    usage = reader.upstream_usage
    if usage is not announced and usage is not None:
        calls.announced(usage)
    return usage


WIRE_APIS = ("chat", "responses", "messages")
"""What an upstream is called with: Chat Completions, the Responses API, or Anthropic's
Messages API."""
_PATHS = {"chat": "/chat/completions", "responses": "/responses", "messages": "/messages"}
_READERS: dict[str, type[ChunkReader]] = {
    "chat": ChunkReader,
    "responses": responses_upstream.ResponsesEventReader,
    "messages": messages_upstream.MessagesEventReader,
}


class UpstreamBackend:
    """Forwards completions to ``<base_url>/chat/completions`` (or ``/responses``, or
    ``/messages``)."""

    transport = _http1.Endpoint
    """The HTTP client, made with the URL, the headers and ``connect_timeout``
    (``bench/transports.py`` measures others in its place)."""

    check_base_url = staticmethod(http_base_url)

    prompt_caching = True
    """Its upstreams reuse a prompt they saw (OpenAI's, Anthropic's, vLLM's, llama.cpp's
    servers): an alias's sessions stick to a deployment unless it says otherwise."""

    def __init__(self, config: BackendConfig) -> None:
        self.check_options(config.options)
        self.check_base_url(config.base_url)  # a row written past the admin and the API
        self.config = config
        self.wire_api: str = config.options.get("wire_api", "chat")
        self.url = config.base_url.rstrip("/") + _PATHS[self.wire_api]
        self.retries = int(config.options.get("retries", 2))
        self.backoff = float(config.options.get("backoff", 0.2))
        self.headers = {
            "Accept": "application/json, text/event-stream",
            "Content-Type": "application/json",
            **config.options.get("headers", {}),
        }
        if self.wire_api == "messages":
            # Anthropic's API reads the key from x-api-key (an Authorization header is
            # an OAuth token to it).
            self.headers["anthropic-version"] = messages_upstream.ANTHROPIC_VERSION
            if config.secret:
                self.headers["x-api-key"] = config.secret
        elif config.secret:
            self.headers["Authorization"] = f"Bearer {config.secret}"
        self.connect_timeout = min(float(config.options.get("connect_timeout", 10)), config.timeout)
        self.pass_error_text = config.options.get("pass_error_text") is True
        self.cache_ttl = config.options.get("cache_ttl", True) is not False
        digest = hashlib.sha256(f"{config.name}:{config.base_url}".encode()).hexdigest()
        self._fingerprint = f"fp_{digest[:10]}"

    @staticmethod
    def price_provider(options: dict[str, Any]) -> str:
        """Anthropic's prices behind its Messages API, OpenAI's behind the others."""
        return "anthropic" if options.get("wire_api") == "messages" else "openai"

    @staticmethod
    def check_options(options: dict[str, Any]) -> None:
        """:data:`OPTIONS` only, each of its type: ``retries`` 0 to 10, ``backoff`` 0 to
        60 seconds, ``connect_timeout`` above 0 to 600 seconds, ``pass_error_text`` and
        ``cache_ttl`` booleans, ``headers`` names and values an HTTP request can carry, ``wire_api``
        one of :data:`WIRE_APIS`."""
        known_options(options, OPTIONS)
        number_option(options, "retries", 0, 10, integer=True)
        number_option(options, "backoff", 0, 60)
        number_option(options, "connect_timeout", 0.001, 600)
        for flag in ("pass_error_text", "cache_ttl"):
            if not isinstance(options.get(flag, False), bool):
                raise ValueError(f"'{flag}' must be true or false.")
        if options.get("wire_api", "chat") not in WIRE_APIS:
            raise ValueError('\'wire_api\' must be "chat", "responses" or "messages".')
        headers = options.get("headers", {})
        if not isinstance(headers, dict):
            raise ValueError("'headers' must map header names to values.")
        for name, value in headers.items():
            if not _HEADER_NAME.fullmatch(name) or name.lower() in _FRAMING_HEADERS:
                raise ValueError(f"'headers': {name!r} is not a header a backend may set.")
            if not isinstance(value, str) or not _HEADER_VALUE.fullmatch(value):
                raise ValueError(
                    f"'headers': the value of {name!r} must be text without control characters."
                )

    @property
    def system_fingerprint(self) -> str:
        return self._fingerprint

    @cached_property
    def _endpoint(self) -> _http1.Endpoint:
        """Made at the first request, so that a bad URL fails it like an unreachable one."""
        return self.transport(self.url, self.headers, connect_timeout=self.connect_timeout)

    @cached_property
    def _embeddings_endpoint(self) -> _http1.Endpoint:
        url = self.config.base_url.rstrip("/") + "/embeddings"
        return self.transport(url, self.headers, connect_timeout=self.connect_timeout)

    async def embed(self, request: EmbeddingsRequest, model: str) -> Embeddings:
        """The request's vectors from ``<base_url>/embeddings``, asked for in base64 (a
        fifth of the bytes of numbers), read as :func:`upstream_embeddings` reads them;
        retried and timed as a completion."""
        if self.wire_api == "messages":  # Anthropic's API embeds nothing
            raise APIError(
                "The model does not serve embeddings.", param="model", code="model_not_supported"
            )
        body: dict[str, Any] = {
            "model": model or request.model,
            "input": request.body["input"],
            "encoding_format": "base64",
        }
        if request.dimensions is not None:
            body["dimensions"] = request.dimensions
        if request.user is not None and "user" in request.forwarded_params:
            body["user"] = request.user
        deadline = asyncio.get_running_loop().time() + self.config.timeout
        limit = MAX_EMBEDDINGS_ANSWER_BYTES + len(request.inputs) * MAX_ANSWER_BYTES_PER_INPUT
        calls = upstream_calls.get() or UpstreamCalls()
        try:
            async with self._response(
                orjson.dumps(body), deadline, calls, self._embeddings_endpoint
            ) as response:
                if _is_stream(response.headers.get("content-type", ""), False):
                    raise malformed("the embeddings answer is an event stream")
                try:
                    answer = await response.read(limit)
                except _http1.Timeout:
                    raise timeout_error() from None
                except _http1.TooLarge as exc:
                    raise malformed(str(exc)) from None
                except _http1.HTTPError as exc:
                    self._log("the connection dropped", exc)
                    raise malformed(f"the connection dropped ({type(exc).__name__})") from None
            embeddings = upstream_embeddings(answer, request)
        except UpstreamError as error:
            raise self._reported(error) from None
        if embeddings.counted:
            logger.warning(
                "chatparity: backend %s: embeddings usage not believed, tokens counted instead",
                self.config.name,
            )
        return embeddings

    async def stream(self, request: ChatRequest, model: str) -> AsyncIterator[Event]:
        body = {
            name: value
            for name, value in request.body.items()
            if name in FORWARDED or name in request.forwarded_params
        }
        choice = request.tool_choice
        one_choice = self.wire_api != "chat"  # the others answer one choice a request
        if self.wire_api == "responses":
            body = responses_upstream.upstream_request(request, model, body)
        elif self.wire_api == "messages":
            body = messages_upstream.upstream_request(
                request, model, body, cache_ttl=self.cache_ttl
            )
        else:
            if request.translated_markers:  # Anthropic's, which strict servers refuse
                body = without_cache_markers(body)
            body = functions_as_tools(body)  # what every OpenAI-compatible server knows
            if request.max_tokens is None and request.completion_limit is not None:
                body["max_tokens"] = request.completion_limit  # what its admission reserved
            # Streamed only when the client streams: a whole answer is cheaper to read.
            body.update(model=model or request.model, stream=request.stream)
            if request.stream:
                body["stream_options"] = {"include_usage": True}
            if choice.mode == "required" and len(request.tools) == 1:
                # The same request, in the form upstreams that ignore "required" still obey.
                function = {"name": request.tools[0].name}
                body["tool_choice"] = {"type": "function", "function": function}
        calls = upstream_calls.get() or UpstreamCalls()  # read here, in the request's task
        reader = partial(
            _READERS[self.wire_api],
            prompt_tokens=prompt_bound(request),
            call_finish="stop" if choice.mode == "function" else "tool_calls",
            max_tokens=body.get("max_output_tokens", body.get("max_tokens"))
            if one_choice
            else request.most_completion_tokens,
        )
        deadline = asyncio.get_running_loop().time() + self.config.timeout
        # The Responses and Messages APIs answer one choice: each of n is asked on its own.
        primary = reader(n=1 if one_choice else request.n)
        async with aclosing(self._read(body, primary, deadline, calls)) as events:
            async for event in events:
                yield event
        readers = [primary]
        unseen = primary.unseen()
        # An upstream that ignored n: each missing choice is asked for on its own.
        missing = unseen if len(unseen) < request.n else []
        if one_choice:
            missing = list(range(1, request.n))
        for event in primary.close(i for i in primary.indices if i not in missing):
            yield event
        for index in missing:
            extra = reader(n=1, first_index=index)
            one = body if one_choice else {**body, "n": 1}
            async with aclosing(self._read(one, extra, deadline, calls)) as events:
                async for event in events:
                    yield event
            for event in extra.close(extra.indices):
                yield event
            readers.append(extra)
        for refused in (r.refused_usage for r in readers if r.refused_usage is not None):
            logger.warning(
                "chatparity: backend %s: usage not believed, tokens counted instead: %s",
                self.config.name,
                self._masked(excerpt(refused)),
            )
        yield Usage(
            prompt_tokens=sum(r.usage.prompt_tokens for r in readers),
            completion_tokens=sum(r.usage.completion_tokens for r in readers),
            cached_tokens=sum(r.usage.cached_tokens for r in readers),
            reasoning_tokens=sum(r.usage.reasoning_tokens for r in readers),
            cache_write_5m_tokens=sum(r.usage.cache_write_5m_tokens for r in readers),
            cache_write_1h_tokens=sum(r.usage.cache_write_1h_tokens for r in readers),
            counted=any(r.usage.counted for r in readers),
        )

    async def _read(
        self, body: dict[str, Any], reader: ChunkReader, deadline: float, calls: UpstreamCalls
    ) -> AsyncGenerator[Event, None]:
        """The events of one upstream request, up to its ``[DONE]`` or the end of its body,
        the call noted in ``calls`` with the prompt the upstream says it read as soon as
        it says it (a Messages upstream, at its first event).

        What its content type says is read: a stream (also one it was not asked for) or
        a whole completion (also for a stream request); anything else is malformed."""
        line_limit = app_settings.MAX_UPSTREAM_LINE_BYTES
        announced: Usage | None = None
        try:
            async with self._response(orjson.dumps(body), deadline, calls) as response:
                sse = SSEReader(limit=line_limit)
                streamed = _is_stream(response.headers.get("content-type", ""), body["stream"])
                try:
                    if not streamed:  # a whole completion; it leaves the reader done
                        answer = await response.read(MAX_ANSWER_BYTES)
                        events = reader.read_completion(answer)
                        announced = _announce(reader, calls, announced)
                        for item in events:
                            yield item
                    while not reader.done:
                        line = await response.readline(line_limit)
                        event = sse.flush() if line is None else sse.feed(line)
                        if event is not None:
                            events = reader.read(event)
                            announced = _announce(reader, calls, announced)
                            for item in events:
                                yield item
                        if line is None:
                            reader.body_ended()  # before [DONE]: what is open gets finished
                            break
                except _http1.Timeout:
                    raise timeout_error() from None
                except _http1.TooLarge as exc:
                    raise malformed(str(exc)) from None
                except _http1.HTTPError as exc:
                    self._log("the connection dropped", exc)
                    raise malformed(f"the connection dropped ({type(exc).__name__})") from None
                if len(reader.unseen()) == len(reader.indices):  # never an empty answer
                    raise malformed("the answer has no choices")
        except UpstreamError as error:
            raise self._reported(error) from None

    @asynccontextmanager
    async def _response(
        self,
        content: bytes,
        deadline: float,
        calls: UpstreamCalls,
        endpoint: _http1.Endpoint | None = None,
    ) -> AsyncIterator[_http1.Response]:
        """The upstream's streaming response once it answered 2xx; retried before that.
        Asked of ``endpoint`` (default: the completions one). Each attempt is noted in
        ``calls`` as it is sent, and taken back when the upstream refuses it (an error
        status, a connection that failed before an answer); one left waiting (the client
        left, the time-out) stays: the upstream may well bill it.

        Read to its end, its connection is pooled; left early, it is closed at once."""
        endpoint = endpoint or self._endpoint
        observers = signals.observers
        head = (
            b"".join([observer.upstream_headers() for observer in observers]) if observers else b""
        )
        retries = self.retries if asks_again.get() else 0
        for attempt in range(retries + 1):
            failure: APIError
            calls.sent()
            try:
                response = await endpoint.post(content, deadline, head)
            except _http1.Timeout:
                raise timeout_error() from None
            except _http1.ConnectError as exc:
                calls.refused()
                self._log("could not connect", exc)
                failure = APIError(
                    "The upstream is unavailable.",
                    status=503,
                    type="server_error",
                    code="upstream_unavailable",
                )
            except _http1.HTTPError as exc:
                calls.refused()
                self._log("the connection failed", exc)
                failure = APIError(
                    f"The upstream connection failed ({type(exc).__name__}).",
                    status=502,
                    type="server_error",
                    code="upstream_error",
                )
            else:
                if 200 <= response.status < 300:
                    try:
                        yield response
                    except BaseException:
                        response.close()
                        raise
                    response.release()  # pooled once the rest of the body (if any) arrived
                    return
                calls.refused()
                failure = await self._error(response)
                if response.status not in _RETRYABLE_STATUS:
                    raise failure
            if attempt == retries:
                raise failure
            for observer in observers:
                observer.upstream_retry(self.config.name)
            await asyncio.sleep(self.backoff * 2**attempt)

    async def _error(self, response: _http1.Response) -> UpstreamError:
        """The upstream's error answer in OpenAI's envelope, its status kept."""
        try:
            body = await response.read(MAX_ERROR_BYTES)
        except _http1.Timeout:
            raise timeout_error() from None
        except _http1.HTTPError:
            body = b""  # cut short: an error all the same
        try:
            payload: Any = orjson.loads(body)
        except orjson.JSONDecodeError:
            payload = body.decode("utf-8", "replace")
        error = upstream_error(payload, status=response.status)
        error.retry_after = retry_after(response.headers)
        return error

    def _reported(self, error: UpstreamError) -> UpstreamError:
        """``error``, what the upstream sent logged, its own message passed on when the
        backend opts in; the secret never shown."""
        logger.warning(
            "chatparity: backend %s: %s %s",
            self.config.name,
            error.message,
            self._masked(error.detail) or "(nothing more)",
        )
        if self.pass_error_text and error.upstream_message:
            error.message = self._masked(error.upstream_message)
        return error

    def _log(self, what: str, exc: Exception) -> None:
        """A connection failure, with what it says of the upstream, for the server's log only."""
        logger.warning(
            "chatparity: backend %s: %s: %s", self.config.name, what, self._masked(repr(exc))
        )

    def _masked(self, text: str) -> str:
        return text.replace(self.config.secret, "***") if self.config.secret else text
