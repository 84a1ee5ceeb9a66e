"""The semantic cache: a single-turn request answered by a stored answer to a similar
one (docs/caching.md, "The semantic cache").

Only single-turn requests (instructions, then one user message) take part. Everything
but the user's text must match exactly: the system prompt, every parameter, the alias,
the scope. Those make a bucket (:func:`~chatparity.protocol.caching.bucket_digest`),
kept in the response cache's own store beside the entries: for each answer kept, its
entry's key, the user text's embedding and the numbers and negations the text states
(never the text). A request whose own entry is missing is embedded (by the embedded
embedding model, or the embeddings alias its options name) and answered by the entry of
the bucket's most similar text, if that text's similarity reaches the alias's threshold
and it states the same numbers and negations. The embedding is the gateway's own work:
the key pays nothing for it.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import orjson

from ..accounting import keys
from ..accounting.keys import Grant
from ..backends import get_backend, serves_embeddings
from ..backends.base import BackendConfig, EmbeddingBackend
from ..backends.embedder import EmbedderBackend
from ..conf import app_settings
from ..models import CacheState
from ..protocol.caching import SemanticOptions, bucket_digest, facts, single_turn
from ..protocol.embeddings import EmbeddingsRequest
from ..protocol.errors import APIError
from ..protocol.request import ChatRequest
from .cache import Lookup, entry_key, hit_of, kept, served_by
from .cache_store import Unavailable, call

logger = logging.getLogger(__name__)

EMBEDDED = "embedded"
"""How a bucket names the embedded embedding model (an alias is named by its id)."""
_embedded: list[EmbedderBackend] = []


def embedded_model() -> EmbedderBackend:
    """The embedded embedding model (the ``embeddings`` extra's), made once a process."""
    if not _embedded:
        _embedded.append(EmbedderBackend(BackendConfig(name="response cache", kind="embedder")))
    return _embedded[0]


async def embedding(text: str, options: SemanticOptions) -> bytes:
    """``text``'s vector (little-endian float32) by the embeddings alias ``options``
    names, else by the embedded model; an :class:`APIError` if neither can embed it."""
    backend: Any = embedded_model()
    model = ""
    if options.embeddings:
        alias = (await keys.aliases()).find(options.embeddings, None)
        if alias is None or not serves_embeddings(alias.backend):
            raise APIError(f"no embeddings alias {options.embeddings!r}", status=503)
        backend, model = get_backend(alias.backend), alias.model
    assert isinstance(backend, EmbeddingBackend)
    request = EmbeddingsRequest(model=model, inputs=(text,), body={"model": model, "input": text})
    embedded = await backend.embed(request, model)
    return bytes(embedded.vectors[0])


@dataclass
class Bucket:
    """A request's bucket, and what it adds to it once its answer is kept."""

    store: str
    key: str
    vector: bytes
    facts: str
    ttl: int

    async def add(self, entry: str) -> None:
        """Add the answer kept under ``entry`` (the oldest out past ``SEMANTIC_VECTORS``).
        Two workers adding at once may lose one of the two: a missed hit, never a
        wrong one."""
        try:
            held = unpacked(await call(self.store, "get", self.key), len(self.vector))
        except Unavailable:
            return  # the answer's own entry says so already, if the store is down
        entries, stated, vectors = held
        if entry in entries:
            return
        most = int(app_settings.RESPONSE_CACHE["SEMANTIC_VECTORS"])
        entries, stated = [*entries, entry][-most:], [*stated, self.facts][-most:]
        vectors = (vectors + self.vector)[-most * len(self.vector) :]
        await kept(self.store, {self.key: packed(entries, stated, vectors)}, self.ttl)


def packed(entries: list[str], stated: list[str], vectors: bytes) -> bytes:
    header = orjson.dumps([entries, stated])
    return len(header).to_bytes(4, "little") + header + vectors


def unpacked(value: Any, width: int) -> tuple[list[str], list[str], bytes]:
    """A bucket as :func:`packed` kept it; empty if there is none, or it cannot be read
    (vectors of another width: the embeddings changed model)."""
    try:
        size = int.from_bytes(value[:4], "little")
        entries, stated = orjson.loads(value[4 : 4 + size])
        vectors = bytes(value[4 + size :])
    except (TypeError, ValueError, orjson.JSONDecodeError):
        return [], [], b""
    if len(vectors) != len(entries) * width or len(stated) != len(entries):
        return [], [], b""
    return entries, stated, vectors


def most_similar(vector: bytes, vectors: bytes) -> list[tuple[float, int]]:
    """The cosine similarity of ``vector`` to each of ``vectors``, most similar first."""
    import numpy as np

    asked = np.frombuffer(vector, dtype="<f4")
    held = np.frombuffer(vectors, dtype="<f4").reshape(-1, asked.size)
    norms = np.linalg.norm(held, axis=1) * float(np.linalg.norm(asked))
    similarities = held @ asked / np.where(norms > 0, norms, 1.0)
    return sorted(((float(s), i) for i, s in enumerate(similarities)), reverse=True)


async def match(lookup: Lookup, chat: ChatRequest, grant: Grant) -> None:
    """Give ``lookup`` (whose own entry is missing, or not read) its bucket, and the
    answer of the bucket's most similar text when it is similar enough and states the
    same facts (a hit marked ``semantic``, with its similarity)."""
    options = lookup.options.semantic
    text = single_turn(chat)
    if options is None or not text:
        return
    record = lookup.record
    try:
        vector = await embedding(text, options)
    except Exception as exc:  # an embeddings backend's failure is the cache's, not the request's
        logger.warning("chatparity: the semantic cache could not embed a request: %s", exc)
        record.cache_note = "semantic: not embedded"
        return
    embedder = options.embeddings.lower() or EMBEDDED
    digest = bucket_digest(chat, served_by(lookup.alias))
    key = entry_key(lookup.alias, lookup.scope, f"bucket:{embedder}", digest)
    stated = facts(text)
    lookup.semantic = Bucket(lookup.store, key, vector, stated, lookup.options.ttl)
    if not lookup.control.read:
        return
    try:
        bucket = await call(lookup.store, "get", key)
        entries, held_facts, vectors = unpacked(bucket, len(vector))
        for similarity, index in most_similar(vector, vectors) if entries else ():
            if similarity < options.threshold:
                break
            if held_facts[index] != stated:
                continue
            hit = hit_of(await call(lookup.store, "get", entries[index]), chat, record)
            if hit is not None:  # else expired: the next most similar may still be kept
                lookup.hit = hit
                record.cache, record.cache_similarity = CacheState.SEMANTIC, similarity
                return
    except Unavailable:
        record.cache_note = "semantic: store unavailable"
