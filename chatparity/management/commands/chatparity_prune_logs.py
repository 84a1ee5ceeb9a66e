import datetime
import time
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db.models import QuerySet
from django.utils import timezone

from chatparity.accounting.rollups import day_start, reconcile, utc_day
from chatparity.models import RequestLog

DEFAULT_BATCH_SIZE = 5000


class Command(BaseCommand):
    help = (
        "Delete the request log's rows from before the UTC day --older-than days ago, a"
        " batch at a time, and print how many. Their usage stays in the daily rollups, which"
        " every report reads: each day's rollups are checked against its rows first, and"
        " rebuilt from them if they miss any. Safe while requests are served; run it from"
        " cron, e.g. daily."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--older-than",
            type=int,
            required=True,
            metavar="DAYS",
            help="Keep the rows of the last DAYS UTC days (today included) and delete the rest.",
        )
        parser.add_argument(
            "--batch-size",
            type=int,
            default=DEFAULT_BATCH_SIZE,
            help=f"Rows deleted per statement (default {DEFAULT_BATCH_SIZE}): short"
            " transactions that never lock the whole table.",
        )
        parser.add_argument(
            "--pause",
            type=float,
            default=0.0,
            metavar="SECONDS",
            help="Rest between batches (default none): room for replicas and vacuum.",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        days, batch_size, pause = options["older_than"], options["batch_size"], options["pause"]
        if days < 1:
            raise CommandError("--older-than must be at least 1 (today's rows are kept).")
        if batch_size < 1:
            raise CommandError("--batch-size must be at least 1.")
        if pause < 0:
            raise CommandError("--pause must not be negative.")
        kept_from = utc_day(timezone.now()) - datetime.timedelta(days=days - 1)
        old = RequestLog.objects.filter(created_at__lt=day_start(kept_from))
        first = old.order_by("created_at").values_list("created_at", flat=True).first()
        rebuilt = deleted = 0
        if first is not None:
            day = utc_day(first)
            while day < kept_from:
                rebuilt += reconcile(day)
                day += datetime.timedelta(days=1)
            deleted = self._delete(old, first, batch_size, pause)
        self.stdout.write(
            f"Deleted {deleted} log row(s) from before {kept_from.isoformat()} (UTC); their"
            f" usage stays in the daily rollups ({rebuilt} day(s) rebuilt from the log first)."
        )

    @staticmethod
    def _delete(
        old: QuerySet[RequestLog], since: datetime.datetime, batch_size: int, pause: float
    ) -> int:
        """Delete ``old`` oldest first, each batch after the last one's time (not
        rescanning the index entries of rows already deleted); how many went."""
        deleted = 0
        while True:
            batch = list(
                old.filter(created_at__gte=since)
                .order_by("created_at")
                .values_list("pk", "created_at")[:batch_size]
            )
            if not batch:
                return deleted
            # Counted from what the delete removed: a row another run took meanwhile is not.
            _, removed = RequestLog.objects.filter(pk__in=[pk for pk, _ in batch]).delete()
            deleted += removed.get(RequestLog._meta.label, 0)
            if len(batch) < batch_size:
                return deleted
            since = batch[-1][1]
            if pause:
                time.sleep(pause)
