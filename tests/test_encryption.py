"""Backend secrets at rest: Fernet tokens in the database, plaintext to Python, keys rotated."""

from io import StringIO

import pytest
from cryptography.fernet import Fernet
from django.core.exceptions import ImproperlyConfigured
from django.core.management import CommandError, call_command
from django.db import connection
from django.test import TestCase, override_settings

from chatparity import encryption
from chatparity.models import Backend
from tests.support.migrating import MigratingTestCase

SECRET = "sk-upstream-very-secret-4242"
OLD_KEY, NEW_KEY = Fernet.generate_key().decode(), Fernet.generate_key().decode()


def keys(*fernet_keys):
    return override_settings(CHATPARITY={"SECRET_KEYS": list(fernet_keys)})


def column(backend):
    """What the database holds in the secret column, read past the ORM."""
    table = connection.ops.quote_name(Backend._meta.db_table)
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT secret FROM {table} WHERE id = %s", [backend.pk])
        return cursor.fetchone()[0]


def write_column(backend, value):
    table = connection.ops.quote_name(Backend._meta.db_table)
    with connection.cursor() as cursor:
        cursor.execute(f"UPDATE {table} SET secret = %s WHERE id = %s", [value, backend.pk])


def upstream(name="up", secret=SECRET):
    return Backend.objects.create(
        name=name, kind="openai", base_url="http://127.0.0.1:9/v1", secret=secret
    )


def plaintext_of(token, key):
    assert token.startswith(encryption.PREFIX)
    return Fernet(key.encode()).decrypt(token.removeprefix(encryption.PREFIX).encode()).decode()


class AtRestTests(TestCase):
    def test_the_column_holds_a_token_never_the_plaintext(self):
        backend = upstream()
        stored = column(backend)
        assert SECRET not in stored
        assert stored.startswith(encryption.PREFIX)
        assert Backend.objects.get(pk=backend.pk).secret == SECRET

    def test_the_token_is_fernet_under_the_first_configured_key(self):
        with keys(NEW_KEY, OLD_KEY):
            backend = upstream()
        assert plaintext_of(column(backend), NEW_KEY) == SECRET

    def test_each_save_encrypts_afresh(self):
        one, two = upstream("one"), upstream("two")
        assert column(one) != column(two)

    def test_an_empty_secret_stays_empty_and_can_be_filtered_on(self):
        backend = upstream(secret="")
        assert column(backend) == ""
        assert list(Backend.objects.filter(secret="")) == [backend]
        assert not Backend.objects.exclude(secret="").exists()

    def test_a_row_saved_before_encryption_is_still_read(self):
        backend = upstream()
        write_column(backend, SECRET)
        assert Backend.objects.get(pk=backend.pk).secret == SECRET

    def test_values_lists_decrypt_too(self):
        upstream()
        assert list(Backend.objects.values_list("secret", flat=True)) == [SECRET]


class KeyTests(TestCase):
    def test_old_tokens_decrypt_while_the_old_key_is_listed_after_the_new(self):
        with keys(OLD_KEY):
            backend = upstream()
        with keys(NEW_KEY, OLD_KEY):
            assert Backend.objects.get(pk=backend.pk).secret == SECRET

    def test_a_token_under_a_key_no_longer_listed_is_a_clear_configuration_error(self):
        with keys(OLD_KEY):
            backend = upstream()
        with (
            keys(NEW_KEY),
            pytest.raises(
                ImproperlyConfigured, match=r'keep the old key in CHATPARITY\["SECRET_KEYS"\]'
            ),
        ):
            Backend.objects.get(pk=backend.pk)

    def test_default_keys_follow_django_secret_key_and_its_fallbacks(self):
        with override_settings(SECRET_KEY="a" * 50, SECRET_KEY_FALLBACKS=[]):
            backend = upstream()
        with override_settings(SECRET_KEY="b" * 50, SECRET_KEY_FALLBACKS=["a" * 50]):
            assert Backend.objects.get(pk=backend.pk).secret == SECRET
        with (
            override_settings(SECRET_KEY="b" * 50, SECRET_KEY_FALLBACKS=[]),
            pytest.raises(ImproperlyConfigured),
        ):
            Backend.objects.get(pk=backend.pk)

    def test_keys_of_ones_own_still_open_tokens_under_the_derived_key(self):
        backend = upstream()  # SECRET_KEYS empty: under the key derived from SECRET_KEY
        with keys(NEW_KEY):
            assert Backend.objects.get(pk=backend.pk).secret == SECRET
            assert "Re-encrypted 1 backend secret(s)" in rotate_secrets()
        assert plaintext_of(column(backend), NEW_KEY) == SECRET

    def test_something_else_than_fernet_keys_is_a_configuration_error(self):
        for configured in (["not-a-fernet-key"], NEW_KEY):
            with (
                override_settings(CHATPARITY={"SECRET_KEYS": configured}),
                pytest.raises(ImproperlyConfigured, match=r'CHATPARITY\["SECRET_KEYS"\] must'),
            ):
                upstream()


def rotate_secrets():
    out = StringIO()
    call_command("chatparity_rotate_secrets", stdout=out)
    return out.getvalue()


class RotateCommandTests(TestCase):
    def test_every_secret_is_re_encrypted_under_the_first_key(self):
        with keys(OLD_KEY):
            one, two = upstream("one"), upstream("two", secret="sk-two")
        legacy = upstream("legacy", secret="")
        write_column(legacy, "sk-plain")  # saved before encryption existed
        upstream("none", secret="")
        with keys(NEW_KEY, OLD_KEY):
            assert "Re-encrypted 3 backend secret(s)" in rotate_secrets()
        assert [plaintext_of(column(row), NEW_KEY) for row in (one, two, legacy)] == [
            SECRET,
            "sk-two",
            "sk-plain",
        ]
        with keys(NEW_KEY):  # the old key can go
            secrets = set(Backend.objects.values_list("secret", flat=True))
        assert secrets == {"", SECRET, "sk-plain", "sk-two"}

    def test_secrets_no_key_opens_are_named_and_left_as_they_are(self):
        with keys(OLD_KEY):
            lost = upstream("lost")
        with keys(NEW_KEY):
            kept = upstream("kept")
            before = column(lost)
            out = StringIO()
            with pytest.raises(CommandError, match="backend\\(s\\) lost with the configured keys"):
                call_command("chatparity_rotate_secrets", stdout=out)
        assert "Re-encrypted 1 backend secret(s)" in out.getvalue()
        assert column(lost) == before
        assert plaintext_of(column(kept), NEW_KEY) == SECRET


class MigrationTests(MigratingTestCase):
    """0006_security encrypts the plaintext secrets 0005 left, and decrypts them when unapplied."""

    BEFORE = [("chatparity", "0005_limits_and_budgets")]
    AFTER = [("chatparity", "0006_security")]

    def test_plaintext_rows_are_encrypted_and_unapplying_restores_them(self):
        old_apps = self.migrate(self.BEFORE)
        OldBackend = old_apps.get_model("chatparity", "Backend")
        with_secret = OldBackend.objects.create(name="up", kind="openai", secret=SECRET)
        without = OldBackend.objects.create(name="local", kind="local", secret="")

        self.migrate(self.AFTER)
        assert column(with_secret).startswith(encryption.PREFIX)
        assert encryption.decrypt(column(with_secret)) == SECRET
        assert column(without) == ""

        self.migrate(self.BEFORE)
        assert (column(with_secret), column(without)) == (SECRET, "")


class CheckTests(TestCase):
    databases = {"default"}

    def test_keys_that_are_not_fernet_keys_are_reported_at_start(self):
        from chatparity.checks import check_secret_keys

        with keys("not-a-key"):
            assert [m.id for m in check_secret_keys()] == ["chatparity.E030"]
        with keys(NEW_KEY):
            assert check_secret_keys() == []

    def test_a_secret_no_configured_key_opens_stops_migrate_not_requests(self):
        from chatparity.checks import check_stored_secrets

        with keys(OLD_KEY):
            upstream(name="lost")
        with keys(NEW_KEY):
            messages = check_stored_secrets(databases=["default"])
            assert [m.id for m in messages] == ["chatparity.E031"]
            assert "lost" in messages[0].msg
        with keys(NEW_KEY, OLD_KEY):
            assert check_stored_secrets(databases=["default"]) == []
