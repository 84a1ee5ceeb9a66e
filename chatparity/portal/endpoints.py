"""Where this site serves chatparity's API, told as a client is configured: read from
where the URLconf mounts ``chatparity.urls`` (``path("llm/", include(...))`` serves
``/llm/v1/...``), with the request's scheme and host."""

from __future__ import annotations

from dataclasses import dataclass

from django.core.exceptions import ImproperlyConfigured
from django.db.models import QuerySet
from django.http import HttpRequest
from django.urls import NoReverseMatch, reverse

from ..backends import serves_chat
from ..models import ModelAlias


@dataclass(frozen=True)
class ApiUrls:
    """The API's addresses: the OpenAI SDKs' base URL (``.../v1``), the Anthropic
    SDKs' and Claude Code's (the mount, without ``/v1``: they add ``/v1/messages``),
    and the path the playground posts chat completions to."""

    openai: str
    anthropic: str
    chat_completions: str


def api_urls(request: HttpRequest) -> ApiUrls | None:
    """The API's addresses as ``request``'s client reaches them; None when the URLconf
    does not mount ``chatparity.urls``."""
    try:
        chat_completions = reverse("chatparity:chat-completions")
        messages = reverse("chatparity:messages")
    except NoReverseMatch:
        return None
    return ApiUrls(
        openai=absolute(request, chat_completions.removesuffix("/chat/completions")),
        anthropic=absolute(request, messages.removesuffix("/v1/messages")),
        chat_completions=chat_completions,
    )


def absolute(request: HttpRequest, path: str) -> str:
    """``path`` (a mount: empty for the site's root) as a URL without a trailing slash."""
    return request.build_absolute_uri(path or "/").rstrip("/")


def chat_aliases(aliases: QuerySet[ModelAlias]) -> list[str]:
    """The public ids of those of ``aliases`` that answer chat (not embeddings), by name;
    an alias whose backend cannot be built is left out."""
    names = []
    for alias in aliases.select_related("backend").filter(backend__enabled=True):
        try:
            chat = serves_chat(alias.backend)
        except (ImproperlyConfigured, ImportError, KeyError):
            continue
        if chat:
            names.append(alias.public_id)
    return sorted(names, key=str.lower)
