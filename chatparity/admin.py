"""Admin for keys, backends, aliases and their deployments, and the request log."""

from __future__ import annotations

import contextlib
import csv
import datetime
import io
import json
from collections.abc import AsyncIterator, Iterator
from decimal import Decimal
from functools import cached_property
from html import escape
from http import HTTPStatus
from typing import Any, cast

from asgiref.sync import async_to_sync, sync_to_async
from django import forms
from django.contrib import admin, messages
from django.contrib.admin import helpers
from django.contrib.admin.options import IncorrectLookupParameters
from django.contrib.admin.templatetags.admin_list import result_headers
from django.contrib.admin.views.main import PAGE_VAR, ChangeList
from django.core.exceptions import ValidationError
from django.core.handlers.asgi import ASGIRequest
from django.core.paginator import Paginator
from django.db.models import Count, Max, Min, Prefetch, QuerySet
from django.forms.models import BaseInlineFormSet
from django.http import HttpRequest, HttpResponse, StreamingHttpResponse
from django.template.response import TemplateResponse
from django.urls import reverse
from django.utils import timezone
from django.utils.formats import date_format
from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString, mark_safe
from django.utils.text import capfirst
from django.utils.translation import gettext

from .accounting import catalog, limits
from .accounting import deployments as shared
from .accounting.rollups import FAILED
from .gateway import probe
from .kinds import kinds
from .models import (
    ApiKey,
    Backend,
    CacheState,
    DailyAliasUsage,
    Deployment,
    Endpoint,
    ModelAlias,
    Plan,
    RequestLog,
    StoredResponse,
    deployments_problem,
)


class ApiKeyForm(forms.ModelForm):
    """A key for every alias, or for the aliases selected: never both by mistake; for
    its editor or no one, unless they may issue keys for other users."""

    editor: Any = None  # the user saving it, set per request by ApiKeyAdmin.get_form

    def clean(self) -> dict[str, Any]:
        cleaned = super().clean() or {}
        owner = cleaned.get("owner")
        if self.editor is not None and not self.instance.may_be_given_to(owner, self.editor):
            self.add_error(
                "owner",
                "Only a user who may issue keys for other users can give a key to someone"
                " else: it would read their stored responses.",
            )
        try:
            ApiKey.check_alias_scope(
                bool(cleaned.get("all_aliases")), cleaned.get("allowed_aliases") or ()
            )
        except ValidationError as refusal:
            self.add_error(None, refusal)
        return cleaned


@admin.register(ApiKey)
class ApiKeyAdmin(admin.ModelAdmin):
    form = ApiKeyForm
    list_display = [
        "name", "masked_key", "owner", "status", "all_aliases", "expires_at", "created_at",
        "last_used_at",
    ]  # fmt: skip
    list_filter = ["is_active", "all_aliases", "owner"]
    search_fields = ["name", "prefix"]
    readonly_fields = ["masked_key", "usage_against_limits", "created_at", "last_used_at"]
    filter_horizontal = ["allowed_aliases"]
    actions = ["revoke", "reactivate"]
    limits = (
        "requests_per_minute", "tokens_per_minute", "max_concurrent", "token_budget",
        "cost_budget", "budget_period",
    )  # fmt: skip

    def get_form(
        self, request: HttpRequest, obj: ApiKey | None = None, change: bool = False, **kwargs: Any
    ) -> Any:
        form = cast("type[ApiKeyForm]", super().get_form(request, obj, change, **kwargs))
        form.editor = request.user  # a class made for this request
        return form

    def get_fieldsets(self, request: HttpRequest, obj: ApiKey | None = None) -> Any:
        key = (
            "name", "owner", "is_active", "expires_at", "needs_plan", "all_aliases",
            "allowed_aliases", "response_cache",
        )  # fmt: skip
        if obj is None:
            return [(None, {"fields": key}), ("Limits and budgets", {"fields": self.limits})]
        return [
            (None, {"fields": ("masked_key", *key, "created_at", "last_used_at")}),
            ("Limits and budgets", {"fields": (*self.limits, "usage_against_limits")}),
        ]

    @admin.display(description="usage now")
    def usage_against_limits(self, key: ApiKey) -> str:
        rows = async_to_sync(limits.standing)(key)
        if not rows:
            return "No limits or budgets."
        return format_html_join(
            "",
            "<div class='limit'>{}: {}</div>",
            (
                (
                    row.name,
                    format_html("<strong>{}</strong> of {}", row.used_text, row.allowed_text),
                )
                if row.used is not None
                else (row.name, "unknown")
                for row in rows
            ),
        )

    @admin.display(description="key", ordering="prefix")
    def masked_key(self, key: ApiKey) -> str:
        return f"{key.prefix}…"

    @admin.display(description="status")
    def status(self, key: ApiKey) -> str:
        if not key.is_active:
            return "revoked"
        return "expired" if key.is_expired else "active"

    def save_model(self, request: HttpRequest, obj: ApiKey, form: Any, change: bool) -> None:
        if not change:
            # Only on this response; never in the session, messages or the database.
            request.chatparity_plaintext = obj.issue()  # type: ignore[attr-defined]
        super().save_model(request, obj, form, change)

    def response_add(
        self, request: HttpRequest, obj: ApiKey, post_url_continue: str | None = None
    ) -> HttpResponse:
        context = {
            **self.admin_site.each_context(request),
            "opts": self.opts,
            "title": "API key created",
            "breadcrumb": obj.name,
            "key": obj,
            "plaintext": request.chatparity_plaintext,  # type: ignore[attr-defined]
        }
        # The admin's views are never_cache, so no copy of the key stays in a cache.
        return TemplateResponse(request, "admin/chatparity/apikey/created.html", context)

    @admin.action(description="Revoke selected keys", permissions=["change"])
    def revoke(self, request: HttpRequest, queryset: QuerySet[ApiKey]) -> None:
        count = self._set_active(request, queryset, False)
        self.message_user(request, f"Revoked {count} key(s).", messages.SUCCESS)

    @admin.action(description="Reactivate selected keys", permissions=["change"])
    def reactivate(self, request: HttpRequest, queryset: QuerySet[ApiKey]) -> None:
        count = self._set_active(request, queryset, True)
        self.message_user(request, f"Reactivated {count} key(s).", messages.SUCCESS)

    def _set_active(self, request: HttpRequest, queryset: QuerySet[ApiKey], active: bool) -> int:
        """Save each key that changes, noted in its admin history; how many did."""
        keys = list(queryset.filter(is_active=not active))
        for key in keys:
            key.is_active = active
            # save(), not update(): its signal empties this worker's key cache at once.
            key.save(update_fields=["is_active"])
            self.log_change(request, key, "Reactivated." if active else "Revoked.")
        return len(keys)


class PlanForm(forms.ModelForm):
    """Every alias, or the aliases selected: never both by mistake."""

    def clean(self) -> dict[str, Any]:
        cleaned = super().clean() or {}
        if cleaned.get("all_aliases") and cleaned.get("allowed_aliases"):
            self.add_error(
                "allowed_aliases",
                "Untick 'all aliases' to limit the plan to these, or select none.",
            )
        return cleaned


@admin.register(Plan)
class PlanAdmin(admin.ModelAdmin):
    """Plans: who has them (users, groups), the aliases their keys may use, the limits of
    each key they make in the portal, and the budgets all of one user's keys share."""

    form = PlanForm
    # Five columns that fit 1280 px beside the admin's sidebars: each key's limits and
    # the owner budgets summed up in one each (the plan's page has every field).
    list_display = ["name", "priority", "aliases", "each_key", "owner_budget"]
    search_fields = ["name", "description"]
    filter_horizontal = ["users", "groups", "allowed_aliases"]
    fieldsets = [
        (None, {"fields": ("name", "description", "users", "groups", "priority")}),
        ("Aliases", {"fields": ("all_aliases", "allowed_aliases", "response_cache")}),
        ("Each key made in the portal", {"fields": Plan.KEY_LIMITS}),
        (
            "All of one user's keys together",
            {"fields": ("owner_token_budget", "owner_cost_budget", "owner_budget_period")},
        ),
    ]

    class Media:
        css = {"all": ["chatparity/admin/changelists.css"]}

    def get_queryset(self, request: HttpRequest) -> QuerySet[Plan]:
        plans: QuerySet[Plan] = super().get_queryset(request)
        return plans.annotate(alias_count=Count("allowed_aliases"))

    @admin.display(description="aliases", ordering="all_aliases")
    def aliases(self, plan: Plan) -> str:
        if plan.all_aliases:
            return "all"
        count = plan.alias_count  # type: ignore[attr-defined]
        return "none" if not count else f"{count} selected"

    @admin.display(description="each key made in the portal")
    def each_key(self, plan: Plan) -> str:
        return limits_text(
            [
                (plan.requests_per_minute, "requests/min"),
                (plan.tokens_per_minute, "tokens/min"),
                (plan.max_concurrent, "at once"),
            ],
            plan.token_budget,
            plan.cost_budget,
            plan.get_budget_period_display(),
        )

    @admin.display(description="all of one user's keys")
    def owner_budget(self, plan: Plan) -> str:
        return limits_text(
            [],
            plan.owner_token_budget,
            plan.owner_cost_budget,
            plan.get_owner_budget_period_display(),
        )


def usd(amount: Decimal) -> str:
    """``amount`` of US dollars without trailing zeros: ``$1,234.5``."""
    return "$" + format(amount, ",f").rstrip("0").rstrip(".")


def limits_text(
    rates: list[tuple[int | None, str]],
    tokens: int | None,
    cost: Decimal | None,
    period: str,
) -> str:
    """Limits and budgets in a line: those set, ``60 requests/min · 1,000,000 tokens ·
    $5 per month (UTC)``, or "none"."""
    parts = [f"{value:,} {unit}" for value, unit in rates if value is not None]
    budget = [
        *([f"{tokens:,} tokens"] if tokens is not None else []),
        *([usd(cost)] if cost is not None else []),
    ]
    if budget:
        parts.append(f"{' + '.join(budget)} {period}")
    return " · ".join(parts) or "none"


class BackendForm(forms.ModelForm):
    """The kinds offered are those ``CHATPARITY["BACKEND_CLASSES"]`` configures (a site's
    own too). The secret is write-only: never rendered back; left blank, it stays as it
    was."""

    kind = forms.ChoiceField(help_text=Backend._meta.get_field("kind").help_text)
    base_url = forms.URLField(required=False, assume_scheme="https")
    secret = forms.CharField(
        required=False,
        strip=False,
        widget=forms.PasswordInput(render_value=False, attrs={"autocomplete": "new-password"}),
        help_text="Write-only. Leave blank to keep the stored secret.",
    )
    clear_secret = forms.BooleanField(required=False, help_text="Remove the stored secret.")

    class Meta:
        model = Backend
        fields = ["name", "kind", "base_url", "secret", "options", "timeout", "enabled"]

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # A row's own kind too: one no longer configured is shown, and refused by the
        # row's checks, rather than silently replaced by the first kind offered.
        offered = sorted({*kinds(), self.instance.kind})
        cast(forms.ChoiceField, self.fields["kind"]).choices = [(kind, kind) for kind in offered]

    def clean_secret(self) -> str:
        if self.cleaned_data.get("clear_secret"):
            return ""
        return str(self.cleaned_data["secret"] or self.instance.secret)

    def clean(self) -> dict[str, Any]:
        cleaned = super().clean() or {}
        if cleaned.get("clear_secret"):
            cleaned["secret"] = ""
        # Else whoever may change a backend could point it at a server of theirs and
        # receive the secret they may not read.
        moved = sorted({"kind", "base_url"} & set(self.changed_data))
        typed = self["secret"].data or cleaned.get("clear_secret")
        if moved and self.instance.secret and not typed:
            self.add_error(
                "secret",
                f"Enter the secret again (or clear it) to change the {' and '.join(moved)}:"
                " the stored one never goes to a new place unasked.",
            )
        return cleaned


@admin.register(Backend)
class BackendAdmin(admin.ModelAdmin):
    form = BackendForm
    list_display = ["name", "kind", "base_url", "has_secret", "enabled", "alias_count"]
    list_filter = ["kind", "enabled"]
    search_fields = ["name", "base_url"]
    actions = ["test_connection"]

    def get_queryset(self, request: HttpRequest) -> QuerySet[Backend]:
        backends: QuerySet[Backend] = super().get_queryset(request)
        return backends.annotate(alias_count=Count("aliases"))

    @admin.display(boolean=True, description="secret")
    def has_secret(self, backend: Backend) -> bool:
        return bool(backend.secret)

    @admin.display(description="aliases", ordering="alias_count")
    def alias_count(self, backend: Backend) -> int:
        return backend.alias_count  # type: ignore[attr-defined, no-any-return]

    @admin.action(description="Test connection", permissions=["change"])
    def test_connection(self, request: HttpRequest, queryset: QuerySet[Backend]) -> None:
        """A one-token completion on each backend: it may cost money, hence the change
        permission, and leaves a log row."""
        for backend in queryset:
            trial = async_to_sync(probe.check_connection)(backend, request.user.get_username())
            if trial.ok:
                self.message_user(
                    request,
                    f"{backend.name}: connected, answered in {trial.duration_ms:.0f} ms.",
                    messages.SUCCESS,
                )
            else:
                self.message_user(request, f"{backend.name}: {trial.error}", messages.ERROR)


class DeploymentForm(forms.ModelForm):
    """A deployment; the alias's own (``primary``) has its backend and model from the
    alias, edited above."""

    class Meta:
        model = Deployment
        fields = [
            "backend", "model", "name", "weight", "tier", "requests_per_minute",
            "tokens_per_minute", "max_in_flight", "enabled",
        ]  # fmt: skip

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if self.instance.primary:
            for name in ("backend", "model"):
                self.fields[name].disabled = True
                self.fields[name].help_text = "The alias's own: change it above."


class DeploymentFormSet(BaseInlineFormSet):
    """An alias's deployments as they will be once saved, refused when no deployment
    could serve, or a tier is left without one (:func:`deployments_problem`); its own
    deployment is never deleted here."""

    def clean(self) -> None:
        super().clean()
        kept = []
        for form in self.forms:
            cleaned = getattr(form, "cleaned_data", None)
            if not cleaned or (form.instance.pk is None and not form.has_changed()):
                continue  # invalid (said on the form), or an extra form left empty
            if not cleaned.get("DELETE"):
                kept.append(form.instance)
            elif form.instance.primary:
                raise ValidationError(
                    "The alias's own backend cannot be deleted here: change the alias's"
                    " backend above, or disable its deployment."
                )
        if not any(form.instance.primary for form in self.forms):
            kept.append(Deployment(primary=True))  # made with the alias, as it is by default
        problem = deployments_problem(kept)
        if problem:
            raise ValidationError(problem)

    def save_existing(self, form: Any, obj: Deployment, commit: bool = True) -> Deployment:
        if obj.primary:  # as the alias, saved just before, says now
            obj.backend, obj.model = self.instance.backend, self.instance.model
        saved: Deployment = super().save_existing(form, obj, commit)
        return saved


def _health_text(health: shared.Health, now: float) -> str:
    """A deployment's state as the alias's page shows it."""
    if health.cooling(now):
        until = datetime.datetime.fromtimestamp(health.cooling_until, datetime.UTC)
        state = f"cooling until {until:%H:%M:%S} UTC ({health.cooling_until - now:.0f} s)"
    elif health.probing:
        state = "cooled down, being tried again"
    elif health.half_open:
        state = "cooled down, to be tried again"
    elif health.failures:
        state = f"failing ({health.failures} in a row)"
    else:
        state = "healthy"
    ttft = shared.percentile(health.samples, 50)
    share = health.error_share
    return "; ".join(
        [
            state,
            f"{health.in_flight} in flight",
            f"first token p50 {ttft:.0f} ms" if ttft is not None else "first token: not measured",
            f"errors {share:.0%} of {health.requests}" if share is not None else "no errors",
        ]
    )


class DeploymentInline(admin.TabularInline):
    """An alias's deployments, each with its state now (shared by every worker)."""

    model = Deployment
    form = DeploymentForm
    formset = DeploymentFormSet
    extra = 0
    readonly_fields = ["state"]

    snapshot: shared.Snapshot | None = None
    """The state of the page's alias's deployments, read once for the page."""

    def get_formset(self, request: HttpRequest, obj: Any = None, **kwargs: Any) -> Any:
        if obj is not None and self.snapshot is None:
            rows = list(Deployment.objects.filter(alias=obj).select_related("backend"))
            with contextlib.suppress(limits.Unavailable):
                self.snapshot = async_to_sync(shared.snapshot)(rows, obj.pk, samples="stream")
        return super().get_formset(request, obj, **kwargs)

    @admin.display(description="state now")
    def state(self, deployment: Deployment) -> str:
        if deployment.pk is None:
            return "—"
        if self.snapshot is None:
            return "unknown (the counters are unavailable)"
        health = self.snapshot.health.get(shared.scope(deployment), shared.HEALTHY)
        return _health_text(health, self.snapshot.now)


class TryItForm(forms.Form):
    prompt = forms.CharField(initial=probe.TRY_PROMPT, widget=forms.Textarea(attrs={"rows": 3}))
    max_tokens = forms.IntegerField(initial=64, min_value=1, max_value=1024)


@admin.register(ModelAlias)
class ModelAliasAdmin(admin.ModelAdmin):
    list_display = [
        "public_id", "backend", "model", "enabled", "listed", "owned_by", "context_window",
        "requests_per_minute", "tokens_per_minute",
    ]  # fmt: skip
    list_filter = ["backend", "enabled", "listed"]
    search_fields = ["public_id", "model", "description"]
    list_select_related = ["backend"]
    actions = ["try_it", "purge_response_cache", "fill_prices"]
    inlines = [DeploymentInline]

    @admin.action(description="Purge their response cache", permissions=["change"])
    def purge_response_cache(self, request: HttpRequest, queryset: QuerySet[ModelAlias]) -> None:
        """Forget every answer the selected aliases keep, at once: each alias's generation,
        part of all its cache keys, is bumped (its entries expire unread). Workers see the
        new generation within ``CACHE_SECONDS``, this one at once."""
        aliases = list(queryset)
        for alias in aliases:
            alias.cache_generation += 1  # two purges at once bump it once: purged all the same
            # save(), not update(): its signal empties this worker's alias cache at once.
            alias.save(update_fields=["cache_generation"])
            self.log_change(request, alias, "Purged its response cache.")
        self.message_user(
            request, f"Purged the response cache of {len(aliases)} alias(es).", messages.SUCCESS
        )

    @admin.action(description="Try it: send a short prompt", permissions=["change"])
    def try_it(self, request: HttpRequest, queryset: QuerySet[ModelAlias]) -> TemplateResponse:
        """An intermediate page: a prompt form, and each selected alias's reply and timing.

        Each reply may cost money, hence the change permission, and leaves a log row.
        """
        form = TryItForm(request.POST if "prompt" in request.POST else None)
        trials = []
        if form.is_valid():
            trials = [
                async_to_sync(probe.try_alias)(
                    alias,
                    request.user.get_username(),
                    form.cleaned_data["prompt"],
                    form.cleaned_data["max_tokens"],
                )
                for alias in queryset.select_related("backend").prefetch_related(
                    Prefetch("deployments", Deployment.objects.select_related("backend"))
                )
            ]
        context = {
            **self.admin_site.each_context(request),
            "opts": self.opts,
            "title": "Try it",
            "form": form,
            "aliases": queryset,
            "trials": trials,
            "action_checkbox_name": helpers.ACTION_CHECKBOX_NAME,
        }
        return TemplateResponse(request, "admin/chatparity/modelalias/try_it.html", context)

    @admin.action(description="Fill prices from the genai-prices catalog", permissions=["change"])
    def fill_prices(self, request: HttpRequest, queryset: QuerySet[ModelAlias]) -> None:
        """Each selected alias's prices set to the catalog's for its upstream model, a price
        the catalog has none of blank (the provider's ratio); an alias it does not know is
        left as it is."""
        for alias in queryset.select_related("backend").order_by("public_id"):
            try:
                found = catalog.fill(alias)
            except catalog.CatalogMissing as missing:
                self.message_user(request, str(missing), messages.ERROR)
                return
            if found is None:
                shown = alias.model or alias.public_id
                self.message_user(
                    request,
                    f"{alias.public_id}: the catalog does not know {shown!r}; prices unchanged.",
                    messages.WARNING,
                )
                continue
            alias.save(update_fields=list(catalog.PRICE_FIELDS))
            filled = f"Prices from genai-prices {catalog.version()} ({found.name})."
            self.log_change(request, alias, filled)
            tiers = " Its prices rise past a prompt length: the alias keeps the base ones."
            self.message_user(
                request,
                f"{alias.public_id}: {filled}{tiers if found.tiered else ''}",
                messages.WARNING if found.tiered else messages.SUCCESS,
            )


# A spreadsheet takes a cell starting with one of these for a formula (OWASP's list).
FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")


def csv_cell(value: Any) -> Any:
    """``value`` safe to open in a spreadsheet: text that would start a formula gets a
    leading ``'``, as OWASP advises against CSV injection."""
    if isinstance(value, str) and value.startswith(FORMULA_STARTS):
        return "'" + value
    return value


CSV_COLUMNS = [
    "created_at", "endpoint", "request_id", "completion_id", "key_prefix", "alias", "backend",
    "upstream_model", "stream", "n", "status_code", "error_type", "error_code", "cancelled",
    "finish_reasons", "prompt_tokens", "completion_tokens", "total_tokens", "cached_tokens",
    "reasoning_tokens", "usage_counted", "time_to_first_token_ms", "duration_ms",
    "output_tokens_per_second", "client_ip", "user_agent", "cache_write_5m_tokens",
    "cache_write_1h_tokens", "cost",
]  # fmt: skip
CSV_COLUMNS += ["deployment", "deployments_tried"]  # which deployment of the alias served it


# Rows of the CSV export a query reads, and streams, at a time.
CSV_CHUNK_ROWS = 2000


def csv_chunks(rows: QuerySet[RequestLog]) -> Iterator[str]:
    """``rows`` as CSV, oldest first: the header, then CSV_CHUNK_ROWS rows a chunk, each
    chunk a query that goes on from where the last ended (no cursor held between them)."""
    buffer = io.StringIO()
    writer = csv.writer(buffer)
    writer.writerow(CSV_COLUMNS)
    yield buffer.getvalue()
    reasons = CSV_COLUMNS.index("finish_reasons")
    ordered = rows.order_by("created_at", "pk").values_list(*CSV_COLUMNS, "pk")
    chunk = list(ordered[:CSV_CHUNK_ROWS])
    while chunk:
        buffer.seek(0)
        buffer.truncate()
        for *values, _ in chunk:
            values[reasons] = " ".join(values[reasons])
            writer.writerow([csv_cell(value) for value in values])
        yield buffer.getvalue()
        *last, last_pk = chunk[-1]
        after = ordered.filter(created_at__gte=last[0]).exclude(created_at=last[0], pk__lte=last_pk)
        chunk = list(after[:CSV_CHUNK_ROWS])


async def one_by_one(chunks: Iterator[str]) -> AsyncIterator[str]:
    """``chunks``, each made in the request's thread as it is sent: under ASGI Django
    reads a plain iterator whole before it sends the first byte."""

    def following() -> str | None:
        return next(chunks, None)

    while (chunk := await sync_to_async(following)()) is not None:
        yield chunk


class AliasFilter(admin.SimpleListFilter):
    """The configured aliases, not a DISTINCT over the log."""

    title = "alias"
    parameter_name = "alias"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        aliases = ModelAlias.objects.order_by("public_id").values_list("public_id", flat=True)
        return [(alias, alias) for alias in aliases]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        return queryset.filter(alias=self.value()) if self.value() else queryset


class StatusFilter(admin.SimpleListFilter):
    """Failures, or the statuses the gateway answers with: a fixed list, not a DISTINCT
    over the log."""

    title = "status"
    parameter_name = "status"
    STATUSES = (200, 400, 403, 404, 408, 413, 422, 429, 500, 502, 503, 504)

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return [
            ("failed", "any failure"),
            *((str(code), f"{code} {HTTPStatus(code).phrase}") for code in self.STATUSES),
        ]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        value = self.value()
        if not value:
            return queryset
        if value == "failed":
            return queryset.filter(FAILED)
        if not (value.isascii() and value.isdigit()):
            raise IncorrectLookupParameters(f"status={value!r}")
        return queryset.filter(status_code=int(value))


# Pages counted past the one shown, and no more: a COUNT(*) over the whole log was the
# slowest query of every page.
COUNTED_PAGES_AHEAD = 10


class CappedPaginator(Paginator):
    """Counts the rows only up to COUNTED_PAGES_AHEAD pages past ``page``: ``capped``
    says there are more (the page links go as far as counted)."""

    def __init__(self, rows: QuerySet[RequestLog], *args: Any, page: int, **kwargs: Any) -> None:
        super().__init__(rows, *args, **kwargs)
        self.rows = rows
        self.limit = (max(page, 1) + COUNTED_PAGES_AHEAD) * self.per_page

    @cached_property
    def counted(self) -> int:
        return self.rows[: self.limit + 1].count()

    @cached_property
    def count(self) -> int:
        return min(self.counted, self.limit)

    @property
    def capped(self) -> bool:
        return self.counted > self.limit


class RequestLogChangeList(ChangeList):
    """The request log's changelist: its date drill-down from the rollups, its rows
    written by RequestLogAdmin.rows (the template admin/chatparity/requestlog/
    change_list.html shows them with Django's headers)."""

    # What the rows show: not the bodies, which a page of rows would read whole.
    SHOWN = (
        "created_at", "request_id", "key_prefix", "alias", "endpoint", "stream", "status_code",
        "error_type", "error_code", "cancelled", "finish_reasons", "cache", "prompt_tokens",
        "completion_tokens", "time_to_first_token_ms", "duration_ms",
    )  # fmt: skip

    def get_queryset(
        self, request: HttpRequest, exclude_parameters: Any = None
    ) -> QuerySet[RequestLog]:
        rows: QuerySet[RequestLog] = super().get_queryset(request, exclude_parameters)
        return rows.only(*self.SHOWN)

    @cached_property
    def headers(self) -> list[dict[str, Any]]:
        return list(result_headers(self))

    @cached_property
    def sorted_by(self) -> int:
        """How many columns the page is sorted by."""
        return sum(1 for header in self.headers if header["sortable"] and header["sorted"])

    @cached_property
    def rows(self) -> SafeString:
        return cast(RequestLogAdmin, self.model_admin).rows(self)

    @cached_property
    def date_drilldown(self) -> dict[str, Any]:
        """What Django's date hierarchy shows (its template's context), from the daily
        rollups and the log's first and last rows (the ends of an index) rather than
        DISTINCT dates over the log: the years, months or days the log holds requests
        of, before other filters."""
        span = RequestLog.objects.aggregate(first=Min("created_at"), last=Max("created_at"))
        if span["first"] is None:
            return {"show": False}
        first, last = (timezone.localtime(span[end]).date() for end in ("first", "last"))
        asked = [self.params.get(f"created_at__{part}") for part in ("year", "month", "day")]
        if not any(asked) and first.year == last.year:  # as Django opens it
            asked[:2] = [str(first.year), str(first.month) if first.month == last.month else None]
        try:
            year, month, day = (int(part) if part else None for part in asked)
            if year and month and day:
                chosen = datetime.date(year, month, day)
                back = {"link": self._link(year, month), "title": self._month(chosen)}
                choices = [{"title": capfirst(date_format(chosen, "MONTH_DAY_FORMAT"))}]
            elif year and month:
                start = datetime.date(year, month, 1)
                end = (start + datetime.timedelta(days=31)).replace(day=1)
                back = {"link": self._link(year), "title": str(year)}
                choices = [
                    {
                        "link": self._link(year, month, one.day),
                        "title": capfirst(date_format(one, "MONTH_DAY_FORMAT")),
                    }
                    for one in self._logged(max(start, first), end - datetime.timedelta(days=1))
                ]
            elif year:
                days = self._logged(
                    max(datetime.date(year, 1, 1), first), datetime.date(year, 12, 31)
                )
                back = {"link": self._link(), "title": gettext("All dates")}
                choices = [
                    {"link": self._link(year, one.month), "title": self._month(one)}
                    for one in sorted({one.replace(day=1) for one in days})
                ]
            else:
                back = None
                years = range(first.year, last.year + 1)
                choices = [{"link": self._link(one), "title": str(one)} for one in years]
        except ValueError:  # not a date: ChangeList has refused the filter already
            return {"show": False}
        return {"show": True, "back": back, "choices": choices}

    def _link(self, *parts: int) -> str:
        names = [f"created_at__{part}" for part in ("year", "month", "day")]
        chosen = dict(zip(names, map(str, parts), strict=False))
        return self.get_query_string(chosen, ["created_at__"])

    @staticmethod
    def _month(day: datetime.date) -> str:
        return capfirst(date_format(day, "YEAR_MONTH_FORMAT"))

    @staticmethod
    def _logged(since: datetime.date, until: datetime.date) -> list[datetime.date]:
        """The days from ``since`` to ``until`` with requests, from the daily rollups."""
        days = DailyAliasUsage.objects.filter(day__gte=since, day__lte=until).order_by("day")
        return list(days.values_list("day", flat=True).distinct())


# What the response cache did, under a row's status (nothing without one).
CACHE_SHOWN = {
    state: f'<div class="chatparity-muted">cache {label}</div>'
    for state, label in CacheState.choices
}
# The list's short names of the endpoints (the row's page has the paths).
ENDPOINT_NAMES: dict[str, str] = {
    Endpoint.CHAT_COMPLETIONS: "chat", Endpoint.RESPONSES: "responses",
    Endpoint.MESSAGES: "messages", Endpoint.EMBEDDINGS: "embeddings",
}  # fmt: skip


def local_time(moment: datetime.datetime) -> SafeString:
    """A changelist's time of day in the site's time zone, and below it the day unless
    it is today: a strftime, not a locale's formats (the year is the date drill-down's)."""
    local = timezone.localtime(moment)
    if local.date() == timezone.localdate():
        return mark_safe(local.strftime("%H:%M:%S"))
    return mark_safe(local.strftime('%H:%M:%S<div class="chatparity-muted">%m-%d</div>'))


def latency(ms: float | None) -> str:
    """A latency as people read it, to three significant digits at most: ``0.4 ms``,
    ``8.2 ms``, ``245 ms``, then seconds, ``1.68 s``, ``12.0 s``, ``123 s``; a dash when
    it was not measured. (Each unit from where the one below would round to ten of it.)"""
    if ms is None:
        return "—"
    if ms < 9.95:
        return f"{ms:.1f} ms"
    if ms < 999.5:
        return f"{ms:.0f} ms"
    seconds = ms / 1000
    if seconds < 9.995:
        return f"{seconds:.2f} s"
    return f"{seconds:.1f} s" if seconds < 99.95 else f"{seconds:,.0f} s"


@admin.register(RequestLog)
class RequestLogAdmin(admin.ModelAdmin):
    """The request log, fast at millions of rows: every filter and search uses an index
    (chatparity.models.RequestLog.Meta.indexes); filter choices come from the keys, the
    aliases and a fixed list of statuses; nothing counts or lists DISTINCT values over
    the whole log (docs/history.md)."""

    # Seven columns that fit 1280 px beside the admin's sidebars, written by the methods
    # below with the standard library's escape, not a template or a locale's formats,
    # and a page of them at once (RequestLogChangeList.rows): the page's rendering was
    # 0.73 s of 1.02 at 100 rows of 14 columns (issue 38). The row's page has every field.
    list_display = ["time", "key", "served", "outcome", "tokens", "first_token", "duration"]
    # The latencies on the row's page too as the list shows them (latency()).
    exclude = ["time_to_first_token_ms", "duration_ms"]
    readonly_fields = ["first_token", "duration"]
    list_filter = [
        "endpoint", "api_key", AliasFilter, StatusFilter, "stream", "cancelled",
        "usage_counted", "created_at",
    ]  # fmt: skip
    search_fields = ["request_id__exact", "completion_id__exact"]
    search_help_text = "A request id (x-request-id) or a completion id, exactly."
    date_hierarchy = "created_at"
    show_full_result_count = False
    show_facets = admin.ShowFacets.NEVER
    actions = ["export_csv"]

    class Media:
        css = {"all": ["chatparity/admin/changelists.css"]}

    def action_checkbox(self, row: RequestLog) -> SafeString:
        """The row's box for actions, as Django's but not rendered by a widget's template
        (a quarter of the page's time)."""
        return mark_safe(
            f'<input type="checkbox" name="{helpers.ACTION_CHECKBOX_NAME}" value="{row.pk}"'
            f' class="action-select" aria-label="Select request {escape(row.request_id)}">'
        )

    @admin.display(description="time", ordering="created_at")
    def time(self, row: RequestLog) -> SafeString:
        return local_time(row.created_at)

    @admin.display(description="key", ordering="key_prefix")
    def key(self, row: RequestLog) -> SafeString:
        return mark_safe(escape(row.key_prefix))

    @admin.display(description="alias", ordering="alias")
    def served(self, row: RequestLog) -> SafeString:
        """The alias asked for, and below it the endpoint, streamed or not."""
        endpoint = ENDPOINT_NAMES.get(row.endpoint) or escape(row.endpoint)
        stream = " · stream" if row.stream else ""
        return mark_safe(
            f'{escape(row.alias) or "—"}<div class="chatparity-muted">{endpoint}{stream}</div>'
        )

    @admin.display(description="status", ordering="status_code")
    def outcome(self, row: RequestLog) -> SafeString:
        """The status and what ended the request: the error (breakable at its
        underscores), a hang-up, or the finish reasons; below it what the response cache
        did, if the alias has one."""
        if row.error_type:
            shown = "_<wbr>".join(escape(row.error_type).split("_"))
            detail = f'<span title="{escape(row.error_code)}">{shown}</span>'
        else:
            detail = "cancelled" if row.cancelled else escape(", ".join(row.finish_reasons))
        cache = CACHE_SHOWN.get(row.cache, "")
        return mark_safe(f"{row.status_code} {detail}{cache}")

    @admin.display(description="tokens in → out", ordering="total_tokens")
    def tokens(self, row: RequestLog) -> SafeString:
        return mark_safe(f"{row.prompt_tokens:,} → {row.completion_tokens:,}")

    @admin.display(description="first token", ordering="time_to_first_token_ms")
    def first_token(self, row: RequestLog) -> SafeString:
        return mark_safe(latency(row.time_to_first_token_ms))

    @admin.display(description="duration", ordering="duration_ms")
    def duration(self, row: RequestLog) -> SafeString:
        return mark_safe(latency(row.duration_ms))

    def rows(self, cl: ChangeList) -> SafeString:
        """The page's rows as Django's changelist writes them (the first cell a link to
        the row's page, keeping the list's filters), each cell by its method above."""
        change = reverse(f"{self.admin_site.name}:chatparity_requestlog_change", args=[0])
        before, after = change.rsplit("/0/", 1)
        kept = f"?{escape(cl.preserved_filters)}" if cl.preserved_filters else ""
        shown = [name for name in cl.list_display if isinstance(name, str)]
        boxes = "action_checkbox" in shown
        shown = [name for name in shown if name != "action_checkbox"]
        cells, names = [getattr(self, name) for name in shown], [f"field-{n}" for n in shown]
        written = []
        for row in cl.result_list:
            link = f'<a href="{before}/{row.pk}/{after}{kept}">{cells[0](row)}</a>'
            written.append(
                "<tr>"
                + (f'<td class="action-checkbox">{self.action_checkbox(row)}</td>' if boxes else "")
                + f'<th class="{names[0]}">{link}</th>'
                + "".join(
                    f'<td class="{name}">{cell(row)}</td>'
                    for name, cell in zip(names[1:], cells[1:], strict=True)
                )
                + "</tr>"
            )
        return mark_safe("\n".join(written))

    def get_changelist(self, request: HttpRequest, **kwargs: Any) -> type[ChangeList]:
        return RequestLogChangeList

    def get_paginator(
        self,
        request: HttpRequest,
        queryset: QuerySet[RequestLog],
        per_page: int,
        orphans: int = 0,
        allow_empty_first_page: bool = True,
    ) -> CappedPaginator:
        try:
            page = int(request.GET.get(PAGE_VAR, 1))
        except ValueError:
            page = 1
        return CappedPaginator(queryset, per_page, orphans, allow_empty_first_page, page=page)

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: object = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: object = None) -> bool:
        return False

    @admin.action(description="Export selected rows as CSV", permissions=["view"])
    def export_csv(
        self, request: HttpRequest, queryset: QuerySet[RequestLog]
    ) -> StreamingHttpResponse:
        """The rows as CSV, streamed as they are read: the first bytes leave at once,
        and a busy key's month is never held in memory."""
        chunks = csv_chunks(queryset)
        body = one_by_one(chunks) if isinstance(request, ASGIRequest) else chunks
        response = StreamingHttpResponse(body, content_type="text/csv; charset=utf-8")
        response["Content-Disposition"] = 'attachment; filename="chatparity-requests.csv"'
        return response


def pretty_json(value: Any) -> SafeString:
    """``value`` as indented JSON in a ``<pre>``, escaped: stored responses hold what
    clients and models wrote."""
    return format_html("<pre class='chatparity-json'>{}</pre>", json.dumps(value, indent=2))


@admin.register(StoredResponse)
class StoredResponseAdmin(admin.ModelAdmin):
    """Responses kept for ``/v1/responses`` (``store``): read-only; deleted with the
    delete permission, or when ``RESPONSES_RETENTION`` runs out."""

    list_display = ["id", "key", "owner", "model", "status", "created_at"]
    list_filter = ["status", "created_at"]
    list_select_related = ["api_key", "owner"]
    search_fields = ["=id", "=previous_response_id"]
    date_hierarchy = "created_at"
    fields = readonly_fields = (
        "id", "key", "owner", "previous_response_id", "model", "status", "created_at",
        "input_items_json", "response_json",
    )  # fmt: skip

    @admin.display(description="key", ordering="api_key__prefix")
    def key(self, stored: StoredResponse) -> str:
        if stored.api_key is None:
            return "(deleted key)"
        return f"{stored.api_key.name} ({stored.api_key.prefix}…)"

    @admin.display(description="input items")
    def input_items_json(self, stored: StoredResponse) -> SafeString:
        return pretty_json(stored.input_items)

    @admin.display(description="response")
    def response_json(self, stored: StoredResponse) -> SafeString:
        return pretty_json(stored.response)

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: object = None) -> bool:
        return False
