from typing import Any

from chatparity.conf import app_settings
from chatparity.management.base import ChangingCommand
from chatparity.models import Backend, ModelAlias

LOCAL_ALIAS = "smollm2"
EMBEDDING_ALIAS = "embed-small"


class Command(ChangingCommand):
    help = (
        "Create the local backends and the 'smollm2' (chat) and 'embed-small' (embeddings)"
        " aliases, unless they exist."
    )

    def handle(self, *args: Any, **options: Any) -> None:
        self._alias(
            "local",
            LOCAL_ALIAS,
            model="SmolLM2-135M-Instruct",
            owned_by="huggingfacetb",
            context_window=app_settings.LOCAL_MODEL["n_ctx"],
            description="SmolLM2-135M-Instruct (Q4_1) embedded through llama.cpp.",
        )
        self._alias(
            "embedder",
            EMBEDDING_ALIAS,
            model="all-MiniLM-L6-v2",
            owned_by="sentence-transformers",
            context_window=app_settings.EMBEDDING_MODEL["max_input_tokens"],
            description="all-MiniLM-L6-v2 (int8 ONNX, 384 dimensions) embedded through ONNX"
            " Runtime.",
        )

    def _alias(self, kind: str, public_id: str, **fields: Any) -> None:
        """The backend of ``kind`` (named after it) and the alias ``public_id`` on it."""
        backend, created = Backend.objects.get_or_create(name=kind, defaults={"kind": kind})
        self.stdout.write(f"{'Created' if created else 'Kept'} backend {backend.name!r}")
        alias, created = ModelAlias.objects.get_or_create(
            public_id__iexact=public_id,
            defaults={"public_id": public_id, "backend": backend, **fields},
        )
        self.stdout.write(f"{'Created' if created else 'Kept'} alias {alias.public_id!r}")
