"""Usage history at scale: the request log's pages against 2,000,000 rows over 90 days.

    .venv/bin/python bench/history.py [--rows 2000000] [--days 90] [--repeat 3]
                                      [--data-dir DIR] [--database-url URL] [--prune DAYS]

One command. It starts a throw-away PostgreSQL (as CI does: initdb into a temporary
folder, a free port; ``--data-dir`` keeps the seeded cluster for the next run, which
then measures the migrations on it, and ``--database-url`` uses a server of yours),
migrates it, seeds realistic RequestLog rows in SQL (``generate_series``: keys used as
unevenly as real ones, a busy key with about a quarter of the traffic, aliases,
errors, streams, tokens, latencies, ids as the gateway makes them), builds their daily
rollups as the migration does for rows logged before them, then serves the example
project with one uvicorn worker and measures, warm, the median of ``--repeat``
requests each:

- the admin's request-log list: first page, one key's rows, a search by completion
  id, a day and a month of the date drill-down;
- the usage dashboard over 1, 14, 90 and 365 days;
- the management API: the log's first page and one a million rows in, usage per
  day, latency;
- the self-service portal's usage page, when ``chatparity.portal`` is installed;
- the CSV export of the busy key's month: time to first byte and to the last;
- the spool drain's look-up of 500 request ids;

and, per page, the queries it ran and the slowest (the same request made in this
process). Then the log's bytes on disk per million rows, and with ``--prune DAYS``
how long ``chatparity_prune_logs`` takes. It prints one Markdown table
(docs/history.md shows it).
"""

from __future__ import annotations

import argparse
import base64
import datetime
import io
import os
import re
import secrets
import shutil
import statistics
import string
import subprocess
import sys
import tempfile
import time
import urllib.parse
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import harness
import httpx
from harness import ROOT, log

DATABASE = "chatparity_history"
PASSWORD = "bench-history"
KEYS = 200
USERS = 40
# (public id, backend, upstream model, USD per million prompt / completion tokens, share)
ALIASES = (
    ("gpt-4o-mini", "openai", "gpt-4o-mini-2024-07-18", "0.15", "0.60", 0.40),
    ("smollm2", "local", "SmolLM2-135M-Instruct", "0", "0", 0.20),
    ("gpt-4o", "openai", "gpt-4o-2024-08-06", "2.50", "10.00", 0.15),
    ("claude-sonnet", "anthropic", "claude-sonnet-4-5", "3.00", "15.00", 0.12),
    ("llama-70b", "vllm", "meta-llama/Llama-3.3-70B-Instruct", "0.60", "0.60", 0.08),
    ("codex-high", "codex", "gpt-5-codex", "1.25", "10.00", 0.05),
)
# (status, error type, error code, share): what the gateway answers, as a busy site sees it.
STATUSES = (
    (200, "", "", 0.965),
    (429, "rate_limit_exceeded", "rate_limit_exceeded", 0.010),
    (400, "invalid_request_error", "invalid_value", 0.008),
    (404, "invalid_request_error", "model_not_found", 0.004),
    (502, "server_error", "upstream_error", 0.005),
    (503, "server_error", "service_unavailable", 0.003),
    (500, "server_error", "interrupted", 0.002),
    (504, "timeout_error", "request_timeout", 0.002),
    (413, "invalid_request_error", "request_too_large", 0.001),
)
USER_AGENTS = (
    "OpenAI/Python 1.60.0",
    "AsyncOpenAI/Python 1.59.7",
    "OpenAI/JS 4.77.0",
    "Anthropic/Python 0.42.0",
    "langchain-openai/0.3.0 OpenAI/Python 1.60.0",
    "codex_cli_rs/0.46.0 (Debian 12; x86_64)",
    "curl/8.5.0",
)
SEED_CHUNK = 250_000


# -- PostgreSQL -------------------------------------------------------------------


def postgres_bin() -> Path:
    found = sorted(Path("/usr/lib/postgresql").glob("*/bin"), key=lambda p: int(p.parent.name))
    if not found:
        sys.exit("PostgreSQL is not installed: apt-get install -y postgresql")
    return found[-1]


@contextmanager
def postgres(data_dir: Path | None) -> Iterator[str]:
    """A PostgreSQL server of this run's own, its URL; its cluster in ``data_dir`` (made
    if need be, kept after) or in a temporary folder (removed after)."""
    temporary = data_dir is None
    folder = Path(tempfile.mkdtemp(prefix="chatparity-history-")) if temporary else data_dir
    assert folder is not None
    folder.mkdir(parents=True, exist_ok=True)
    as_postgres = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []
    if as_postgres:  # initdb refuses to run as root
        shutil.chown(folder, "postgres")
    cluster = folder / "pg"
    binaries = postgres_bin()
    if not (cluster / "PG_VERSION").exists():
        initdb = [str(binaries / "initdb"), "-D", str(cluster), "-A", "trust", "-U", "postgres"]
        subprocess.run([*as_postgres, *initdb, "-E", "UTF8", "--locale=C"], check=True,
                       stdout=subprocess.DEVNULL)  # fmt: skip
    port = harness.free_port()
    options = (
        f"-p {port} -k {folder} -c listen_addresses=127.0.0.1 -c fsync=off"
        " -c shared_buffers=256MB -c work_mem=16MB -c maintenance_work_mem=256MB"
        " -c max_wal_size=4GB"
    )
    pg_ctl = [*as_postgres, str(binaries / "pg_ctl"), "-D", str(cluster)]
    subprocess.run([*pg_ctl, "-l", str(folder / "pg.log"), "-w", "-o", options, "start"],
                   check=True, stdout=subprocess.DEVNULL)  # fmt: skip
    try:
        admin = f"postgres://postgres@127.0.0.1:{port}/postgres"
        exists = psql(admin, f"SELECT 1 FROM pg_database WHERE datname = '{DATABASE}'")
        if not exists:
            psql(admin, f"CREATE DATABASE {DATABASE}")
        yield f"postgres://postgres@127.0.0.1:{port}/{DATABASE}"
    finally:
        subprocess.run([*pg_ctl, "-m", "fast", "stop"], stdout=subprocess.DEVNULL)
        if temporary:
            shutil.rmtree(folder, ignore_errors=True)


def psql(url: str, sql: str) -> bool:
    """Run ``sql``; whether it returned rows."""
    import psycopg

    with psycopg.connect(url, autocommit=True) as connection:
        cursor = connection.execute(sql)  # type: ignore[arg-type]
        return bool(cursor.description and cursor.fetchall())


# -- seeding --------------------------------------------------------------------


def cumulative(shares: list[float]) -> list[float]:
    """Bucket lower bounds for width_bucket(random(), ...): 0, s1, s1+s2, ..."""
    bounds, total = [0.0], 0.0
    for share in shares[:-1]:
        total += share
        bounds.append(round(total, 6))
    return bounds


SEED_SQL = """
INSERT INTO chatparity_requestlog (
    endpoint, completion_id, request_id, api_key_id, key_prefix, alias, backend,
    upstream_model, stream, n, status_code, error_type, error_code, cancelled,
    finish_reasons, prompt_tokens, completion_tokens, total_tokens, cached_tokens,
    reasoning_tokens, usage_counted, time_to_first_token_ms, duration_ms,
    output_tokens_per_second, cost, client_ip, user_agent, request_body, response_body,
    created_at /* columns added since */
)
SELECT
    CASE WHEN responses THEN 'responses' ELSE 'chat.completions' END,
    CASE WHEN status <> 200 THEN ''
         WHEN responses THEN 'resp_' || md5(g || 'c') || substr(md5(g || 'd'), 1, 18)
         ELSE 'chatcmpl-' || substr(md5(g || 'c') || md5(g || 'd'), 1, 29) END,
    'req_' || md5(g || 'r'),
    key_id, key_prefix, alias, backend, upstream_model,
    stream, 1, status, error_type, error_code, cancelled,
    CASE WHEN status <> 200 THEN '[]'::jsonb
         WHEN u3 < 0.03 THEN '["length"]'::jsonb
         WHEN u3 < 0.08 THEN '["tool_calls"]'::jsonb
         ELSE '["stop"]'::jsonb END,
    prompt, completion, prompt + completion,
    CASE WHEN u4 < 0.3 THEN prompt / 2 ELSE 0 END,
    CASE WHEN alias = 'codex-high' THEN completion / 2 ELSE 0 END,
    false,
    CASE WHEN stream AND status = 200 THEN first_token END,
    duration,
    CASE WHEN status = 200 AND completion > 0
         THEN completion / greatest(duration - coalesce(first_token, 0), 1) * 1000 END,
    (prompt * input_price + completion * output_price) / 1000000,
    ('10.' || (key_index %% 250) || '.' || (g / 250 %% 250) || '.' || (g %% 250))::inet,
    (%(agents)s::text[])[1 + key_index %% %(agent_count)s],
    NULL, '',
    %(start)s::timestamptz + (g - 1 + u1) * %(step)s::interval /* their defaults */
FROM (
    SELECT r.*, a.alias, a.backend, a.upstream_model, a.input_price, a.output_price,
           s.status, s.error_type, s.error_code,
           (%(key_ids)s::bigint[])[key_index + 1] AS key_id,
           (%(key_prefixes)s::text[])[key_index + 1] AS key_prefix,
           CASE WHEN s.status = 200 THEN floor(exp(ln(40) + u2 * ln(100)))::int ELSE 0 END
               AS prompt,
           CASE WHEN s.status = 200 THEN floor(exp(ln(5) + u3 * ln(200)))::int ELSE 0 END
               AS completion,
           s.status = 200 AND u1 < 0.01 AS cancelled,
           80 + 900 * u4 * u4 AS first_token,
           CASE WHEN s.status = 200 THEN 150 + exp(ln(5) + u3 * ln(200)) * 12 * (0.5 + u4)
                ELSE 5 + 45 * u4 END AS duration
    FROM (
        SELECT g,
               floor(%(keys)s * power(random(), 4))::int AS key_index,
               width_bucket(random(), %(alias_bounds)s::float8[]) AS alias_index,
               width_bucket(random(), %(status_bounds)s::float8[]) AS status_index,
               random() < 0.2 AS responses,
               random() < 0.6 AS stream,
               random() AS u1, random() AS u2, random() AS u3, random() AS u4
        FROM generate_series(%(first)s::bigint, %(last)s::bigint) AS g
    ) r
    JOIN (SELECT * FROM unnest(%(alias_ids)s::text[], %(backends)s::text[],
                               %(models)s::text[], %(input_prices)s::numeric[],
                               %(output_prices)s::numeric[])
                 WITH ORDINALITY AS a(alias, backend, upstream_model, input_price,
                                      output_price, position)) a
      ON a.position = r.alias_index
    JOIN (SELECT * FROM unnest(%(status_codes)s::int[], %(error_types)s::text[],
                               %(error_codes)s::text[])
                 WITH ORDINALITY AS s(status, error_type, error_code, position)) s
      ON s.position = r.status_index
) seeded
"""


def seed_statement(connection: Any) -> tuple[str, dict[str, Any]]:
    """SEED_SQL with the log's columns it does not name (added since it was written), each
    given its model default, and their parameters."""
    from chatparity.models import RequestLog

    named = set(re.findall(r"\w+", SEED_SQL.split("SELECT")[0]))
    added = [
        field
        for field in RequestLog._meta.concrete_fields
        if not field.primary_key and field.column not in named
    ]
    statement = SEED_SQL.replace(
        "/* columns added since */", "".join(f", {field.column}" for field in added)
    ).replace("/* their defaults */", "".join(f", %(default_{field.column})s" for field in added))
    defaults = {
        f"default_{field.column}": field.get_db_prep_save(field.get_default(), connection)
        for field in added
    }
    return statement, defaults


@dataclass
class Seeded:
    """What the measured pages look for in the seeded log."""

    rows: int
    first_day: datetime.date
    last_day: datetime.date
    busy_key_id: int
    busy_prefix: str
    owner_id: int
    completion_id: str
    middle_time: datetime.datetime
    request_ids: list[str] = field(default_factory=list)


def seed(rows: int, days: int) -> Seeded:
    """Keys, owners, backends and aliases through the ORM; ``rows`` log rows over the
    ``days`` days up to today in SQL, unless the database holds them already."""
    from django.contrib.auth import get_user_model
    from django.db import connection

    from chatparity.models import ApiKey, Backend, ModelAlias, RequestLog

    last_day = datetime.datetime.now(datetime.UTC).date()
    first_day = last_day - datetime.timedelta(days=days - 1)
    if not ApiKey.objects.exists():
        user_model = get_user_model()
        users = user_model.objects.bulk_create(
            user_model(username=f"user{i:02}", email=f"user{i:02}@example.com")
            for i in range(USERS)
        )
        backends = {
            name: Backend.objects.create(name=name, kind="openai", base_url="https://up.example")
            for name in sorted({alias[1] for alias in ALIASES})
        }
        for public_id, backend, model, input_price, output_price, _ in ALIASES:
            ModelAlias.objects.create(
                public_id=public_id,
                backend=backends[backend],
                model=model,
                input_price=input_price,
                output_price=output_price,
            )
        keys = []
        for i in range(KEYS):
            key = ApiKey(name=f"key {i:03}", owner=users[i % USERS] if i % 5 else None)
            key.issue()
            keys.append(key)
        ApiKey.objects.bulk_create(keys)
    keys = list(ApiKey.objects.order_by("name"))
    have = RequestLog.objects.count()
    if have < rows:
        start = datetime.datetime.combine(first_day, datetime.time(), tzinfo=datetime.UTC)
        step = datetime.timedelta(days=days) / rows
        params = {
            "agents": list(USER_AGENTS),
            "agent_count": len(USER_AGENTS),
            "start": start,
            "step": step,
            "keys": KEYS,
            "key_ids": [key.pk for key in keys],
            "key_prefixes": [key.prefix for key in keys],
            "alias_bounds": cumulative([alias[5] for alias in ALIASES]),
            "alias_ids": [alias[0] for alias in ALIASES],
            "backends": [alias[1] for alias in ALIASES],
            "models": [alias[2] for alias in ALIASES],
            "input_prices": [alias[3] for alias in ALIASES],
            "output_prices": [alias[4] for alias in ALIASES],
            "status_bounds": cumulative([status[3] for status in STATUSES]),
            "status_codes": [status[0] for status in STATUSES],
            "error_types": [status[1] for status in STATUSES],
            "error_codes": [status[2] for status in STATUSES],
        }
        statement, defaults = seed_statement(connection)
        began = time.perf_counter()
        with connection.cursor() as cursor:
            cursor.execute("SELECT setseed(0.27)")
            for first in range(have + 1, rows + 1, SEED_CHUNK):
                last = min(first + SEED_CHUNK - 1, rows)
                cursor.execute(statement, {**params, **defaults, "first": first, "last": last})
                log(f"  seeded rows {first:,}-{last:,} ({time.perf_counter() - began:.0f} s)")
            cursor.execute("VACUUM ANALYZE chatparity_requestlog")
        log(f"Seeded {rows - have:,} rows in {time.perf_counter() - began:.0f} s")
    busy = keys[0]
    owner_id = busy.owner_id or next(key.owner_id for key in keys if key.owner_id)
    noon = datetime.datetime.combine(
        first_day + datetime.timedelta(days=days // 2), datetime.time(12), tzinfo=datetime.UTC
    )
    middle = (
        RequestLog.objects.filter(created_at__gte=noon, status_code=200)
        .order_by("created_at")
        .values_list("completion_id", "created_at")
        .first()
    )
    assert middle is not None
    late_ids = RequestLog.objects.order_by("-pk").values_list("request_id", flat=True)[:500]
    return Seeded(
        rows=RequestLog.objects.count(),
        first_day=first_day,
        last_day=last_day,
        busy_key_id=busy.pk,
        busy_prefix=busy.prefix,
        owner_id=owner_id,
        completion_id=middle[0],
        middle_time=middle[1],
        request_ids=list(late_ids),
    )


# -- the pages --------------------------------------------------------------------


@dataclass
class Page:
    """A request to measure: ``form`` makes it a POST of that form (with the CSRF token)."""

    label: str
    path: str
    form: dict[str, str] | None = None
    expect: str = ""  # text the body must hold, so that an error page is not measured
    user: str = "admin"  # or "owner": the busy key's, for the portal


@dataclass
class Timing:
    label: str
    first_byte_ms: float
    total_ms: float
    size: int
    queries: int = 0
    slowest_ms: float = 0.0


def cursor(created_at: datetime.datetime) -> str:
    """The API's log cursor for the page after ``created_at`` (DRF's CursorPagination)."""
    position = urllib.parse.urlencode({"p": str(created_at)})
    return base64.b64encode(position.encode()).decode()


def pages(seeded: Seeded) -> list[Page]:
    changelist = "/admin/chatparity/requestlog/"
    dashboard = "/admin/chatparity_dashboard/usagedashboard/"
    last = seeded.last_day
    middle = seeded.first_day + (last - seeded.first_day) / 2
    month_start = (middle - datetime.timedelta(days=15)).isoformat()
    month_end = (middle + datetime.timedelta(days=15)).isoformat()
    busy_key = f"api_key__id__exact={seeded.busy_key_id}"
    select_all = {"action": "export_csv", "select_across": "1", "index": "0"}

    def span(days: int) -> str:
        return f"since={(last - datetime.timedelta(days=days - 1)).isoformat()}&until={last}"

    result = [
        Page("admin log: first page", changelist, expect="result_list"),
        Page("admin log: one key", f"{changelist}?{busy_key}", expect="result_list"),
        Page(
            "admin log: search a completion id",
            f"{changelist}?q={seeded.completion_id}",
            expect=seeded.completion_id[:20],
        ),
        Page(
            "admin log: a day (drill-down)",
            f"{changelist}?created_at__year={middle.year}&created_at__month={middle.month}"
            f"&created_at__day={middle.day}",
            expect="result_list",
        ),
        Page(
            "admin log: a month (drill-down)",
            f"{changelist}?created_at__year={middle.year}&created_at__month={middle.month}",
            expect="result_list",
        ),
        *(
            Page(f"dashboard: {days} days", f"{dashboard}?{span(days)}", expect="Usage dashboard")
            for days in (1, 14, 90, 365)
        ),
        Page("API logs/: first page", "/api/logs/?limit=50", expect="request_id"),
        Page(
            f"API logs/: {seeded.rows // 2:,} rows in",
            f"/api/logs/?limit=50&cursor={cursor(seeded.middle_time)}",
            expect="request_id",
        ),
        Page(
            "API usage/: per day, 90 days",
            f"/api/usage/?group_by=day&{span(90)}",
            expect="requests",
        ),
        Page("API usage/latency/: everything", "/api/usage/latency/", expect="p95_ms"),
        Page(
            "CSV export: the busy key's month",
            f"{changelist}?{busy_key}&created_at__gte={month_start}&created_at__lt={month_end}",
            form={**select_all, "_selected_action": "1"},
            expect="created_at,",
        ),
    ]
    from django.apps import apps

    if apps.is_installed("chatparity.portal"):
        month = middle.strftime("%Y-%m")
        result.append(
            Page(
                "portal: a user's month of usage",
                f"/portal/usage/?month={month}",
                expect="Usage",
                user="owner",
            )
        )
    return result


def measure_server(site: str, cookies: dict[str, str], page: Page, repeat: int) -> Timing:
    """The median of ``repeat`` requests after one to warm up: time to the first byte
    of the body, and to its last."""
    firsts, totals, size = [], [], 0
    with httpx.Client(base_url=site, cookies=cookies, timeout=600) as client:
        for attempt in range(repeat + 1):
            data = None
            if page.form is not None:
                data = {**page.form, "csrfmiddlewaretoken": cookies["csrftoken"]}
            began = time.perf_counter()
            with client.stream(
                "POST" if data else "GET", page.path, data=data, headers={"Referer": site}
            ) as response:
                chunks = response.iter_bytes()
                first = next(chunks, b"")
                first_byte = time.perf_counter() - began
                body = first + b"".join(chunks)
            total = time.perf_counter() - began
            if response.status_code != 200 or page.expect.encode() not in body:
                raise RuntimeError(f"{page.label}: {response.status_code} {body[:500]!r}")
            if attempt:
                firsts.append(first_byte * 1000)
                totals.append(total * 1000)
            size = len(body)
    return Timing(page.label, statistics.median(firsts), statistics.median(totals), size)


def count_queries(page: Page, timing: Timing, user: Any) -> None:
    """The queries ``page`` runs, made in this process against the same database."""
    from django.db import connection
    from django.test import Client
    from django.test.utils import CaptureQueriesContext

    client = Client(HTTP_HOST="localhost", enforce_csrf_checks=False)
    client.force_login(user)
    with CaptureQueriesContext(connection) as queries:
        if page.form is not None:
            response = client.post(page.path, page.form)
        else:
            response = client.get(page.path)
        if response.streaming:
            b"".join(response.streaming_content)  # type: ignore[arg-type]
        response.close()
    timing.queries = len(queries.captured_queries)
    timing.slowest_ms = max((float(q["time"]) * 1000 for q in queries), default=0.0)


def drain_lookup(seeded: Seeded, repeat: int) -> Timing:
    """The spool drain's query: which of 500 request ids the log holds."""
    from chatparity.models import RequestLog

    times = []
    for attempt in range(repeat + 1):
        began = time.perf_counter()
        held = list(
            RequestLog.objects.filter(request_id__in=seeded.request_ids).values_list(
                "request_id", flat=True
            )
        )
        if attempt:
            times.append((time.perf_counter() - began) * 1000)
    assert len(held) == len(seeded.request_ids)
    median = statistics.median(times)
    return Timing("spool drain: 500 request ids", median, median, 0, 1, median)


def sizes() -> list[tuple[str, int]]:
    """Bytes on disk of the log's table (with its TOAST), of each of its indexes, and of
    each daily rollup table with its indexes."""
    from django.db import connection

    from chatparity.models import DailyAliasUsage, DailyKeyTotal, DailyKeyUsage

    models = (DailyKeyUsage, DailyAliasUsage, DailyKeyTotal)
    rollups = [model._meta.db_table for model in models]
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT pg_table_size('chatparity_requestlog'), 'log: table'"
            " UNION ALL SELECT pg_relation_size(indexrelid), 'log: ' || indexrelid::regclass"
            " FROM pg_index WHERE indrelid = 'chatparity_requestlog'::regclass"
            " UNION ALL SELECT pg_total_relation_size(name), name FROM unnest(%s::text[]) name",
            [rollups],
        )
        return [(name, int(size)) for size, name in cursor.fetchall()]


def build_rollups(seeded: Seeded) -> float:
    """Seconds to build the rollups of the seeded rows, a day at a time (as the migration
    and chatparity_prune_logs do for rows logged without them)."""
    from chatparity.accounting.rollups import reconcile

    began = time.perf_counter()
    day = seeded.first_day
    while day <= seeded.last_day:
        reconcile(day)
        day += datetime.timedelta(days=1)
    return time.perf_counter() - began


def login(user: Any) -> dict[str, str]:
    """``user``'s session and CSRF cookies for the server."""
    from django.test import Client

    client = Client(HTTP_HOST="localhost")
    client.force_login(user)
    # A CSRF secret of our own: Django takes the same 32 characters in the form.
    csrf = "".join(secrets.choice(string.ascii_letters + string.digits) for _ in range(32))
    return {"sessionid": client.cookies["sessionid"].value, "csrftoken": csrf}


def users(seeded: Seeded) -> dict[str, Any]:
    """The staff user who reads the admin, and the busy key's owner, who reads the portal."""
    from django.contrib.auth import get_user_model
    from django.contrib.auth.models import Permission

    user_model = get_user_model()
    admin = user_model.objects.filter(username="bench").first()
    if admin is None:
        admin = user_model.objects.create_superuser("bench", "bench@example.com", PASSWORD)
    owner = user_model.objects.get(pk=seeded.owner_id)
    owner.user_permissions.add(*Permission.objects.filter(codename="use_portal"))
    return {"admin": admin, "owner": owner}


def prune(days: int) -> str:
    """chatparity_prune_logs --older-than ``days``: what it printed and how long it took."""
    from django.core.management import call_command

    out = io.StringIO()
    began = time.perf_counter()
    call_command("chatparity_prune_logs", "--older-than", str(days), stdout=out)
    return f"{out.getvalue().strip()} In {time.perf_counter() - began:.1f} s."


def table(
    timings: list[Timing], seeded: Seeded, disk: list[tuple[str, int]], notes: list[str]
) -> str:
    lines = [
        f"{seeded.rows:,} log rows over {(seeded.last_day - seeded.first_day).days + 1} days,"
        " PostgreSQL, one uvicorn worker, warm; medians.",
        "",
        "| request | first byte | whole | body | queries | slowest query |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for t in timings:
        lines.append(
            f"| {t.label} | {t.first_byte_ms:,.0f} ms | {t.total_ms:,.0f} ms |"
            f" {t.size / 1024:,.0f} KiB | {t.queries} | {t.slowest_ms:,.0f} ms |"
        )
    log_total = sum(size for name, size in disk if name.startswith("log: "))
    lines += ["", "| on disk | bytes per log row | MiB per million log rows |", "|---|---:|---:|"]
    for name, size in [*disk, ("log: all", log_total)]:
        per_row = size / seeded.rows
        lines.append(f"| {name} | {per_row:,.0f} | {per_row * 1e6 / 2**20:,.0f} |")
    return "\n".join([*lines, "", *notes])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=2_000_000)
    parser.add_argument("--days", type=int, default=90)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--data-dir", type=Path, help="keep the seeded cluster here")
    parser.add_argument("--database-url", help="a PostgreSQL database to use instead")
    parser.add_argument(
        "--prune", type=int, metavar="DAYS", help="last, prune the rows older than DAYS days"
    )
    args = parser.parse_args()

    with ExitStack() as stack:
        url = args.database_url or stack.enter_context(postgres(args.data_dir))
        env = {
            **os.environ,
            "DATABASE_URL": url,
            "DJANGO_SETTINGS_MODULE": "project.settings",
            "DJANGO_ENV": "development",
            "DEBUG": "0",
            "ALLOWED_HOSTS": "localhost,127.0.0.1",
            "PYTHONUNBUFFERED": "1",
        }
        os.environ.update(env)
        sys.path.insert(0, str(ROOT))
        import django
        from django.core.management import call_command

        django.setup()
        began = time.perf_counter()
        call_command("migrate", verbosity=0)
        notes = [f"migrate: {time.perf_counter() - began:.1f} s."]
        seeded = seed(args.rows, args.days)
        notes.append(f"Rollups checked (and built where missing): {build_rollups(seeded):.1f} s.")

        port = harness.free_port()
        site = f"http://127.0.0.1:{port}"
        stack.enter_context(
            harness.serve(
                harness.chatparity_command("uvicorn", port),
                f"{site}/healthz",
                env=env,
                log_file=Path(tempfile.gettempdir()) / "chatparity-history-server.log",
            )
        )
        accounts = users(seeded)
        cookies = {name: login(user) for name, user in accounts.items()}
        timings = []
        for page in pages(seeded):
            log(f"  {page.label}...")
            timing = measure_server(site, cookies[page.user], page, args.repeat)
            count_queries(page, timing, accounts[page.user])
            timings.append(timing)
        timings.append(drain_lookup(seeded, args.repeat))
        disk = sizes()
        load = ", ".join(f"{value:.1f}" for value in os.getloadavg())
        notes.append(f"Load average after the measurements: {load} on {os.cpu_count()} CPUs.")
        if args.prune:
            notes.append(prune(args.prune))
        print(table(timings, seeded, disk, notes))


if __name__ == "__main__":
    main()
