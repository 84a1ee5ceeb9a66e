"""``POST /v1/embeddings``: OpenAI's Embeddings API on the keys, aliases, limits and log
of the chat endpoints.

The request is validated by :mod:`chatparity.protocol.embeddings` (the model
first: an unknown one is OpenAI's 404 whatever else is wrong), served by the
alias it names if a deployment of that alias embeds (else a 400 naming the
model), admitted under the alias's and the key's limits for its input tokens
(counted exactly where its one deployment tokenizes, as the embedded model does;
else texts at their bound, the most an upstream's usage is believed; the
reservation made exact by the usage), and answered by one of its deployments
(:mod:`.routing`: another when one fails before answering), or, if they are
unavailable (502, 503, 504), by the alias's fallbacks that embed. No answer
within ``FIRST_BYTE_TIMEOUT`` seconds is a 504. The log row is an ``embeddings``
row: its input tokens and cost, never a vector (with ``LOG_BODIES`` the request
body is kept, the answer not).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from typing import Any

from ..accounting.keys import Grant
from ..accounting.ledger import Accounting
from ..accounting.limits import Estimate
from ..backends import get_backend, serves_embeddings
from ..backends.base import EmbeddingBackend, current_caller, upstream_calls
from ..conf import app_settings
from ..models import Deployment, Endpoint, ModelAlias
from ..protocol import errors
from ..protocol.embeddings import (
    Embeddings,
    EmbeddingsRequest,
    counted_tokens,
    embeddings_object,
    parse_embeddings_request,
)
from ..protocol.errors import APIError
from ..protocol.events import Usage
from ..protocol.request import parse_model
from . import cache
from .pipeline import (
    _UNAVAILABLE,
    Call,
    Reply,
    _limits,
    endpoint,
    first_byte_timeout,
    first_usable,
    json_reply,
    serve,
    serving,
)
from .routing import Route, first_answer

logger = logging.getLogger(__name__)


@endpoint("POST")
async def embeddings(call: Call) -> Reply:
    return await serve(call, _embed, logged_as=Endpoint.EMBEDDINGS)


async def _embed(body: Any, accounting: Accounting, grant: Grant) -> Reply:
    record = accounting.record
    record.request_body = body
    record.body = None  # the answer is vectors: never logged
    try:
        request = parse_embeddings_request(body, _limits())
    except APIError:
        await serving(parse_model(body), grant, accounting)
        raise
    try:
        async with asyncio.timeout(app_settings.FIRST_BYTE_TIMEOUT) as deadline:
            alias = await serving(request.model, grant, accounting)
            vectors = await _looked_up(request, alias, grant, accounting)
            if vectors is None:
                embedded = answered = await _answer(
                    request, alias, grant, accounting, deadline.when()
                )
            elif vectors.missing:
                embedded = await _answer(vectors.asked(), alias, grant, accounting, deadline.when())
                answered = vectors.answer(embedded)
            else:  # every vector from the cache
                embedded, answered = None, vectors.answer(None)
    except TimeoutError:
        if not deadline.expired():
            raise
        raise first_byte_timeout() from None
    if embedded is not None:  # what the backend embedded now: the rest was paid for before
        accounting.observe(Usage(embedded.prompt_tokens, 0, counted=embedded.counted))
    answer = embeddings_object(
        answered, model=request.model, encoding_format=request.encoding_format
    )
    await accounting.settle()
    return json_reply(answer)


async def _looked_up(
    request: EmbeddingsRequest, alias: ModelAlias, grant: Grant, accounting: Accounting
) -> cache.Vectors | None:
    """The response cache's part in ``request`` on ``alias``, if the alias has one: a
    vector kept for each input, so that embedding the same texts again (a re-indexing
    job) pays only for the new ones."""
    if not alias.response_cache:
        return None
    options = cache.options_of(alias)
    if options is None or not serves_embeddings(alias.backend):
        return None
    return await cache.look_up_vectors(request, alias, grant, accounting, options)


async def _answer(
    request: EmbeddingsRequest,
    alias: ModelAlias,
    grant: Grant,
    accounting: Accounting,
    deadline: float | None = None,
) -> Embeddings:
    """``request`` admitted on ``alias`` and embedded by one of its deployments that
    embed (:mod:`.routing`), or else by its fallbacks', in order."""
    accounting.served_by(alias)
    route = Route(alias, accounting, serves_embeddings, deadline=deadline)
    if route.empty:
        raise errors.not_an_embedding_model(alias.public_id)
    served = await _counted(alias, request, route)
    await accounting.reserve(alias, Estimate(counted_tokens(served), 0))
    current_caller.set(accounting.caller)  # in this request's task: its backends see it
    upstream_calls.set(accounting.record.upstream)
    fallbacks = list(alias.fallbacks)
    try:
        while True:
            failure = await _embedded(route, served, accounting)
            if not isinstance(failure, APIError):
                return failure
            if failure.status not in _UNAVAILABLE:
                raise failure
            failed = alias
            alias, route, served = await _fall_back(
                fallbacks, request, grant, accounting, failure, deadline
            )
            logger.warning("chatparity: %s failed (%s), falling back to %s", failed, failure, alias)
    finally:
        accounting.backend_done()


async def _embedded(
    route: Route, request: EmbeddingsRequest, accounting: Accounting
) -> Embeddings | APIError:
    """``request`` embedded by a deployment of ``route``'s alias; else why none did."""

    async def ask(deployment: Deployment) -> Embeddings:
        backend = get_backend(deployment.backend)
        assert isinstance(backend, EmbeddingBackend), "its kind serves embeddings"
        return await accounting.answer(backend.embed(request, deployment.model))

    return await first_answer(route, ask)


async def _counted(
    alias: ModelAlias, request: EmbeddingsRequest, route: Route
) -> EmbeddingsRequest:
    """``request`` as ``alias``'s deployments are to embed it: with the parameters the
    alias forwards and, when its one deployment tokenizes, its texts as token ids (which
    :func:`counted_tokens` counts exactly). Texts are counted at their bound: the most
    any of several deployments is believed to bill."""
    served = dataclasses.replace(
        request,
        forwarded_params=frozenset(
            name for name in alias.forwarded_params or () if isinstance(name, str)
        ),
    )
    if route.group.shared:
        return served
    (deployment,) = route.group.deployments
    tokenize = getattr(get_backend(deployment.backend), "tokenized", None)
    if tokenize is not None:
        served = await tokenize(served, deployment.model)
    return served


async def _fall_back(
    fallbacks: list[str],
    request: EmbeddingsRequest,
    grant: Grant,
    accounting: Accounting,
    failure: APIError,
    deadline: float | None,
) -> tuple[ModelAlias, Route, EmbeddingsRequest]:
    """The next of ``fallbacks`` that embeds, ``grant`` may use and whose limits admit
    ``request``, the admission moved to it, with its route and the request as it
    embeds it; else the last refusal of a limit, or ``failure``."""
    while (alias := await first_usable(fallbacks, grant, serves_embeddings)) is not None:
        route = Route(alias, accounting, serves_embeddings, deadline=deadline)
        try:
            served = await _counted(alias, request, route)
            await accounting.reserve(alias, Estimate(counted_tokens(served), 0))
        except APIError as refusal:
            failure = refusal
            continue
        accounting.fell_back(alias)
        return alias, route, served
    raise failure
