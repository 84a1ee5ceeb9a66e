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
from collections.abc import Iterable, Sequence
from decimal import Decimal
from typing import Any

from django.apps import apps as global_apps
from django.apps.registry import Apps
from django.db import connections, router, transaction
from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.models import Count, Max, Model, Q, Sum

from ..models import (
    DURATION_BUCKETS,
    FIRST_TOKEN_BUCKETS,
    LATENCY_BOUNDS_MS,
    ApiKey,
    DailyAliasUsage,
    DailyDeploymentUsage,
    DailyKeyTotal,
    DailyKeyUsage,
    DailyUsage,
    RequestLog,
)

# A row that failed: an error status, or an error after streaming began (status 200).
FAILED = Q(status_code__gte=400) | ~Q(error_type="")

# What a rollup sums, in the order of a tally.
MEASURES = (
    "requests", "errors", "cancelled", "prompt_tokens", "completion_tokens", "total_tokens",
    "cached_tokens", "reasoning_tokens", "cost", "duration_ms", "first_token_ms",
    "first_tokens", *DURATION_BUCKETS, *FIRST_TOKEN_BUCKETS,
)  # fmt: skip
TOKENS = MEASURES[3:8]
# What a key's daily total sums: the measures up to the cost, no latency.
TOTALS = MEASURES[: MEASURES.index("cost") + 1]
_AT = {name: index for index, name in enumerate(MEASURES)}

KeyGrain = tuple[datetime.date, str, str, str]  # day, key prefix, alias, endpoint


def grain(model: type[Model]) -> tuple[str, ...]:
    """What a rollup is per: the fields of its model's one unique constraint."""
    (constraint,) = model._meta.constraints
    return tuple(constraint.fields)  # type: ignore[attr-defined]


def bucket(ms: float) -> int:
    """The histogram bucket of a latency: the first bound it does not exceed."""
    return bisect.bisect_left(LATENCY_BOUNDS_MS, ms)


def utc_day(moment: datetime.datetime) -> datetime.date:
    return moment.astimezone(datetime.UTC).date()


def day_start(day: datetime.date) -> datetime.datetime:
    """The moment a UTC day begins."""
    return datetime.datetime.combine(day, datetime.time(), tzinfo=datetime.UTC)


def _empty_tally() -> list[Any]:
    sums: list[Any] = [0] * len(MEASURES)
    sums[_AT["cost"]] = Decimal(0)
    return sums


def tally(rows: Iterable[RequestLog]) -> dict[KeyGrain, tuple[int | None, list[Any]]]:
    """``rows`` summed per day, key, alias and endpoint, each with the key's id."""
    groups: dict[KeyGrain, tuple[int | None, list[Any]]] = {}
    for row in rows:
        assert row.created_at is not None  # set by the insert
        of = (utc_day(row.created_at), row.key_prefix, row.alias, row.endpoint)
        entry = groups.get(of)
        if entry is None:
            entry = groups[of] = (row.api_key_id, _empty_tally())
        _count(entry[1], row)
    return groups


def tally_by_deployment(rows: Iterable[RequestLog]) -> dict[tuple[Any, ...], list[Any]]:
    """The ``rows`` a deployment served summed per day, alias, deployment and endpoint."""
    groups: dict[tuple[Any, ...], list[Any]] = {}
    for row in rows:
        if row.deployment:
            assert row.created_at is not None  # set by the insert
            of = (utc_day(row.created_at), row.alias, row.deployment, row.endpoint)
            _count(groups.setdefault(of, _empty_tally()), row)
    return groups


def _count(sums: list[Any], row: RequestLog) -> None:
    """Add ``row`` to a tally."""
    sums[_AT["requests"]] += 1
    sums[_AT["errors"]] += row.status_code >= 400 or bool(row.error_type)
    sums[_AT["cancelled"]] += row.cancelled
    for name in TOKENS:
        sums[_AT[name]] += getattr(row, name)
    sums[_AT["cost"]] += Decimal(row.cost)
    sums[_AT["duration_ms"]] += row.duration_ms
    sums[_AT[DURATION_BUCKETS[bucket(row.duration_ms)]]] += 1
    first_token = row.time_to_first_token_ms
    if first_token is not None:
        sums[_AT["first_token_ms"]] += first_token
        sums[_AT["first_tokens"]] += 1
        sums[_AT[FIRST_TOKEN_BUCKETS[bucket(first_token)]]] += 1


def summed_per(
    groups: dict[KeyGrain, tuple[int | None, list[Any]]], keep: tuple[int, ...], width: int
) -> dict[tuple[Any, ...], list[Any]]:
    """Per-key tallies summed per the grain's parts at ``keep`` (0 is the day, 1 the key,
    2 the alias, 3 the endpoint), their first ``width`` measures."""
    totals: dict[tuple[Any, ...], list[Any]] = {}
    for of, (_, sums) in groups.items():
        total = totals.setdefault(tuple(of[at] for at in keep), _empty_tally()[:width])
        for index in range(width):
            total[index] += sums[index]
    return totals


def record(rows: Sequence[RequestLog], connection: BaseDatabaseWrapper) -> None:
    """Add ``rows``, just inserted on ``connection``, to their days' rollups: call it in
    the transaction that inserted them. In a fixed order of rows, so that two workers
    adding to the same rollups wait for each other rather than deadlock."""
    groups = tally(rows)
    rollups: list[tuple[type[Model], dict[tuple[Any, ...], tuple[list[Any], dict[str, Any]]]]]
    rollups = [
        (DailyKeyUsage, {of: (sums, {"api_key_id": key}) for of, (key, sums) in groups.items()})
    ]
    for total, keep, width in (
        (DailyAliasUsage, (0, 2, 3), len(MEASURES)),
        (DailyKeyTotal, (0, 1), len(TOTALS)),
    ):
        summed = summed_per(groups, keep, width)
        rollups.append((total, {of: (sums, {}) for of, sums in summed.items()}))
    by_deployment = tally_by_deployment(rows)
    if by_deployment:
        rollups.append(
            (DailyDeploymentUsage, {of: (sums, {}) for of, sums in by_deployment.items()})
        )
    with connection.cursor() as cursor:
        for model, sums_of in rollups:
            cursor.executemany(
                _upsert_sql(connection, model),
                [
                    _parameters(model, of, sums, named, connection)
                    for of, (sums, named) in sorted(sums_of.items())
                ],
            )


def _parameters(
    model: type[Model],
    of: tuple[Any, ...],
    sums: list[Any],
    named: dict[str, Any],
    connection: BaseDatabaseWrapper,
) -> dict[str, Any]:
    """One upsert's parameters by column: by name, which Django passes on to SQLite as
    they are (it rewrites ``%s`` by a regular expression, each time, a third of the
    cost of a batch's rollups)."""
    parameters = dict(zip(grain(model), of, strict=True))
    parameters["day"] = connection.ops.adapt_datefield_value(of[0])
    parameters.update(zip(_measures(model), sums, strict=True))
    parameters["cost"] = connection.ops.adapt_decimalfield_value(parameters["cost"], 20, 8)
    parameters.update(named)
    return parameters


def _measures(model: type[Model]) -> tuple[str, ...]:
    return MEASURES if issubclass(model, DailyUsage) else TOTALS


_upserts: dict[tuple[str, type[Model]], str] = {}  # by database vendor and model


def _upsert_sql(connection: BaseDatabaseWrapper, model: type[Model]) -> str:
    """INSERT ... ON CONFLICT (its grain) DO UPDATE adding the sums (PostgreSQL and
    SQLite); a key's rollup also names the key and its owner, as they were at the day's
    first request (an update of them would rewrite an index entry on every batch)."""
    statement = _upserts.get((connection.vendor, model))
    if statement is not None:
        return statement
    quote = connection.ops.quote_name
    table = quote(model._meta.db_table)
    per, sums = grain(model), _measures(model)
    columns = [*per, *sums]
    values = [f"%({column})s" for column in columns]
    updates = [f"{quote(column)} = {table}.{quote(column)} + excluded.{quote(column)}"
               for column in sums]  # fmt: skip
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


def reconcile(day: datetime.date, *, using: str | None = None, apps: Apps = global_apps) -> bool:
    """Rebuild ``day``'s rollups from its log rows if they sum fewer; whether it did.

    On ``using``, else the database the site's routers write the log to; with the models
    of ``apps`` (a migration's, or the project's). On PostgreSQL the rollups are locked
    against writes meanwhile: a batch written now waits (milliseconds) and adds its rows
    to the rebuilt rollups, which did not count them. On SQLite a batch committed
    between the count and the rebuild makes the rebuild fail ("database is locked"), not
    miscount.
    """
    log, per_key, per_alias, per_key_total, per_deployment = (
        apps.get_model("chatparity", name)
        for name in (
            "RequestLog", "DailyKeyUsage", "DailyAliasUsage", "DailyKeyTotal",
            "DailyDeploymentUsage",
        )
    )  # fmt: skip
    database = using or router.db_for_write(log)
    connection = connections[database]
    start = day_start(day)
    rows = log.objects.using(database).filter(
        created_at__gte=start, created_at__lt=start + datetime.timedelta(days=1)
    )
    models = (per_key, per_alias, per_key_total, per_deployment)
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
        per_key.objects.using(database).bulk_create(
            [
                per_key(
                    day=day,
                    api_key_id=facts.pop("last_key"),
                    owner_id=facts.pop("last_owner"),
                    **_unprefixed(facts),
                )
                for facts in rows.order_by()
                .values("key_prefix", "alias", "endpoint")
                .annotate(**_log_sums())
            ],
            batch_size=500,
        )
        by_deployment = rows.exclude(deployment="").order_by()
        per_deployment.objects.using(database).bulk_create(
            [
                per_deployment(day=day, **_unprefixed(facts))
                for facts in by_deployment.values("alias", "deployment", "endpoint").annotate(
                    **_log_sums(per_key=False)
                )
            ],
            batch_size=500,
        )
        for model, per, measures in (
            (per_alias, ("alias", "endpoint"), MEASURES),
            (per_key_total, ("key_prefix",), TOTALS),
        ):
            sums = {f"sum_{name}": Sum(name) for name in measures}
            model.objects.using(database).bulk_create(
                [
                    model(day=day, **_unprefixed(facts))
                    for facts in rollups[0].order_by().values(*per).annotate(**sums)
                ],
                batch_size=500,
            )
    return True


def _unprefixed(facts: dict[str, Any]) -> dict[str, Any]:
    """An aggregate's row with ``sum_`` taken off its names (an annotation may not have a
    field's name) and nothing None (a sum over no values)."""
    return {
        name.removeprefix("sum_"): 0 if value is None and name.startswith("sum_") else value
        for name, value in facts.items()
    }


def _log_sums(*, per_key: bool = True) -> dict[str, Any]:
    """The aggregates over log rows that make one key's rollup (``per_key``: its key and
    owner too), or one deployment's."""
    named = {"last_key": Max("api_key"), "last_owner": Max("api_key__owner")} if per_key else {}
    sums: dict[str, Any] = {
        **named,
        "sum_requests": Count("pk"),
        "sum_errors": Count("pk", filter=FAILED),
        "sum_cancelled": Count("pk", filter=Q(cancelled=True)),
        **{f"sum_{name}": Sum(name) for name in TOKENS},
        "sum_cost": Sum("cost"),
        "sum_duration_ms": Sum("duration_ms"),
        "sum_first_token_ms": Sum("time_to_first_token_ms"),
        "sum_first_tokens": Count("time_to_first_token_ms"),
    }
    for columns, field in (
        (DURATION_BUCKETS, "duration_ms"),
        (FIRST_TOKEN_BUCKETS, "time_to_first_token_ms"),
    ):
        for index, column in enumerate(columns):
            within = Q(**{f"{field}__isnull": False})
            if index:
                within &= Q(**{f"{field}__gt": LATENCY_BOUNDS_MS[index - 1]})
            if index < len(LATENCY_BOUNDS_MS):
                within &= Q(**{f"{field}__lte": LATENCY_BOUNDS_MS[index]})
            sums[f"sum_{column}"] = Count("pk", filter=within)
    return sums
