"""Finer latency histograms in the daily rollups (issue 32): 83 buckets up to 10 minutes
instead of 20 up to 5, each above 5 ms at most 21% wider than its lower bound, so that
a percentile is within 10% of the true value (chatparity.accounting.reports.percentile).
Each histogram is a JSON object of the buckets with requests, not a column per bucket.

Each old bucket's count is shared among the finer buckets it spans, in proportion to
their widths, as the old reading placed its values (linearly within the bucket): days
logged before read as they did, no finer. The old bucket past 5 minutes goes to the
bucket above it (5 to 6 minutes), where it read its lower bound. Backwards, the finer
buckets are summed into the old.

Then the rollups of the days the log holds more rows of than they count are rebuilt
from the log (migration 0011 did it before; the latest migration that changes the
rollups does it, as their code writes them now).
"""

import bisect
import datetime

from django.db import migrations, models, router

OLD_BOUNDS = (
    5, 10, 20, 30, 50, 100, 200, 300, 500, 1_000, 2_000, 3_000, 5_000, 10_000, 20_000,
    30_000, 60_000, 120_000, 300_000,
)  # fmt: skip
# The bounds as of this migration (chatparity.models.LATENCY_BOUNDS_MS); the keys of a
# histogram are these, and ">600000" past them.
NEW_BOUNDS = (
    *range(1, 10),
    *(
        bound
        for power in range(5)
        for step in (10, 12, 14, 16, 18, 20, 24, 27, 30, 36, 43, 50, 60, 72, 86)
        if (bound := step * 10**power) <= 600_000
    ),
)
PAST = f">{NEW_BOUNDS[-1]}"
ROLLUPS = ("dailykeyusage", "dailyaliasusage")
# Each histogram, and the prefix of its old columns.
HISTOGRAMS = (("duration_histogram", "duration_ms"), ("first_token_histogram", "first_token_ms"))


def old_columns(prefix):
    return [f"{prefix}_le_{bound}" for bound in OLD_BOUNDS] + [f"{prefix}_over_{OLD_BOUNDS[-1]}"]


def finer(counts):
    """Old counts (one per old bucket, the last past them) as a histogram of the new
    buckets: each count shared by width, in whole requests that add up to it (a finer
    bucket gets the count's share up to its top less the share up to its bottom, both
    rounded down)."""
    histogram = {}
    lower = 0
    for upper, count in zip(OLD_BOUNDS, counts, strict=False):
        spanned = [bound for bound in NEW_BOUNDS if lower < bound <= upper]
        below = 0
        for bound in spanned:
            up_to = count * (bound - lower) // (upper - lower)
            if up_to > below:
                histogram[str(bound)] = up_to - below
            below = up_to
        lower = upper
    if counts[-1]:
        histogram[str(NEW_BOUNDS[bisect.bisect_right(NEW_BOUNDS, OLD_BOUNDS[-1])])] = counts[-1]
    return histogram


def coarser(histogram):
    """A histogram of the new buckets as counts of the old (the last past them)."""
    counts = [0] * (len(OLD_BOUNDS) + 1)
    for key, count in histogram.items():
        bound = float("inf") if key == PAST else int(key)
        counts[bisect.bisect_left(OLD_BOUNDS, bound)] += count
    return counts


def _rewrite(apps, schema_editor, read, write, written):
    """Each rollup row's ``write`` fields from its ``read`` ones, a thousand at a time."""
    database = schema_editor.connection.alias
    for name in ROLLUPS:
        model = apps.get_model("chatparity", name)
        if not router.allow_migrate_model(database, model):
            continue
        rows = model.objects.using(database).order_by("pk")
        last = 0
        while chunk := list(rows.filter(pk__gt=last).values("pk", *read)[:1000]):
            changed = [model(pk=row["pk"], **write(row)) for row in chunk]
            model.objects.using(database).bulk_update(changed, written)
            last = chunk[-1]["pk"]


def to_histograms(apps, schema_editor):
    _rewrite(
        apps,
        schema_editor,
        [column for _, prefix in HISTOGRAMS for column in old_columns(prefix)],
        lambda row: {
            name: finer([row[column] for column in old_columns(prefix)])
            for name, prefix in HISTOGRAMS
        },
        [name for name, _ in HISTOGRAMS],
    )
    fill_rollups(apps, schema_editor)


def to_columns(apps, schema_editor):
    _rewrite(
        apps,
        schema_editor,
        [name for name, _ in HISTOGRAMS],
        lambda row: {
            column: count
            for name, prefix in HISTOGRAMS
            for column, count in zip(old_columns(prefix), coarser(row[name]), strict=True)
        },
        [column for _, prefix in HISTOGRAMS for column in old_columns(prefix)],
    )


def fill_rollups(apps, schema_editor):
    """The rollups of every day logged so far that they count fewer rows of, from the
    log, one day per transaction."""
    from chatparity.accounting.rollups import reconcile, utc_day

    log = apps.get_model("chatparity", "RequestLog")
    database = schema_editor.connection.alias
    if not router.allow_migrate_model(database, log):
        return
    times = log.objects.using(database).order_by("created_at").values_list("created_at", flat=True)
    first, last = times.first(), times.last()
    if first is None:
        return
    day = utc_day(first)
    while day <= utc_day(last):
        reconcile(day, using=database, apps=apps)
        day += datetime.timedelta(days=1)


class RemoveCounts(migrations.operations.base.Operation):
    """Count columns (PositiveIntegerField, default 0) removed from a model at once: as
    one change of the migration state, not 40 (Django renders the model anew for each
    RemoveField, 2 s here)."""

    def __init__(self, model_name, names):
        self.model_name = model_name
        self.names = names

    def deconstruct(self):
        return (type(self).__name__, [], {"model_name": self.model_name, "names": self.names})

    def state_forwards(self, app_label, state):
        fields = state.models[app_label, self.model_name].fields
        for name in self.names:
            del fields[name]
        state.reload_model(app_label, self.model_name, delay=True)

    def database_forwards(self, app_label, schema_editor, from_state, to_state):
        model = from_state.apps.get_model(app_label, self.model_name)
        if self.allow_migrate_model(schema_editor.connection.alias, model):
            for name in self.names:
                schema_editor.remove_field(model, model._meta.get_field(name))

    def database_backwards(self, app_label, schema_editor, from_state, to_state):
        model = to_state.apps.get_model(app_label, self.model_name)
        if self.allow_migrate_model(schema_editor.connection.alias, model):
            for name in self.names:
                schema_editor.add_field(model, model._meta.get_field(name))

    def describe(self):
        return f"Remove {len(self.names)} counts from {self.model_name}"


class Migration(migrations.Migration):
    # Safe on a live PostgreSQL: each step commits alone (the rollups rebuilt one day
    # per short transaction, each locking them for its day only), as 0011 was.
    atomic = False

    dependencies = [
        ("chatparity", "0019_prompt_cache_prices"),
    ]

    operations = [
        *(
            migrations.AddField(
                model_name=rollup,
                name=name,
                field=models.JSONField(blank=True, default=dict, help_text=help_text),
            )
            for rollup in ROLLUPS
            for name, help_text in (
                (
                    "duration_histogram",
                    'Requests per bucket of duration: {"<upper bound, ms>": requests, ...},'
                    ' ">600000" past the last; a bucket starts at the bound before its own.',
                ),
                (
                    "first_token_histogram",
                    "Requests per bucket of time to first token, as duration_histogram.",
                ),
            )
        ),
        migrations.RunPython(to_histograms, to_columns, elidable=False),
        *(
            RemoveCounts(rollup, [c for _, prefix in HISTOGRAMS for c in old_columns(prefix)])
            for rollup in ROLLUPS
        ),
    ]
