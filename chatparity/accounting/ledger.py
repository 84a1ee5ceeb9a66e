"""One request's accounting, from admission to its log row.

The endpoint that serves a request owns its :class:`Accounting`: created once
the key is known, it takes the request's admission under the rate limits,
observes what the backend sends, and when the reply is done it settles the
limits, writes the log row, then announces it, in that order and once.
Nothing else changes the request's record: the transports only tell the reply
when the client left and when they are done with it.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import AsyncIterator, Awaitable
from typing import Any, TypeVar

from .. import signals
from ..models import Deployment, ModelAlias, RequestLog
from ..protocol import errors
from ..protocol.errors import APIError
from ..protocol.events import Event, Finish, ReasoningDelta, TextDelta, ToolCallDelta, Usage
from ..protocol.request import ChatRequest
from . import journal, limits
from .limits import Admission
from .record import UsageRecord
from .writer import log

logger = logging.getLogger(__name__)

T = TypeVar("T")


UNKNOWN_MODEL = "unknown"
"""The alias logged for a request that names no model its key may use: a name a client
made up is never stored or charted as sent (only in its body, with ``LOG_BODIES``)."""


class Accounting:
    """What one request reserved and did, until its row is written.

    A request with no API key (an admin's trial) is admitted under the limits of
    the alias alone: see :func:`chatparity.accounting.limits.admit`.
    """

    def __init__(self, record: UsageRecord) -> None:
        self.record = record
        self.admission: Admission | None = None
        self.estimate: limits.Estimate | None = None
        """What the request was last admitted as (its tokens, which a deployment's quota
        holds too)."""
        self.deployment_hold: Admission | None = None
        """The quota of the deployment asked last (:func:`~.limits.hold`), settled with
        the request's own."""
        self._row: RequestLog | None = None
        self._settled = False
        for observer in signals.observers:
            observer.started(record)

    @property
    def caller(self) -> str:
        """Who asks, for backends that take turns among keys: the key, else who made an
        admin's trial."""
        key = self.record.api_key
        return f"key {key.pk}" if key is not None else self.record.key_prefix

    @property
    def headers(self) -> dict[str, str]:
        """The rate-limit headers of the reply: the limits the request was admitted under."""
        return self.admission.headers if self.admission is not None else {}

    def requested(self, chat: ChatRequest, body: Any) -> None:
        """Note what the client asked for, before anything may refuse it (the model it
        names only once an alias serves it: :meth:`served_by`, :meth:`unknown_model`)."""
        record = self.record
        record.request_body = body
        record.stream, record.n = chat.stream, chat.n

    def unknown_model(self) -> None:
        """The request names no model its key may use: logged as :data:`UNKNOWN_MODEL`."""
        self.record.alias = UNKNOWN_MODEL

    def served_by(self, alias: ModelAlias) -> None:
        """Log the request under ``alias``, at its prices."""
        record = self.record
        record.alias = alias.public_id  # as configured, so reports group one alias once
        record.model_alias = alias
        record.backend, record.upstream_model = alias.backend.name, alias.model

    def deployed(self, deployment: Deployment, hold: Admission | None) -> None:
        """The request is asked of ``deployment`` (of the alias serving it), holding
        ``hold`` of its quota."""
        record = self.record
        record.backend, record.upstream_model = deployment.backend.name, deployment.model
        record.deployment = deployment.label
        record.deployments_tried += 1
        self.deployment_hold = hold

    async def admit(self, alias: ModelAlias, chat: ChatRequest, prompt_tokens: int) -> ChatRequest:
        """Reserve ``chat`` as ``alias`` serves it: its prompt (``prompt_tokens``, as its
        backend counts it or at its bound) once per choice and its completion cap in every
        limit (OpenAI's 429 when one refuses it). Returns ``chat`` as the backend is to
        serve it: with the completion limit its limits left it, when it set none."""
        await self.reserve(alias, limits.Estimate.of(chat, alias, prompt_tokens))
        return self._limited(chat)

    def _limited(self, chat: ChatRequest) -> ChatRequest:
        limit = self.admission.completion_limit if self.admission is not None else None
        return chat if limit is None else dataclasses.replace(chat, completion_limit=limit)

    async def reserve(self, alias: ModelAlias | None, estimate: limits.Estimate) -> None:
        """Reserve ``estimate`` on ``alias`` (None: under the key's own limits alone), or
        raise the 429 of a limit that refuses it. A request admitted already, before it
        read what it continues, has its reservation made ``estimate`` on ``alias``."""
        self.estimate = estimate
        if self.admission is not None:
            await self.admission.switch(alias, estimate)
            self.record.reserved_prompt = estimate.prompt_per_choice
            journal.begin(self.record)  # noted again, as the request now stands
            return
        observers = signals.observers
        for observer in observers:
            observer.admitting(self.record)
        try:
            self.admission = await limits.admit(self.record.api_key, alias, estimate)
        except BaseException as refusal:
            for observer in observers:
                observer.admitted(self.record, refusal)
            raise
        for observer in observers:
            observer.admitted(self.record, None)
        self.record.reserved_prompt = estimate.prompt_per_choice
        journal.begin(self.record)

    async def switch(self, alias: ModelAlias, chat: ChatRequest, prompt_tokens: int) -> ChatRequest:
        """Move the admitted request to ``alias``, a fallback, under its own limits, as
        ``chat`` (the request as ``alias`` serves it, its prompt ``prompt_tokens`` there);
        returns it as :meth:`admit` does."""
        assert self.admission is not None, "a request is admitted before it falls back"
        await self.reserve(alias, limits.Estimate.of(chat, alias, prompt_tokens))
        self.fell_back(alias)
        return self._limited(chat)

    def fell_back(self, alias: ModelAlias) -> None:
        """The request, its admission moved, is served by ``alias``, a fallback."""
        for observer in signals.observers:
            observer.fallback(self.record.backend)
        self.served_by(alias)

    async def first_event(self, events: AsyncIterator[Event]) -> Event:
        """The first of a backend's ``events``, the time waited for it noted (the
        gateway's overhead is the rest)."""
        return await self.answer(anext(events))

    async def answer(self, answering: Awaitable[T]) -> T:
        """What a backend answers (its first event, its vectors), the time waited for
        it noted."""
        record = self.record
        if record.backend_started is None:
            record.backend_started = time.perf_counter()
        observers = signals.observers
        for observer in observers:
            observer.calling_backend(record)
        try:
            answer = await answering
        except BaseException as failure:
            for observer in observers:
                observer.backend_answered(record, failure)
            raise
        record.backend_answered = time.perf_counter()
        for observer in observers:
            observer.backend_answered(record, None)
        return answer

    def backend_done(self) -> None:
        """The backend that answered sent its last event, or failed midway."""
        self.record.backend_ended = time.perf_counter()
        for observer in signals.observers:
            observer.backend_done(self.record)

    def overhead(self, elapsed: float, now: float) -> float:
        """Of ``elapsed`` seconds up to ``now``, those not spent waiting on a backend."""
        return elapsed - self.record.backend_seconds(now)

    def answering(self, completion_id: str) -> None:
        """The backend began: its answer is ``completion_id``."""
        self.record.completion_id = completion_id

    def observe(self, event: Event) -> None:
        record = self.record
        if isinstance(event, TextDelta | ToolCallDelta | ReasoningDelta):  # thinking is output
            if record.first_token_at is None:
                record.first_token_at = time.perf_counter()
            record.completion_tokens_sent += event.tokens
        elif isinstance(event, Finish):
            record.finish_reasons[event.index] = event.reason
        elif isinstance(event, Usage):
            record.usage = event

    def observe_chunk(self, chunk: dict[str, Any]) -> None:
        if self.record.body is not None:
            self.record.body.add(chunk)

    def fail(self, exc: Exception, *, streaming: bool = False) -> APIError:
        """Note the request's failure and return it as the client is told it: an
        :class:`APIError` as it is, anything else a 500, logged as the bug it is.
        ``streaming``: the reply began, so its status stays."""
        if not isinstance(exc, APIError):
            logger.error("chatparity: unexpected failure", exc_info=exc)
        error = errors.as_api_error(exc)
        self.record.error = error
        if not streaming:
            self.record.status_code = error.status
        return error

    def cancel(self) -> None:
        """The client left before the whole reply was sent."""
        self.record.cancelled = True

    async def settle(self) -> None:
        """Give back the slot in flight and make the tokens reserved what was used: once,
        as soon as the answer is complete and before its last byte goes out, so a
        client's next request (on any worker) never finds its own slot still taken.
        :meth:`close` settles whatever was not settled before."""
        if self._settled:
            return
        self._settled = True
        usage = self.record.tokens
        if self.deployment_hold is not None:
            await self.deployment_hold.settle(usage)
        if self.admission is None:
            return
        try:
            await self.admission.settle(usage)
        except Exception:  # the counters' store: a slot it keeps expires on its own
            logger.exception(
                "chatparity: the limits of %s were not settled", self.record.request_id
            )

    async def close(self) -> RequestLog:
        """Settle the limits (the slot in flight given back, the tokens reserved made
        what was used) before anything else, write the row, then send
        :data:`~chatparity.signals.request_logged`: once, whatever happened. The row,
        written or not (a row the database refuses is logged, never raised)."""
        if self._row is not None:
            return self._row
        row = self._row = self.record.row()
        observers = signals.observers
        for observer in observers:
            observer.writing(self.record)
        try:
            await self.settle()
            try:
                await log(row)
            finally:  # cancelled, the row is written all the same
                journal.end(row.request_id)
        finally:
            for observer in observers:
                observer.ended(self.record, row)
        return row
