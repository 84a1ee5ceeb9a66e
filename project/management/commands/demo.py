"""``manage.py demo`` (``make run``): the demo's API key, made once and shown again on
every run, and where everything is."""

import os
import sys
from pathlib import Path
from typing import Any

from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.management.base import CommandParser
from django.shortcuts import resolve_url
from django.urls import reverse

from chatparity.management.base import ChangingCommand
from chatparity.management.commands.chatparity_bootstrap import EMBEDDING_ALIAS, LOCAL_ALIAS
from chatparity.models import ApiKey, hash_key

DEMO_KEY = "demo"
KEY_FILE = Path(__file__).resolve().parents[3] / "var" / "demo-key"  # git ignores var/


def demo_key(path: Path) -> tuple[str, bool]:
    """The plaintext of the key ``path`` holds while that key serves, else of a new key
    named "demo" written there (readable by its owner only); and whether it is new."""
    if path.exists():
        plaintext = path.read_text().strip()
        kept = ApiKey.objects.filter(hashed_key=hash_key(plaintext), is_active=True).first()
        if kept is not None and not kept.is_expired:
            return plaintext, False
    _, plaintext = ApiKey.objects.create_key(DEMO_KEY)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.unlink(missing_ok=True)
    with os.fdopen(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "w") as file:
        file.write(plaintext + "\n")
    return plaintext, True


def shown(path: Path) -> str:
    """``path`` as typed from the current folder: relative below it, else absolute."""
    relative = os.path.relpath(path)
    return str(path.absolute()) if relative.startswith("..") else relative


class Command(ChangingCommand):
    help = (
        "Make the demo's API key, unless the one var/demo-key holds still serves, and print"
        " it with the OpenAI and Anthropic base URLs and the admin, portal and sign-in pages."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--host", default="127.0.0.1", help="as the server listens on")
        parser.add_argument("--port", type=int, default=8000, help="as the server listens on")
        parser.add_argument("--key-file", type=Path, default=KEY_FILE)

    def handle(self, *args: Any, **options: Any) -> None:
        plaintext, new = demo_key(options["key_file"])
        host = options["host"]
        site = f"http://{f'[{host}]' if ':' in host else host}:{options['port']}"
        openai = site + reverse("chatparity:models").removesuffix("/models")
        admin = site + reverse("admin:index")
        if not get_user_model().objects.filter(is_superuser=True).exists():
            python = shown(Path(sys.executable))
            admin += f"  (make a superuser first: {python} manage.py createsuperuser)"
        made = "a new one" if new else "the same as before"
        models = f"models: {LOCAL_ALIAS}; {EMBEDDING_ALIAS} for embeddings"
        self.stdout.write(
            f"\nThe demo's API key ({made}; {shown(options['key_file'])} keeps it):\n"
            f"    export KEY={plaintext}\n"
            f"OpenAI base URL:    {openai}  ({models})\n"
            f"Anthropic base URL: {openai.removesuffix('/v1')}\n"
            f"Admin:              {admin}\n"
            f"Portal:             {site}{reverse('chatparity-portal:keys')}\n"
            f"Sign in:            {site}{resolve_url(settings.LOGIN_URL)}\n"
        )
