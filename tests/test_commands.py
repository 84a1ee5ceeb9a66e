"""Management commands, system checks and migrations."""

import datetime
from io import StringIO

import pytest
from django.core.checks import run_checks
from django.core.management import CommandError, call_command
from django.db import connection
from django.test import override_settings
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from chatparity.models import ApiKey, Backend, ModelAlias, StoredResponse, hash_key


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
