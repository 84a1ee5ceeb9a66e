import datetime
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.utils import timezone

from chatparity.accounting.rollups import reconcile, utc_day


class Command(BaseCommand):
    help = (
        "Check the daily rollups of the last --days UTC days (today included) against the"
        " request log's rows, and rebuild those that miss some: after an upgrade, for the"
        " rows that workers of the version before wrote while it was deployed. Safe while"
        " requests are served."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--days",
            type=int,
            default=2,
            metavar="DAYS",
            help="How many UTC days back, today included (default 2: yesterday and today).",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        days = options["days"]
        if days < 1:
            raise CommandError("--days must be at least 1.")
        today = utc_day(timezone.now())
        checked = [today - datetime.timedelta(days=back) for back in range(days - 1, -1, -1)]
        rebuilt = [day.isoformat() for day in checked if reconcile(day)]
        self.stdout.write(
            f"Checked the rollups of {days} day(s) from {checked[0].isoformat()} (UTC);"
            f" rebuilt from the log: {', '.join(rebuilt) or 'none'}."
        )
