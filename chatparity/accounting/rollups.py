"""The log's daily rollups (DailyKeyUsage, DailyAliasUsage, DailyKeyTotal,
DailyDeploymentUsage), which every report reads.

The log writer adds each batch of rows to their days' rollups in the transaction that
inserts them (:func:`record`): no query on a request's path, and rows that come late
(from the spool, or a killed worker's journal) are counted the same way. A day whose
rollups sum fewer rows than the log holds for it (rows logged before the rollups
existed, or by a worker of an older version) is rebuilt from the log
(:func:`reconcile`); one whose rollups sum more keeps them: its rows were pruned.
"""

from __future__ import annotations

import bisect
import datetime
import functools
import operator
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

import orjson
from django.apps import apps as global_apps
from django.apps.registry import Apps
from django.db import connections, router, transaction
from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.models import Case, Count, Max, Model, Q, QuerySet, Sum, Value, When

from ..models import (
    CACHE_HITS,
    HISTOGRAM_KEYS,
    LATENCY_BOUNDS_MS,
    ApiKey,
    CacheState,
    DailyAliasUsage,
    DailyDeploymentUsage,
    DailyKeyTotal,
    DailyKeyUsage,
    RequestLog,
)

# A row that failed: an error status, or an error after streaming began (status 200).
FAILED = Q(status_code__gte=400) | ~Q(error_type="")
# What the response cache did: answered alone, or looked up and asked a backend.
CACHE_MISSES = frozenset({CacheState.MISS, CacheState.PARTIAL})

# What a rollup sums, in the order of a tally.
MEASURES = (
    "requests", "errors", "cancelled", "prompt_tokens", "completion_tokens", "total_tokens",
    "cached_tokens", "reasoning_tokens", "cache_write_5m_tokens", "cache_write_1h_tokens",
    "cost", "cache_hits", "cache_misses", "cost_saved", "duration_ms", "first_token_ms",
    "first_tokens",
)  # fmt: skip
TOKENS = MEASURES[MEASURES.index("prompt_tokens") : MEASURES.index("cost")]
MONEY = ("cost", "cost_saved")
# What a key's daily total sums: the measures up to the cost and the cache's, no latency.
TOTALS = MEASURES[: MEASURES.index("cost_saved") + 1]
_AT = {name: index for index, name in enumerate(MEASURES)}
# A DailyUsage's latency histograms, and the log's field each counts.
HISTOGRAMS = (
    ("duration_histogram", "duration_ms"),
    ("first_token_histogram", "time_to_first_token_ms"),
)

KeyGrain = tuple[datetime.date, str, str, str]  # day, key prefix, alias, endpoint
DeploymentGrain = tuple[datetime.date, str, str, str]  # day, alias, deployment, endpoint


def grain(model: type[Model]) -> tuple[str, ...]:
    """What a rollup is per: the fields of its model's one unique constraint."""
    (constraint,) = model._meta.constraints
    return tuple(constraint.fields)  # type: ignore[attr-defined]


@functools.cache
def has_latency(model: type[Model]) -> bool:
    """Whether a rollup is a DailyUsage (with latencies), as a migration's models say."""
    return any(field.name == HISTOGRAMS[0][0] for field in model._meta.concrete_fields)


def bucket(ms: float) -> int:
    """The histogram bucket of a latency, by index: the first bound it does not exceed."""
    return bisect.bisect_left(LATENCY_BOUNDS_MS, ms)


def utc_day(moment: datetime.datetime) -> datetime.date:
    return moment.astimezone(datetime.UTC).date()


def day_start(day: datetime.date) -> datetime.datetime:
    """The moment a UTC day begins."""
    return datetime.datetime.combine(day, datetime.time(), tzinfo=datetime.UTC)


def _empty_sums() -> list[Any]:
    sums: list[Any] = [0] * len(MEASURES)
    for name in MONEY:
        sums[_AT[name]] = Decimal(0)
    return sums


def _empty_histograms() -> tuple[Counter[int], Counter[int]]:
    return Counter(), Counter()


@dataclass
class Tally:
    """What some rows of one grain sum to: MEASURES, and per histogram of HISTOGRAMS how
    many fell in each bucket (by index)."""

    key_id: int | None = None
    sums: list[Any] = field(default_factory=_empty_sums)
    histograms: tuple[Counter[int], Counter[int]] = field(default_factory=_empty_histograms)

    def count(self, row: RequestLog) -> None:
        """Add one log row."""
        sums = self.sums
        sums[_AT["requests"]] += 1
        sums[_AT["errors"]] += row.status_code >= 400 or bool(row.error_type)
        sums[_AT["cancelled"]] += row.cancelled
        for name in TOKENS:
            sums[_AT[name]] += getattr(row, name)
        sums[_AT["cost"]] += Decimal(row.cost)
        sums[_AT["cache_hits"]] += row.cache in CACHE_HITS
        sums[_AT["cache_misses"]] += row.cache in CACHE_MISSES
        sums[_AT["cost_saved"]] += Decimal(row.cost_saved)
        sums[_AT["duration_ms"]] += row.duration_ms
        self.histograms[0][bucket(row.duration_ms)] += 1
        first_token = row.time_to_first_token_ms
        if first_token is not None:
            sums[_AT["first_token_ms"]] += first_token
            sums[_AT["first_tokens"]] += 1
            self.histograms[1][bucket(first_token)] += 1

    def add(self, other: Tally) -> None:
        self.sums = list(map(operator.add, self.sums, other.sums))
        for counts, more in zip(self.histograms, other.histograms, strict=True):
            counts.update(more)

    def fields(self, model: type[Model]) -> dict[str, Any]:
        """The values of ``model``'s measures (and histograms, by key)."""
        if not has_latency(model):
            return dict(zip(TOTALS, self.sums, strict=False))
        values = dict(zip(MEASURES, self.sums, strict=True))
        for (name, _), counts in zip(HISTOGRAMS, self.histograms, strict=True):
            values[name] = {HISTOGRAM_KEYS[at]: count for at, count in sorted(counts.items())}
        return values


def tally(rows: Iterable[RequestLog]) -> dict[KeyGrain, Tally]:
    """``rows`` summed per day, key, alias and endpoint, each with the key's id."""
    groups: dict[KeyGrain, Tally] = {}
    for row in rows:
        assert row.created_at is not None  # set by the insert
        of = (utc_day(row.created_at), row.key_prefix, row.alias, row.endpoint)
        entry = groups.get(of)
        if entry is None:
            entry = groups[of] = Tally(row.api_key_id)
        entry.count(row)
    return groups


def tally_by_deployment(rows: Iterable[RequestLog]) -> dict[DeploymentGrain, Tally]:
    """The ``rows`` a deployment served summed per day, alias, deployment and endpoint."""
    groups: dict[DeploymentGrain, Tally] = {}
    for row in rows:
        if row.deployment:
            assert row.created_at is not None  # set by the insert
            of = (utc_day(row.created_at), row.alias, row.deployment, row.endpoint)
            groups.setdefault(of, Tally()).count(row)
    return groups


def summed_per(
    groups: Mapping[KeyGrain, Tally], keep: tuple[int, ...]
) -> dict[tuple[Any, ...], Tally]:
    """Per-key tallies summed per the grain's parts at ``keep`` (0 is the day, 1 the key,
    2 the alias, 3 the endpoint)."""
    totals: dict[tuple[Any, ...], Tally] = {}
    for of, part in groups.items():
        per = tuple(of[at] for at in keep)
        total = totals.get(per)
        if total is None:
            total = totals[per] = Tally()
        total.add(part)
    return totals


def record(rows: Sequence[RequestLog], connection: BaseDatabaseWrapper) -> None:
    """Add ``rows``, just inserted on ``connection``, to their days' rollups: call it in
    the transaction that inserted them. In a fixed order of rows, so that two workers
    adding to the same rollups wait for each other rather than deadlock."""
    groups = tally(rows)
    rollups: list[tuple[type[Model], Mapping[Any, Tally]]] = [
        (DailyKeyUsage, groups),
        (DailyAliasUsage, summed_per(groups, (0, 2, 3))),
        (DailyKeyTotal, summed_per(groups, (0, 1))),
    ]
    by_deployment = tally_by_deployment(rows)
    if by_deployment:
        rollups.append((DailyDeploymentUsage, by_deployment))
    with connection.cursor() as cursor:
        for model, tallies in rollups:
            cursor.executemany(
                _upsert_sql(connection, model),
                [_parameters(model, of, tallies[of], connection) for of in sorted(tallies)],
            )


def _parameters(
    model: type[Model], of: tuple[Any, ...], part: Tally, connection: BaseDatabaseWrapper
) -> dict[str, Any]:
    """One upsert's parameters by column: by name (Django rewrites ``%s`` for SQLite by
    a regular expression, each time: a third of the cost of a batch's rollups), the
    histograms as JSON."""
    parameters = dict(zip(grain(model), of, strict=True))
    parameters.update(part.fields(model))
    parameters["day"] = connection.ops.adapt_datefield_value(of[0])
    for name in MONEY:
        parameters[name] = connection.ops.adapt_decimalfield_value(parameters[name], 20, 8)
    for name, _ in HISTOGRAMS:
        if name in parameters:
            parameters[name] = orjson.dumps(parameters[name]).decode()
    if model is DailyKeyUsage:
        parameters["api_key_id"] = part.key_id
    return parameters


_upserts: dict[tuple[str, type[Model]], str] = {}  # by database vendor and model


def _upsert_sql(connection: BaseDatabaseWrapper, model: type[Model]) -> str:
    """INSERT ... ON CONFLICT (its grain) DO UPDATE adding the sums (PostgreSQL and
    SQLite), and each bucket's count to a histogram's (:func:`_added`); a key's rollup
    also names the key and its owner, as they were at the day's first request (an
    update of them would rewrite an index entry on every batch)."""
    statement = _upserts.get((connection.vendor, model))
    if statement is not None:
        return statement
    quote = connection.ops.quote_name
    table = quote(model._meta.db_table)
    per = grain(model)
    sums = MEASURES if has_latency(model) else TOTALS
    columns = [*per, *sums]
    updates = [f"{quote(column)} = {table}.{quote(column)} + excluded.{quote(column)}"
               for column in sums]  # fmt: skip
    values = [f"%({column})s" for column in columns]
    if has_latency(model):
        for name, _ in HISTOGRAMS:
            column, value = quote(name), f"%({name})s"
            columns.append(name)
            values.append(f"{value}::jsonb" if connection.vendor == "postgresql" else value)
            added = _added(connection, f"{table}.{column}", f"excluded.{column}")
            updates.append(f"{column} = {added}")
    if model is DailyKeyUsage:
        columns += ["api_key_id", "owner_id"]
        apikey = quote(ApiKey._meta.db_table)
        values += ["%(api_key_id)s", f"(SELECT owner_id FROM {apikey} WHERE id = %(api_key_id)s)"]
    statement = (
        f"INSERT INTO {table} ({', '.join(map(quote, columns))}) VALUES ({', '.join(values)})"
        f" ON CONFLICT ({', '.join(map(quote, per))}) DO UPDATE SET {', '.join(updates)}"
    )
    _upserts[(connection.vendor, model)] = statement
    return statement


def _added(connection: BaseDatabaseWrapper, histogram: str, added: str) -> str:
    """SQL of ``histogram`` (a JSON object of counts) with the counts of ``added`` added
    to its own, key by key: the keys of ``added`` only are read and written (a batch's
    rows of a grain fall in a few buckets)."""
    if connection.vendor == "postgresql":
        return (
            f"{histogram} || coalesce((SELECT jsonb_object_agg(added.key, added.value::bigint"
            f" + coalesce(({histogram} ->> added.key)::bigint, 0))"
            f" FROM jsonb_each_text({added}) AS added), '{{}}'::jsonb)"
        )
    return (
        f"json_patch({histogram}, (SELECT json_group_object(added.key, added.value"
        f" + coalesce(json_extract({histogram}, '$.\"' || added.key || '\"'), 0))"
        f" FROM json_each({added}) AS added))"
    )


def reconcile(day: datetime.date, *, using: str | None = None, apps: Apps = global_apps) -> bool:
    """Rebuild ``day``'s rollups from its log rows if they sum fewer; whether it did.

    On ``using``, else the database the site's routers write the log to; with the models
    of ``apps`` (a migration's, or the project's: the latest migration that changes the
    rollups calls it, with the models they end with). On PostgreSQL the rollups are
    locked against writes meanwhile: a batch written now waits (milliseconds) and adds
    its rows to the rebuilt rollups, which did not count them. On SQLite a batch
    committed between the count and the rebuild makes the rebuild fail ("database is
    locked"), not miscount.
    """
    log, per_key, per_alias, per_key_total = (
        apps.get_model("chatparity", name)
        for name in ("RequestLog", "DailyKeyUsage", "DailyAliasUsage", "DailyKeyTotal")
    )
    try:
        per_deployment = [apps.get_model("chatparity", "DailyDeploymentUsage")]
    except LookupError:  # a migration's models from before deployments (0021)
        per_deployment = []
    database = using or router.db_for_write(log)
    connection = connections[database]
    start = day_start(day)
    rows = log.objects.using(database).filter(
        created_at__gte=start, created_at__lt=start + datetime.timedelta(days=1)
    )
    models = (per_key, per_alias, per_key_total, *per_deployment)
    rollups = [model.objects.using(database).filter(day=day) for model in models]
    with transaction.atomic(using=database):
        if connection.vendor == "postgresql":
            tables = ", ".join(connection.ops.quote_name(m._meta.db_table) for m in models)
            with connection.cursor() as cursor:
                cursor.execute(f"LOCK TABLE {tables} IN SHARE ROW EXCLUSIVE MODE")
        if rows.count() <= (rollups[0].aggregate(n=Sum("requests"))["n"] or 0):
            return False
        for days_rollups in rollups:
            days_rollups.delete()
        groups, owners = _log_tallies(day, rows, ("key_prefix", "alias", "endpoint"))
        rebuilt: list[tuple[type[Model], Mapping[Any, Tally], dict[Any, dict[str, Any]]]] = [
            (
                per_key,
                groups,
                {
                    of: {"api_key_id": part.key_id, "owner_id": owners[of]}
                    for of, part in groups.items()
                },
            ),
            (per_alias, summed_per(groups, (0, 2, 3)), {}),
            (per_key_total, summed_per(groups, (0, 1)), {}),
        ]
        for model in per_deployment:
            served = rows.exclude(deployment="")
            by_deployment, _ = _log_tallies(day, served, ("alias", "deployment", "endpoint"))
            rebuilt.append((model, by_deployment, {}))
        for model, tallies, more in rebuilt:
            model._default_manager.using(database).bulk_create(
                [
                    model(
                        **dict(zip(grain(model), of, strict=True)),
                        **part.fields(model),
                        **more.get(of, {}),
                    )
                    for of, part in tallies.items()
                ],
                batch_size=500,
            )
    return True


def _log_tallies(
    day: datetime.date, rows: QuerySet[Any], per: tuple[str, str, str]
) -> tuple[dict[KeyGrain, Tally], dict[KeyGrain, int | None]]:
    """``rows`` (of ``day``) summed per the fields ``per`` (a key, alias and endpoint, or
    an alias, deployment and endpoint) by the database, and the owner of each grain's
    last key."""
    groups: dict[KeyGrain, Tally] = {}
    owners: dict[KeyGrain, int | None] = {}
    aggregates = {
        "last_key": Max("api_key"),
        "last_owner": Max("api_key__owner"),
        "sum_requests": Count("pk"),
        "sum_errors": Count("pk", filter=FAILED),
        "sum_cancelled": Count("pk", filter=Q(cancelled=True)),
        **{f"sum_{name}": Sum(name) for name in TOKENS},
        "sum_cost": Sum("cost"),
        "sum_cache_hits": Count("pk", filter=Q(cache__in=CACHE_HITS)),
        "sum_cache_misses": Count("pk", filter=Q(cache__in=CACHE_MISSES)),
        "sum_cost_saved": Sum("cost_saved"),
        "sum_duration_ms": Sum("duration_ms"),
        "sum_first_token_ms": Sum("time_to_first_token_ms"),
        "sum_first_tokens": Count("time_to_first_token_ms"),
    }
    for facts in rows.order_by().values(*per).annotate(**aggregates):
        of = (day, *(facts[name] for name in per))
        sums = [facts[f"sum_{name}"] or 0 for name in MEASURES]
        groups[of] = Tally(facts["last_key"], sums)
        owners[of] = facts["last_owner"]
    for histogram, (_, logged) in enumerate(HISTOGRAMS):
        bucket_of = Case(
            *(
                When(**{f"{logged}__lte": bound}, then=Value(at))
                for at, bound in enumerate(LATENCY_BOUNDS_MS)
            ),
            default=Value(len(LATENCY_BOUNDS_MS)),
        )
        counted = (
            rows.filter(**{f"{logged}__isnull": False})
            .order_by()
            .annotate(at=bucket_of)
            .values(*per, "at")
            .annotate(requests=Count("pk"))
        )
        for facts in counted:
            of = (day, *(facts[name] for name in per))
            groups[of].histograms[histogram][facts["at"]] = facts["requests"]
    return groups, owners
