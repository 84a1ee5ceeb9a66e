"""The daily rollups sum the log's rows exactly: as they are written in batches, when
they come late from the spool or a killed worker's journal, when they were logged
without rollups, and after they are pruned."""

import datetime
import random
import threading
import time
from collections import Counter, defaultdict
from decimal import Decimal

import orjson
import pytest
from django.db import connection, connections
from django.db.migrations.executor import MigrationExecutor
from django.test.utils import CaptureQueriesContext

from chatparity.accounting import journal, rollups, spool
from chatparity.accounting.inserts import insert_rows
from chatparity.accounting.record import UsageRecord
from chatparity.models import (
    HISTOGRAM_KEYS,
    LATENCY_BOUNDS_MS,
    ApiKey,
    DailyAliasUsage,
    DailyDeploymentUsage,
    DailyKeyTotal,
    DailyKeyUsage,
    DailyUsage,
    RequestLog,
)
from tests.scripted import SCRIPTED
from tests.support.logs import logged_without_rollups, noon

DAY1, DAY2, DAY3 = datetime.date(2025, 3, 1), datetime.date(2025, 3, 2), datetime.date(2025, 3, 3)
ALIASES = ("gpt", "llama", "")
DEPLOYMENTS = ("vllm-1/llama", "vllm-2/llama", "")  # "": none served it (refused first)
ENDPOINTS = ("chat.completions", "responses", "messages")
TOKENS = ("prompt_tokens", "completion_tokens", "total_tokens", "cached_tokens",
          "reasoning_tokens", "cache_write_5m_tokens", "cache_write_1h_tokens")  # fmt: skip
SUMS = ("requests", "errors", "cancelled", *TOKENS, "cost", "cache_hits", "cache_misses",
        "cost_saved", "first_tokens", "duration_histogram", "first_token_histogram")  # fmt: skip
CACHE_STATES = ("", "", "hit", "semantic", "partial", "miss", "bypass")

on_postgresql = pytest.mark.skipif(
    connection.vendor != "postgresql", reason="concurrent writers need PostgreSQL"
)


def varied_rows(count, seed, days=(DAY1, DAY2, DAY3), prefixes=("sk-cp-AAAA", "sk-cp-BBBB")):
    """``count`` unsaved rows as a busy site logs them: errors, hang-ups, streams with a
    first token, tokens and costs, latencies from 0 to past the last bucket."""
    chance = random.Random(seed)
    rows = []
    for index in range(count):
        status = chance.choice([200] * 8 + [429, 502])
        prompt, completion = chance.randrange(0, 3000), chance.randrange(0, 900)
        streamed = chance.random() < 0.6
        rows.append(
            RequestLog(
                request_id=f"req-{seed}-{index}",
                key_prefix=chance.choice(prefixes),
                alias=chance.choice(ALIASES),
                deployment=chance.choice(DEPLOYMENTS),
                endpoint=chance.choice(ENDPOINTS),
                status_code=status,
                error_type="" if status == 200 and chance.random() < 0.9 else "server_error",
                cancelled=chance.random() < 0.05,
                prompt_tokens=prompt,
                completion_tokens=completion,
                total_tokens=prompt + completion,
                cached_tokens=prompt // 3,
                reasoning_tokens=completion // 4,
                cache_write_5m_tokens=prompt // 5,
                cache_write_1h_tokens=prompt // 7,
                cost=Decimal(chance.randrange(0, 10**6)) / 10**8,
                cache=(cache := chance.choice(CACHE_STATES)),
                cost_saved=Decimal(chance.randrange(0, 10**6)) / 10**8 if cache else 0,
                duration_ms=chance.choice([0.0, 5.0, 5.5, 999.9, 400_000.0])
                if index % 7 == 0
                else chance.lognormvariate(6, 1.5),
                time_to_first_token_ms=chance.lognormvariate(5, 1) if streamed else None,
                created_at=noon(chance.choice(days))
                + datetime.timedelta(seconds=chance.randrange(-43_200, 43_200)),
            )
        )
    return rows


def bucket_of(ms):
    """The bucket a latency falls in, by the bounds' definition: (previous, bound]."""
    for index, bound in enumerate(LATENCY_BOUNDS_MS):
        if ms <= bound:
            return index
    return len(LATENCY_BOUNDS_MS)


def summed(rows, per):
    """The log rows summed in Python per the fields ``per`` (a day is created_at's UTC
    date): what the rollups must say."""
    totals = defaultdict(
        lambda: Counter(duration_histogram=Counter(), first_token_histogram=Counter())
    )
    for row in rows:
        facts = {"day": row.created_at.astimezone(datetime.UTC).date()}
        of = tuple(facts[name] if name in facts else getattr(row, name) for name in per)
        total = totals[of]
        total["requests"] += 1
        total["errors"] += row.status_code >= 400 or row.error_type != ""
        total["cancelled"] += row.cancelled
        for name in TOKENS:
            total[name] += getattr(row, name)
        total["cost"] += Decimal(row.cost)
        total["cache_hits"] += row.cache in ("hit", "semantic")
        total["cache_misses"] += row.cache in ("miss", "partial")
        total["cost_saved"] += Decimal(row.cost_saved)
        total["duration_ms"] += row.duration_ms
        total["duration_histogram"][HISTOGRAM_KEYS[bucket_of(row.duration_ms)]] += 1
        if row.time_to_first_token_ms is not None:
            total["first_tokens"] += 1
            total["first_token_ms"] += row.time_to_first_token_ms
            total["first_token_histogram"][
                HISTOGRAM_KEYS[bucket_of(row.time_to_first_token_ms)]
            ] += 1
    return totals


def in_rollups(model, per):
    return {tuple(getattr(rollup, name) for name in per): rollup for rollup in model.objects.all()}


def assert_rollups_sum_the_log(rows=None):
    """Every rollup holds exactly the log's rows (``rows``, else those in the table)."""
    rows = list(RequestLog.objects.all()) if rows is None else rows
    deployed = [row for row in rows if row.deployment]
    for model in (DailyKeyUsage, DailyAliasUsage, DailyKeyTotal, DailyDeploymentUsage):
        per = rollups.grain(model)
        counted = deployed if model is DailyDeploymentUsage else rows
        expected, found = summed(counted, per), in_rollups(model, per)
        assert set(found) == set(expected), model
        latency = issubclass(model, DailyUsage)
        measures = SUMS if latency else rollups.TOTALS
        for of, total in expected.items():
            rollup = found[of]
            assert {name: getattr(rollup, name) for name in measures} == {
                name: total[name] for name in measures
            }, (model, of)
            if latency:
                assert rollup.duration_ms == pytest.approx(total["duration_ms"])
                assert rollup.first_token_ms == pytest.approx(total["first_token_ms"])


@pytest.mark.django_db
def test_rollups_sum_the_rows_of_each_batch_written():
    rows = varied_rows(300, seed=1)
    for start in range(0, len(rows), 37):
        insert_rows(rows[start : start + 37])
    assert RequestLog.objects.count() == 300
    assert_rollups_sum_the_log()


@pytest.mark.django_db
def test_a_batch_is_one_insert_and_one_upsert_per_rollup_whatever_its_size():
    with CaptureQueriesContext(connection) as queries:
        insert_rows(varied_rows(120, seed=2))
    statements = [q["sql"] for q in queries if "chatparity_" in q["sql"]]
    assert len(statements) == 5  # the log, then the rollups of keys, aliases, totals, deployments
    assert all("ON CONFLICT" in upsert for upsert in statements[1:])


@pytest.mark.django_db
def test_a_keys_rollup_names_the_key_and_its_owner_then(django_user_model):
    ada = django_user_model.objects.create(username="ada")
    key, _ = ApiKey.objects.create_key("laptop", owner=ada)
    insert_rows([RequestLog(api_key=key, key_prefix=key.prefix, status_code=200, duration_ms=1)])
    rollup = DailyKeyUsage.objects.get()
    assert (rollup.api_key_id, rollup.owner_id) == (key.pk, ada.pk)
    spooled = RequestLog(api_key_id=key.pk, key_prefix=key.prefix, status_code=200, duration_ms=1)
    insert_rows([spooled])  # as the spool's drain writes one: the key not loaded
    assert DailyKeyUsage.objects.get().requests == 2


@pytest.fixture
def spool_dir(settings, tmp_path):
    settings.CHATPARITY = {**SCRIPTED, "SPOOL_DIR": str(tmp_path / "spool")}
    return tmp_path / "spool"


@pytest.mark.django_db(transaction=True)
def test_rows_spooled_days_ago_count_on_their_own_day_once_drained(spool_dir):
    insert_rows(varied_rows(40, seed=3, days=(DAY3,)))
    late = varied_rows(25, seed=4, days=(DAY1, DAY2))
    spool.keep(late)
    assert spool.drain() == 25
    assert spool.drain() == 0
    assert_rollups_sum_the_log()
    assert sorted(DailyAliasUsage.objects.values_list("day", flat=True).distinct()) == [
        DAY1,
        DAY2,
        DAY3,
    ]


@pytest.mark.django_db(transaction=True)
def test_a_killed_workers_requests_count_as_interrupted_on_the_day_they_ran(spool_dir):
    spool_dir.mkdir()
    began = noon(DAY1).timestamp()
    record = UsageRecord(request_id="req-killed", key_prefix="sk-cp-AAAA", alias="gpt")
    record.started = time.perf_counter() - (time.time() - began)
    last_noted = {"progress": "req-killed", "seen": began + 5, "completion_tokens": 7}
    # What a worker killed on DAY1, five seconds into the request, left in its journal.
    (spool_dir / "journal-999999.jsonl").write_bytes(
        journal._begin_line(record) + orjson.dumps(last_noted) + b"\n"
    )
    assert journal.recover() == 1
    assert spool.drain() == 1
    rollup = DailyKeyUsage.objects.get()
    assert (rollup.day, rollup.key_prefix, rollup.alias) == (DAY1, "sk-cp-AAAA", "gpt")
    assert (rollup.requests, rollup.errors, rollup.completion_tokens) == (1, 1, 7)
    assert_rollups_sum_the_log()


@pytest.mark.django_db
def test_a_day_logged_without_rollups_is_rebuilt_from_the_log():
    # Rows an older version wrote: in the log, in no rollup.
    insert_rows(varied_rows(30, seed=5, days=(DAY1,)))
    logged_without_rollups(varied_rows(50, seed=6, days=(DAY1, DAY2)))
    assert rollups.reconcile(DAY1)
    assert rollups.reconcile(DAY2)
    assert_rollups_sum_the_log()
    assert not rollups.reconcile(DAY1)  # they agree now: nothing to do


@pytest.mark.django_db
def test_a_pruned_day_keeps_its_rollups():
    insert_rows(varied_rows(60, seed=7, days=(DAY1, DAY2)))
    rows = list(RequestLog.objects.all())
    RequestLog.objects.filter(created_at__lt=rollups.day_start(DAY2)).delete()
    assert not rollups.reconcile(DAY1)
    assert_rollups_sum_the_log(rows)


@on_postgresql
@pytest.mark.django_db(transaction=True)
def test_workers_adding_to_the_same_rollups_at_once_lose_nothing_and_never_deadlock():
    batches = [varied_rows(50, seed=100 + index, days=(DAY1,)) for index in range(24)]

    def write(mine):
        try:
            for batch in mine:
                insert_rows(batch)
        finally:
            connections.close_all()

    workers = [threading.Thread(target=write, args=(batches[i::6],)) for i in range(6)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    assert RequestLog.objects.count() == 24 * 50
    assert_rollups_sum_the_log()


@on_postgresql
@pytest.mark.django_db(transaction=True)
def test_a_day_rebuilt_while_rows_are_written_counts_each_row_once():
    logged_without_rollups(varied_rows(200, seed=8, days=(DAY1,)))
    batches = [varied_rows(20, seed=200 + index, days=(DAY1,)) for index in range(15)]

    def write():
        try:
            for batch in batches:
                insert_rows(batch)
        finally:
            connections.close_all()

    writer = threading.Thread(target=write)
    writer.start()
    try:
        rebuilt = rollups.reconcile(DAY1)
    finally:
        writer.join()
    assert rebuilt
    assert_rollups_sum_the_log()


@pytest.mark.django_db(transaction=True)
def test_a_site_upgraded_from_before_the_rollups_gets_them_from_its_log():
    # Migration 0011 fills the rollups with reconcile(), with the models of its time,
    # which hold none of the measures added since (cache writes among them).
    executor = MigrationExecutor(connection)
    before = [("chatparity", "0010_round3")]
    executor.migrate(before)
    old_log = executor.loader.project_state(before).apps.get_model("chatparity", "RequestLog")
    logged_at = noon(DAY1)
    old_log.objects.create(request_id="req-old", key_prefix="sk-cp-OLD", status_code=200,
                           duration_ms=5.0, prompt_tokens=7, cached_tokens=3,
                           cost=Decimal("0.00000123"))  # fmt: skip
    old_log.objects.update(created_at=logged_at)
    executor.loader.build_graph()
    executor.migrate(executor.loader.graph.leaf_nodes())
    (rollup,) = DailyKeyUsage.objects.all()
    assert (rollup.day, rollup.requests, rollup.prompt_tokens, rollup.cached_tokens) == (
        DAY1, 1, 7, 3,
    )  # fmt: skip
    assert (rollup.cache_write_5m_tokens, rollup.cache_write_1h_tokens) == (0, 0)
    assert rollup.cost == Decimal("0.00000123")
