"""Serializers of the management API: resources, query parameters and report rows."""

from __future__ import annotations

import base64
import datetime
import json
from copy import copy
from typing import Any

from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from django.db.models import QuerySet
from rest_framework import serializers
from rest_framework.exceptions import PermissionDenied
from rest_framework.validators import UniqueValidator

from ..accounting import deployments
from ..accounting.reports import DIMENSIONS, Dimension, LogFilter, cache_read_share
from ..kinds import kinds
from ..models import (
    ApiKey,
    Backend,
    BudgetPeriod,
    Deployment,
    Endpoint,
    ModelAlias,
    Plan,
    RequestLog,
    StoredResponse,
    deployments_problem,
)


class AliasField(serializers.SlugRelatedField[ModelAlias]):
    """A model alias by its public id, matched case-insensitively like the chat API does."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(slug_field="public_id", queryset=ModelAlias.objects.all(), **kwargs)

    def to_internal_value(self, data: Any) -> ModelAlias:
        try:
            return ModelAlias.objects.get(public_id__iexact=str(data))
        except ModelAlias.DoesNotExist:
            self.fail("does_not_exist", slug_name=self.slug_field, value=data)
        except ModelAlias.MultipleObjectsReturned:  # only if the DB constraint is missing
            self.fail("invalid")


class ApiKeySerializer(serializers.ModelSerializer[ApiKey]):
    """An API key without its secret: only the display prefix is ever shown.

    ``all_aliases`` (default true) lets it use every alias; false limits it to
    ``allowed_aliases``, a list of alias public ids, where an empty list means none.
    """

    allowed_aliases = AliasField(
        many=True,
        required=False,
        help_text="With all_aliases false: the public ids of the aliases this key may use.",
    )

    class Meta:
        model = ApiKey
        fields = [
            "id", "name", "prefix", "owner", "is_active", "expires_at", "needs_plan",
            "all_aliases", "allowed_aliases", "requests_per_minute", "tokens_per_minute",
            "max_concurrent", "token_budget", "cost_budget", "budget_period", "created_at",
            "last_used_at",
        ]  # fmt: skip

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        request = self.context.get("request")
        key = self.instance or ApiKey()
        if (
            "owner" in attrs
            and request is not None
            and not key.may_be_given_to(attrs["owner"], request.user)
        ):
            raise PermissionDenied(
                "A key for another user needs the permission to issue keys for other users:"
                " that key would read their stored responses."
            )
        # Before all_aliases, naming aliases was how a key was limited: a client that
        # still does so must not get a key for every alias instead.
        all_aliases = attrs.get("all_aliases", self.instance.all_aliases if self.instance else True)
        ApiKey.check_alias_scope(all_aliases, attrs.get("allowed_aliases", ()))
        return attrs


class ApiKeyCreateSerializer(ApiKeySerializer):
    """A new API key; the response carries its plaintext ``key``, shown this once only."""

    key = serializers.SerializerMethodField(help_text="The plaintext key. It is never shown again.")

    class Meta(ApiKeySerializer.Meta):
        fields = [*ApiKeySerializer.Meta.fields, "key"]

    def create(self, validated_data: dict[str, Any]) -> ApiKey:
        aliases = validated_data.pop("allowed_aliases", [])
        key, self.plaintext = ApiKey.objects.create_key(**validated_data)
        key.allowed_aliases.set(aliases)
        return key

    def get_key(self, key: ApiKey) -> str:
        return self.plaintext


class ModelAliasSerializer(serializers.ModelSerializer[ModelAlias]):
    """A public model id mapped to a backend.

    ``backend`` is the backend's unique **name** (not its id), in requests and responses.
    ``public_id`` is unique case-insensitively.
    """

    backend = serializers.SlugRelatedField[Backend](
        slug_field="name", queryset=Backend.objects.all(), help_text="The backend's name."
    )

    class Meta:
        model = ModelAlias
        fields = [
            "id", "public_id", "backend", "model", "default_params", "fallbacks", "max_n",
            "forwarded_params", "cache_breakpoints", "enabled", "listed", "owned_by",
            "context_window", "description", "requests_per_minute", "tokens_per_minute",
            "input_price", "output_price", "cached_input_price", "cache_write_5m_price",
            "cache_write_1h_price", "response_cache", "created_at", "routing",
            "sticky_sessions",
        ]  # fmt: skip
        extra_kwargs = {
            "public_id": {
                "validators": [
                    UniqueValidator(
                        queryset=ModelAlias.objects.all(),
                        lookup="iexact",
                        message="An alias with this public id already exists (case-insensitively).",
                    )
                ]
            }
        }

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        """``ModelAlias.clean()``, which DRF does not call: default parameters, fallbacks,
        forwarded parameters and ``max_n`` refused with the field at fault."""
        alias = copy(self.instance) if self.instance is not None else ModelAlias()
        for name, value in attrs.items():
            setattr(alias, name, value)
        alias.clean()
        return attrs


class DeploymentSerializer(serializers.ModelSerializer[Deployment]):
    """A deployment of an alias: ``alias`` by its public id, ``backend`` by its name.

    The alias's own deployment (``primary``) is made with the alias and follows its
    backend and model (change them on the alias); it is never deleted here. A change
    that would leave the alias without a deployment to serve it (none enabled with a
    weight above 0), or a tier without a deployment, is a 400 that says what to change.
    ``state`` is the deployment's state now, shared by every worker.
    """

    alias = AliasField(help_text="The alias's public id.")
    backend = serializers.SlugRelatedField[Backend](
        slug_field="name", queryset=Backend.objects.all(), help_text="The backend's name."
    )
    state = serializers.SerializerMethodField()

    class Meta:
        model = Deployment
        fields = [
            "id", "alias", "backend", "model", "name", "weight", "tier", "requests_per_minute",
            "tokens_per_minute", "max_in_flight", "enabled", "primary", "state",
        ]  # fmt: skip
        read_only_fields = ["primary"]

    def get_state(self, deployment: Deployment) -> dict[str, Any] | None:
        """``in_flight``, ``cooling_until`` (ISO time, or null), ``half_open``,
        ``failures`` (in a row), ``error_share`` (of ``requests`` over the failure
        window), ``first_token_p50_ms``; null while the counters cannot be read."""
        snapshot = self.context.get("snapshots", {}).get(deployment.alias_id)
        if snapshot is None:
            return None
        health = snapshot.health.get(deployments.scope(deployment), deployments.HEALTHY)
        cooling = health.cooling(snapshot.now)
        return {
            "in_flight": health.in_flight,
            "cooling_until": datetime.datetime.fromtimestamp(
                health.cooling_until, datetime.UTC
            ).isoformat()
            if cooling
            else None,
            "half_open": health.half_open,
            "failures": health.failures,
            "requests": health.requests,
            "error_share": health.error_share,
            "first_token_p50_ms": deployments.percentile(health.samples, 50),
        }

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        """``Deployment.clean()``, then the alias's deployments as they would be."""
        deployment = copy(self.instance) if self.instance is not None else Deployment()
        if deployment.primary and {"backend", "model", "alias"} & {
            name for name, value in attrs.items() if value != getattr(deployment, name)
        }:
            raise serializers.ValidationError(
                "This is the alias's own deployment: change its backend and model on the alias."
            )
        for name, value in attrs.items():
            setattr(deployment, name, value)
        deployment.clean()
        check_group(deployment.alias, deployment)
        return attrs


def check_group(alias: ModelAlias, changed: Deployment | None, *, deleted: bool = False) -> None:
    """Refuse (a 400) ``alias``'s deployments with ``changed`` saved (or ``deleted``)
    when they could not serve it, saying what to change."""
    group = [d for d in alias.deployments.all() if changed is None or d.pk != changed.pk]
    if changed is not None and not deleted:
        group.append(changed)
    problem = deployments_problem(group)
    if problem:
        raise serializers.ValidationError(problem)


class PlanSerializer(serializers.ModelSerializer[Plan]):
    """A plan: who has it, the aliases its users' keys may use, the limits of each key
    they make in the portal, and the budgets all of one user's keys share.

    ``users`` are user ids (given it directly, before any plan of their groups),
    ``groups`` group names; ``all_aliases`` (default true) lets their keys use every
    alias, false only ``allowed_aliases`` (public ids; an empty list means none).
    """

    users = serializers.PrimaryKeyRelatedField[Any](
        many=True,
        required=False,
        queryset=get_user_model()._default_manager.all(),
        help_text="Ids of the users given it directly.",
    )
    groups = serializers.SlugRelatedField[Group](
        many=True,
        required=False,
        slug_field="name",
        queryset=Group.objects.all(),
        help_text="Names of the groups whose members have it.",
    )
    allowed_aliases = AliasField(
        many=True,
        required=False,
        help_text="With all_aliases false: the public ids of the only aliases its users'"
        " keys may use.",
    )
    # Labelled apart from a key's budget_period: the schema's two enums are then two
    # named choice sets, not one set under two names (which drf-spectacular warns of).
    owner_budget_period = serializers.ChoiceField(
        choices=[
            (period, f"{label}, all of one user's keys") for period, label in BudgetPeriod.choices
        ],
        default=BudgetPeriod.MONTH,
        help_text="The period of the owner budgets.",
    )

    class Meta:
        model = Plan
        fields = [
            "id", "name", "description", "users", "groups", "priority", "all_aliases",
            "allowed_aliases", *Plan.KEY_LIMITS, "owner_token_budget", "owner_cost_budget",
            "owner_budget_period", "created_at", "updated_at",
        ]  # fmt: skip

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        """Every alias or those selected, never both by mistake (as in the admin)."""
        plan = self.instance
        every = attrs.get("all_aliases", plan.all_aliases if plan is not None else True)
        if "allowed_aliases" in attrs:
            selected = bool(attrs["allowed_aliases"])
        else:
            selected = plan is not None and plan.allowed_aliases.exists()
        if every and selected:
            raise serializers.ValidationError(
                {
                    "allowed_aliases": "Set all_aliases to false to limit the plan to these"
                    " aliases, or select none."
                }
            )
        return attrs


# Fields that decide where a backend's secret is sent.
SECRET_GOES_TO = ("kind", "base_url")


class BackendSerializer(serializers.ModelSerializer[Backend]):
    """A backend. ``secret`` is write-only: omit it on update to keep it, send "" to clear it."""

    has_secret = serializers.SerializerMethodField()

    class Meta:
        model = Backend
        fields = [
            "id", "name", "kind", "base_url", "secret", "has_secret", "options", "timeout",
            "enabled", "updated_at",
        ]  # fmt: skip
        extra_kwargs = {"secret": {"write_only": True}}

    def get_fields(self) -> dict[str, serializers.Field[Any, Any, Any, Any]]:
        fields = super().get_fields()
        # The kinds CHATPARITY["BACKEND_CLASSES"] configures as the settings say now (a
        # site's own too), not as they were when this class was made.
        fields["kind"] = serializers.ChoiceField(
            choices=kinds(),
            required=False,
            help_text=Backend._meta.get_field("kind").help_text,
        )
        return fields

    def get_has_secret(self, backend: Backend) -> bool:
        return bool(backend.secret)

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        """``Backend.clean()``, which DRF does not call (its kind, base URL, options and
        timeout); a stored secret sent somewhere new only when it comes with the change."""
        backend = copy(self.instance) if self.instance is not None else Backend()
        # Else whoever may change a backend could point it at a server of theirs and
        # receive the secret they may not read.
        moved = [
            name
            for name in SECRET_GOES_TO
            if attrs.get(name, getattr(backend, name)) != getattr(backend, name)
        ]
        if moved and backend.secret and "secret" not in attrs:
            raise serializers.ValidationError(
                {
                    "secret": f'Send the secret again (or "" to clear it) with a new'
                    f" {' and '.join(moved)}: the stored one never goes to a new place unasked."
                }
            )
        for name, value in attrs.items():
            setattr(backend, name, value)
        backend.clean()
        return attrs


class RequestLogSerializer(serializers.ModelSerializer[RequestLog]):
    """One request log row; ``api_key`` is the key's id (null once the key is deleted)."""

    class Meta:
        model = RequestLog
        fields = "__all__"


def exact_matches(params: dict[str, Any], columns: dict[str, str]) -> dict[str, Any]:
    """Lookups for the query parameters given: ``columns`` maps each parameter to its lookup."""
    return {column: params[param] for param, column in columns.items() if param in params}


class StoredResponseSerializer(serializers.ModelSerializer[StoredResponse]):
    """A response of ``/v1/responses`` kept with ``store``; ``api_key`` is the key's id
    and ``key_prefix`` its prefix (both null once the key is deleted)."""

    key_prefix = serializers.CharField(source="api_key.prefix", default=None, read_only=True)

    class Meta:
        model = StoredResponse
        fields = [
            "id", "api_key", "key_prefix", "owner", "previous_response_id", "model", "status",
            "created_at",
        ]  # fmt: skip
        read_only_fields = fields


class StoredResponseDetailSerializer(StoredResponseSerializer):
    """A stored response with its input items and the response object the client received."""

    class Meta(StoredResponseSerializer.Meta):
        fields = [*StoredResponseSerializer.Meta.fields, "input_items", "response"]
        read_only_fields = fields


class StoredResponseFilterSerializer(serializers.Serializer[Any]):
    """Query parameters of `responses/`: exact matches, all optional."""

    key = serializers.CharField(required=False, help_text="Key prefix, as shown in `keys/`.")
    model = serializers.CharField(required=False, help_text="The model id the client asked for.")
    status = serializers.CharField(required=False, help_text="completed, incomplete, failed, ...")
    previous_response_id = serializers.CharField(
        required=False, help_text="The responses that continued this one."
    )

    # query parameter -> StoredResponse lookup
    COLUMNS = {
        "key": "api_key__prefix",
        "model": "model",
        "status": "status",
        "previous_response_id": "previous_response_id",
    }

    def filter_rows(self, rows: QuerySet[StoredResponse]) -> QuerySet[StoredResponse]:
        """``rows`` narrowed by the validated parameters."""
        return rows.filter(**exact_matches(self.validated_data, self.COLUMNS))


class LogFilterSerializer(serializers.Serializer[LogFilter]):
    """Query parameters choosing log rows, as
    :class:`~chatparity.accounting.reports.LogFilter` does."""

    since = serializers.DateField(required=False, help_text="First day (UTC), inclusive.")
    until = serializers.DateField(required=False, help_text="Last day (UTC), inclusive.")
    key = serializers.CharField(required=False, help_text="Key prefix, as shown in `keys/`.")
    alias = serializers.CharField(required=False, help_text="Alias, case-insensitively.")
    endpoint = serializers.ChoiceField(
        choices=Endpoint.choices, required=False, help_text="The /v1 endpoint served."
    )

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        since, until = attrs.get("since"), attrs.get("until")
        if since is not None and until is not None and since > until:
            raise serializers.ValidationError({"until": "Must not be before since."})
        return attrs

    def log_filter(self) -> LogFilter:
        """The filter the validated parameters ask for."""
        data = self.validated_data
        return LogFilter(
            since=data.get("since"),
            until=data.get("until"),
            key_prefix=data.get("key", ""),
            alias=data.get("alias", ""),
            endpoint=data.get("endpoint", ""),
        )

    def filter_rows(self, rows: QuerySet[RequestLog]) -> QuerySet[RequestLog]:
        """``rows`` narrowed by the validated parameters."""
        return self.log_filter().apply(rows)


class RequestLogFilterSerializer(LogFilterSerializer):
    """Query parameters of `logs/`: those of the reports plus exact column matches."""

    status = serializers.IntegerField(
        required=False, min_value=100, max_value=599, help_text="HTTP status code."
    )
    stream = serializers.BooleanField(required=False, help_text="true or false.")
    cancelled = serializers.BooleanField(required=False, help_text="true or false.")

    # query parameter -> RequestLog field
    COLUMNS = {"status": "status_code", "stream": "stream", "cancelled": "cancelled"}

    def filter_rows(self, rows: QuerySet[RequestLog]) -> QuerySet[RequestLog]:
        return super().filter_rows(rows).filter(**exact_matches(self.validated_data, self.COLUMNS))


class UsageFilterSerializer(LogFilterSerializer):
    """Query parameters of `usage/`: the log filters, the dimensions to group by and the
    page (`limit` groups, after the `cursor` of the page before's ``next``)."""

    DEFAULT_LIMIT = 1000
    MAX_LIMIT = 10_000

    group_by = serializers.CharField(
        default="day",
        help_text=f"Comma-separated subset of {', '.join(DIMENSIONS)}, in any order.",
    )
    limit = serializers.IntegerField(
        default=DEFAULT_LIMIT,
        min_value=1,
        help_text=f"Groups per page, {DEFAULT_LIMIT:,} by default, at most {MAX_LIMIT:,}.",
    )
    cursor = serializers.CharField(
        required=False, help_text="Where the page starts: as the previous page's `next` says."
    )

    def validate_limit(self, value: int) -> int:
        return min(value, self.MAX_LIMIT)

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        attrs = super().validate(attrs)
        if "cursor" in attrs:
            attrs["after"] = read_cursor(attrs["cursor"], attrs["group_by"])
        return attrs

    def validate_group_by(self, value: str) -> list[Dimension]:
        names = [name.strip() for name in value.split(",") if name.strip()]
        unknown = sorted(set(names) - set(DIMENSIONS))
        if unknown or not names:
            raise serializers.ValidationError(
                f"Use a comma-separated subset of {', '.join(DIMENSIONS)}"
                + (f"; unknown: {', '.join(unknown)}." if unknown else ".")
            )
        return [dimension for dimension in DIMENSIONS if dimension in names]


def usage_cursor(position: list[Any], dimensions: list[Dimension]) -> str:
    """The opaque `cursor` of the page after the group at ``position``."""
    text = json.dumps({"group_by": dimensions, "after": position}, default=str)
    return base64.urlsafe_b64encode(text.encode()).decode()


def read_cursor(cursor: str, dimensions: list[Dimension]) -> list[str]:
    """The position a :func:`usage_cursor` holds, if it was made for ``dimensions``."""
    try:
        held = json.loads(base64.urlsafe_b64decode(cursor.encode()))
        position = held["after"]
        valid = held["group_by"] == dimensions and len(position) == len(dimensions)
        valid = valid and all(isinstance(value, str) for value in position)
    except (ValueError, TypeError, KeyError):
        valid = False
    if not valid:
        raise serializers.ValidationError({"cursor": "Not a cursor of this group_by."})
    return list(position)


class UsageRowSerializer(serializers.Serializer[Any]):
    """Totals of one group; only the columns of the requested dimensions are present."""

    day = serializers.DateField(required=False, help_text="With group_by=day.")
    key_prefix = serializers.CharField(required=False, help_text="With group_by=key.")
    key_name = serializers.CharField(
        required=False, help_text="With group_by=key; the prefix if the key was deleted."
    )
    alias = serializers.CharField(required=False, help_text="With group_by=alias.")
    endpoint = serializers.CharField(required=False, help_text="With group_by=endpoint.")
    requests = serializers.IntegerField()
    # The metaclass turns this into a field; Serializer.errors, which it shadows, stays intact.
    errors = serializers.IntegerField()  # type: ignore[assignment]
    cancelled = serializers.IntegerField()
    prompt_tokens = serializers.IntegerField(
        help_text="Every input token, cache reads and writes included."
    )
    completion_tokens = serializers.IntegerField()
    total_tokens = serializers.IntegerField()
    cached_tokens = serializers.IntegerField(
        help_text="Prompt tokens read from the provider's prompt cache."
    )
    cache_write_5m_tokens = serializers.IntegerField(
        help_text="Prompt tokens written to the provider's prompt cache for 5 minutes."
    )
    cache_write_1h_tokens = serializers.IntegerField(
        help_text="Prompt tokens written to the provider's prompt cache for an hour."
    )
    cache_read_share = serializers.SerializerMethodField(
        help_text="cached_tokens / prompt_tokens; null without prompt tokens."
    )
    cost = serializers.DecimalField(
        max_digits=20, decimal_places=8, help_text="USD, at the aliases' prices."
    )

    def get_cache_read_share(self, row: dict[str, Any]) -> float | None:
        return cache_read_share(row["cached_tokens"], row["prompt_tokens"])


class UsagePageSerializer(serializers.Serializer[Any]):
    """One page of `usage/`: its groups in order and the link to the next page."""

    next = serializers.URLField(allow_null=True, help_text="The next page; null on the last.")
    results = UsageRowSerializer(many=True)


class LatencyRowSerializer(serializers.Serializer[Any]):
    """Latency of one alias, in milliseconds: percentiles read from the daily rollups'
    histograms, within 10% of the true value from 5 ms up (docs/history.md)."""

    alias = serializers.CharField()
    requests = serializers.IntegerField()
    error_rate = serializers.FloatField()
    p50_ms = serializers.FloatField(allow_null=True)
    p95_ms = serializers.FloatField(allow_null=True)
    ttft_p50_ms = serializers.FloatField(allow_null=True, help_text="Time to first token.")
    ttft_p95_ms = serializers.FloatField(allow_null=True, help_text="Time to first token.")


class DeploymentLatencyRowSerializer(LatencyRowSerializer):
    """Latency of one deployment of an alias, as :class:`LatencyRowSerializer` says it."""

    deployment = serializers.CharField(help_text="The deployment that served the requests.")
