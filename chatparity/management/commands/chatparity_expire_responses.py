import datetime
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.utils import timezone

from chatparity.checks import retention_problem
from chatparity.conf import app_settings
from chatparity.models import StoredResponse

DEFAULT_BATCH_SIZE = 1000


class Command(BaseCommand):
    help = (
        "Delete the stored responses of /v1/responses older than"
        ' CHATPARITY["RESPONSES_RETENTION"] seconds, a batch at a time, and print how many.'
        " Run it from cron, e.g. hourly."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--batch-size",
            type=int,
            default=DEFAULT_BATCH_SIZE,
            help=f"Rows deleted per statement (default {DEFAULT_BATCH_SIZE}): short"
            " transactions that never lock the whole table.",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        batch_size = options["batch_size"]
        if batch_size < 1:
            raise CommandError("--batch-size must be at least 1.")
        problem = retention_problem(app_settings.RESPONSES_RETENTION)
        if problem:
            raise CommandError(problem)
        cutoff = timezone.now() - datetime.timedelta(seconds=app_settings.RESPONSES_RETENTION)
        expired = StoredResponse.objects.filter(created_at__lt=cutoff).order_by("created_at")
        deleted = 0
        while True:
            batch = list(expired.values_list("pk", flat=True)[:batch_size])
            if not batch:
                break
            # Counted from what the delete removed: a row another run took meanwhile is not.
            _, removed = StoredResponse.objects.filter(pk__in=batch).delete()
            deleted += removed.get(StoredResponse._meta.label, 0)
            if len(batch) < batch_size:
                break
        self.stdout.write(
            f"Deleted {deleted} stored response(s) created before {cutoff.isoformat()}."
        )
