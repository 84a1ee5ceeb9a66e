"""The small protocols backends implement (chat, embeddings), and the checks of their
configuration."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable
from urllib.parse import urlsplit

from ..protocol import errors
from ..protocol.embeddings import Embeddings, EmbeddingsRequest
from ..protocol.events import Event, UpstreamCalls
from ..protocol.request import ChatRequest

current_caller: ContextVar[str] = ContextVar("chatparity_caller", default="")
"""Who asks, in the task of the request (the gateway names its API key), so a backend
that many keys share can take turns among them."""
asks_again: ContextVar[bool] = ContextVar("chatparity_asks_again", default=True)
"""Whether a backend asks its upstream again itself after a failure before the first
event: not while another deployment of the alias may serve the request instead."""

upstream_calls: ContextVar[UpstreamCalls | None] = ContextVar("chatparity_calls", default=None)
"""Where a backend that calls an upstream notes each call it sends and the prompt the
upstream announced for it, in the task of the request (read before its first event:
the rest of a stream may be read from another task). The request is charged the
prompt of every call noted, whether or not its answer ends."""


@dataclass(frozen=True, slots=True)
class BackendConfig:
    """A backend's settings, detached from the database row they came from."""

    name: str
    kind: str
    base_url: str = ""
    secret: str = field(default="", repr=False)  # never in tracebacks or debug pages
    options: dict[str, Any] = field(default_factory=dict)
    timeout: float = 600.0


class ChatBackend(Protocol):
    """Produces normalized events for a validated request.

    ``stream`` is an async generator. Anything wrong that can be known before
    the first event (a prompt too long, an upstream refusing) is raised as
    :class:`~chatparity.protocol.errors.APIError` before the first event, so
    the client gets a real HTTP status. Closing or cancelling the generator
    must stop the work behind it at once.

    ``model`` is the serving alias's model. A backend that passes parameters on
    to another server passes the client's sampling and format parameters from
    ``request.body`` and others only when named in ``request.forwarded_params``
    (the alias's choice, never the client's), and notes each call it sends in
    :data:`upstream_calls`.

    A backend with a tokenizer may have ``async prompt_tokens(request, model) ->
    int``: the exact tokens of the prompt it makes of ``request`` (the chat
    template's own tokens too), or the 400 it would refuse ``request`` with. Admission
    reserves that count (a backend without one is reserved at
    :func:`~chatparity.protocol.tokens.prompt_bound`); and ``async
    count_tokens(request, model) -> int``, the same count whether or not it fits,
    which ``/v1/messages/count_tokens`` answers.

    Two static methods may check a Backend row before it is saved (the admin
    and the management API; a kind without them is not checked). Each raises
    ValueError with a message naming what is wrong, shown on the row's field:

    ``check_options(options: dict) -> None``
        Unknown options, values of the wrong type, numbers out of range. The
        backend runs it on ``config.options`` when it is built too, so a row
        written some other way fails the same way, before serving anything.
    ``check_base_url(base_url: str) -> None``
        A URL this kind cannot use, or the lack of one it needs
        (:func:`http_base_url`, :func:`no_base_url`).

    A third says whose prices its upstream bills by, and so what an alias's blank cache
    prices are (:data:`~chatparity.models.CACHE_PRICE_RATIOS`):

    ``price_provider(options: dict) -> str | None``
        ``"anthropic"``, ``"openai"``, or None (the default): every input token at the
        input price.
    """

    config: BackendConfig

    def __init__(self, config: BackendConfig) -> None: ...

    @property
    def system_fingerprint(self) -> str: ...

    def stream(self, request: ChatRequest, model: str) -> AsyncIterator[Event]: ...


@runtime_checkable
class EmbeddingBackend(Protocol):
    """Embeds a validated request's inputs.

    ``embed`` returns one vector per input, in input order, of the request's
    ``dimensions`` when it gives them (shortened and renormalised, for a model
    that allows it; else :func:`~chatparity.protocol.embeddings.dimensions_not_supported`),
    and the tokens the inputs were. Anything wrong is raised as
    :class:`~chatparity.protocol.errors.APIError`: an input longer than the model
    reads, an upstream refusing. Cancelling it must stop the work behind it.

    ``model`` is the serving alias's model; a backend that passes the request on
    passes ``user`` only when named in ``request.forwarded_params``. A kind whose
    class has ``embed`` serves ``/v1/embeddings``; one with ``stream`` serves the
    chat endpoints (a kind may serve both). Its rows are checked as
    :class:`ChatBackend` says.

    A backend with a tokenizer may have ``async tokenized(request, model) ->
    EmbeddingsRequest``: ``request`` with its texts as the model's token ids, which
    admission reserves exactly and ``embed`` then takes as they are; a backend
    without one is reserved at
    :func:`~chatparity.protocol.embeddings.counted_tokens`, the bound its usage is
    believed within.
    """

    config: BackendConfig

    def __init__(self, config: BackendConfig) -> None: ...

    async def embed(self, request: EmbeddingsRequest, model: str) -> Embeddings: ...


def not_installed(model: str, extra: str, *, or_set: str = "") -> errors.APIError:
    """The 503 of a model this server cannot load: chatparity's ``extra`` is not installed
    (or else the options ``or_set`` names are not set)."""
    alternative = f", or set the backend's {or_set}" if or_set else ""
    return errors.model_unavailable(
        f"The {model} is not installed on this server: install chatparity's '{extra}'"
        f" extra in the server's environment{alternative}."
    )


def known_options(options: dict[str, Any], known: frozenset[str]) -> None:
    """Raise ValueError naming the options not in ``known``."""
    unknown = sorted(options.keys() - known)
    if unknown:
        raise ValueError(
            f"Unknown option(s) {', '.join(map(repr, unknown))}; this kind of backend"
            f" takes {', '.join(map(repr, sorted(known)))}."
        )


def number_option(
    options: dict[str, Any], name: str, lo: float, hi: float, *, integer: bool = False
) -> None:
    """Raise ValueError unless ``options[name]``, when given, is a number (an integer
    with ``integer``) from ``lo`` to ``hi``."""
    if name not in options:
        return
    value = options[name]
    kind = "an integer" if integer else "a number"
    valid = isinstance(value, int) if integer else isinstance(value, int | float)
    if isinstance(value, bool) or not valid or not lo <= value <= hi:
        raise ValueError(f"{name!r} must be {kind} from {lo} to {hi}, not {value!r}.")


def no_base_url(base_url: str) -> None:
    """The ``check_base_url`` of kinds that connect to nothing."""
    if base_url:
        raise ValueError("This kind of backend connects to no URL: leave the base URL blank.")


def http_base_url(base_url: str) -> None:
    """The ``check_base_url`` of kinds that talk to an HTTP server: an http(s) URL
    with a host, no query or fragment (paths are added to it) and no credentials
    (those go in the secret)."""
    if not base_url:
        raise ValueError("This kind of backend needs the URL of its server, e.g. https://host/v1.")
    try:
        parts = urlsplit(base_url)
        parts.port  # noqa: B018  (a port out of range raises here)
    except ValueError as exc:
        raise ValueError(f"Not a valid URL: {exc}.") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError("Use an http:// or https:// URL with a host.")
    # Not parts.query: a bare "?" or "#" leaves it empty, and would still turn the
    # path added after it into a query or a fragment.
    if "?" in base_url or "#" in base_url:
        raise ValueError("Paths are added to this URL: give it no query or fragment.")
    if parts.username is not None or parts.password is not None:
        raise ValueError(
            "Put no credentials in the URL: the secret holds them, encrypted and never shown."
        )
