"""The command backend: a program declared in settings, run as a model.

Which programs may run is decided by whoever deploys the settings, never by a
database row: ``CHATPARITY["COMMANDS"]`` declares each program by name, and a
Backend row of kind ``command`` names one and sets only what a row may. Each
choice of a request runs the program once, without a shell and in a process
group of its own; what it writes to stdout is the answer, relayed as it
arrives.

A declaration, ``CHATPARITY["COMMANDS"][name]``:

``argv`` (required)
    The command as a list of strings, e.g. ``["llm", "-m", "{model}", "--no-log"]``.
    Arguments after the program may hold ``{name}`` placeholders (str.format
    syntax, plain names only; ``{{`` and ``}}`` are literal braces):
    ``{prompt}`` the conversation as text, ``{system}`` the system and developer
    messages, ``{model}`` the alias's model, a scalar request parameter such
    as ``{reasoning_effort}``, ``{temperature}``, ``{max_tokens}``, ``{seed}``
    (the alias's ``default_params`` count as sent), or any other name given a
    value in ``defaults`` (which a client cannot set). A placeholder still
    without a value is a 400 ``missing_required_parameter`` before anything runs.
``defaults``
    Placeholder values used when the request gives none, e.g.
    ``{"reasoning_effort": "medium", "system": ""}``.
``env``
    Variables set in the program's environment, e.g. ``{"LLM_USER_PATH": "/var/lib/llm"}``.
``pass_env``
    Names of variables copied from the server's environment when set there,
    e.g. ``["HTTPS_PROXY"]``.
``secret_env``
    The variable that receives the backend's ``secret`` (e.g. ``OPENAI_API_KEY``);
    the secret never goes on the command line.
``max_seconds``
    The longest any request may run, whatever a backend sets (default: no cap).
``prompt_via``
    ``"stdin"`` (the prompt is written to stdin, which is then closed) or
    ``"argument"`` (stdin is empty). Default: ``"argument"`` when an argument
    uses ``{prompt}``, else ``"stdin"``.
``trim``
    Drop whitespace at the very end of the output (default ``true``): most
    programs end with a newline that is not part of the answer.

A Backend row's ``options``:

``command`` (required)
    The name of a declaration.
``defaults``
    Values for placeholders of the declaration's ``argv``, over its own ``defaults``.
``max_seconds``
    The longest a request may run (default: the row's ``timeout``); never more
    than the declaration's ``max_seconds``. Past it the process group is killed
    and the request fails with 504 ``timeout_error`` / ``request_timeout``.
``trim``
    Overrides the declaration's ``trim``.

Nothing else: the program, its arguments and its environment come from the
settings only. A row naming an undeclared program or setting anything else is
refused when saved (``Backend.clean()``: the admin and the management API);
one written to the database some other way fails when the backend is built
(the client gets a generic 500, the server log the reason), and runs nothing.

The program's environment is PATH, HOME and LANG (the server's, else
``os.defpath``, the user's home directory and ``C.UTF-8``), then ``pass_env``,
``env`` and the secret; never the rest of the server's environment
(``SECRET_KEY``, ``DATABASE_URL``, ...).

Every value that goes into an argument is checked before anything runs, and
refused with a 400 ``invalid_value`` (``param``: ``messages`` for the prompt
and the system text, else the placeholder's name) when it holds a control
character (NUL, any other C0 character but tab, newline and carriage return,
or DEL), or when it would put a ``-`` at the start of an argument that comes
before any ``--`` argument (the program would read it as an option), negative
numbers included: a template that takes them writes ``--flag={name}`` or puts
the placeholder after ``--``.

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
exit is a 500 ``command_failed`` naming the exit status. Both come before the
first event when nothing was sent yet. What the program writes to stderr is
logged (a warning naming the backend) when it fails, and never sent to the client.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
import math
import os
import re
import signal
import string
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, TypeGuard

from django.core.exceptions import ImproperlyConfigured

from ..conf import app_settings
from ..protocol import errors
from ..protocol.errors import APIError
from ..protocol.events import Event, Finish, TextDelta, Usage
from ..protocol.request import ChatRequest, Message
from ..protocol.tokens import CHARS_PER_TOKEN, approximate_tokens
from .base import BackendConfig, no_base_url
from .text import TextStreamer

logger = logging.getLogger(__name__)

_CHUNK = 4096
_GRACE = 2.0  # seconds from SIGTERM to SIGKILL
_POLL = 0.1  # seconds between checks of whether a program's leader process exited
_QUEUE = 64  # events buffered ahead of the client; beyond it the programs wait
_STDERR_TAIL = 4096

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
_DECLARATION_KEYS = frozenset(
    {"argv", "defaults", "env", "pass_env", "secret_env", "max_seconds", "prompt_via", "trim"}
)
_ROW_KEYS = frozenset({"command", "defaults", "max_seconds", "trim"})
_VARIABLE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
# C0 controls but tab, newline and carriage return (normal in prompts), and DEL.
_CONTROL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]")
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
Template = tuple[tuple[str, str | None], ...]
"""One argument as (literal text, placeholder name or None) pieces, braces unescaped."""


# -- declarations and options ------------------------------------------------


class CommandConfigError(ValueError):
    """A declaration in ``CHATPARITY["COMMANDS"]``, or a backend's options, is wrong."""


@dataclass(frozen=True, slots=True)
class Declaration:
    """A program declared in ``CHATPARITY["COMMANDS"]``, checked."""

    name: str
    argv: tuple[str, ...]
    templates: tuple[Template, ...]
    """``argv[1:]`` parsed."""
    guarded: tuple[bool, ...]
    """For each of ``argv[1:]``: whether it comes before any ``--`` argument."""
    fields: frozenset[str]
    """Every placeholder name the arguments use."""
    prompt_via: Literal["stdin", "argument"]
    defaults: Mapping[str, str]
    env: Mapping[str, str]
    pass_env: tuple[str, ...]
    secret_env: str | None
    max_seconds: float | None
    trim: bool

    def environment(self, secret: str = "") -> dict[str, str]:
        """The program's whole environment: nothing of the server's but what is named."""
        environment = {
            "PATH": os.environ.get("PATH", os.defpath),
            "HOME": os.environ.get("HOME", os.path.expanduser("~")),
            "LANG": os.environ.get("LANG", "C.UTF-8"),
        }
        environment.update((name, os.environ[name]) for name in self.pass_env if name in os.environ)
        environment.update(self.env)
        if secret and self.secret_env:
            environment[self.secret_env] = secret
        return environment


@dataclass(frozen=True, slots=True)
class CommandOptions:
    """A command backend's program, as declared, with what its row sets."""

    declaration: Declaration
    defaults: Mapping[str, str]
    """The declaration's defaults, the row's over them."""
    max_seconds: float
    trim: bool


def parse_declaration(name: object, declaration: object) -> Declaration:
    """Check one entry of ``CHATPARITY["COMMANDS"]``; raise CommandConfigError naming
    what is wrong."""
    where = f"CHATPARITY['COMMANDS'][{name!r}]"
    if not isinstance(name, str) or not name:
        raise CommandConfigError(f"{where}: a program's name must be a non-empty string")
    if not isinstance(declaration, dict):
        raise CommandConfigError(f"{where} must be a dict")
    unknown = sorted(declaration.keys() - _DECLARATION_KEYS)
    if unknown:
        raise CommandConfigError(f"{where}: unknown key(s) {', '.join(map(str, unknown))}")
    argv = declaration.get("argv")
    if not isinstance(argv, list) or not argv or not all(isinstance(a, str) for a in argv):
        raise CommandConfigError(f"{where}: 'argv' must be a non-empty list of strings")
    if not argv[0] or _template(where, argv[0]) != ((argv[0], None),):
        raise CommandConfigError(f"{where}: the program, argv[0], must be a plain non-empty string")
    templates = tuple(_template(where, arg) for arg in argv[1:])
    defaults = _defaults(f"{where}: 'defaults'", declaration.get("defaults", {}))
    fields = frozenset(name for pieces in templates for _, name in pieces if name is not None)
    unknown = sorted(fields - _BUILTINS - _PARAMETERS - defaults.keys())
    if unknown:
        raise CommandConfigError(
            f"{where}: unknown placeholder(s) {', '.join(unknown)}: use prompt, system, model,"
            " a request parameter, or give the name a value in 'defaults'"
        )
    prompt_via = declaration.get("prompt_via", "argument" if "prompt" in fields else "stdin")
    if prompt_via not in ("stdin", "argument"):
        raise CommandConfigError(f"{where}: 'prompt_via' must be 'stdin' or 'argument'")
    if prompt_via == "argument" and "prompt" not in fields:
        raise CommandConfigError(
            f"{where}: 'prompt_via' is 'argument' but no argument uses {{prompt}}"
        )
    env = declaration.get("env", {})
    if not isinstance(env, dict) or not all(
        _is_variable(name) and isinstance(value, str) and "\0" not in value
        for name, value in env.items()
    ):
        raise CommandConfigError(f"{where}: 'env' must map variable names to strings")
    pass_env = declaration.get("pass_env", [])
    if not isinstance(pass_env, list) or not all(_is_variable(name) for name in pass_env):
        raise CommandConfigError(f"{where}: 'pass_env' must be a list of variable names")
    secret_env = declaration.get("secret_env")
    if secret_env is not None and not _is_variable(secret_env):
        raise CommandConfigError(f"{where}: 'secret_env' must be a variable name")
    max_seconds = declaration.get("max_seconds")
    if max_seconds is not None and not _is_positive(max_seconds):
        raise CommandConfigError(f"{where}: 'max_seconds' must be a positive number")
    trim = declaration.get("trim", True)
    if not isinstance(trim, bool):
        raise CommandConfigError(f"{where}: 'trim' must be true or false")
    return Declaration(
        name=name,
        argv=tuple(argv),
        templates=templates,
        guarded=_guarded(argv[1:]),
        fields=fields,
        prompt_via=prompt_via,
        defaults=defaults,
        env=dict(env),
        pass_env=tuple(pass_env),
        secret_env=secret_env,
        max_seconds=None if max_seconds is None else float(max_seconds),
        trim=trim,
    )


def declared(name: str) -> Declaration:
    """The program ``CHATPARITY["COMMANDS"]`` declares as ``name``, checked."""
    commands = app_settings.COMMANDS
    if not isinstance(commands, dict) or name not in commands:
        names = ", ".join(sorted(map(str, commands))) if isinstance(commands, dict) else ""
        raise CommandConfigError(
            f"no program {name!r} is declared in CHATPARITY['COMMANDS']"
            f" (declared: {names or 'none'})"
        )
    return parse_declaration(name, commands[name])


def resolve_options(options: object, timeout: float = math.inf) -> CommandOptions:
    """A Backend row's ``options`` on its declaration; raise CommandConfigError naming
    what is wrong. ``timeout`` is the row's, the default of ``max_seconds``."""
    if not isinstance(options, dict):
        raise CommandConfigError("options must be an object")
    name = options.get("command")
    if not isinstance(name, str) or not name:
        raise CommandConfigError("'command' must name a program declared in CHATPARITY['COMMANDS']")
    unknown = sorted(options.keys() - _ROW_KEYS)
    if unknown:
        raise CommandConfigError(
            f"option(s) {', '.join(map(str, unknown))} cannot be set on a backend: the program,"
            " its arguments and its environment are declared in CHATPARITY['COMMANDS'];"
            " a backend sets only command, defaults, max_seconds and trim"
        )
    declaration = declared(name)
    defaults = _defaults("'defaults'", options.get("defaults", {}))
    unused = sorted(defaults.keys() - declaration.fields)
    if unused:
        raise CommandConfigError(
            f"'defaults': {', '.join(unused)} is not a placeholder of {name!r}"
            f" (its placeholders: {', '.join(sorted(declaration.fields)) or 'none'})"
        )
    cap = declaration.max_seconds
    max_seconds = options.get("max_seconds")
    if max_seconds is not None and not _is_positive(max_seconds):
        raise CommandConfigError("'max_seconds' must be a positive number")
    if max_seconds is not None and cap is not None and max_seconds > cap:
        raise CommandConfigError(f"'max_seconds' cannot exceed {cap:g}, the most {name!r} may run")
    limit = min(timeout if max_seconds is None else max_seconds, math.inf if cap is None else cap)
    if not limit > 0:
        raise CommandConfigError("the backend's timeout must be a positive number of seconds")
    trim = options.get("trim", declaration.trim)
    if not isinstance(trim, bool):
        raise CommandConfigError("'trim' must be true or false")
    return CommandOptions(
        declaration=declaration,
        defaults={**declaration.defaults, **defaults},
        max_seconds=float(limit),
        trim=trim,
    )


def parse_options(config: BackendConfig) -> CommandOptions:
    """``config``'s options resolved; raise ImproperlyConfigured naming what is wrong."""
    try:
        return resolve_options(config.options, config.timeout)
    except CommandConfigError as exc:
        raise ImproperlyConfigured(f"command backend {config.name!r}: {exc}.") from None


def _template(where: str, arg: str) -> Template:
    """``arg``'s pieces; anything fancier than a plain ``{name}`` is refused."""
    try:
        parsed = list(string.Formatter().parse(arg))
    except ValueError as exc:
        raise CommandConfigError(f"{where}: argument {arg!r}: {exc}") from None
    pieces = []
    for literal, name, spec, conversion in parsed:
        if name is not None and (not name.isidentifier() or spec or conversion):
            raise CommandConfigError(
                f"{where}: argument {arg!r}: only plain {{name}} placeholders are allowed"
                " (no attribute, index, conversion or format spec)"
            )
        pieces.append((literal, name))
    return tuple(pieces)


def _guarded(args: Sequence[str]) -> tuple[bool, ...]:
    ended = args.index("--") if "--" in args else len(args)
    return tuple(position < ended for position in range(len(args)))


def _defaults(where: str, defaults: object) -> dict[str, str]:
    if not isinstance(defaults, dict) or not all(
        isinstance(name, str) and isinstance(value, Scalar) for name, value in defaults.items()
    ):
        raise CommandConfigError(f"{where} must map names to strings, numbers or booleans")
    texts = {name: _text(value) for name, value in defaults.items()}
    for name, text in texts.items():
        if _CONTROL.search(text):
            raise CommandConfigError(f"{where}: the value of {name!r} holds a control character")
    return texts


def _is_variable(name: object) -> bool:
    return isinstance(name, str) and _VARIABLE.fullmatch(name) is not None


def _is_number(value: object) -> TypeGuard[int | float]:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _is_positive(value: object) -> TypeGuard[int | float]:
    return _is_number(value) and 0 < value < math.inf


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
    for function in message.calls:
        text += f"\n[called {function['name']}({function['arguments']})]"
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
    """Serves completions from a declared command-line program (see the module docstring)."""

    check_base_url = staticmethod(no_base_url)

    def __init__(self, config: BackendConfig) -> None:
        self.config = config
        self.options = parse_options(config)
        self.declaration = self.options.declaration
        digest = hashlib.sha256(json.dumps(self.declaration.argv).encode()).hexdigest()
        self._fingerprint = f"fp_{digest[:10]}"

    @staticmethod
    def check_options(options: dict[str, Any]) -> None:
        """Raise CommandConfigError unless ``options`` name a declared program and set
        only what a Backend row may (see the module docstring); :func:`parse_options`
        checks the same when the backend is built."""
        try:
            resolve_options(options)
        except CommandConfigError as exc:
            raise CommandConfigError(f"{exc}.") from None

    @property
    def system_fingerprint(self) -> str:
        """Stable for one ``argv`` template."""
        return self._fingerprint

    async def stream(self, request: ChatRequest, model: str) -> AsyncIterator[Event]:
        _check_supported(request)
        declaration = self.declaration
        prompt, system = render_prompt(
            request.messages, system_apart="system" in declaration.fields
        )
        argv = self._argv(request, model, prompt, system)
        stdin = prompt.encode() if declaration.prompt_via == "stdin" else None
        environment = declaration.environment(self.config.secret)
        deadline = asyncio.get_running_loop().time() + self.options.max_seconds
        queue: asyncio.Queue[_Item] = asyncio.Queue(_QUEUE)
        runs: list[_Run] = []
        pumps: list[asyncio.Task[None]] = []
        try:
            for index in range(request.n):
                runs.append(await self._spawn(index, argv, environment, stdin, request))
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
                counted=True,  # estimated from characters: the program reports none
            )
        finally:
            await _stop(pumps, runs)

    def _argv(self, request: ChatRequest, model: str, prompt: str, system: str | None) -> list[str]:
        """The declared argv filled in; a 400 for a value missing or refused."""
        declaration = self.declaration
        values = dict(self.options.defaults)
        # Only request parameters: a name the declaration alone gives a value stays its own.
        values.update(
            (name, _text(value))
            for name, value in request.body.items()
            if name in _PARAMETERS and name in declaration.fields and isinstance(value, Scalar)
        )
        if request.most_completion_tokens is not None:
            values["max_tokens"] = str(request.most_completion_tokens)
        values["prompt"] = prompt
        if model:
            values["model"] = model
        if system is not None:
            values["system"] = system
        for name in sorted(declaration.fields - values.keys()):
            needed = "a system or developer message" if name == "system" else f"'{name}'"
            raise APIError(
                f"The model `{request.model}` requires {needed} in the request.",
                param=_param(name),
                code="missing_required_parameter",
            )
        for name in sorted(declaration.fields):
            if _CONTROL.search(values[name]):
                raise _refused(name, "it cannot contain control characters")
        argv = [declaration.argv[0]]
        for pieces, guarded in zip(declaration.templates, declaration.guarded, strict=True):
            argv.append(_fill(pieces, values, guarded=guarded))
        return argv

    async def _spawn(
        self,
        index: int,
        argv: list[str],
        environment: dict[str, str],
        stdin: bytes | None,
        request: ChatRequest,
    ) -> _Run:
        pipe, devnull = asyncio.subprocess.PIPE, asyncio.subprocess.DEVNULL
        name = self.declaration.name
        try:
            process = await asyncio.create_subprocess_exec(
                *argv,
                stdin=devnull if stdin is None else pipe,
                stdout=pipe,
                stderr=pipe,
                env=environment,
                start_new_session=True,  # its own process group, killed as one
            )
        except OSError as exc:
            logger.warning(
                "chatparity: backend %r could not start %r (%s): %s",
                self.config.name, name, argv[0], exc,
            )  # fmt: skip
            raise APIError(
                f"The command {name!r} could not be started.",
                status=500,
                type="server_error",
                code="spawn_error",
            ) from exc
        logger.debug("chatparity: started %s (pid %d)", name, process.pid)
        output = _Output(
            index, request.stop, request.most_completion_tokens, trim=self.options.trim
        )
        run = _Run(index, name, process, output)
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
        """The client's generic error for a failed run; its stderr goes to the log only."""
        how = f"was killed by signal {-code}" if code < 0 else f"exited with status {code}"
        stderr = run.stderr.decode(errors="replace").strip()
        if self.config.secret:
            stderr = stderr.replace(self.config.secret, "***")
        logger.warning(
            "chatparity: backend %r: the command %r %s; its stderr ends: %s",
            self.config.name, run.program, how, stderr or "(empty)",
        )  # fmt: skip
        return APIError(
            f"The command {run.program!r} {how}.",
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
            raise errors.timed_out(
                f"The command did not finish within {self.options.max_seconds:g} seconds."
            ) from None


def _fill(pieces: Template, values: Mapping[str, str], *, guarded: bool) -> str:
    """One argument with its placeholders' values. In a ``guarded`` one (before any
    ``--``), a value may not be what puts a ``-`` at the argument's start."""
    parts: list[str] = []
    for literal, name in pieces:
        parts.append(literal)
        if name is None:
            continue
        value = values[name]
        if guarded and value.startswith("-") and not any(parts):
            raise _refused(name, "it cannot begin with '-'")
        parts.append(value)
    return "".join(parts)


def _param(name: str) -> str:
    return "messages" if name in ("prompt", "system") else name


def _refused(name: str, problem: str) -> APIError:
    what = {"prompt": "the prompt", "system": "the system message"}.get(name, f"'{name}'")
    message = f"Invalid value for {what}: {problem}."
    return APIError(message, param=_param(name), code="invalid_value")


def _check_supported(request: ChatRequest) -> None:
    """Refuse, as a 400, what a program printing text cannot do."""
    if request.logprobs:
        raise APIError("logprobs are not supported by this model.", param="logprobs")
    if request.tools and request.tool_choice.mode in ("required", "function"):
        if request.legacy_functions:
            raise APIError("This model cannot call functions.", param="function_call")
        raise APIError("This model cannot call tools.", param="tool_choice")


__all__ = [
    "CommandBackend",
    "CommandConfigError",
    "CommandOptions",
    "Declaration",
    "declared",
    "parse_declaration",
    "parse_options",
    "render_prompt",
    "resolve_options",
]
