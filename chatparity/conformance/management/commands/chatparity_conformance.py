import json
import os
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from chatparity.conformance import framework, suite


class Command(BaseCommand):
    # It judges a remote server; the local project's state is irrelevant.
    requires_system_checks: list[str] = []
    help = (
        "Check an OpenAI-compatible server (BASE_URL like http://127.0.0.1:8000/v1) against"
        " OpenAI's Chat Completions, Responses and Embeddings wire contracts and Anthropic's"
        " Messages API;"
        " exits non-zero if any check fails."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("base_url", metavar="BASE_URL", nargs="?")
        parser.add_argument(
            "--key",
            default=os.environ.get("OPENAI_API_KEY"),
            help="API key to send (default: $OPENAI_API_KEY).",
        )
        parser.add_argument(
            "--model",
            help="Model id to request (default: the first id from GET /models that is not"
            " named an embedding model).",
        )
        parser.add_argument(
            "--embedding-model",
            help="Model id of the embeddings checks (default: the first id from GET /models"
            " with 'embed' in it; none: they are not run).",
        )
        parser.add_argument(
            "--timeout", type=float, default=60.0, help="Per-request timeout in seconds."
        )
        parser.add_argument(
            "--only", action="append", default=[], metavar="NAME",
            help="Run only checks whose name contains NAME (repeatable).",
        )  # fmt: skip
        parser.add_argument(
            "--skip", action="append", default=[], metavar="NAME",
            help="Skip checks whose name contains NAME (repeatable).",
        )  # fmt: skip
        parser.add_argument("--json", action="store_true", help="Print the results as JSON.")
        parser.add_argument(
            "--list", action="store_true", help="List the selected checks and exit."
        )

    def handle(self, *args: Any, **options: Any) -> None:
        if options["list"]:
            for check in framework.select(suite.CHECKS, only=options["only"], skip=options["skip"]):
                self.stdout.write(f"{check.name:<28} {check.description}")
            return
        base_url: str | None = options["base_url"]
        if not base_url:
            raise CommandError("pass BASE_URL, e.g. http://127.0.0.1:8000/v1")
        if not options["key"]:
            raise CommandError("pass --key or set OPENAI_API_KEY")
        try:
            model, results = suite.run(
                base_url,
                options["key"],
                model=options["model"],
                embedding_model=options["embedding_model"],
                timeout=options["timeout"],
                only=options["only"],
                skip=options["skip"],
            )
        except framework.ConformanceError as exc:
            raise CommandError(str(exc), returncode=2) from exc
        if not results:
            raise CommandError("no check matches --only/--skip", returncode=2)
        if options["json"]:
            self.stdout.write(json.dumps(framework.as_json(base_url, model, results), indent=2))
        else:
            self.stdout.write(f"{base_url}  model {model!r}\n")
            self.stdout.write(framework.format_table(results))
        failed = [result.name for result in results if not result.ok]
        if failed:
            raise CommandError(f"{len(failed)} of {len(results)} checks failed", returncode=1)
