"""Migration 0020: the rollups' latency histograms made finer (JSON objects of the
buckets with requests), the old counts kept, the days never rolled up filled."""

import datetime
import importlib

import pytest
from django.db import connection
from django.db.migrations.executor import MigrationExecutor

from chatparity.accounting import reports
from chatparity.models import LATENCY_BOUNDS_MS, DailyAliasUsage, DailyKeyUsage
from tests.support.logs import logged_without_rollups, noon

BEFORE = [("chatparity", "0019_prompt_cache_prices")]
AFTER = [("chatparity", "0020_finer_latency_histograms")]
DAY = datetime.date(2025, 3, 1)
# Counts per old bucket: 5 in (0, 5] ms, 7 in (500, 1,000], 3 in (2,000, 3,000], 2 past
# 300,000; first tokens: 4 in (5, 10].
OLD_COUNTS = {
    "duration_ms_le_5": 5,
    "duration_ms_le_1000": 7,
    "duration_ms_le_3000": 3,
    "duration_ms_over_300000": 2,
    "first_token_ms_le_10": 4,
}
migration = importlib.import_module("chatparity.migrations.0020_finer_latency_histograms")

pytestmark = pytest.mark.django_db(transaction=True)


def migrate(targets=None):
    """The database migrated to ``targets`` (the latest of every app by default); the
    models as they were there."""
    executor = MigrationExecutor(connection)
    targets = targets or executor.loader.graph.leaf_nodes()
    executor.migrate(targets)
    executor.loader.build_graph()
    return executor.loader.project_state(targets).apps


@pytest.fixture
def before():
    """The database as 0015 left it; the latest schema again afterwards."""
    yield migrate(BEFORE)
    migrate()


@pytest.fixture
def old_day(before):
    """A day of the old histograms' counts, in both rollups that have histograms."""
    for name in ("DailyAliasUsage", "DailyKeyUsage"):
        before.get_model("chatparity", name).objects.create(
            day=DAY, alias="smollm2", endpoint="chat.completions", requests=17, **OLD_COUNTS
        )
    return before


def test_its_bounds_are_the_models():
    assert migration.NEW_BOUNDS == LATENCY_BOUNDS_MS


def test_each_old_count_is_shared_among_the_finer_buckets_it_spans(old_day):
    migrate(AFTER)
    for model in DailyAliasUsage, DailyKeyUsage:
        (rollup,) = model.objects.all()
        assert rollup.duration_histogram == {
            # (0, 5] by widths of one millisecond each
            "1": 1, "2": 1, "3": 1, "4": 1, "5": 1,
            # (500, 1,000]: widths 100, 120, 140 and 140 of 500
            "600": 1, "720": 2, "860": 2, "1000": 2,
            # (2,000, 3,000]: widths 400, 300 and 300 of 1,000
            "2400": 1, "2700": 1, "3000": 1,
            # past 5 minutes: the bucket above, to 6
            "360000": 2,
        }  # fmt: skip
        assert rollup.first_token_histogram == {"7": 1, "8": 1, "9": 1, "10": 1}


def test_old_days_read_within_the_old_buckets_as_before(old_day):
    migrate(AFTER)
    (latency,) = reports.latency_by_alias(reports.LogFilter())
    assert 500 < latency["p50_ms"] <= 1000  # the 9th of 17, in (500, 1,000]
    assert 300_000 < latency["p95_ms"] <= 360_000  # the 17th, past 5 minutes (read 300,000)
    assert 5 < latency["ttft_p50_ms"] <= 10


def test_backwards_sums_the_finer_buckets_into_the_old(old_day):
    migrate(AFTER)
    apps = migrate(BEFORE)
    for name in ("DailyAliasUsage", "DailyKeyUsage"):
        model = apps.get_model("chatparity", name)
        columns = [field.name for field in model._meta.fields if "_ms_" in field.name]
        (row,) = model.objects.values(*columns)
        assert {column: count for column, count in row.items() if count} == OLD_COUNTS


def test_the_days_the_rollups_never_counted_are_rolled_up_from_the_log(before):
    log = before.get_model("chatparity", "RequestLog")  # the log as 0019 left it
    logged_without_rollups(
        [
            log(
                request_id=f"r{ms}",
                key_prefix="sk-cp-test",
                alias="smollm2",
                status_code=200,
                duration_ms=ms,
                created_at=noon(DAY),
            )
            for ms in (100.0, 7393.0)
        ],
        log,
    )
    migrate(AFTER)
    (rollup,) = DailyAliasUsage.objects.all()
    assert (rollup.requests, rollup.duration_histogram) == (2, {"100": 1, "8600": 1})
