"""``manage.py demo``, the example project's last step of ``make run`` before it serves:
one demo key, made once and shown again on every run, and where everything is."""

import datetime
import stat
import subprocess
from io import StringIO

import pytest
from django.conf import settings
from django.contrib.auth.models import User
from django.core.management import call_command
from django.shortcuts import resolve_url
from django.utils import timezone

from chatparity.models import ApiKey, hash_key
from project.management.commands.demo import KEY_FILE, Command

pytestmark = pytest.mark.django_db


def demo(key_file, *arguments):
    """What the command prints, and the plaintext it gives as ``export KEY=...``."""
    out = StringIO()
    call_command(Command(), "--key-file", str(key_file), *arguments, stdout=out)
    (line,) = [line for line in out.getvalue().splitlines() if "export KEY=" in line]
    return out.getvalue(), line.strip().removeprefix("export KEY=")


def test_the_first_run_makes_a_demo_key_that_serves_and_keeps_it_for_its_owner_only(
    tmp_path, client
):
    key_file = tmp_path / "var" / "demo-key"
    printed, plaintext = demo(key_file)
    assert "(a new one;" in printed
    key = ApiKey.objects.get()
    assert (key.name, key.hashed_key) == ("demo", hash_key(plaintext))
    assert key_file.read_text() == plaintext + "\n"
    assert stat.S_IMODE(key_file.stat().st_mode) == 0o600
    models = client.get("/v1/models", headers={"Authorization": f"Bearer {plaintext}"})
    assert models.status_code == 200


def test_the_key_file_is_in_the_checkouts_var_folder_which_git_ignores():
    root = KEY_FILE.parents[1]
    assert (root / "manage.py").exists()
    ignored = subprocess.run(["git", "check-ignore", "-q", KEY_FILE], cwd=root, check=False)
    assert ignored.returncode == 0


def test_every_next_run_shows_the_same_key_and_adds_none(tmp_path):
    key_file = tmp_path / "demo-key"
    _, first = demo(key_file)
    printed, again = demo(key_file)
    assert again == first
    assert "(the same as before;" in printed
    assert ApiKey.objects.count() == 1


@pytest.mark.parametrize(
    "retired",
    [{"is_active": False}, {"expires_at": timezone.now() - datetime.timedelta(seconds=1)}],
    ids=["revoked", "expired"],
)
def test_a_demo_key_that_no_longer_serves_is_replaced_by_a_new_one(tmp_path, retired):
    key_file = tmp_path / "demo-key"
    _, first = demo(key_file)
    ApiKey.objects.filter(hashed_key=hash_key(first)).update(**retired)
    printed, second = demo(key_file)
    assert second != first
    assert "(a new one;" in printed
    assert key_file.read_text() == second + "\n"
    assert ApiKey.objects.filter(hashed_key=hash_key(second), is_active=True).exists()


def test_a_key_file_whose_key_is_not_in_the_database_is_replaced(tmp_path):
    key_file = tmp_path / "demo-key"
    key_file.write_text("sk-cp-from-another-database\n")
    _, plaintext = demo(key_file)
    assert plaintext != "sk-cp-from-another-database"
    assert ApiKey.objects.get().hashed_key == hash_key(plaintext)


def test_it_prints_the_base_urls_and_the_admin_portal_and_sign_in_pages(tmp_path):
    User.objects.create_superuser("admin")
    printed, plaintext = demo(tmp_path / "demo-key", "--host", "::1", "--port", "8123")
    assert printed.splitlines()[2:] == [
        f"    export KEY={plaintext}",
        "OpenAI base URL:    http://[::1]:8123/v1  (models: smollm2; embed-small for embeddings)",
        "Anthropic base URL: http://[::1]:8123",
        "Admin:              http://[::1]:8123/admin/",
        "Portal:             http://[::1]:8123/portal/",
        f"Sign in:            http://[::1]:8123{resolve_url(settings.LOGIN_URL)}",
    ]


def test_until_there_is_a_superuser_it_says_how_to_make_one(tmp_path):
    printed, _ = demo(tmp_path / "demo-key")
    (admin,) = [line for line in printed.splitlines() if line.startswith("Admin:")]
    assert admin.startswith("Admin:              http://127.0.0.1:8000/admin/  (make a superuser")
    assert admin.endswith("python manage.py createsuperuser)")
