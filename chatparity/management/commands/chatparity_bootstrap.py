from typing import Any

from django.core.management.base import BaseCommand

from chatparity.conf import app_settings
from chatparity.models import Backend, ModelAlias

LOCAL_ALIAS = "smollm2"


class Command(BaseCommand):
    help = "Create the local backend and the 'smollm2' alias, unless they exist."

    def handle(self, *args: Any, **options: Any) -> None:
        backend, created = Backend.objects.get_or_create(
            name="local", defaults={"kind": "local"}
        )
        self.stdout.write(f"{'Created' if created else 'Kept'} backend {backend.name!r}")
        alias, created = ModelAlias.objects.get_or_create(
            public_id__iexact=LOCAL_ALIAS,
            defaults={
                "public_id": LOCAL_ALIAS,
                "backend": backend,
                "model": "SmolLM2-135M-Instruct",
                "owned_by": "huggingfacetb",
                "context_window": app_settings.LOCAL_MODEL["n_ctx"],
                "description": "SmolLM2-135M-Instruct (Q4_1) embedded through llama.cpp.",
            },
        )
        self.stdout.write(f"{'Created' if created else 'Kept'} alias {alias.public_id!r}")
