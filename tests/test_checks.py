"""System checks of the programs declared in ``CHATPARITY["COMMANDS"]``, and the
example project's declarations."""

import os
import sys
from pathlib import Path
from unittest import mock

import pytest
from django.core.checks import run_checks
from django.test import override_settings

from chatparity.accounting.spool import FIX
from chatparity.backends.command import parse_declaration
from chatparity.checks import (
    check_commands,
    check_cors_origins,
    check_counters,
    check_embedding_model,
    check_hosted_tools,
    check_response_cache,
    check_response_cache_shared,
    check_responses_retention,
    check_spool_dir,
    check_stored_response_bytes,
)
from project import settings as project_settings
from tests.support import spools


def reported(commands):
    """(id, message) of what the command checks say of ``commands``."""
    with override_settings(CHATPARITY={"COMMANDS": commands}):
        return [(message.id, message.msg) for message in check_commands()]


def test_declarations_of_installed_programs_pass():
    commands = {
        "cat": {"argv": ["cat"]},
        "python": {
            "argv": [sys.executable, "-c", "print(1)", "--", "{prompt}"],
            "defaults": {"reasoning_effort": "low"},
            "env": {"PYTHONUTF8": "1"},
            "pass_env": ["HTTPS_PROXY"],
            "secret_env": "OPENAI_API_KEY",
            "max_seconds": 60,
            "prompt_via": "argument",
            "trim": False,
        },
    }
    assert reported(commands) == []


def test_commands_that_are_not_a_dict_are_an_error():
    assert [id for id, _ in reported(["cat"])] == ["chatparity.E020"]


@pytest.mark.parametrize(
    ("declaration", "problem"),
    [
        ({"argv": "cat -n"}, "'argv' must be a non-empty list of strings"),
        ({"argv": ["cat", "{colour}"]}, "unknown placeholder(s) colour"),
        ({"argv": ["cat", "{model!r}"]}, "only plain {name} placeholders"),
        ({"argv": ["cat"], "shell": True}, "unknown key(s) shell"),
        ({"argv": ["cat"], "env": {"PATH": None}}, "'env' must map variable names to strings"),
        ("cat", "must be a dict"),
    ],
)
def test_a_malformed_declaration_is_an_error_naming_it(declaration, problem):
    ((id, message),) = reported({"cli": declaration})
    assert id == "chatparity.E021"
    assert message.startswith("CHATPARITY['COMMANDS']['cli']")
    assert problem in message


def test_a_program_not_found_on_the_path_it_runs_with_is_a_warning(tmp_path):
    program = tmp_path / "cli"
    program.write_text("#!/bin/sh\n")
    assert [id for id, _ in reported({"cli": {"argv": ["no-such-program-anywhere"]}})] == [
        "chatparity.W020"
    ]
    assert [id for id, _ in reported({"cli": {"argv": [str(program)]}})] == ["chatparity.W020"]
    program.chmod(0o755)
    assert reported({"cli": {"argv": [str(program)]}}) == []
    assert reported({"cli": {"argv": ["cli"], "env": {"PATH": str(tmp_path)}}}) == []


@override_settings(CHATPARITY={"COMMANDS": {"cli": {"argv": ["cat", "{nope}"]}}})
def test_manage_check_reports_the_declarations():
    assert "chatparity.E021" in {message.id for message in run_checks()}


def test_the_example_project_declares_llm_and_codex(monkeypatch):
    monkeypatch.setattr(project_settings, "_program", lambda name: f"/opt/bin/{name}")
    commands = project_settings._commands()
    assert sorted(commands) == ["codex", "llm"]
    llm, codex = (parse_declaration(name, commands[name]) for name in ("llm", "codex"))
    assert (llm.argv[0], llm.prompt_via) == ("/opt/bin/llm", "stdin")
    assert (codex.secret_env, codex.prompt_via, codex.defaults) == (
        "OPENAI_API_KEY", "argument", {"reasoning_effort": "medium"},
    )  # fmt: skip
    assert codex.argv[-2:] == ("--", "{prompt}")


def test_the_example_project_declares_only_what_is_installed(monkeypatch):
    monkeypatch.setattr(project_settings, "_program", lambda name: None)
    assert project_settings._commands() == {}
    llm = project_settings.CHATPARITY["COMMANDS"]["llm"]["argv"][0]  # this venv has the llm CLI
    assert llm == str(Path(sys.executable).with_name("llm"))


@pytest.mark.parametrize("seconds", [1, 3600.0, 30 * 24 * 3600, 100 * 365 * 24 * 3600.0])
def test_a_positive_responses_retention_passes(seconds):
    with override_settings(CHATPARITY={"RESPONSES_RETENTION": seconds}):
        assert check_responses_retention() == []


@pytest.mark.parametrize(
    ("seconds", "problem"),
    [
        (0, "must be a positive number of seconds, not 0."),
        (-60, "must be a positive number of seconds, not -60."),
        ("30d", "must be a positive number of seconds, not '30d'."),
        (None, "must be a positive number of seconds, not None."),
        (True, "must be a positive number of seconds, not True."),
        (float("nan"), "must be a positive number of seconds, not nan."),
        (float("inf"), "reaches back past the year 1"),
        (10**12, "reaches back past the year 1"),
    ],
)
def test_a_responses_retention_that_is_not_a_positive_number_is_an_error(seconds, problem):
    with override_settings(CHATPARITY={"RESPONSES_RETENTION": seconds}):
        (message,) = check_responses_retention()
        assert "chatparity.E050" in {message.id for message in run_checks()}
    assert message.id == "chatparity.E050"
    assert message.msg.startswith("CHATPARITY['RESPONSES_RETENTION'] ")
    assert problem in message.msg


def test_hosted_tools_policies_by_alias_pass():
    for policies in ({}, {"*": "refuse"}, {"*": "omit", "Strict-GPT": "refuse", "gpt": "pass"}):
        with override_settings(CHATPARITY={"HOSTED_TOOLS": policies}):
            assert check_hosted_tools() == []


@pytest.mark.parametrize(
    ("policies", "problem"),
    [
        ({"codex": "drop"}, "gives {'codex': 'drop'}: each alias's policy is 'omit' or"),
        ({"*": None}, "gives {'*': None}"),
        ("refuse", "to 'omit' or 'refuse' or 'pass', not 'refuse'."),
    ],
)
def test_a_hosted_tools_policy_not_known_is_an_error(policies, problem):
    with override_settings(CHATPARITY={"HOSTED_TOOLS": policies}):
        (message,) = check_hosted_tools()
        assert "chatparity.E051" in {message.id for message in run_checks()}
    assert message.id == "chatparity.E051"
    assert message.msg.startswith("CHATPARITY['HOSTED_TOOLS'] ")
    assert problem in message.msg


def cors_reported(origins):
    """(id, message) of what the CORS check says of ``origins``."""
    with override_settings(CHATPARITY={"CORS_ALLOWED_ORIGINS": origins}):
        return [(message.id, message.msg) for message in check_cors_origins()]


def test_cors_origins_and_the_wildcard_pass():
    assert cors_reported([]) == []
    assert cors_reported(["*"]) == []
    origins = ["https://app.example.com", "http://localhost:5173", "http://[::1]:8000"]
    assert cors_reported(origins) == []


def test_each_cors_entry_that_is_not_an_origin_is_an_error():
    reported = cors_reported(["https://app.example.com/", "app.example.com", 3, "https://ok"])
    assert [id for id, _ in reported] == ["chatparity.E060"] * 3
    assert "'https://app.example.com/' is not an origin" in reported[0][1]
    assert "3 is not a string" in reported[2][1]


def test_cors_origins_as_one_string_are_an_error():
    assert cors_reported("https://app.example.com") == [
        (
            "chatparity.E060",
            "CHATPARITY['CORS_ALLOWED_ORIGINS']: 'https://app.example.com' is not a list"
            " of origins.",
        )
    ]


def test_the_cors_check_runs_with_the_others():
    with override_settings(CHATPARITY={"CORS_ALLOWED_ORIGINS": ["nope"]}):
        assert "chatparity.E060" in [message.id for message in run_checks()]


def test_the_packaged_embedding_model_passes():
    assert check_embedding_model() == []


def test_an_embedding_model_file_not_there_is_a_warning(tmp_path):
    missing = str(tmp_path / "model.onnx")
    with override_settings(CHATPARITY={"EMBEDDING_MODEL": {"model_path": missing}}):
        (warning,) = check_embedding_model()
    assert warning.id == "chatparity.W005"
    assert repr(missing) in warning.msg


# Security round 3: the spool folder and the bounds of stored responses.


def spool_reported(path):
    with override_settings(CHATPARITY={"SPOOL_DIR": str(path)}):
        reported = [(message.id, message.msg) for message in check_spool_dir()]
        assert {id for id, _ in reported} <= {message.id for message in run_checks()}
    return reported


def test_a_spool_folder_of_this_users_alone_passes(tmp_path):
    mine = tmp_path / "spool"
    mine.mkdir(mode=0o700)
    assert spool_reported(mine) == []
    mine.chmod(0o755)  # others may read it, not write to it
    assert spool_reported(mine) == []
    assert spool_reported(tmp_path / "made-when-needed") == []
    with override_settings(CHATPARITY={"SPOOL_DIR": None}):
        assert check_spool_dir() == []


@pytest.mark.parametrize(
    ("make", "problem"),
    [
        (
            lambda path: path.mkdir() or path.chmod(0o760),
            "is not this user's alone: other users may write to it (mode 760)",
        ),
        (
            lambda path: path.mkdir() or path.chmod(0o706),
            "is not this user's alone: other users may write to it (mode 706)",
        ),
        (
            lambda path: path.mkdir() or path.chmod(0o777),
            "is not this user's alone: other users may write to it (mode 777)",
        ),
        (lambda path: path.write_bytes(b""), "is not a folder"),
    ],
    ids=["writable by its group", "writable by any user", "writable by anyone", "a file"],
)
def test_a_spool_folder_chatparity_would_refuse_is_an_error(tmp_path, make, problem):
    spool = tmp_path / "spool"
    make(spool)
    ((id, message),) = spool_reported(spool)
    assert id == "chatparity.E071"
    assert message == (
        f"CHATPARITY['SPOOL_DIR'] ({spool}) {problem}: chatparity will not spool there, nor serve."
    )


@spools.ANOTHER_USER
def test_a_spool_folder_of_another_user_is_an_error(tmp_path, other):
    (tmp_path / "spool").mkdir(mode=0o700)
    with mock.patch("os.getuid", return_value=os.getuid() + other):
        ((id, message),) = spool_reported(tmp_path / "spool")
    assert id == "chatparity.E071"
    assert "it belongs to another user" in message


@pytest.mark.parametrize("layout", spools.RESOLVED, ids=spools.layout_id)
def test_a_spool_folder_reached_through_symlinks_no_one_else_can_change_passes(tmp_path, layout):
    configured, _ = layout(tmp_path)
    assert spool_reported(configured) == []


@pytest.mark.parametrize("layout", spools.REFUSED, ids=spools.layout_id)
def test_a_spool_folder_reached_through_symlinks_others_could_change_is_an_error(tmp_path, layout):
    configured, said = layout(tmp_path)
    with override_settings(CHATPARITY={"SPOOL_DIR": str(configured)}):
        (error,) = check_spool_dir()
    assert error.id == "chatparity.E071"
    assert error.msg.startswith(f"CHATPARITY['SPOOL_DIR'] ({configured}")
    assert said in error.msg
    assert error.hint == FIX


def test_a_linked_spool_folder_says_where_it_leads(tmp_path):
    configured, real = spools.a_link_to_a_private_folder(tmp_path)
    real.chmod(0o777)
    ((_, message),) = spool_reported(configured)
    assert message.startswith(f"CHATPARITY['SPOOL_DIR'] ({configured}, which leads to {real})")


def test_a_spool_folder_in_a_folder_anyone_may_write_to_is_a_warning(tmp_path):
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)  # no sticky bit: anyone may rename what is in it
    ((_, replaced),) = spool_reported(shared / "spool")
    assert "they may put theirs in its place" in replaced
    shared.chmod(0o1777)  # as /tmp: only its owner may, but anyone may make it first
    ((_, squatted),) = spool_reported(shared / "spool")
    assert "any user may make it first" in squatted
    (shared / "spool").mkdir(mode=0o700)
    assert spool_reported(shared / "spool") == []


def test_positive_bounds_of_stored_responses_pass():
    with override_settings(CHATPARITY={"STORED_RESPONSE_BYTES": {"KEY": 10**12}}):
        assert check_stored_response_bytes() == []


@pytest.mark.parametrize("bound", [0, -1, "2MiB", None, True, 1.5])
def test_a_bound_of_stored_responses_that_is_not_a_positive_integer_is_an_error(bound):
    with override_settings(CHATPARITY={"STORED_RESPONSE_BYTES": {"CHAIN": bound}}):
        (message,) = check_stored_response_bytes()
        assert "chatparity.E052" in {message.id for message in run_checks()}
    assert message.id == "chatparity.E052"
    assert f"{{'CHAIN': {bound!r}}}" in message.msg


DUMMY_CACHE = {"default": {"BACKEND": "django.core.cache.backends.dummy.DummyCache"}}


def test_a_cache_that_keeps_nothing_and_no_redis_is_a_warning():
    with override_settings(CACHES=DUMMY_CACHE, CHATPARITY={}):
        (message,) = check_counters()
        assert "chatparity.W080" in {message.id for message in run_checks()}
    assert "rate limits and budgets" in message.msg
    with override_settings(CACHES=DUMMY_CACHE, CHATPARITY={"REDIS_URL": "redis://x"}):
        assert check_counters() == []
    assert check_counters() == []  # the tests' own cache keeps what it is given


def test_a_log_database_the_writer_cannot_write_is_an_error():
    from django.db import connections

    from chatparity.checks import check_log_database

    assert check_log_database() == []  # SQLite, or CI's PostgreSQL
    with mock.patch.object(type(connections["default"]), "vendor", "mysql"):
        (error,) = check_log_database()
    assert error.id == "chatparity.E070"
    assert "mysql" in error.msg


LOCAL = {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"}
REDIS = "django.core.cache.backends.redis.RedisCache"


def cache_checks(caches, **response_cache):
    """The ids of what the response cache's checks say under ``caches`` and
    ``CHATPARITY["RESPONSE_CACHE"]`` (with ``REDIS_URL`` when given)."""
    redis_url = response_cache.pop("REDIS_URL", None)
    chatparity = {"RESPONSE_CACHE": response_cache, "REDIS_URL": redis_url}
    with override_settings(CACHES=caches, CHATPARITY=chatparity):
        return sorted(message.id for message in check_response_cache())


def test_the_response_cache_has_a_store_of_its_own():
    assert cache_checks({"default": LOCAL}) == []  # no response cache
    answers = {**LOCAL, "LOCATION": "answers"}
    assert cache_checks({"default": LOCAL, "answers": answers}, CACHE="answers") == []
    # Two caches in memory under one name are one: the counters'.
    assert cache_checks({"default": LOCAL, "answers": LOCAL}, CACHE="answers") == [
        "chatparity.E092"
    ]
    assert cache_checks({"default": LOCAL}, CACHE="answers") == ["chatparity.E091"]
    # The limits count in the default cache when REDIS_URL is not set.
    assert cache_checks({"default": LOCAL}, CACHE="default") == ["chatparity.E092"]
    counters = "redis://10.0.0.5:6379/0"
    own = {"default": LOCAL, "answers": {"BACKEND": REDIS, "LOCATION": "redis://10.0.0.9:6379/0"}}
    assert cache_checks(own, CACHE="answers", REDIS_URL=counters) == []
    same = {"default": LOCAL, "answers": {"BACKEND": REDIS, "LOCATION": counters}}
    assert cache_checks(same, CACHE="answers", REDIS_URL=counters) == ["chatparity.E092"]
    listed = {"default": LOCAL, "answers": {"BACKEND": REDIS, "LOCATION": [counters]}}
    assert cache_checks(listed, CACHE="answers", REDIS_URL=counters) == ["chatparity.E092"]
    # Another database of the same server: its eviction is the counters' too.
    other_db = {"default": LOCAL, "answers": {"BACKEND": REDIS, "LOCATION": counters[:-1] + "4"}}
    assert cache_checks(other_db, CACHE="answers", REDIS_URL=counters) == ["chatparity.W093"]
    default = {"default": {"BACKEND": REDIS, "LOCATION": counters}}
    assert cache_checks({**same, **default}, CACHE="answers") == ["chatparity.E092"]
    dummy = {"default": LOCAL, "answers": DUMMY_CACHE["default"]}
    assert cache_checks(dummy, CACHE="answers") == ["chatparity.W094"]


def test_the_response_cache_s_bounds_are_positive_whole_numbers():
    caches = {"default": LOCAL}
    for name in ("MAX_ENTRY_BYTES", "MAX_BYTES", "MAX_TTL", "SEMANTIC_VECTORS"):
        for value in (0, -1, 1.5, "10", True, None):
            assert cache_checks(caches, **{name: value}) == ["chatparity.E090"], (name, value)


def test_a_response_cache_in_each_worker_s_memory_is_a_deploy_warning():
    with override_settings(
        CACHES={"default": LOCAL, "answers": LOCAL},
        CHATPARITY={"RESPONSE_CACHE": {"CACHE": "answers"}},
    ):
        (warning,) = check_response_cache_shared()
        assert warning.id == "chatparity.W095"
        assert "chatparity.W095" not in {message.id for message in run_checks()}
        assert "chatparity.W095" in {m.id for m in run_checks(include_deployment_checks=True)}
    assert check_response_cache_shared() == []  # no response cache


def test_the_example_project_s_response_cache_passes_its_checks():
    caches, chatparity = project_settings.CACHES, project_settings.CHATPARITY
    with override_settings(CACHES=caches, CHATPARITY=chatparity):
        assert check_response_cache() == []
