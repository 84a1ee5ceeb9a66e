"""The usage dashboard: the admin page of UsageDashboard, drawn from
``chatparity.accounting.reports`` (the daily rollups, never the log)."""

from __future__ import annotations

import datetime
from collections import defaultdict
from collections.abc import Sequence
from decimal import Decimal
from typing import Any

from django import forms
from django.contrib import admin
from django.contrib.auth import get_permission_codename
from django.core.exceptions import PermissionDenied
from django.core.validators import MinValueValidator
from django.db.models import Model
from django.http import HttpRequest
from django.template.response import TemplateResponse
from django.urls import URLPattern, path
from django.utils import timezone

from ..accounting.reports import (
    LogFilter,
    cache_by_alias,
    cache_read_percent,
    latency_by_alias,
    latency_by_deployment,
    usage,
)
from ..models import ApiKey, DailyAliasUsage, Endpoint, ModelAlias, RequestLog
from .charts import grouped_bars, stacked_bars
from .models import UsageDashboard
from .tail import TAIL_PATH

DEFAULT_DAYS = 14
DEFAULT_SPAN = datetime.timedelta(days=DEFAULT_DAYS - 1)
MAX_DAYS = 366
# Also keeps date arithmetic on the defaults far from datetime.date.min.
EARLIEST = datetime.date(2000, 1, 1)
NO_ALIAS = "(no alias)"


def _permissions(model: type[Model]) -> list[str]:
    return [
        f"{model._meta.app_label}.{get_permission_codename(action, model._meta)}"
        for action in ("view", "change")
    ]


VIEW_PERMISSIONS = (*_permissions(UsageDashboard), *_permissions(RequestLog))


def can_view_usage(user: Any) -> bool:
    """Active staff allowed to view (or change) the request log or the usage dashboard."""
    return bool(
        user.is_active
        and user.is_staff
        and any(user.has_perm(permission) for permission in VIEW_PERMISSIONS)
    )


def utc_today() -> datetime.date:
    return timezone.now().astimezone(datetime.UTC).date()


def key_choices() -> list[tuple[str, str]]:
    """All keys, then each key's prefix labelled with its keys' names (from the keys, not
    the log: a deleted key's usage shows in the table of keys)."""
    names: dict[str, list[str]] = defaultdict(list)
    for prefix, name in ApiKey.objects.order_by("name").values_list("prefix", "name"):
        names[prefix].append(name)
    return [("", "All keys")] + [
        (prefix, f"{' / '.join(names[prefix])} ({prefix}…)") for prefix in sorted(names)
    ]


def alias_choices() -> list[tuple[str, str]]:
    """All aliases, then configured ones and those of the daily usage (a few rows a day),
    once per name ignoring case like the filter."""
    seen: dict[str, str] = {}
    for alias in [
        *ModelAlias.objects.values_list("public_id", flat=True),
        *DailyAliasUsage.objects.order_by().values_list("alias", flat=True).distinct(),
    ]:
        if alias:
            seen.setdefault(alias.lower(), alias)
    return [("", "All aliases")] + [(alias, alias) for _, alias in sorted(seen.items())]


class DashboardForm(forms.Form):
    """The GET filters; ``cleaned_data`` always holds a usable range, the defaults if need be."""

    since = forms.DateField(
        required=False,
        validators=[MinValueValidator(EARLIEST)],
        widget=forms.DateInput(attrs={"type": "date"}, format="%Y-%m-%d"),
    )
    until = forms.DateField(
        required=False,
        validators=[MinValueValidator(EARLIEST)],
        widget=forms.DateInput(attrs={"type": "date"}, format="%Y-%m-%d"),
    )
    key = forms.ChoiceField(required=False, choices=key_choices)
    alias = forms.ChoiceField(required=False, choices=alias_choices)
    endpoint = forms.ChoiceField(required=False, choices=[("", "All endpoints"), *Endpoint.choices])

    def __init__(self, data: Any, *, today: datetime.date) -> None:
        super().__init__(data)
        self.today = today

    def clean(self) -> dict[str, Any]:
        data = super().clean() or {}
        until = data.get("until") or self.today
        since = data.get("since") or until - DEFAULT_SPAN
        if since > until:
            problem = "The start date is after the end date"
        elif (until - since).days >= MAX_DAYS:
            problem = f"Choose at most {MAX_DAYS} days"
        else:
            problem = ""
        if problem:
            self.add_error(None, f"{problem}; showing the last {DEFAULT_DAYS} days.")
            since, until = self.today - DEFAULT_SPAN, self.today
        data.update(since=since, until=until)
        # Show the range in effect rather than empty date inputs.
        shown = {name: data[name].isoformat() for name in ("since", "until")}
        self.data = {**shown, **{name: value for name, value in self.data.items() if value}}
        return data

    def log_filter(self) -> LogFilter:
        """The filter asked for, with defaults in place of anything missing or invalid."""
        self.is_valid()
        data = self.cleaned_data
        return LogFilter(
            since=data["since"],
            until=data["until"],
            key_prefix=data.get("key") or "",
            alias=data.get("alias") or "",
            endpoint=data.get("endpoint") or "",
        )


def days_between(since: datetime.date, until: datetime.date) -> list[datetime.date]:
    return [since + datetime.timedelta(days=i) for i in range((until - since).days + 1)]


def _alias_label(alias: str) -> str:
    return alias or NO_ALIAS


def daily_charts(log_filter: LogFilter, days: Sequence[datetime.date]) -> dict[str, str]:
    """Requests and tokens per day, stacked by alias."""
    index = {day: i for i, day in enumerate(days)}
    requests: dict[str, list[float]] = defaultdict(lambda: [0.0] * len(days))
    tokens: dict[str, list[float]] = defaultdict(lambda: [0.0] * len(days))
    for group in usage(log_filter, ["day", "alias"]):
        label = _alias_label(group["alias"])
        requests[label][index[group["day"]]] += group["requests"]
        tokens[label][index[group["day"]]] += group["total_tokens"]
    categories = [day.isoformat() for day in days]
    return {
        "requests_chart": stacked_bars(
            categories, requests, chart="requests-per-day", title="Requests per day by alias"
        ),
        "tokens_chart": stacked_bars(
            categories, tokens, chart="tokens-per-day", title="Tokens per day by alias"
        ),
    }


def endpoint_table(log_filter: LogFilter) -> list[dict[str, Any]]:
    """Requests, tokens and errors per endpoint, labelled with its path."""
    labels = dict(Endpoint.choices)
    return [
        {**row, "label": labels.get(row["endpoint"], row["endpoint"])}
        for row in usage(log_filter, ["endpoint"])
    ]


def with_cache_share(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``rows`` with their ``cache_read_percent``."""
    for row in rows:
        row["cache_read_percent"] = cache_read_percent(row["cached_tokens"], row["prompt_tokens"])
    return rows


def caching_table(log_filter: LogFilter) -> list[dict[str, Any]]:
    """Per alias: its prompt tokens, their cache reads and writes, the share read, and
    the cost."""
    rows = usage(log_filter, ["alias"])
    return with_cache_share([{**row, "label": _alias_label(row["alias"])} for row in rows])


def latency_table(log_filter: LogFilter) -> tuple[list[dict[str, Any]], str]:
    """Per alias latency and error rate rows, and their chart."""
    table = [
        {**row, "label": _alias_label(row["alias"]), "error_percent": row["error_rate"] * 100}
        for row in latency_by_alias(log_filter)
    ]
    columns = {
        "p50 latency": "p50_ms",
        "p95 latency": "p95_ms",
        "p50 first token": "ttft_p50_ms",
        "p95 first token": "ttft_p95_ms",
    }
    chart = grouped_bars(
        [row["label"] for row in table],
        {name: [row[column] or 0.0 for row in table] for name, column in columns.items()},
        chart="latency-by-alias",
        title="Latency and time to first token by alias",
        unit="ms",
    )
    return table, chart


def deployment_table(log_filter: LogFilter) -> list[dict[str, Any]]:
    """Per alias and deployment: latency and error rate, for every key."""
    return [
        {**row, "label": _alias_label(row["alias"]), "error_percent": row["error_rate"] * 100}
        for row in latency_by_deployment(log_filter)
    ]


class UsageDashboardAdmin(admin.ModelAdmin):  # type: ignore[type-arg]
    """Charts and tables of the request log: the only page of UsageDashboard in the admin."""

    def has_view_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return can_view_usage(request.user)

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def get_urls(self) -> list[URLPattern]:
        # Only the changelist: rows are viewed (and bodies guarded) in RequestLogAdmin.
        name = f"{self.opts.app_label}_{self.opts.model_name}_changelist"
        return [path("", self.admin_site.admin_view(self.changelist_view), name=name)]

    def changelist_view(
        self, request: HttpRequest, extra_context: dict[str, Any] | None = None
    ) -> TemplateResponse:
        """The dashboard for the GET filters."""
        if not self.has_view_permission(request):
            raise PermissionDenied
        form = DashboardForm(request.GET, today=utc_today())
        log_filter = form.log_filter()
        keys = with_cache_share(
            sorted(
                usage(log_filter, ["key"]), key=lambda row: (-row["requests"], row["key_prefix"])
            )
        )
        requests, errors, prompt, cached = (
            sum(row[measure] for row in keys)
            for measure in ("requests", "errors", "prompt_tokens", "cached_tokens")
        )
        context: dict[str, Any] = {
            **self.admin_site.each_context(request),
            "title": "Usage dashboard",
            "subtitle": None,
            "opts": self.opts,
            "form": form,
            "filter": log_filter,
            "keys": keys,
            "totals": {
                "requests": requests,
                "errors": errors,
                "error_percent": errors / requests * 100 if requests else 0.0,
                "tokens": sum(row["total_tokens"] for row in keys),
                "cost": sum((row["cost"] for row in keys), Decimal(0)),
                "cache_read_percent": cache_read_percent(cached, prompt),
            },
            "tail_path": "/" + TAIL_PATH,
            **(extra_context or {}),
        }
        if requests:
            days = days_between(form.cleaned_data["since"], form.cleaned_data["until"])
            context.update(
                daily_charts(log_filter, days),
                endpoints=endpoint_table(log_filter),
                caching=caching_table(log_filter),
            )
            context["latency"], context["latency_chart"] = latency_table(log_filter)
            context["deployments"] = deployment_table(log_filter)
            context["cache"] = cache_by_alias(log_filter)
        return TemplateResponse(
            request, "admin/chatparity_dashboard/usagedashboard/change_list.html", context
        )


admin.site.register(UsageDashboard, UsageDashboardAdmin)
