"""The command backend on real programs: cat, printf, sh, env, yes, and the llm CLI with SmolLM2.

Every program is declared in ``CHATPARITY["COMMANDS"]`` (``override_settings``);
backends name it. Direct tests drive ``CommandBackend.stream``; view tests go
through /v1/chat/completions with Django's async test client, and the hang-up
test through ASGI with ``http.disconnect``.
"""

import asyncio
import logging
import math
import os
import re
import sys
import tempfile
import time
from pathlib import Path

import orjson
import pytest
from asgiref.sync import sync_to_async
from asgiref.testing import ApplicationCommunicator
from django.core.asgi import get_asgi_application
from django.core.exceptions import ImproperlyConfigured, ValidationError
from django.core.signals import request_finished, request_started
from django.db import close_old_connections
from django.test import TestCase, TransactionTestCase, override_settings

from chatparity.admin import BackendForm
from chatparity.api.serializers import BackendSerializer
from chatparity.backends import backend_class
from chatparity.backends.base import BackendConfig
from chatparity.backends.command import CommandBackend
from chatparity.models import ApiKey, Backend, ModelAlias, RequestLog
from chatparity.protocol.errors import APIError
from chatparity.protocol.events import Finish, TextDelta, Usage
from chatparity.protocol.request import ChatRequest, Message, Tool, ToolChoice, parse_chat_request
from tests.asgi import completion_scope

LLM = str(Path(sys.executable).with_name("llm"))  # the llm CLI of this venv
# Prints its own pid and a background child's, then waits: a process group to kill.
GRANDPARENT = ["sh", "-c", 'sleep 300 & echo "$$ $!"; sleep 300']


def declaring(**commands):
    """Settings that declare ``commands`` (name -> declaration)."""
    return override_settings(CHATPARITY={"COMMANDS": commands})


def command(*argv, timeout=60.0, secret="", options=None, **declaration):
    """A backend of ``argv``, declared as ``cli`` with ``declaration``; ``options`` are
    what its row sets beside the name."""
    config = BackendConfig(
        name="cli",
        kind="command",
        secret=secret,
        options={"command": "cli", **(options or {})},
        timeout=timeout,
    )
    with declaring(cli={"argv": list(argv), **declaration}):
        return CommandBackend(config)


def ask(content="Hello there", *, messages=None, body=None, **fields):
    return ChatRequest(
        model="cli",
        messages=messages or [Message("user", content)],
        body=body or {},
        **fields,
    )


def run(backend, request, model="some-model"):
    """All the events, or the APIError that ended them (with the events before it)."""

    async def collect():
        events = []
        try:
            async for event in backend.stream(request, model):
                events.append(event)
        except APIError as error:
            return events, error
        return events, None

    return asyncio.run(asyncio.wait_for(collect(), 30))


def answer(backend, request, model="some-model"):
    events, error = run(backend, request, model)
    assert error is None, error
    return events


def text_of(events, index=0):
    return "".join(e.text for e in events if isinstance(e, TextDelta) and e.index == index)


def failure(backend, request):
    events, error = run(backend, request)
    assert error is not None, events
    return events, error


def running(pid):
    """Whether ``pid`` still runs (a zombie left for init to reap does not)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def wait_until_gone(pid, seconds=5.0):
    deadline = time.monotonic() + seconds
    while running(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    return not running(pid)


def assert_group_is_gone(leader, child):
    assert not Path(f"/proc/{leader}").exists(), "the program was not reaped"
    assert wait_until_gone(child), "the program's child outlived it"


# -- streaming ---------------------------------------------------------------


def test_deltas_arrive_while_the_program_still_runs(tmp_path):
    flag = tmp_path / "go"
    script = f'printf first; while [ ! -e "{flag}" ]; do sleep 0.02; done; printf second'
    backend = command("sh", "-c", script)

    async def scenario():
        events = aiter(backend.stream(ask(), "m"))
        first = await asyncio.wait_for(anext(events), 10)  # printf without a newline
        flag.touch()
        return first, [event async for event in events]

    first, rest = asyncio.run(scenario())
    assert first == TextDelta(0, "first", tokens=2)
    assert text_of(rest) == "second"
    assert rest[-2:] == [
        Finish(0, "stop"),
        Usage(prompt_tokens=3, completion_tokens=3, counted=True),
    ]


def test_a_character_split_across_writes_is_not_broken():
    script = r"printf '\303'; sleep 0.2; printf '\251'; sleep 0.2; printf t"
    events = answer(command("sh", "-c", script), ask())
    assert [e.text for e in events if isinstance(e, TextDelta)] == ["é", "t"]


def test_tokens_are_estimated_as_characters_over_four():
    request = ask("x" * 10)
    events = answer(command("printf", "%s", "a" * 4 * 3 + "b"), request)
    deltas = [e for e in events if isinstance(e, TextDelta)]
    usage = events[-1]
    assert usage == Usage(prompt_tokens=math.ceil(10 / 4), completion_tokens=4, counted=True)
    assert sum(delta.tokens for delta in deltas) == usage.completion_tokens


def test_trailing_whitespace_is_trimmed_unless_asked_not_to():
    assert text_of(answer(command("printf", "  two\n  lines \n\n"), ask())) == "  two\n  lines"
    untrimmed = command("printf", "line\n", trim=False)
    assert text_of(answer(untrimmed, ask())) == "line\n"


def test_system_fingerprint_is_a_stable_hash_of_the_argv_template():
    one = command("llm", "-m", "{model}").system_fingerprint
    assert re.fullmatch(r"fp_[0-9a-f]{10}", one)
    assert command("llm", "-m", "{model}").system_fingerprint == one
    assert command("llm", "-m", "{model}", "-n").system_fingerprint != one


# -- prompt and templates ----------------------------------------------------


def test_prompt_goes_to_stdin_by_default_and_a_lone_user_message_is_bare():
    assert text_of(answer(command("cat"), ask("What is 2+2?"))) == "What is 2+2?"


def test_conversation_is_rendered_with_system_first_and_roles_labelled():
    messages = [
        Message("user", "Hi"),
        Message("system", "Be brief."),
        Message("assistant", "Hello!"),
        Message("user", "Bye"),
    ]
    events = answer(command("cat"), ask(messages=messages))
    assert text_of(events) == "System: Be brief.\n\nUser: Hi\n\nAssistant: Hello!\n\nUser: Bye"


def test_prompt_via_argument_leaves_stdin_empty():
    backend = command("sh", "-c", 'printf "%s|" "$1"; cat', "sh", "{prompt}")
    assert backend.declaration.prompt_via == "argument"
    assert text_of(answer(backend, ask("Hi"))) == "Hi|"


def test_prompt_can_go_both_ways_when_asked():
    backend = command("sh", "-c", 'printf "%s|" "$1"; cat', "sh", "{prompt}", prompt_via="stdin")
    assert text_of(answer(backend, ask("Hi"))) == "Hi|Hi"


def test_system_placeholder_takes_the_system_messages_out_of_the_prompt():
    backend = command("sh", "-c", 'printf "[%s]" "$1"; cat', "sh", "{system}")
    messages = [Message("developer", "Be brief."), Message("user", "Hi")]
    events = answer(backend, ask(messages=messages))
    assert text_of(events) == "[Be brief.]Hi"
    assert events[-1].prompt_tokens == math.ceil(len("Be brief.Hi") / 4)


def test_templates_take_model_request_parameters_and_defaults():
    backend = command(
        "printf",
        "%s;",
        "{model}",
        "--temperature={temperature}",
        "{max_tokens}",
        "{reasoning_effort}",
        defaults={"reasoning_effort": "medium"},
    )
    request = ask(body={"temperature": 0.5, "max_completion_tokens": 40}, max_tokens=40)
    assert (
        text_of(answer(backend, request, model="SmolLM2")) == "SmolLM2;--temperature=0.5;40;medium;"
    )
    request = ask(body={"temperature": 0, "reasoning_effort": "high"}, max_tokens=9)
    assert text_of(answer(backend, request, model="m")) == "m;--temperature=0;9;high;"


def test_a_placeholder_without_a_value_is_a_400_before_anything_runs(tmp_path):
    marker = tmp_path / "ran"
    backend = command("sh", "-c", 'touch "$1"', "sh", str(marker), "{reasoning_effort}")
    events, error = failure(backend, ask())
    assert events == []
    assert (error.status, error.type, error.code, error.param) == (
        400, "invalid_request_error", "missing_required_parameter", "reasoning_effort",
    )  # fmt: skip
    assert not marker.exists()


def test_a_system_placeholder_without_system_messages_needs_a_default():
    backend = command("printf", "[%s]", "{system}")
    assert failure(backend, ask())[1].param == "messages"
    backend = command("printf", "[%s]", "{system}", defaults={"system": ""})
    assert text_of(answer(backend, ask())) == "[]"


def test_the_client_cannot_fill_a_placeholder_only_the_declaration_gives():
    backend = command("printf", "%s", "{profile}", defaults={"profile": "safe"})
    assert text_of(answer(backend, ask(body={"profile": "--evil"}))) == "safe"


# -- declarations ------------------------------------------------------------


@pytest.mark.parametrize(
    ("declaration", "problem"),
    [
        ({"argv": ["printf", "{a.b}"]}, "only plain {name} placeholders"),
        ({"argv": ["printf", "{a[0]}"]}, "only plain {name} placeholders"),
        ({"argv": ["printf", "{model!r}"]}, "only plain {name} placeholders"),
        ({"argv": ["printf", "{model:>9}"]}, "only plain {name} placeholders"),
        ({"argv": ["printf", "{}"]}, "only plain {name} placeholders"),
        ({"argv": ["printf", "{model"]}, "expected '}'"),
        ({"argv": ["printf", "{reasoning_efort}"]}, "unknown placeholder(s) reasoning_efort"),
        ({"argv": ["{model}"]}, "argv[0], must be a plain non-empty string"),
        ({"argv": [""]}, "argv[0], must be a plain non-empty string"),
        ({"argv": []}, "'argv' must be a non-empty list"),
        ({"argv": "llm -m x"}, "'argv' must be a non-empty list"),
        ({"argv": ["cat"], "prompt_via": "argument"}, "no argument uses {prompt}"),
        ({"argv": ["cat"], "prompt_via": "file"}, "'prompt_via' must be"),
        ({"argv": ["cat"], "max_seconds": 0}, "'max_seconds' must be a positive"),
        ({"argv": ["cat"], "secret_env": "A KEY"}, "'secret_env' must be"),
        ({"argv": ["cat"], "defaults": {"x": [1]}}, "'defaults' must map"),
        ({"argv": ["cat"], "defaults": {"x": "a\0b"}}, "'x' holds a control character"),
        ({"argv": ["cat"], "env": {"A=B": "x"}}, "'env' must map variable names"),
        ({"argv": ["cat"], "env": {"A": 1}}, "'env' must map variable names"),
        ({"argv": ["cat"], "pass_env": "HOME"}, "'pass_env' must be a list"),
        ({"argv": ["cat"], "cwd": "/tmp"}, "unknown key(s) cwd"),
        (["cat"], "must be a dict"),
    ],
)
def test_bad_declarations_are_refused_when_the_backend_is_built(declaration, problem):
    config = BackendConfig(name="cli", kind="command", options={"command": "cli"})
    with declaring(cli=declaration), pytest.raises(ImproperlyConfigured) as raised:
        CommandBackend(config)
    assert problem in str(raised.value)


@pytest.mark.parametrize(
    ("options", "problem"),
    [
        ({"argv": ["sh", "-c", "id"]}, "'command' must name a program declared"),
        (
            {"command": "sh"},
            "no program 'sh' is declared in CHATPARITY['COMMANDS'] (declared: cli)",
        ),
        ({"command": "cli", "argv": ["sh"]}, "option(s) argv cannot be set on a backend"),
        ({"command": "cli", "env": {"LD_PRELOAD": "x"}}, "option(s) env cannot be set"),
        ({"command": "cli", "pass_env": ["SECRET_KEY"]}, "option(s) pass_env cannot be set"),
        ({"command": "cli", "secret_env": "X"}, "option(s) secret_env cannot be set"),
        ({"command": "cli", "prompt_via": "argument"}, "option(s) prompt_via cannot be set"),
        ({"command": "cli", "defaults": {"flag": "x"}}, "flag is not a placeholder of 'cli'"),
        ({"command": "cli", "defaults": {"model": "a\x1bb"}}, "holds a control character"),
        ({"command": "cli", "max_seconds": 31}, "'max_seconds' cannot exceed 30"),
        ({"command": "cli", "max_seconds": -1}, "'max_seconds' must be a positive number"),
        ({"command": "cli", "trim": "no"}, "'trim' must be true or false"),
        ("cat", "options must be an object"),
    ],
)
def test_a_backend_names_a_declared_program_and_sets_nothing_else(options, problem):
    config = BackendConfig(name="mine", kind="command", options=options)
    cli = {"argv": ["printf", "%s", "{model}"], "max_seconds": 30}
    with declaring(cli=cli), pytest.raises(ImproperlyConfigured) as raised:
        CommandBackend(config)
    assert problem in str(raised.value)


def test_a_backend_sets_defaults_max_seconds_and_trim_within_its_declaration():
    template = ("printf", "%s;%s\n", "{model}", "{reasoning_effort}")
    declared = {"defaults": {"reasoning_effort": "medium"}, "max_seconds": 30}
    plain = command(*template, **declared)
    assert (plain.options.max_seconds, plain.options.trim) == (30, True)
    assert text_of(answer(plain, ask(), model="m")) == "m;medium"
    row = {"defaults": {"reasoning_effort": "low", "model": "m1"}, "max_seconds": 5, "trim": False}
    chosen = command(*template, **declared, options=row)
    assert (chosen.options.max_seconds, chosen.options.trim) == (5, False)
    assert text_of(answer(chosen, ask(), model="")) == "m1;low\n"
    assert text_of(answer(chosen, ask(body={"reasoning_effort": "high"}), model="m")) == "m;high\n"


def test_the_declared_max_seconds_caps_the_backend_timeout():
    backend = command("sleep", "300", timeout=600, max_seconds=0.3)
    assert backend.options.max_seconds == 0.3
    started = time.monotonic()
    assert failure(backend, ask())[1].code == "request_timeout"
    assert time.monotonic() - started < 10
    assert command("cat", timeout=2, max_seconds=30).options.max_seconds == 2


# -- argument guard ----------------------------------------------------------

# Records that it ran in the file $0, then prints its arguments.
ARGUMENTS = ("sh", "-c", 'touch "$0"; printf "%s|" "$@"')
PASSWD = [Message("system", "--output=/etc/passwd"), Message("user", "Hi")]


def arguments_of(tmp_path, template, *, model="m", **request):
    """What the program got as arguments from ``template``, or the error (it never ran)."""
    marker = tmp_path / "ran"
    backend = command(*ARGUMENTS, str(marker), *template, defaults={"system": ""})
    events, error = run(backend, ask(**request), model)
    assert marker.exists() == (error is None)
    return error or text_of(events)


@pytest.mark.parametrize(
    ("template", "request_", "param"),
    [
        (["{prompt}"], {"content": "--version"}, "messages"),
        (["{system}{prompt}"], {"messages": PASSWD}, "messages"),
        (["{system}{prompt}"], {"content": "-x"}, "messages"),
        (["{presence_penalty}"], {"body": {"presence_penalty": -1.5}}, "presence_penalty"),
        (["{seed}"], {"body": {"seed": -5}}, "seed"),
        (["{model}"], {"model": "-rf"}, "model"),
    ],
    ids=["prompt", "system-then-prompt", "empty-system-then-prompt", "negative-float",
         "negative-integer", "model"],
)  # fmt: skip
def test_a_value_that_would_start_an_argument_with_a_dash_is_refused(
    tmp_path, template, request_, param
):
    error = arguments_of(tmp_path, template, **request_)
    assert (error.status, error.type, error.code, error.param) == (
        400, "invalid_request_error", "invalid_value", param,
    )  # fmt: skip
    assert "cannot begin with '-'" in error.message


@pytest.mark.parametrize(
    ("template", "request_", "sent"),
    [
        (["x{prompt}"], {"content": "-v"}, "x-v|"),
        (["--penalty={presence_penalty}"], {"body": {"presence_penalty": -1.5}}, "--penalty=-1.5|"),
        (["{system}{prompt}"], {"messages": [Message("system", "Be"), Message("user", "-x")]},
         "Be-x|"),
        (["--", "{system}{prompt}"], {"messages": PASSWD}, "--|--output=/etc/passwdHi|"),
        (["--", "-a", "--", "{system}"], {"messages": PASSWD}, "--|-a|--|--output=/etc/passwd|"),
        (["{prompt}", "--"], {"content": "a\tb\r\nc"}, "a\tb\r\nc|--|"),
    ],
    ids=["after-a-literal", "in-a-flag", "after-a-value", "after-double-dash",
         "after-the-first-double-dash", "tab-and-newlines"],
)  # fmt: skip
def test_a_value_is_passed_where_it_cannot_start_an_option(tmp_path, template, request_, sent):
    assert arguments_of(tmp_path, template, **request_) == sent


@pytest.mark.parametrize("character", ["\0", "\x01", "\x1b", "\x0b", "\x7f"])
@pytest.mark.parametrize(
    ("template", "request_", "param"),
    [
        (["{prompt}"], lambda c: {"content": f"Hi{c}there"}, "messages"),
        (["--", "{system}"], lambda c: {"messages": [Message("system", c), Message("user", "Hi")]},
         "messages"),
        (["--user={user}"], lambda c: {"body": {"user": f"me{c}"}}, "user"),
        (["{model}"], lambda c: {"model": f"m{c}"}, "model"),
    ],
    ids=["prompt", "system", "parameter", "model"],
)  # fmt: skip
def test_a_control_character_in_any_value_is_a_400_before_anything_runs(
    tmp_path, character, template, request_, param
):
    error = arguments_of(tmp_path, template, **request_(character))
    assert (error.status, error.code, error.param) == (400, "invalid_value", param)
    assert "control characters" in error.message


def test_a_control_character_in_a_prompt_sent_to_stdin_is_no_argument():
    assert text_of(answer(command("cat"), ask("a\0b"))) == "a\0b"


def test_the_registry_knows_the_command_kind():
    assert backend_class("command") is CommandBackend


# -- choices, limits, stops --------------------------------------------------


def test_n_runs_the_program_once_per_choice_concurrently():
    backend = command("sh", "-c", "printf a; sleep 0.3; printf b")
    events = answer(backend, ask(n=2))
    deltas = [e for e in events if isinstance(e, TextDelta)]
    assert {deltas[0].index, deltas[1].index} == {0, 1}  # both started before either went on
    for index in (0, 1):  # and each streamed as it ran
        assert [d.text for d in deltas if d.index == index] == ["a", "b"]
    assert sorted(e.index for e in events if isinstance(e, Finish)) == [0, 1]
    assert events[-1].completion_tokens == 1 + 1  # ceil(2 / 4) each


def test_max_tokens_cuts_the_text_kills_the_program_and_finishes_with_length():
    backend = command("sh", "-c", "echo $$; exec yes")
    events = answer(backend, ask(max_tokens=5))
    text = text_of(events)
    assert len(text) == 5 * 4
    assert events[-2:] == [
        Finish(0, "length"),
        Usage(prompt_tokens=3, completion_tokens=5, counted=True),
    ]
    assert not Path(f"/proc/{text.split()[0]}").exists()


def test_a_stop_sequence_is_never_emitted_even_split_across_writes():
    backend = command("sh", "-c", 'printf "Hello ST"; sleep 0.2; printf "OP world"; sleep 300')
    started = time.monotonic()
    events = answer(backend, ask(stop=["STOP"]))
    assert text_of(events) == "Hello"
    assert events[-2] == Finish(0, "stop")
    assert time.monotonic() - started < 10  # the program was stopped, not waited for


@pytest.mark.parametrize(
    "leftover",
    ["sleep 300 &", "sleep 300 >/dev/null 2>&1 &"],
    ids=["holding-stdout", "detached"],
)
def test_a_child_the_program_leaves_behind_is_killed_when_it_exits(leftover):
    started = time.monotonic()
    events = answer(command("sh", "-c", f'{leftover} echo "$$ $!"', max_seconds=20), ask())
    assert time.monotonic() - started < 10  # not held open until the time-out
    assert events[-2] == Finish(0, "stop")
    assert_group_is_gone(*text_of(events).split())


def test_tools_the_program_cannot_call_and_logprobs_are_400s():
    tool = Tool("get_time")
    forced = ask(tools=[tool], tool_choice=ToolChoice("required"))
    assert failure(command("cat"), forced)[1].param == "tool_choice"
    assert failure(command("cat"), ask(logprobs=True))[1].param == "logprobs"
    assert text_of(answer(command("cat"), ask("Hi", tools=[tool], tool_choice=ToolChoice("auto"))))


LEGACY = {"model": "cli", "functions": [{"name": "get_time"}]}


def test_deprecated_functions_are_answered_in_text_and_a_forced_call_is_a_400_naming_it():
    hi = [{"role": "user", "content": "Hi"}]
    events = answer(command("cat"), parse_chat_request({**LEGACY, "messages": hi}))
    assert (text_of(events), events[-2]) == ("Hi", Finish(0, "stop"))
    forced = parse_chat_request({**LEGACY, "messages": hi, "function_call": {"name": "get_time"}})
    error = failure(command("cat"), forced)[1]
    assert (error.param, error.message) == ("function_call", "This model cannot call functions.")


def test_a_deprecated_function_call_and_its_result_are_in_the_conversation():
    messages = [
        {"role": "user", "content": "Time?"},
        {
            "role": "assistant",
            "content": None,
            "function_call": {"name": "get_time", "arguments": "{}"},
        },
        {"role": "function", "name": "get_time", "content": "noon"},
    ]
    events = answer(command("cat"), parse_chat_request({**LEGACY, "messages": messages}))
    assert text_of(events) == "User: Time?\n\nAssistant: [called get_time({})]\n\nFunction: noon"


# -- failures ----------------------------------------------------------------


@pytest.mark.parametrize("how", ["options", "backend timeout"])
def test_time_out_before_any_output_is_a_504(how):
    backend = (
        command("sleep", "300", max_seconds=0.3)
        if how == "options"
        else command("sleep", "300", timeout=0.3)
    )
    events, error = failure(backend, ask())
    assert events == []
    assert (error.status, error.type, error.code) == (504, "timeout_error", "request_timeout")


def test_time_out_after_output_ends_the_events_with_the_504():
    events, error = failure(command(*GRANDPARENT, max_seconds=0.5), ask())
    leader, child = text_of(events).split()
    assert error.code == "request_timeout"
    assert_group_is_gone(leader, child)


def test_a_missing_program_is_a_spawn_error_naming_only_the_declaration(caplog):
    events, error = failure(command("/nonexistent/bin/cli-program"), ask())
    assert events == []
    assert (error.status, error.type, error.code) == (500, "server_error", "spawn_error")
    assert error.message == "The command 'cli' could not be started."
    assert "/nonexistent/bin/cli-program" in caplog.text  # for whoever runs the server


def test_a_program_that_is_not_executable_is_a_spawn_error(tmp_path):
    script = tmp_path / "cli"
    script.write_text("#!/bin/sh\necho hi\n")
    assert failure(command(str(script)), ask())[1].code == "spawn_error"


def test_non_zero_exit_answers_the_status_alone_and_logs_the_stderr(caplog):
    backend = command("sh", "-c", "echo 'loading' >&2; echo 'Error: no key at /srv' >&2; exit 3")
    with caplog.at_level(logging.WARNING, logger="chatparity.backends.command"):
        events, error = failure(backend, ask())
    assert events == []
    assert (error.status, error.type, error.code) == (500, "server_error", "command_failed")
    assert error.message == "The command 'cli' exited with status 3."
    (record,) = caplog.records
    assert record.levelno == logging.WARNING
    assert "backend 'cli'" in record.getMessage()
    assert "loading\nError: no key at /srv" in record.getMessage()


def test_a_program_killed_by_a_signal_says_so():
    error = failure(command("sh", "-c", "echo secret-ish >&2; kill -9 $$"), ask())[1]
    assert error.message == "The command 'cli' was killed by signal 9."


def test_non_zero_exit_after_output_fails_after_the_deltas():
    events, error = failure(command("sh", "-c", "printf partial; exit 4"), ask())
    assert text_of(events) == "partial"
    assert not any(isinstance(e, Finish) for e in events)
    assert error.code == "command_failed"
    assert "status 4" in error.message


def test_the_secret_reaches_only_the_named_variable_and_never_an_error_or_the_log(caplog):
    secret = "sk-upstream-1234567890"
    echo = 'printf "%s" "$UPSTREAM_KEY"'
    assert text_of(answer(command("sh", "-c", echo, secret=secret), ask())) == ""
    passed = command("sh", "-c", echo, secret=secret, secret_env="UPSTREAM_KEY")
    assert text_of(answer(passed, ask())) == secret
    leaky = command(
        "sh", "-c", 'echo "bad key $UPSTREAM_KEY" >&2; exit 1', secret=secret,
        secret_env="UPSTREAM_KEY",
    )  # fmt: skip
    error = failure(leaky, ask())[1]
    assert secret not in error.message + caplog.text
    assert "bad key ***" in caplog.text


# -- environment -------------------------------------------------------------


def environment_of(backend):
    return dict(line.split("=", 1) for line in text_of(answer(backend, ask())).splitlines())


def test_the_program_gets_path_home_lang_and_only_what_is_declared(monkeypatch):
    monkeypatch.setenv("SECRET_KEY", "django-secret")
    monkeypatch.setenv("DATABASE_URL", "postgres://user:password@db/chat")
    monkeypatch.setenv("HTTPS_PROXY", "http://proxy:3128")
    monkeypatch.setenv("LANG", "fr_FR.UTF-8")
    backend = command(
        "env", secret="sk-1", secret_env="UPSTREAM_KEY", env={"LLM_USER_PATH": "/var/lib/llm"},
        pass_env=["HTTPS_PROXY", "NOT_SET_ANYWHERE"],
    )  # fmt: skip
    assert environment_of(backend) == {
        "PATH": os.environ["PATH"],
        "HOME": os.environ["HOME"],
        "LANG": "fr_FR.UTF-8",
        "HTTPS_PROXY": "http://proxy:3128",
        "LLM_USER_PATH": "/var/lib/llm",
        "UPSTREAM_KEY": "sk-1",
    }


def test_without_the_server_s_own_values_the_environment_has_safe_ones(monkeypatch):
    for name in ("PATH", "HOME", "LANG"):
        monkeypatch.delenv(name, raising=False)
    environment = environment_of(command("/usr/bin/env"))
    assert environment == {
        "PATH": os.defpath,
        "HOME": os.path.expanduser("~"),
        "LANG": "C.UTF-8",
    }


def test_the_declaration_s_env_wins_over_the_server_s_path():
    assert environment_of(command("env", env={"PATH": "/bin"}))["PATH"] == "/bin"


# -- cancellation ------------------------------------------------------------


def test_cancelling_the_consumer_kills_the_whole_process_group():
    backend = command(*GRANDPARENT)

    async def scenario():
        first = asyncio.get_running_loop().create_future()

        async def consume():
            async for event in backend.stream(ask(), "m"):
                if not first.done():
                    first.set_result(event)

        consumer = asyncio.create_task(consume())
        delta = await asyncio.wait_for(first, 10)
        consumer.cancel()  # parked on the next event, as a view is when its client goes
        with pytest.raises(asyncio.CancelledError):
            await consumer
        return delta

    started = time.monotonic()
    leader, child = asyncio.run(scenario()).text.split()
    assert time.monotonic() - started < 10
    assert_group_is_gone(leader, child)


def test_aclose_between_events_kills_the_whole_process_group():
    backend = command(*GRANDPARENT)

    async def scenario():
        events = backend.stream(ask(), "m")
        delta = await asyncio.wait_for(anext(events), 10)
        await events.aclose()
        return delta

    leader, child = asyncio.run(scenario()).text.split()
    assert_group_is_gone(leader, child)


# -- through the view --------------------------------------------------------


class CommandViewTests(TestCase):
    @classmethod
    def setUpTestData(cls):
        cls.key, cls.plaintext = ApiKey.objects.create_key("tests")

    def setUp(self):
        self.commands = {}  # what alias() declares, seen by the settings as it grows
        self.enterContext(override_settings(CHATPARITY={"COMMANDS": self.commands}))

    async def alias(
        self, public_id, *argv, seconds=60.0, default_params=None, model="", **declaration
    ):
        """An alias of a backend named ``public_id`` running ``argv``, declared under that name."""
        self.commands[public_id] = {"argv": list(argv), **declaration}
        backend = await Backend.objects.acreate(
            name=public_id, kind="command", options={"command": public_id}, timeout=seconds
        )
        await ModelAlias.objects.acreate(
            public_id=public_id, backend=backend, model=model, default_params=default_params or {}
        )

    def ask(self, model, content="Hi", **body):
        return self.async_client.post(
            "/v1/chat/completions",
            data=orjson.dumps(
                {"model": model, "messages": [{"role": "user", "content": content}], **body}
            ),
            content_type="application/json",
            headers={"Authorization": f"Bearer {self.plaintext}"},
        )

    async def frames(self, response):
        body = b"".join([part async for part in response.streaming_content])
        # Keepalive comments (": ...") come while a slow program has not answered yet.
        frames = [frame for frame in body.split(b"\n\n") if frame and not frame.startswith(b":")]
        return [frame.removeprefix(b"data: ") for frame in frames]

    async def test_llm_cli_answers_real_smollm2_text_offline(self):
        home = self.enterContext(tempfile.TemporaryDirectory())
        await self.alias(
            "smollm2-cli", LLM, "-m", "{model}", "--no-log", model="SmolLM2",
            env={"LLM_USER_PATH": home},
        )  # fmt: skip
        response = await self.ask(
            "smollm2-cli", "What is the capital of France?", stream=True, max_tokens=24,
            stream_options={"include_usage": True},
        )  # fmt: skip
        assert response.status_code == 200
        frames = await self.frames(response)
        assert frames[-1] == b"[DONE]"
        chunks = [orjson.loads(frame) for frame in frames[:-1]]
        contents = [c["choices"][0]["delta"].get("content") for c in chunks if c["choices"]]
        text = "".join(content or "" for content in contents)
        assert len([content for content in contents if content]) > 1  # streamed, not all at once
        assert re.search(r"[A-Za-z]{3,}", text)
        assert chunks[-1]["usage"]["completion_tokens"] == math.ceil(len(text) / 4)
        assert {chunk["model"] for chunk in chunks} == {"smollm2-cli"}
        row = await RequestLog.objects.aget()
        assert (row.status_code, row.backend, row.upstream_model) == (200, "smollm2-cli", "SmolLM2")

    async def test_reasoning_effort_from_the_alias_fills_the_template(self):
        await self.alias(
            "cli-high", "printf", "effort=%s", "{reasoning_effort}",
            default_params={"reasoning_effort": "high"},
        )  # fmt: skip
        completion = (await self.ask("cli-high")).json()
        assert completion["choices"][0]["message"]["content"] == "effort=high"
        assert completion["choices"][0]["finish_reason"] == "stop"
        lowered = (await self.ask("cli-high", reasoning_effort="low")).json()
        assert lowered["choices"][0]["message"]["content"] == "effort=low"

    async def test_n_choices_and_usage_in_a_completion(self):
        await self.alias("cat", "cat")
        completion = (await self.ask("cat", "Echo me", n=2)).json()
        assert [c["message"]["content"] for c in completion["choices"]] == ["Echo me"] * 2
        assert completion["usage"]["prompt_tokens"] == 2
        assert completion["usage"]["completion_tokens"] == 4
        assert completion["system_fingerprint"].startswith("fp_")

    async def test_missing_parameter_is_a_400(self):
        await self.alias("cli-effort", "printf", "%s", "{reasoning_effort}")
        response = await self.ask("cli-effort", stream=True)
        assert response.status_code == 400
        assert response.json()["error"]["param"] == "reasoning_effort"

    async def test_time_out_before_the_first_byte_is_a_real_504(self):
        await self.alias("slow", "sleep", "300", seconds=0.3)
        response = await self.ask("slow", stream=True)
        assert response.status_code == 504
        assert response.json()["error"] == {
            "message": "The command did not finish within 0.3 seconds.",
            "type": "timeout_error",
            "param": None,
            "code": "request_timeout",
        }
        row = await RequestLog.objects.aget()
        assert (row.status_code, row.error_code) == (504, "request_timeout")

    async def test_time_out_after_the_first_byte_is_an_error_frame_then_done(self):
        await self.alias("stalls", "sh", "-c", "printf partial; sleep 300", max_seconds=0.5)
        response = await self.ask("stalls", stream=True)
        assert response.status_code == 200
        frames = await self.frames(response)
        assert frames[-1] == b"[DONE]"
        assert orjson.loads(frames[-2])["error"]["code"] == "request_timeout"
        assert b'"content":"partial"' in b"".join(frames)
        row = await RequestLog.objects.aget()
        assert (row.status_code, row.error_code) == (200, "request_timeout")

    async def test_spawn_error_is_a_500_without_the_path(self):
        await self.alias("gone", "/nonexistent/bin/cli")
        response = await self.ask("gone", stream=True)
        assert response.status_code == 500
        assert response.json()["error"] == {
            "message": "The command 'gone' could not be started.",
            "type": "server_error",
            "param": None,
            "code": "spawn_error",
        }

    async def test_failure_before_output_is_a_500_and_after_output_an_error_frame(self):
        await self.alias("fails", "sh", "-c", "echo 'quota exceeded for /srv/app' >&2; exit 2")
        with self.assertLogs("chatparity.backends.command", logging.WARNING) as logs:
            response = await self.ask("fails", stream=True)
        assert response.status_code == 500
        assert response.json()["error"] == {
            "message": "The command 'fails' exited with status 2.",
            "type": "server_error",
            "param": None,
            "code": "command_failed",
        }
        assert "quota exceeded for /srv/app" in logs.output[0]

        await self.alias("fails-late", "sh", "-c", "printf partial; sleep 0.1; exit 2")
        response = await self.ask("fails-late", stream=True)
        assert response.status_code == 200
        frames = await self.frames(response)
        assert orjson.loads(frames[-2])["error"]["code"] == "command_failed"
        assert frames[-1] == b"[DONE]"

    async def test_a_backend_written_to_the_database_with_its_own_argv_runs_nothing(self):
        marker = Path(self.enterContext(tempfile.TemporaryDirectory())) / "ran"
        self.commands["cli"] = {"argv": ["sh", "-c", f"touch {marker}"]}  # a real program
        for name, options in [
            ("argv", {"argv": ["sh", "-c", f"touch {marker}"]}),
            ("named", {"command": "cli", "argv": ["sh", "-c", f"touch {marker}"]}),
            ("undeclared", {"command": "sh"}),
        ]:
            backend = await Backend.objects.acreate(name=name, kind="command", options=options)
            await ModelAlias.objects.acreate(public_id=name, backend=backend)
            with self.assertLogs("django.request", logging.ERROR):
                response = await self.ask(name)
            assert response.status_code == 500
            assert response.json()["error"]["message"] == (
                "The server had an error while processing your request."
            )
        assert not marker.exists()


@declaring(cli={"argv": ["printf", "%s", "{model}"], "max_seconds": 30})
class CommandValidationTests(TestCase):
    """The admin and the management API refuse what the backend would refuse."""

    def test_a_command_backend_is_checked_on_full_clean(self):
        Backend(
            name="ok", kind="command", options={"command": "cli", "max_seconds": 5}
        ).full_clean()
        for options in [
            {"argv": ["sh", "-c", "id"]},
            {"command": "sh"},
            {"command": "cli", "env": {}},
        ]:
            with pytest.raises(ValidationError) as raised:
                Backend(name="bad", kind="command", options=options).full_clean()
            assert list(raised.value.message_dict) == ["options"]
        upstream = Backend(name="other", kind="openai", base_url="https://example.com/v1")
        upstream.options = {"argv": ["x"]}
        with pytest.raises(ValidationError, match="Unknown option"):  # its kind's own check
            upstream.full_clean()

    def test_the_admin_form_refuses_an_undeclared_program(self):
        data = {"name": "cli", "kind": "command", "timeout": 60, "enabled": True}
        form = BackendForm(data={**data, "options": '{"argv": ["sh", "-c", "id"]}'})
        assert not form.is_valid()
        assert "'command' must name a program declared" in form.errors["options"][0]
        assert BackendForm(data={**data, "options": '{"command": "cli"}'}).is_valid()

    def test_the_api_serializer_refuses_an_undeclared_program_on_create_and_update(self):
        data = {"name": "cli", "kind": "command", "options": {"command": "sh"}}
        serializer = BackendSerializer(data=data)
        assert not serializer.is_valid()
        assert "no program 'sh' is declared" in str(serializer.errors["options"][0])
        backend = Backend.objects.create(name="cli", kind="local")
        changed = BackendSerializer(backend, data={"kind": "command"}, partial=True)
        assert not changed.is_valid()
        assert "options" in changed.errors
        allowed = BackendSerializer(
            backend, data={"kind": "command", "options": {"command": "cli"}}, partial=True
        )
        assert allowed.is_valid(), allowed.errors


class CommandHangUpTests(TransactionTestCase):
    def setUp(self):
        # As Django's test client does: keep the test database connection open.
        request_started.disconnect(close_old_connections)
        request_finished.disconnect(close_old_connections)
        self.addCleanup(request_started.connect, close_old_connections)
        self.addCleanup(request_finished.connect, close_old_connections)

    async def test_hang_up_kills_the_process_group_and_logs_a_cancelled_row(self):
        _, plaintext = await sync_to_async(ApiKey.objects.create_key)("hang-up")
        self.enterContext(declaring(grandparent={"argv": GRANDPARENT}))
        backend = await Backend.objects.acreate(
            name="grandparent", kind="command", options={"command": "grandparent"}
        )
        await ModelAlias.objects.acreate(public_id="grandparent", backend=backend)
        communicator = ApplicationCommunicator(get_asgi_application(), completion_scope(plaintext))
        body = {"model": "grandparent", "messages": [{"role": "user", "content": "Hi"}]}
        await communicator.send_input(
            {"type": "http.request", "body": orjson.dumps({**body, "stream": True})}
        )
        start = await communicator.receive_output(timeout=30)
        assert start["status"] == 200
        received = b""
        while not (pids := re.search(rb'"content":"(\d+) (\d+)"', received)):
            received += (await communicator.receive_output(timeout=10))["body"]
        await communicator.send_input({"type": "http.disconnect"})
        await communicator.wait(timeout=10)
        row = await RequestLog.objects.aget()
        assert row.cancelled
        assert row.status_code == 200
        leader, child = (int(pid) for pid in pids.groups())
        await sync_to_async(assert_group_is_gone)(leader, child)
