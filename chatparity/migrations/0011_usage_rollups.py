"""Daily usage rollups, the log's indexes for the admin and the spool's drain, and the
rollups of the rows logged so far.

Safe on a live PostgreSQL with millions of log rows, hence not atomic: the log's
indexes are built CONCURRENTLY (writes go on meanwhile). The rollups of the days logged
so far are filled by migration 0019, one day per short transaction.
"""

import datetime

import django.db.models.deletion
from django.conf import settings
from django.db import migrations, models

# The latency histograms' bucket bounds (ms) as of this migration.
BOUNDS_MS = (
    5, 10, 20, 30, 50, 100, 200, 300, 500, 1_000, 2_000, 3_000, 5_000, 10_000, 20_000,
    30_000, 60_000, 120_000, 300_000,
)
ENDPOINTS = [
    ("chat.completions", "/v1/chat/completions"),
    ("responses", "/v1/responses"),
    ("messages", "/v1/messages"),
    ("embeddings", "/v1/embeddings"),
]


def _buckets(measure):
    names = [f"{measure}_le_{bound}" for bound in BOUNDS_MS] + [f"{measure}_over_{BOUNDS_MS[-1]}"]
    return [(name, models.PositiveIntegerField(default=0)) for name in names]


def _count(help_text=""):
    return models.PositiveBigIntegerField(default=0, help_text=help_text)


def _total_fields():
    return [
        ("id", models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name="ID")),
        ("day", models.DateField(help_text="UTC.")),
        ("requests", _count()),
        ("errors", _count("Answered with an error status, or failed after streaming began.")),
        ("cancelled", _count("The client hung up.")),
        ("prompt_tokens", _count()),
        ("completion_tokens", _count()),
        ("total_tokens", _count()),
        ("cached_tokens", _count()),
        ("reasoning_tokens", _count()),
        ("cost", models.DecimalField(decimal_places=8, default=0, help_text="USD.", max_digits=20)),
    ]


def _usage_fields():
    return [
        *_total_fields(),
        ("alias", models.CharField(blank=True, max_length=200)),
        ("endpoint", models.CharField(choices=ENDPOINTS, max_length=32)),
        ("duration_ms", models.FloatField(default=0, help_text="Sum of the requests' durations.")),
        ("first_token_ms", models.FloatField(default=0, help_text="Sum of the times to first token, over first_tokens requests.")),
        ("first_tokens", _count("Requests that sent a first token.")),
        *_buckets("duration_ms"),
        *_buckets("first_token_ms"),
    ]


def _concurrently(schema_editor):
    return {"concurrently": True} if schema_editor.connection.vendor == "postgresql" else {}


class AddIndexConcurrently(migrations.AddIndex):
    """AddIndex, built CONCURRENTLY on PostgreSQL, there ``USING postgresql_using`` if
    given. (django.contrib.postgres has one; it needs psycopg, which a site on SQLite
    does not install.)"""

    def __init__(self, model_name, index, postgresql_using=""):
        super().__init__(model_name, index)
        self.postgresql_using = postgresql_using

    def deconstruct(self):
        name, args, kwargs = super().deconstruct()
        if self.postgresql_using:
            kwargs["postgresql_using"] = self.postgresql_using
        return name, args, kwargs

    def database_forwards(self, app_label, schema_editor, from_state, to_state):
        model = to_state.apps.get_model(app_label, self.model_name)
        if not self.allow_migrate_model(schema_editor.connection.alias, model):
            return
        if schema_editor.connection.vendor == "postgresql":
            using = f" USING {self.postgresql_using}" if self.postgresql_using else ""
            schema_editor.execute(
                self.index.create_sql(model, schema_editor, using=using, concurrently=True)
            )
        else:
            schema_editor.add_index(model, self.index)

    def database_backwards(self, app_label, schema_editor, from_state, to_state):
        model = from_state.apps.get_model(app_label, self.model_name)
        if self.allow_migrate_model(schema_editor.connection.alias, model):
            schema_editor.remove_index(model, self.index, **_concurrently(schema_editor))


def fill_rollups(apps, schema_editor):
    """Nothing now: migration 0019 fills the rollups of the days logged so far, as the
    code writes them since (their histograms are not 0011's columns)."""


class Migration(migrations.Migration):
    atomic = False

    dependencies = [
        ("chatparity", "0010_round3"),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        migrations.CreateModel(
            name="DailyAliasUsage",
            fields=_usage_fields(),
            options={
                "verbose_name": "daily usage of an alias",
                "verbose_name_plural": "daily usage of aliases",
                "constraints": [
                    models.UniqueConstraint(fields=("day", "alias", "endpoint"), name="chatparity_alias_day_once"),
                ],
            },
        ),
        migrations.CreateModel(
            name="DailyKeyUsage",
            fields=[
                *_usage_fields(),
                ("key_prefix", models.CharField(help_text="Kept when the key is deleted.", max_length=32)),
                ("api_key", models.ForeignKey(blank=True, null=True, on_delete=django.db.models.deletion.SET_NULL, related_name="+", to="chatparity.apikey")),
                ("owner", models.ForeignKey(blank=True, help_text="The key's owner when its first request of the day was logged.", null=True, on_delete=django.db.models.deletion.SET_NULL, related_name="+", to=settings.AUTH_USER_MODEL)),
            ],
            options={
                "verbose_name": "daily usage of a key",
                "verbose_name_plural": "daily usage of keys",
                "constraints": [
                    models.UniqueConstraint(fields=("day", "key_prefix", "alias", "endpoint"), name="chatparity_key_day_once"),
                ],
                "indexes": [
                    models.Index(fields=["key_prefix", "day"], name="chatparity_key_usage_key_day"),
                    models.Index(fields=["owner", "day"], name="chatparity_key_usage_owner_day"),
                ],
            },
        ),
        migrations.CreateModel(
            name="DailyKeyTotal",
            fields=[
                *_total_fields(),
                ("key_prefix", models.CharField(help_text="Kept when the key is deleted.", max_length=32)),
            ],
            options={
                "verbose_name": "daily total of a key",
                "verbose_name_plural": "daily totals of keys",
                "constraints": [
                    models.UniqueConstraint(fields=("day", "key_prefix"), name="chatparity_key_total_once"),
                ],
            },
        ),
        AddIndexConcurrently(
            model_name="requestlog",
            index=models.Index(fields=["request_id"], name="chatparity_log_request_id"),
            postgresql_using="hash",
        ),
        AddIndexConcurrently(
            model_name="requestlog",
            index=models.Index(condition=models.Q(("completion_id", ""), _negated=True), fields=["completion_id"], name="chatparity_log_completion_id"),
            postgresql_using="hash",
        ),
        AddIndexConcurrently(
            model_name="requestlog",
            index=models.Index(fields=["alias"], name="chatparity_log_alias"),
        ),
        AddIndexConcurrently(
            model_name="requestlog",
            index=models.Index(
                condition=models.Q(("status_code__gte", 400), models.Q(("error_type", ""), _negated=True), ("cancelled", True), _connector="OR"),
                fields=["created_at"],
                name="chatparity_log_failed_time",
            ),
        ),
        migrations.RunPython(fill_rollups, migrations.RunPython.noop),
    ]
