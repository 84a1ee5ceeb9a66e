"""Management commands, system checks and migrations."""

from io import StringIO

import pytest
from django.core.checks import run_checks
from django.core.management import call_command
from django.test import override_settings

from chatparity.models import ApiKey, Backend, ModelAlias, hash_key


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
    assert Backend.objects.get().kind == "local"
    alias = ModelAlias.objects.get()
    assert (alias.public_id, alias.backend.name) == ("smollm2", "local")


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
