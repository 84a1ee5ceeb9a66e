"""Management commands, system checks and migrations."""

import asyncio
import datetime
import sys
import threading
from io import StringIO

import pytest
from asgiref.sync import sync_to_async
from django.core.checks import run_checks
from django.core.management import CommandError, call_command
from django.db import connection, connections
from django.db.models import Sum
from django.test import override_settings
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from chatparity.accounting import catalog, reports, rollups
from chatparity.accounting.inserts import insert_rows
from chatparity.models import (
    ApiKey,
    Backend,
    DailyAliasUsage,
    ModelAlias,
    RequestLog,
    StoredResponse,
    hash_key,
)
from tests.asgi import ask_fast_path
from tests.scripted import SCRIPTED
from tests.support.logs import logged, logged_without_rollups, noon


@pytest.mark.django_db
def test_createapikey_prints_only_the_plaintext_and_stores_only_its_hash():
    out = StringIO()
    call_command("createapikey", "ci", stdout=out)
    plaintext = out.getvalue().strip()
    assert out.getvalue().count("\n") == 1
    assert plaintext.startswith("sk-cp-")
    key = ApiKey.objects.get()
    assert key.hashed_key == hash_key(plaintext)
    assert key.prefix == plaintext[:10]
    assert plaintext not in {key.name, key.prefix, key.hashed_key}
    assert (key.all_aliases, key.is_active) == (True, True)  # for every alias, as before


@pytest.mark.django_db
def test_bootstrap_is_idempotent():
    for _ in range(2):
        call_command("chatparity_bootstrap", stdout=StringIO())
    assert sorted(Backend.objects.values_list("name", "kind")) == [
        ("embedder", "embedder"),
        ("local", "local"),
    ]
    aliases = ModelAlias.objects.order_by("public_id").values_list("public_id", "backend__name")
    assert list(aliases) == [("embed-small", "embedder"), ("smollm2", "local")]


@pytest.mark.django_db
def test_migrations_are_up_to_date():
    call_command("makemigrations", "chatparity", "--check", "--dry-run", stdout=StringIO())


def check_ids():
    return {message.id for message in run_checks()}


def test_default_configuration_passes_the_checks():
    assert not {id for id in check_ids() if id.startswith("chatparity")}


@override_settings(CHATPARITY={"LOG_BODY": True})
def test_unknown_setting_is_reported():
    assert "chatparity.E002" in check_ids()


@override_settings(CHATPARITY={"BACKEND_CLASSES": {"x": "nowhere.Backend"}})
def test_unimportable_backend_class_is_reported():
    assert "chatparity.E003" in check_ids()


@override_settings(CHATPARITY=["not", "a", "dict"])
def test_settings_that_are_not_a_dict_are_reported():
    assert "chatparity.E001" in check_ids()


@override_settings(CHATPARITY={"LOCAL_MODEL": {"model_path": "/nonexistent.gguf"}})
def test_missing_model_file_is_reported():
    assert "chatparity.W003" in check_ids()


DAY = 24 * 3600


def stored_response(id, age):
    """A stored response created ``age`` ago."""
    return StoredResponse.objects.create(
        id=id, model="m", status="completed", response={}, created_at=timezone.now() - age
    )


def expire(*args):
    out = StringIO()
    call_command("chatparity_expire_responses", *args, stdout=out)
    return out.getvalue()


@pytest.mark.django_db
@override_settings(CHATPARITY={"RESPONSES_RETENTION": 7 * DAY})
def test_expire_responses_deletes_those_older_than_the_retention_in_batches():
    for i in range(5):
        stored_response(f"resp_old{i}", datetime.timedelta(days=8, minutes=i))
    stored_response("resp_recent", datetime.timedelta(days=6, hours=23))
    with CaptureQueriesContext(connection) as queries:
        printed = expire("--batch-size", "2")
    deletes = [q["sql"] for q in queries.captured_queries if q["sql"].startswith("DELETE")]
    assert len(deletes) == 3  # 2 + 2 + 1
    assert list(StoredResponse.objects.values_list("id", flat=True)) == ["resp_recent"]
    assert printed.startswith("Deleted 5 stored response(s) created before ")
    assert expire().startswith("Deleted 0 stored response(s)")


@pytest.mark.django_db
def test_expire_responses_keeps_the_default_thirty_days():
    stored_response("resp_kept", datetime.timedelta(days=29))
    stored_response("resp_gone", datetime.timedelta(days=31))
    assert expire().startswith("Deleted 1 stored response(s)")
    assert list(StoredResponse.objects.values_list("id", flat=True)) == ["resp_kept"]


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("settings_", "args", "problem"),
    [
        ({"RESPONSES_RETENTION": 0}, [], "must be a positive number of seconds"),
        ({}, ["--batch-size", "0"], "--batch-size must be at least 1."),
    ],
)
def test_expire_responses_refuses_a_bad_retention_or_batch_size(settings_, args, problem):
    stored_response("resp_old", datetime.timedelta(days=400))
    with override_settings(CHATPARITY=settings_), pytest.raises(CommandError, match=problem):
        expire(*args)
    assert StoredResponse.objects.count() == 1


def prune(*args):
    out = StringIO()
    call_command("chatparity_prune_logs", *args, stdout=out)
    return out.getvalue()


def days_ago(days):
    return timezone.now().astimezone(datetime.UTC).date() - datetime.timedelta(days=days)


def requests_per_day():
    return dict(DailyAliasUsage.objects.values_list("day").annotate(Sum("requests")))


@pytest.mark.django_db
def test_prune_logs_deletes_the_rows_of_older_days_in_batches_and_keeps_their_usage():
    for days in (0, 0, 1, 2, 3, 3, 3, 9):
        logged(days_ago(days), alias=f"{days} days ago", total_tokens=days)
    before = reports.usage(reports.LogFilter(), ["day", "alias"])
    with CaptureQueriesContext(connection) as queries:
        printed = prune("--older-than", "3", "--batch-size", "2")
    deletes = [q["sql"] for q in queries.captured_queries if q["sql"].startswith("DELETE")]
    assert len(deletes) == 2  # 2 + 2
    assert sorted(RequestLog.objects.values_list("alias", flat=True)) == [
        "0 days ago", "0 days ago", "1 days ago", "2 days ago",
    ]  # fmt: skip
    assert printed.startswith(f"Deleted 4 log row(s) from before {days_ago(2).isoformat()} (UTC)")
    assert reports.usage(reports.LogFilter(), ["day", "alias"]) == before
    assert prune("--older-than", "3").startswith("Deleted 0 log row(s)")
    assert reports.usage(reports.LogFilter(), ["day", "alias"]) == before


@pytest.mark.django_db
def test_prune_logs_first_rebuilds_the_rollups_of_rows_logged_without_them():
    logged(days_ago(5))
    logged_without_rollups(
        [RequestLog(key_prefix="sk-cp-old", status_code=200, duration_ms=1.0, created_at=noon(day))
         for day in (days_ago(5), days_ago(6), days_ago(6))]
    )  # fmt: skip
    printed = prune("--older-than", "1")
    assert "(2 day(s) rebuilt from the log first)" in printed
    assert not RequestLog.objects.exists()
    assert requests_per_day() == {days_ago(5): 2, days_ago(6): 2}


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("args", "problem"),
    [
        (["--older-than", "0"], "at least 1"),
        (["--older-than", "2", "--batch-size", "0"], "at least 1"),
        (["--older-than", "2", "--pause", "-1"], "negative"),
        ([], "--older-than"),
    ],
)
def test_prune_logs_refuses_bad_arguments(args, problem):
    logged(days_ago(30))
    with pytest.raises(CommandError, match=problem):
        prune(*args)
    assert RequestLog.objects.count() == 1


@pytest.mark.django_db
def test_check_rollups_rebuilds_the_recent_days_whose_rollups_miss_rows():
    for day in (days_ago(0), days_ago(1), days_ago(3)):
        logged(day)
    logged_without_rollups(
        [RequestLog(key_prefix="sk-cp-old", status_code=200, duration_ms=1.0, created_at=noon(day))
         for day in (days_ago(1), days_ago(3))]
    )  # fmt: skip
    out = StringIO()
    call_command("chatparity_check_rollups", "--days", "2", stdout=out)
    assert out.getvalue() == (
        f"Checked the rollups of 2 day(s) from {days_ago(1).isoformat()} (UTC); rebuilt from"
        f" the log: {days_ago(1).isoformat()}.\n"
    )
    assert requests_per_day() == {days_ago(0): 1, days_ago(1): 2, days_ago(3): 1}
    with pytest.raises(CommandError, match="at least 1"):
        call_command("chatparity_check_rollups", "--days", "0")


@pytest.mark.skipif(connection.vendor != "postgresql", reason="concurrent writers need PostgreSQL")
@pytest.mark.django_db(transaction=True)
@override_settings(CHATPARITY=SCRIPTED)
def test_prune_logs_while_requests_are_served_loses_none_of_their_rows_or_usage():
    _, plaintext = ApiKey.objects.create_key("busy")
    backend = Backend.objects.create(name="scripted", kind="scripted", options={"script": ["Hi"]})
    ModelAlias.objects.create(public_id="echo", backend=backend)
    for days in range(3, 13):
        insert_rows([
            RequestLog(key_prefix="sk-cp-old", alias="echo", status_code=200, duration_ms=1.0,
                       created_at=noon(days_ago(days)))
            for _ in range(30)
        ])  # fmt: skip
    statuses = []

    def serve():
        async def requests():
            try:
                for _ in range(8):
                    answers = await asyncio.gather(*(ask_fast_path(plaintext) for _ in range(5)))
                    statuses.extend(status for status, _ in answers)
            finally:  # the connections of the thread the queries ran on
                await sync_to_async(connections.close_all)()

        asyncio.run(requests())

    server = threading.Thread(target=serve)
    server.start()
    try:
        printed = prune("--older-than", "2", "--batch-size", "7")
    finally:
        server.join()
    assert printed.startswith("Deleted 300 log row(s)")
    assert statuses == [200] * 40
    assert RequestLog.objects.count() == 40  # every request served is logged
    assert RequestLog.objects.filter(created_at__lt=rollups.day_start(days_ago(1))).count() == 0
    totals = requests_per_day()
    assert totals.pop(days_ago(0)) == 40
    assert totals == {days_ago(days): 30 for days in range(3, 13)}


@pytest.fixture
def priced_aliases(db):
    """Aliases of an Anthropic upstream: one priced as genai-prices' catalog says, one
    not, one of a model the catalog does not know."""
    anthropic = Backend.objects.create(name="anthropic", kind="openai",
                                       base_url="https://api.anthropic.com/v1",
                                       options={"wire_api": "messages"})  # fmt: skip
    ModelAlias.objects.create(public_id="opus", model="claude-opus-4-1", backend=anthropic,
                              input_price=15, output_price=75)  # fmt: skip
    ModelAlias.objects.create(public_id="opus-old", model="claude-opus-4-1", backend=anthropic,
                              input_price=15, output_price=75, cached_input_price="3")  # fmt: skip
    ModelAlias.objects.create(public_id="mine", model="my-finetune", backend=anthropic)


def check_prices(*args):
    out = StringIO()
    call_command("chatparity_check_prices", *args, stdout=out)
    return out.getvalue()


def test_check_prices_lists_the_aliases_whose_prices_differ_and_fails(priced_aliases):
    with pytest.raises(CommandError) as failed:
        check_prices()
    version = catalog.version()
    assert str(failed.value) == f"1 of 3 aliases differ from genai-prices {version}; 1 not in it."
    out = StringIO()
    with pytest.raises(CommandError):
        call_command("chatparity_check_prices", stdout=out)
    assert out.getvalue() == (
        "opus-old (anthropic/claude-opus-4-1): cached_input_price 3.000000, the catalog 1.500000.\n"
    )


def test_check_prices_passes_when_every_alias_agrees_and_names_the_unknown_ones(priced_aliases):
    ModelAlias.objects.filter(public_id="opus-old").update(cached_input_price=None)
    version = catalog.version()
    assert check_prices() == f"0 of 3 aliases differ from genai-prices {version}; 1 not in it.\n"
    assert check_prices("--verbosity", "2").startswith("mine: not in the catalog ('my-finetune').")


def test_check_prices_without_the_catalog_says_how_to_install_it(priced_aliases, monkeypatch):
    monkeypatch.setitem(sys.modules, "genai_prices", None)
    with pytest.raises(CommandError, match=r"django-chatparity\[prices\]"):
        check_prices()
