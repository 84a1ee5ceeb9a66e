"""The command backend: a command-line program as a model.

Each choice of a request runs the configured program once, without a shell and
in a process group of its own; what it writes to stdout is the answer, relayed
as it arrives. ``Backend.options``:

``argv`` (required)
    The command as a list of strings, e.g. ``["llm", "-m", "{model}", "-n"]``.
    Arguments after the program may hold ``{name}`` placeholders (str.format
    syntax, plain names only; ``{{`` and ``}}`` are literal braces):
    ``{prompt}`` the conversation as text, ``{system}`` the system and developer
    messages, ``{model}`` the alias's model, or a scalar request parameter such
    as ``{reasoning_effort}``, ``{temperature}``, ``{max_tokens}``, ``{seed}``.
    A value comes from the request (the alias's ``default_params`` included),
    else from ``defaults``; a placeholder still without one is a 400
    ``invalid_request_error`` before anything runs. An argument made of one
    placeholder only may not receive a value starting with ``-`` (the program
    would read it as an option) unless a ``--`` argument comes before it.
``prompt_via``
    ``"stdin"`` (the prompt is written to stdin, which is then closed) or
    ``"argument"`` (stdin is empty). Default: ``"argument"`` when an argument
    uses ``{prompt}``, else ``"stdin"``.
``defaults``
    Placeholder values used when the request gives none, e.g.
    ``{"reasoning_effort": "medium", "system": ""}``.
``max_seconds``
    The longest a request may run (default: the backend's ``timeout``). Past
    it the process group is killed and the request fails with 504
    ``timeout_error`` / ``request_timeout``.
``secret_env``
    The environment variable that receives the backend's ``secret`` (e.g.
    ``OPENAI_API_KEY``); the secret never goes on the command line.
``env``
    Extra environment variables for the program, over the server's own.
``trim``
    Drop whitespace at the very end of the output (default ``true``): most
    programs end with a newline that is not part of the answer.

The prompt: system and developer messages come first (unless ``{system}``
takes them), then the conversation in order, each message as ``Role: text``
(System, User, Assistant, Tool, Function) separated by blank lines; a
conversation that is a single user message is that message's text alone.

Tokens: the program reports none, so both sides are estimated as
``ceil(characters / 4)``: the prompt (with the ``{system}`` text) for
``prompt_tokens``, and the text actually sent for ``completion_tokens``, which
the deltas' ``tokens`` add up to. ``max_tokens`` cuts the text at
``4 * max_tokens`` characters (finish ``length``); a stop sequence ends it
unsent (finish ``stop``); either way the program is killed at once.

Failures: a program that cannot start is a 500 ``spawn_error``; a non-zero
exit is a 500 ``command_failed`` naming the status and the last line of
stderr. Both come before the first event when nothing was sent yet.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
import os
import re
import signal
import string
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal, TypeGuard

from django.core.exceptions import ImproperlyConfigured

from ..protocol.errors import APIError
from ..protocol.events import Event, Finish, TextDelta, Usage
from ..protocol.request import ChatRequest, Message
from ..protocol.tokens import CHARS_PER_TOKEN, approximate_tokens
from .base import BackendConfig
from .text import TextStreamer

logger = logging.getLogger(__name__)

_CHUNK = 4096
_GRACE = 2.0  # seconds from SIGTERM to SIGKILL
_POLL = 0.1  # seconds between checks of whether a program's leader process exited
_QUEUE = 64  # events buffered ahead of the client; beyond it the programs wait
_STDERR_TAIL = 4096
_MESSAGE_LIMIT = 300

_BUILTINS = frozenset({"prompt", "system", "model"})
# Request parameters whose (scalar) value a placeholder may take.
_PARAMETERS = frozenset(
    {
        "frequency_penalty",
        "max_completion_tokens",
        "max_tokens",
        "n",
        "presence_penalty",
        "prompt_cache_key",
        "reasoning_effort",
        "safety_identifier",
        "seed",
        "service_tier",
        "temperature",
        "top_logprobs",
        "top_p",
        "user",
        "verbosity",
    }
)
_OPTIONS = frozenset({"argv", "prompt_via", "defaults", "max_seconds", "secret_env", "env", "trim"})
_NUMBER = re.compile(r"-\d+(\.\d+)?([eE][-+]?\d+)?")
_LABELS = {
    "system": "System",
    "developer": "System",
    "user": "User",
    "assistant": "Assistant",
    "tool": "Tool",
    "function": "Function",
}
_SYSTEM_ROLES = ("system", "developer")

Scalar = str | int | float | bool


# -- options -----------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class CommandOptions:
    """A command backend's options, checked."""

    argv: tuple[str, ...]
    fields: frozenset[str]
    """Every placeholder name the arguments use."""
    guarded: frozenset[int]
    """Arguments made of one placeholder, before any ``--``: no value may start with ``-``."""
    prompt_via: Literal["stdin", "argument"]
    defaults: Mapping[str, str]
    max_seconds: float
    secret_env: str | None
    env: Mapping[str, str]
    trim: bool


def parse_options(config: BackendConfig) -> CommandOptions:
    """Check ``config.options``; raise ImproperlyConfigured naming what is wrong."""
    options = config.options
    unknown = sorted(options.keys() - _OPTIONS)
    if unknown:
        raise _misconfigured(f"unknown option(s) {', '.join(unknown)}")
    argv = options.get("argv")
    if not isinstance(argv, list) or not argv or not all(isinstance(a, str) for a in argv):
        raise _misconfigured("'argv' must be a non-empty list of strings")
    if _placeholders(argv[0]):
        raise _misconfigured("the program, argv[0], cannot hold a placeholder")
    defaults = options.get("defaults", {})
    if not isinstance(defaults, dict) or not all(
        isinstance(value, Scalar) for value in defaults.values()
    ):
        raise _misconfigured("'defaults' must map names to strings, numbers or booleans")
    fields = frozenset(name for arg in argv[1:] for name in _placeholders(arg))
    unknown = sorted(fields - _BUILTINS - _PARAMETERS - defaults.keys())
    if unknown:
        raise _misconfigured(
            f"unknown placeholder(s) {', '.join(unknown)}: use prompt, system, model,"
            " a request parameter, or give the name a value in 'defaults'"
        )
    prompt_via = options.get("prompt_via", "argument" if "prompt" in fields else "stdin")
    if prompt_via not in ("stdin", "argument"):
        raise _misconfigured("'prompt_via' must be 'stdin' or 'argument'")
    if prompt_via == "argument" and "prompt" not in fields:
        raise _misconfigured("'prompt_via' is 'argument' but no argument uses {prompt}")
    max_seconds = options.get("max_seconds", config.timeout)
    if not _is_number(max_seconds) or max_seconds <= 0:
        raise _misconfigured("'max_seconds' must be a positive number")
    secret_env = options.get("secret_env")
    if secret_env is not None and not (isinstance(secret_env, str) and secret_env.isidentifier()):
        raise _misconfigured("'secret_env' must be an environment variable name")
    env = options.get("env", {})
    if not isinstance(env, dict) or not all(isinstance(v, str) for v in env.values()):
        raise _misconfigured("'env' must map names to strings")
    trim = options.get("trim", True)
    if not isinstance(trim, bool):
        raise _misconfigured("'trim' must be true or false")
    return CommandOptions(
        argv=tuple(argv),
        fields=fields,
        guarded=frozenset(_guarded(argv)),
        prompt_via=prompt_via,
        defaults={name: _text(value) for name, value in defaults.items()},
        max_seconds=float(max_seconds),
        secret_env=secret_env,
        env=dict(env),
        trim=trim,
    )


def _misconfigured(problem: str) -> ImproperlyConfigured:
    return ImproperlyConfigured(f"command backend: {problem}.")


def _placeholders(arg: str) -> list[str]:
    """The names of ``arg``'s ``{name}`` fields; anything fancier is refused."""
    try:
        parsed = list(string.Formatter().parse(arg))
    except ValueError as exc:
        raise _misconfigured(f"argument {arg!r}: {exc}") from None
    names = []
    for _, name, spec, conversion in parsed:
        if name is None:
            continue
        if not name.isidentifier() or spec or conversion:
            raise _misconfigured(
                f"argument {arg!r}: only plain {{name}} placeholders are allowed"
                " (no attribute, index, conversion or format spec)"
            )
        names.append(name)
    return names


def _guarded(argv: Sequence[str]) -> list[int]:
    positions = []
    for position, arg in enumerate(argv[1:], start=1):
        if arg == "--":
            break
        if arg.startswith("{") and arg.endswith("}") and arg[1:-1].isidentifier():
            positions.append(position)
    return positions


def _is_number(value: object) -> TypeGuard[int | float]:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _looks_like_an_option(value: str) -> bool:
    return value.startswith("-") and not _NUMBER.fullmatch(value)


def _text(value: Scalar) -> str:
    return json.dumps(value) if isinstance(value, bool) else str(value)


# -- prompt ------------------------------------------------------------------


def render_prompt(messages: Sequence[Message], *, system_apart: bool) -> tuple[str, str | None]:
    """The conversation as plain text, and the system text when it goes apart.

    See the module docstring for the layout. With ``system_apart`` the system
    and developer messages are left out of the prompt and returned joined (None
    when there are none); otherwise they open the prompt.
    """
    system = [m for m in messages if m.role in _SYSTEM_ROLES]
    rest = [m for m in messages if m.role not in _SYSTEM_ROLES]
    if not system_apart:
        rest = system + rest
    if len(rest) == 1 and rest[0].role == "user":
        prompt = rest[0].content or ""
    else:
        prompt = "\n\n".join(f"{_LABELS[m.role]}: {_message_text(m)}" for m in rest)
    system_text = "\n\n".join(m.content or "" for m in system) if system_apart and system else None
    return prompt, system_text


def _message_text(message: Message) -> str:
    text = message.content or ""
    for call in message.tool_calls or ():
        function = call.get("function", {})
        text += f"\n[called {function.get('name', '')}({function.get('arguments', '')})]"
    return text.strip()


# -- output ------------------------------------------------------------------


class _Output:
    """One program's stdout as text deltas.

    ``TextStreamer`` decodes the bytes incrementally and holds back what
    may begin a stop sequence; on top of it, whitespace at the end is held until
    more text follows (trim), the text is cut where the token budget runs out,
    and each delta counts the tokens its characters add to the running total.
    """

    def __init__(self, index: int, stops: list[str], max_tokens: int | None, *, trim: bool) -> None:
        self.index = index
        self.finish: str | None = None
        self.tokens = 0
        self._room = None if max_tokens is None else max_tokens * CHARS_PER_TOKEN
        self._trim = trim
        self._held = ""
        self._sent = 0
        self._ready: list[TextDelta] = []
        self._streamer = TextStreamer(index, stops, self._accept)

    def feed(self, data: bytes) -> None:
        if self._streamer.feed(data, None) and self.finish is None:
            self.finish = "stop"

    def close(self) -> None:
        """The output ended: send what was held back for a stop sequence."""
        self._streamer.flush()
        self.finish = self.finish or "stop"

    def take(self) -> list[TextDelta]:
        ready, self._ready = self._ready, []
        return ready

    def _accept(self, delta: object) -> None:
        if self.finish is not None or not isinstance(delta, TextDelta):
            return
        text = self._held + delta.text
        body = text.rstrip() if self._trim else text
        self._held = text[len(body) :]
        if self._room is not None and self._sent + len(body) >= self._room:
            body = body[: self._room - self._sent]
            self.finish = "length"
        if body:
            self._sent += len(body)
            tokens = approximate_tokens(self._sent) - self.tokens
            self.tokens += tokens
            self._ready.append(TextDelta(self.index, body, tokens=tokens))


# -- processes ---------------------------------------------------------------


@dataclass(eq=False)
class _Run:
    """One spawned program, answering one choice."""

    index: int
    program: str
    process: asyncio.subprocess.Process
    output: _Output
    stderr: bytearray = field(default_factory=bytearray)
    helpers: list[asyncio.Task[None]] = field(default_factory=list)
    """Its stderr reader first, then its other background tasks."""
    ended: bool = False
    """Exited and reaped, its output read to the end."""

    async def exit_code(self) -> int:
        """Wait for the end of the program; kill what it leaves in its group."""
        code = await self.process.wait()
        self.ended = True
        _signal_group(self.process.pid, signal.SIGKILL)
        await asyncio.gather(*self.helpers[:1], return_exceptions=True)  # the whole stderr tail
        return code


def _signal_group(pid: int, signum: int) -> None:
    """Signal the process group led by ``pid``, which may have ended already.

    Safe after the leader was reaped: a group lives on while any member does,
    and the kernel hands out no pid that is still some group's id.
    """
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pid, signum)


async def _collect_stderr(stream: asyncio.StreamReader | None, tail: bytearray) -> None:
    while stream is not None and (chunk := await stream.read(_CHUNK)):
        tail += chunk
        del tail[:-_STDERR_TAIL]


async def _write_stdin(stdin: asyncio.StreamWriter | None, data: bytes) -> None:
    if stdin is None:
        return
    with contextlib.suppress(BrokenPipeError, ConnectionResetError):  # it need not read it all
        stdin.write(data)
        await stdin.drain()
    stdin.close()


async def _kill_leftovers(process: asyncio.subprocess.Process) -> None:
    """Once the program itself exits, kill what it left running in its group.

    Without this a leftover child holding stdout open would keep the request
    waiting for the end of the output until it timed out.
    """
    # Polled: on Python 3.11 asyncio reports an exit only once the pipes close too.
    while process.returncode is None:  # noqa: ASYNC110
        await asyncio.sleep(_POLL)
    _signal_group(process.pid, signal.SIGKILL)


async def _discard(stream: asyncio.StreamReader | None) -> None:
    while stream is not None and await stream.read(_CHUNK):
        pass


async def _ends_within(process: asyncio.subprocess.Process, seconds: float) -> bool:
    """Whether the process exits and its pipes close within ``seconds``; what it
    still writes is read and dropped, else a full pipe could keep it alive."""
    try:
        async with asyncio.timeout(seconds):
            await asyncio.gather(_discard(process.stdout), _discard(process.stderr), process.wait())
    except TimeoutError:
        return False
    return True


async def _terminate(run: _Run) -> None:
    """Stop a run's whole process group: SIGTERM, SIGKILL after a grace; reap the leader."""
    for task in run.helpers:
        task.cancel()
    await asyncio.gather(*run.helpers, return_exceptions=True)
    if run.ended:
        return
    if run.process.stdin is not None:
        run.process.stdin.close()
    pid = run.process.pid
    _signal_group(pid, signal.SIGTERM)
    await _ends_within(run.process, _GRACE)
    # Even when the leader went quietly, a child may have ignored SIGTERM.
    _signal_group(pid, signal.SIGKILL)
    if not await _ends_within(run.process, _GRACE):
        logger.warning("chatparity: %s (pid %d) did not end after SIGKILL", run.program, pid)
    run.ended = True


async def _stop(pumps: list[asyncio.Task[None]], runs: list[_Run]) -> None:
    for task in pumps:
        task.cancel()
    try:
        await asyncio.gather(*pumps, return_exceptions=True)
        await asyncio.gather(*(_terminate(run) for run in runs))
    except BaseException:
        # Interrupted again (a second cancellation): no grace left to give.
        for run in runs:
            if not run.ended:
                _signal_group(run.process.pid, signal.SIGKILL)
        raise


# -- backend -----------------------------------------------------------------

_Item = TextDelta | Finish | Exception


class CommandBackend:
    """Serves completions from a command-line program (see the module docstring)."""

    def __init__(self, config: BackendConfig) -> None:
        self.config = config
        self.options = parse_options(config)
        digest = hashlib.sha256(json.dumps(self.options.argv).encode()).hexdigest()
        self._fingerprint = f"fp_{digest[:10]}"

    @property
    def system_fingerprint(self) -> str:
        """Stable for one ``argv`` template."""
        return self._fingerprint

    async def stream(self, request: ChatRequest, model: str) -> AsyncIterator[Event]:
        _check_supported(request)
        options = self.options
        prompt, system = render_prompt(request.messages, system_apart="system" in options.fields)
        argv = self._argv(request, model, prompt, system)
        stdin = prompt.encode() if options.prompt_via == "stdin" else None
        deadline = asyncio.get_running_loop().time() + options.max_seconds
        queue: asyncio.Queue[_Item] = asyncio.Queue(_QUEUE)
        runs: list[_Run] = []
        pumps: list[asyncio.Task[None]] = []
        try:
            for index in range(request.n):
                runs.append(await self._spawn(index, argv, stdin, request))
            pumps = [asyncio.create_task(self._pump(run, queue)) for run in runs]
            finished = 0
            while finished < request.n:
                item = await self._next(queue, deadline)
                if isinstance(item, Exception):
                    raise item
                finished += isinstance(item, Finish)
                yield item
            yield Usage(
                prompt_tokens=approximate_tokens(len(prompt) + len(system or "")),
                completion_tokens=sum(run.output.tokens for run in runs),
            )
        finally:
            await _stop(pumps, runs)

    def _argv(self, request: ChatRequest, model: str, prompt: str, system: str | None) -> list[str]:
        options = self.options
        values = dict(options.defaults)
        values.update(
            (name, _text(value))
            for name, value in request.body.items()
            if name in options.fields and isinstance(value, Scalar)
        )
        if request.max_tokens is not None:
            values["max_tokens"] = str(request.max_tokens)
        values["prompt"] = prompt
        if model:
            values["model"] = model
        if system is not None:
            values["system"] = system
        for name in sorted(options.fields - values.keys()):
            needed = "a system or developer message" if name == "system" else f"'{name}'"
            raise APIError(
                f"The model `{request.model}` requires {needed} in the request.",
                param="messages" if name == "system" else name,
                code="missing_required_parameter",
            )
        argv = [options.argv[0]]
        for position, arg in enumerate(options.argv[1:], start=1):
            value = arg.format_map(values)
            if position in options.guarded and _looks_like_an_option(value):
                name = arg[1:-1]
                raise APIError(
                    f"Invalid value for '{name}': it cannot begin with '-'.",
                    param="messages" if name in ("prompt", "system") else name,
                    code="invalid_value",
                )
            argv.append(value)
        return argv

    def _environment(self) -> dict[str, str] | None:
        extra = dict(self.options.env)
        if self.config.secret and self.options.secret_env:
            extra[self.options.secret_env] = self.config.secret
        return {**os.environ, **extra} if extra else None

    async def _spawn(
        self, index: int, argv: list[str], stdin: bytes | None, request: ChatRequest
    ) -> _Run:
        pipe, devnull = asyncio.subprocess.PIPE, asyncio.subprocess.DEVNULL
        try:
            process = await asyncio.create_subprocess_exec(
                *argv,
                stdin=devnull if stdin is None else pipe,
                stdout=pipe,
                stderr=pipe,
                env=self._environment(),
                start_new_session=True,  # its own process group, killed as one
            )
        except OSError as exc:
            raise APIError(
                f"The command {argv[0]!r} could not be started: {exc.strerror or exc}.",
                status=500,
                type="server_error",
                code="spawn_error",
            ) from exc
        logger.debug("chatparity: started %s (pid %d)", argv[0], process.pid)
        output = _Output(index, request.stop, request.max_tokens, trim=self.options.trim)
        run = _Run(index, argv[0], process, output)
        run.helpers = [
            asyncio.create_task(_collect_stderr(process.stderr, run.stderr)),
            asyncio.create_task(_kill_leftovers(process)),
        ]
        if stdin is not None:
            run.helpers.append(asyncio.create_task(_write_stdin(process.stdin, stdin)))
        return run

    async def _pump(self, run: _Run, queue: asyncio.Queue[_Item]) -> None:
        """Relay one run's output, then its Finish, or the exception that ended it."""
        output = run.output
        assert run.process.stdout is not None
        try:
            while output.finish is None:
                data = await run.process.stdout.read(_CHUNK)
                if data:
                    output.feed(data)
                else:
                    code = await run.exit_code()
                    if code != 0:
                        raise self._failed(run, code)
                    output.close()
                for delta in output.take():
                    await queue.put(delta)
            await queue.put(Finish(run.index, output.finish))
            await _terminate(run)  # cut short by a stop sequence or max_tokens
        except Exception as exc:
            await queue.put(exc)

    def _failed(self, run: _Run, code: int) -> APIError:
        lines = run.stderr.decode(errors="replace").strip().splitlines()
        last = lines[-1].strip() if lines else ""
        if self.config.secret:
            last = last.replace(self.config.secret, "***")
        if len(last) > _MESSAGE_LIMIT:
            last = last[:_MESSAGE_LIMIT] + "…"
        how = f"was killed by signal {-code}" if code < 0 else f"exited with status {code}"
        return APIError(
            f"The command {run.program!r} {how}" + (f": {last}" if last else "."),
            status=500,
            type="server_error",
            code="command_failed",
        )

    async def _next(self, queue: asyncio.Queue[_Item], deadline: float) -> _Item:
        """The next item, or the time-out error once ``deadline`` passes without one."""
        with contextlib.suppress(asyncio.QueueEmpty):
            return queue.get_nowait()
        try:
            async with asyncio.timeout_at(deadline):
                return await queue.get()
        except TimeoutError:
            raise APIError(
                f"The command did not finish within {self.options.max_seconds:g} seconds.",
                status=504,
                type="timeout_error",
                code="request_timeout",
            ) from None


def _check_supported(request: ChatRequest) -> None:
    """Refuse, as a 400, what a program printing text cannot do."""
    if request.logprobs:
        raise APIError("logprobs are not supported by this model.", param="logprobs")
    if request.tools and request.tool_choice.mode in ("required", "function"):
        raise APIError("This model cannot call tools.", param="tool_choice")


__all__ = [
    "CommandBackend",
    "CommandOptions",
    "parse_options",
    "render_prompt",
]
