"""The audit trail in the admin: read by staff holding its view permission, changed by nobody."""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.contrib.contenttypes.models import ContentType
from django.db.models import QuerySet
from django.http import HttpRequest
from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString

from ..admin import local_time
from .models import AuditEntry
from .recording import followed


class ObjectTypeFilter(admin.SimpleListFilter):
    """The models followed (a fixed list: no query over the entries to find them)."""

    title = "object type"
    parameter_name = "type"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return [
            (model._meta.model_name or "", str(model._meta.verbose_name)) for model in followed()
        ]

    def queryset(
        self, request: HttpRequest, queryset: QuerySet[AuditEntry]
    ) -> QuerySet[AuditEntry]:
        for model in followed():
            if self.value() == model._meta.model_name:
                return queryset.filter(content_type=ContentType.objects.get_for_model(model))
        return queryset


@admin.register(AuditEntry)
class AuditEntryAdmin(admin.ModelAdmin):  # type: ignore[type-arg]
    # Three columns that fit 1280 px beside the admin's sidebars (the entry's page has
    # every field).
    list_display = ["time", "who", "change"]
    list_filter = ["source", "action", ObjectTypeFilter, "created_at"]
    list_select_related = ["content_type"]
    search_fields = ["=object_id", "actor_name", "object_repr"]
    date_hierarchy = "created_at"
    show_full_result_count = False
    fields = readonly_fields = (
        "created_at", "who", "source", "ip", "action", "content_type", "object_id",
        "object_repr", "changed_fields",
    )  # fmt: skip

    class Media:
        css = {"all": ["chatparity/admin/changelists.css"]}

    @admin.display(description="time", ordering="created_at")
    def time(self, entry: AuditEntry) -> str:
        return local_time(entry.created_at)

    @admin.display(description="who", ordering="actor_name")
    def who(self, entry: AuditEntry) -> str:
        """The user or command, and below it where from."""
        return format_html(
            '{}<div class="chatparity-muted">{}{}</div>',
            entry.actor_name or "—",
            entry.get_source_display(),
            f" · {entry.ip}" if entry.ip else "",
        )

    @admin.display(description="change")
    def change(self, entry: AuditEntry) -> str:
        """What was done to which object: ``changed API key: laptop (sk-cp-AbCd…)``."""
        return format_html(
            "{} {}: {}",
            entry.get_action_display(),
            entry.content_type.name,
            entry.object_repr,
        )

    @admin.display(description="changes")
    def changed_fields(self, entry: AuditEntry) -> SafeString:
        rows = format_html_join(
            "",
            "<tr><th>{}</th><td>{}</td><td>{}</td></tr>",
            (
                (field, _text(values.get("before")), _text(values.get("after")))
                for field, values in entry.changes.items()
            ),
        )
        return format_html(
            "<table class='chatparity-changes'><thead><tr><th>field</th><th>before</th>"
            "<th>after</th></tr></thead><tbody>{}</tbody></table>",
            rows,
        )

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: object = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: object = None) -> bool:
        return False


def _text(value: Any) -> str:
    if value is None:
        return "—"
    if isinstance(value, list):
        return ", ".join(map(str, value)) or "(none)"
    return str(value)
