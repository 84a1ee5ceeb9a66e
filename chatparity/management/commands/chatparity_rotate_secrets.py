from typing import Any

from django.core.exceptions import ImproperlyConfigured
from django.core.management.base import BaseCommand, CommandError
from django.db import models

from chatparity import encryption
from chatparity.models import Backend


class Command(BaseCommand):
    help = (
        "Re-encrypt every backend secret under the first of the configured keys"
        ' (CHATPARITY["SECRET_KEYS"], or the key derived from SECRET_KEY), so older keys'
        " can then be removed."
    )

    def handle(self, *args: Any, **options: Any) -> None:
        rotated, unreadable = 0, []
        rows = Backend.objects.exclude(secret="").annotate(token=encryption.stored("secret"))
        for pk, name, token in rows.values_list("pk", "name", "token"):
            try:
                new_token = encryption.rotate(token)
            except ImproperlyConfigured:
                unreadable.append(name)
                continue
            # Only if the row still holds what was read: a secret saved meanwhile
            # is already under the first key and must not be overwritten.
            rotated += (
                Backend.objects.alias(token=encryption.stored("secret"))
                .filter(pk=pk, token=token)
                .update(secret=models.Value(new_token, output_field=models.TextField()))
            )
        self.stdout.write(f"Re-encrypted {rotated} backend secret(s) under the first key.")
        if unreadable:
            raise CommandError(
                f"Cannot decrypt the secret of backend(s) {', '.join(sorted(unreadable))}"
                " with the configured keys: add the key they were encrypted with to"
                ' CHATPARITY["SECRET_KEYS"] (or SECRET_KEY_FALLBACKS) and run this again,'
                " or set their secret anew."
            )
