"""The conformance suite: every API's checks, in report order, and a run of them.

An API's checks are a module with a ``CHECKS`` table built on :mod:`.framework`;
adding an API is that module and one line in :data:`CHECK_MODULES`.
"""

from __future__ import annotations

from collections.abc import Sequence
from importlib import import_module
from typing import Any

from .framework import (
    Check,
    ConformanceError,
    Result,
    Runner,
    client,
    first_embedding_model,
    first_model,
    model_ids,
    select,
)

CHECK_MODULES = (
    "chatparity.conformance.chat",
    "chatparity.conformance.responses",
    "chatparity.conformance.messages",
    "chatparity.conformance.embeddings",
)
"""The modules whose ``CHECKS`` make up the suite, in the report's order."""

CHECKS: tuple[Check, ...] = tuple(
    check for module in CHECK_MODULES for check in import_module(module).CHECKS
)


def run(
    base_url: str,
    key: str,
    *,
    model: str | None = None,
    embedding_model: str | None = None,
    timeout: float = 60.0,
    only: Sequence[str] = (),
    skip: Sequence[str] = (),
    **client_options: Any,
) -> tuple[str, list[Result]]:
    """Run the selected checks against ``base_url``; returns the model tested and the results.

    ``model`` defaults to the first one ``GET /models`` lists that is not named an
    embedding model, ``embedding_model`` to the first named one; with neither, the
    embeddings checks are not run."""
    with client(base_url, key, timeout, **client_options) as http:
        if model is None:
            model = first_model(model_ids(http))
        if embedding_model is None:
            try:
                embedding_model = first_embedding_model(model_ids(http))
            except ConformanceError:
                embedding_model = ""
        runner = Runner(http, model, embedding_model)
        return model, runner.run_all(select(CHECKS, only=only, skip=skip))


__all__ = ["CHECKS", "CHECK_MODULES", "run"]
