"""Admin for keys, backends, aliases and the request log."""

from __future__ import annotations

from django.contrib import admin

from .models import ApiKey, Backend, ModelAlias, RequestLog


@admin.register(ApiKey)
class ApiKeyAdmin(admin.ModelAdmin):
    list_display = ["name", "prefix", "is_active", "created_at", "last_used_at"]
    search_fields = ["name", "prefix"]
    readonly_fields = ["prefix", "created_at", "last_used_at"]


@admin.register(Backend)
class BackendAdmin(admin.ModelAdmin):
    list_display = ["name", "kind", "base_url", "enabled"]
    exclude = ["secret"]


@admin.register(ModelAlias)
class ModelAliasAdmin(admin.ModelAdmin):
    list_display = ["public_id", "backend", "model", "enabled", "listed"]
    search_fields = ["public_id", "model"]


@admin.register(RequestLog)
class RequestLogAdmin(admin.ModelAdmin):
    list_display = ["created_at", "key_prefix", "alias", "status_code", "stream", "total_tokens"]
    date_hierarchy = "created_at"

    def has_add_permission(self, request: object) -> bool:
        return False

    def has_change_permission(self, request: object, obj: object = None) -> bool:
        return False
