"""API keys, backends, model aliases and their deployments, and the request log."""

from __future__ import annotations

import hashlib
import math
import secrets
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from decimal import Decimal
from functools import cached_property
from typing import Any, TypeVar, cast

from django.conf import settings
from django.core.exceptions import FieldDoesNotExist, ValidationError
from django.db import models, transaction
from django.db.models.functions import Lower
from django.utils import timezone

from .conf import app_settings
from .encryption import EncryptedTextField
from .kinds import backend_class, config_errors, price_provider
from .protocol.caching import parse_cache_options
from .protocol.errors import APIError
from .protocol.events import Usage
from .protocol.request import parse_chat_request
from .protocol.upstream import check_forwarded_params
from .signals import rows_updated

_M = TypeVar("_M", bound=models.Model)


class BudgetPeriod(models.TextChoices):
    DAY = "day", "per day (UTC)"
    MONTH = "month", "per month (UTC)"


def _limit(help_text: str) -> models.PositiveIntegerField[int | None, int | None]:
    return models.PositiveIntegerField(null=True, blank=True, help_text=help_text)


def _price(help_text: str) -> models.DecimalField[Decimal | None, Decimal | None]:
    return models.DecimalField(
        max_digits=12, decimal_places=6, null=True, blank=True, help_text=help_text
    )


def _response_cache(whose: str) -> models.BooleanField[bool, bool]:
    return models.BooleanField(
        "response cache",
        default=True,
        help_text=f"Off: {whose} requests are never answered from the response cache nor"
        " kept in it, whatever their alias says.",
    )


def refused(errors: dict[str, str]) -> ValidationError:
    """A ValidationError with one message per field."""
    # Not code "invalid": a model form would show its field's own message for that code.
    return ValidationError(
        {field: ValidationError(message, code="refused") for field, message in errors.items()}
    )


MILLION = Decimal(1_000_000)  # prices are per million tokens
COST_PRECISION = Decimal("1e-8")
"""A cost's precision in the log and its rollups (USD): a row's cost is rounded to it."""


@dataclass(frozen=True)
class Prices:
    """An alias's prices in USD per million tokens, blanks filled in: what a request
    through it costs (:meth:`cost_of`)."""

    input: Decimal
    output: Decimal
    cached_input: Decimal
    cache_write_5m: Decimal
    cache_write_1h: Decimal

    def cost_of(self, usage: Usage) -> Decimal:
        """USD for ``usage``, by the providers' formula: the prompt tokens neither read
        from nor written to the cache at the input price, reads at the cached input
        price, writes at their lifetime's price, and the completion (reasoning tokens
        are part of it, as OpenAI and Anthropic count them) at the output price."""
        # Cache tokens past the prompt (an upstream's numbers gone wrong) are priced as
        # they are, never as a credit on the rest.
        uncached = max(usage.prompt_tokens - usage.cached_tokens - usage.cache_write_tokens, 0)
        return (
            uncached * self.input
            + usage.cached_tokens * self.cached_input
            + usage.cache_write_5m_tokens * self.cache_write_5m
            + usage.cache_write_1h_tokens * self.cache_write_1h
            + usage.completion_tokens * self.output
        ) / MILLION

    def dearest(self, prompt_tokens: int, completion_tokens: int) -> Usage:
        """The usage of this many tokens that costs the most: every prompt token of the
        dearest kind of input (a cache write, at the usual prices). What a request can
        be charged at most, whatever its upstream reports of its cache."""
        kinds = {
            "cache_write_1h_tokens": self.cache_write_1h,
            "cache_write_5m_tokens": self.cache_write_5m,
            "cached_tokens": self.cached_input,
        }
        kind = max(kinds, key=kinds.__getitem__)
        if kinds[kind] <= self.input:
            return Usage(prompt_tokens, completion_tokens)
        dearest: dict[str, Any] = {kind: prompt_tokens}
        return Usage(prompt_tokens, completion_tokens, **dearest)

    @cached_property
    def journalled(self) -> tuple[str, ...]:
        """These prices as a journal keeps them (:meth:`from_journal` reads them back):
        once per alias, not per request."""
        return tuple(map(str, (self.input, self.output, self.cached_input,
                               self.cache_write_5m, self.cache_write_1h)))  # fmt: skip

    @classmethod
    def from_journal(cls, prices: Sequence[str]) -> Prices:
        """The prices :meth:`journalled` wrote; an older journal's two (input, output)
        price every input token at the input price."""
        if len(prices) == 2:
            prices = [prices[0], prices[1], prices[0], prices[0], prices[0]]
        return cls(*map(Decimal, prices))


# What a blank cache price is, by the provider whose rules the alias's backend bills by
# (kinds.price_provider): a multiple of the input price (cached input, 5-minute write,
# 1-hour write). Anthropic publishes these multipliers for every model; OpenAI's cached
# input is half the input price at most (gpt-4o, o1; a quarter for gpt-4.1, o3, o4-mini; a
# tenth for gpt-5), and it bills no premium for writing it; a backend of no provider's
# (the local model, a program) prices every input token alike.
CACHE_PRICE_RATIOS: dict[str | None, tuple[Decimal, Decimal, Decimal]] = {
    "anthropic": (Decimal("0.1"), Decimal("1.25"), Decimal(2)),
    "openai": (Decimal("0.5"), Decimal(1), Decimal(1)),
    None: (Decimal(1), Decimal(1), Decimal(1)),
}

STAMPS = frozenset({"last_used_at"})
"""Fields chatparity stamps itself, changed by no one (neither audited nor announced)."""
# Rows whose values an update() reads before and after at a time: an IN list a
# database takes whole.
UPDATED_AT_ONCE = 500


class AuditedQuerySet(models.QuerySet[_M]):
    """A queryset whose ``update()`` (and so ``bulk_update()``) announces what it changed
    (:data:`chatparity.signals.rows_updated`), as ``save()`` does with ``post_save``:
    the audit trail records a change made in bulk like one saved. ``delete()`` needs
    nothing: Django sends ``post_delete`` for each row while anyone listens."""

    def update(self, **kwargs: Any) -> int:
        if self.query.is_sliced:  # as Django refuses it, before anything is read
            raise TypeError("Cannot update a query once a slice has been taken.")
        fields = [self.model._meta.get_field(name) for name in kwargs]
        watched = [
            field.attname  # type: ignore[union-attr]
            for field in fields
            if field.name not in STAMPS and not getattr(field, "auto_now", False)
        ]
        if not watched or not rows_updated.has_listeners(self.model):
            return super().update(**kwargs)
        # The rows as they were, locked until the update commits; then only those are
        # updated (not rows that came to match meanwhile) and read again.
        plain = self.model._base_manager.using(self.db)
        matched = plain.filter(pk__in=self.values("pk"))
        with transaction.atomic(using=self.db, savepoint=False):
            before = {
                row.pop("pk"): row
                for row in matched.select_for_update(of=("self",)).values("pk", *watched)
            }
            updated, after = 0, dict[Any, dict[str, Any]]()
            keys = list(before)
            for start in range(0, len(keys), UPDATED_AT_ONCE):
                rows = plain.filter(pk__in=keys[start : start + UPDATED_AT_ONCE])
                updated += rows.update(**kwargs)
                after.update((row.pop("pk"), row) for row in rows.values("pk", *watched))
            if before:
                rows_updated.send(self.model, before=before, after=after, using=self.db)
        return updated


def hash_key(plaintext: str) -> str:
    return hashlib.sha256(plaintext.encode()).hexdigest()


class ApiKeyManager(models.Manager["ApiKey"]):
    def get_queryset(self) -> AuditedQuerySet[ApiKey]:
        return AuditedQuerySet(self.model, using=self._db)

    def create_key(self, name: str, **fields: Any) -> tuple[ApiKey, str]:
        """Create a key; return it with its plaintext, which is never stored."""
        key = self.model(name=name, **fields)
        plaintext = key.issue()
        key.save(force_insert=True)
        return key, plaintext


class ApiKey(models.Model):
    """A bearer key. Only its SHA-256 and a short display prefix are stored."""

    name = models.CharField(max_length=200)
    prefix = models.CharField(max_length=32, editable=False)
    hashed_key = models.CharField(max_length=64, unique=True, editable=False)
    owner = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL
    )
    is_active = models.BooleanField(default=True)
    expires_at = models.DateTimeField(null=True, blank=True)
    needs_plan = models.BooleanField(
        "needs a plan",
        default=False,
        help_text="Serves only while its owner has a plan, within it (the keys made in the"
        " portal): an owner who loses their plan, or is deleted, loses the key too.",
    )
    all_aliases = models.BooleanField(
        default=True,
        help_text="May use every alias, present and future. Off: only the aliases selected.",
    )
    allowed_aliases: models.ManyToManyField[ModelAlias, Any] = models.ManyToManyField(
        "ModelAlias",
        blank=True,
        related_name="api_keys",
        help_text="Aliases this key may use when 'all aliases' is off; none selected means none.",
    )
    requests_per_minute = _limit("Blank: no limit.")
    tokens_per_minute = _limit("Prompt + completion tokens. Blank: no limit.")
    max_concurrent = _limit("Requests in flight at once. Blank: no limit.")
    token_budget = models.PositiveBigIntegerField(
        null=True, blank=True, help_text="Tokens per budget period. Blank: no budget."
    )
    cost_budget = models.DecimalField(
        max_digits=12,
        decimal_places=4,
        null=True,
        blank=True,
        help_text="USD per budget period, from the aliases' prices. Blank: no budget.",
    )
    budget_period = models.CharField(
        max_length=5, choices=BudgetPeriod.choices, default=BudgetPeriod.MONTH
    )
    response_cache = _response_cache("this key's")
    created_at = models.DateTimeField(auto_now_add=True)
    last_used_at = models.DateTimeField(null=True, blank=True, editable=False)

    objects = ApiKeyManager()

    # The owner's plan, read with the key for a request (accounting.keys): its aliases
    # bound the key's, its owner budgets are reserved with the key's own. Not a column.
    owner_plan: Plan | None = None

    class Meta:
        verbose_name = "API key"
        permissions = [("issue_key_for_others", "Can issue keys for other users")]

    def __str__(self) -> str:
        return f"{self.name} ({self.prefix}…)"

    def save(self, *args: Any, **kwargs: Any) -> None:
        """Save; a key for every alias keeps no selection of aliases, which would serve
        again, unasked, once the key is limited anew."""
        adding = self._state.adding
        super().save(*args, **kwargs)
        fields = kwargs.get("update_fields")
        if (
            self.all_aliases
            and not adding
            and (fields is None or "all_aliases" in fields)
            and self.allowed_aliases.exists()
        ):
            self.allowed_aliases.clear()

    @staticmethod
    def check_alias_scope(all_aliases: bool, aliases: Collection[Any]) -> None:
        """Refuse a key for every alias that names some: ``all_aliases`` decides the
        scope, ``allowed_aliases`` is the scope only without it."""
        if all_aliases and aliases:
            raise ValidationError(
                {
                    "allowed_aliases": "Untick 'all aliases' (all_aliases) to limit the key to"
                    " these aliases, or select none."
                }
            )

    def may_be_given_to(self, owner: Any, by: Any) -> bool:
        """Whether the user ``by`` may make ``owner`` (a user, or None) this key's owner:
        no one, ``by`` themselves or the owner it has; anyone else only with
        ``chatparity.issue_key_for_others``, as a user's key reads, continues and deletes
        that user's stored responses."""
        owner_id = None if owner is None else owner.pk
        if owner_id is None or owner_id in (by.pk, self.owner_id):
            return True
        return bool(by.has_perm(f"{self._meta.app_label}.issue_key_for_others"))

    def issue(self) -> str:
        """Give this (unsaved) key a fresh secret; return its plaintext, shown only now."""
        plaintext = str(app_settings.KEY_PREFIX) + secrets.token_urlsafe(32)
        self.prefix = plaintext[: len(app_settings.KEY_PREFIX) + 4]
        self.hashed_key = hash_key(plaintext)
        return plaintext

    @property
    def is_expired(self) -> bool:
        return self.expires_at is not None and self.expires_at <= timezone.now()


class Backend(models.Model):
    """Where completions come from: the embedded model or an upstream."""

    name = models.CharField(max_length=100, unique=True)
    kind = models.CharField(
        max_length=100,
        default="local",
        help_text='A kind in CHATPARITY["BACKEND_CLASSES"]: local, openai, command or the'
        " site's own.",
    )
    base_url = models.URLField(blank=True)
    secret = EncryptedTextField(blank=True, help_text="Encrypted at rest; never shown.")
    options = models.JSONField(default=dict, blank=True)
    timeout = models.FloatField(default=600.0, help_text="Seconds.")
    enabled = models.BooleanField(default=True)
    updated_at = models.DateTimeField(auto_now=True)

    objects = AuditedQuerySet["Backend"].as_manager()

    def __str__(self) -> str:
        return self.name

    def clean(self) -> None:
        """A configured kind, its base URL and options as its class checks them
        (:func:`chatparity.kinds.config_errors`), a positive timeout."""
        errors = config_errors(self.kind, self.base_url, self.options)
        if self.timeout is not None and not self.timeout > 0:
            errors["timeout"] = "Give the seconds a request may take, more than 0."
        if errors:
            raise refused(errors)


MAX_N = 128
"""OpenAI's most choices (``n``) per request."""

# The request's own: never a default an alias adds.
NOT_DEFAULTS = ("model", "messages", "stream", "stream_options")


def check_default_params(params: Any) -> None:
    """Raise ValueError unless ``params`` are parameters a request could carry
    (``ModelAlias.default_params``), with the message the request would get."""
    if not isinstance(params, dict):
        raise ValueError('Give an object of request parameters, e.g. {"max_tokens": 256}.')
    own = [name for name in NOT_DEFAULTS if name in params]
    if own:
        raise ValueError(f"{', '.join(map(repr, own))}: the request's own, never a default.")
    # Any conversation would do: this one names JSON, so that a json_object
    # response_format is judged on its own.
    messages = [{"role": "user", "content": "Answer in JSON."}]
    try:
        parse_chat_request({**params, "model": "alias", "messages": messages})
    except APIError as error:
        raise ValueError(error.message) from None


class Routing(models.TextChoices):
    """How an alias of several deployments chooses one for a request (docs/routing.md)."""

    WEIGHTED = "weighted", "weighted: in proportion to the weights"
    LEAST_BUSY = "least_busy", "least busy: fewest requests in flight"
    LOWEST_LATENCY = "lowest_latency", "lowest latency: fastest recent time to first token"
    MOST_HEADROOM = "most_headroom", "most headroom: most of its quota left"


class StickySessions(models.TextChoices):
    """Whether a request that names its session goes where the session went last."""

    AUTO = "auto", "when an upstream caches prompts"
    ON = "on", "on"
    OFF = "off", "off"


class ModelAlias(models.Model):
    """A public model id mapped to a backend, an upstream model and defaults; served by
    its deployments (the first of which is its own backend and model)."""

    public_id = models.CharField(max_length=200, help_text="Matched case-insensitively.")
    backend = models.ForeignKey(
        Backend,
        on_delete=models.PROTECT,
        related_name="aliases",
        help_text="Its first deployment's: more deployments may serve it too.",
    )
    model = models.CharField(max_length=200, blank=True, help_text="Effective upstream model.")
    routing = models.CharField(
        max_length=20,
        choices=Routing.choices,
        default=Routing.WEIGHTED,
        help_text="How a request chooses among the deployments of the first tier available.",
    )
    sticky_sessions = models.CharField(
        max_length=4,
        choices=StickySessions.choices,
        default=StickySessions.AUTO,
        help_text="A request naming its session (x-session-id, prompt_cache_key,"
        " metadata.user_id, safety_identifier, user) goes to the deployment that served"
        " the session last while it is healthy and within its quota, so its upstream's"
        " prompt cache stays warm.",
    )
    default_params = models.JSONField(
        default=dict, blank=True, help_text="Request parameters applied when the client omits them."
    )
    fallbacks = models.JSONField(
        default=list,
        blank=True,
        help_text="Public ids of aliases to try in order when this one's backend is"
        " unreachable before answering.",
    )
    max_n = models.PositiveSmallIntegerField(
        null=True,
        blank=True,
        help_text="Most choices (n) one request may ask for."
        ' Blank: CHATPARITY["MAX_N"] for the backend\'s kind.',
    )
    forwarded_params = models.JSONField(
        default=list,
        blank=True,
        help_text="Request parameters passed to an upstream beyond the sampling and format"
        " ones, e.g. service_tier, store, metadata, web_search_options. Others are dropped.",
    )
    cache_breakpoints = models.BooleanField(
        default=False,
        help_text="Mark the tools, the system prompt and the last user turn for the prompt"
        " cache of a Messages upstream (Anthropic's) when a request marks nothing itself.",
    )
    enabled = models.BooleanField(default=True)
    listed = models.BooleanField(default=True, help_text="Shown in /v1/models.")
    owned_by = models.CharField(max_length=100, default="chatparity")
    context_window = models.PositiveIntegerField(null=True, blank=True)
    max_output_tokens = models.PositiveIntegerField(
        null=True,
        blank=True,
        help_text="The model's own cap on completion tokens per choice, reserved for a request"
        " that sets none. Blank: the context window.",
    )
    description = models.TextField(blank=True)
    requests_per_minute = _limit("For each key using this alias. Blank: no limit.")
    tokens_per_minute = _limit("For each key using this alias. Blank: no limit.")
    input_price = models.DecimalField(
        max_digits=12, decimal_places=6, default=0, help_text="USD per million prompt tokens."
    )
    output_price = models.DecimalField(
        max_digits=12, decimal_places=6, default=0, help_text="USD per million completion tokens."
    )
    cached_input_price = _price(
        "USD per million prompt tokens read from the provider's prompt cache. Blank: the"
        " provider's ratio to the input price (Anthropic 0.1, OpenAI 0.5 at most)."
    )
    cache_write_5m_price = _price(
        "USD per million prompt tokens written to the provider's prompt cache for 5 minutes."
        " Blank: the provider's ratio to the input price (Anthropic 1.25, OpenAI 1)."
    )
    cache_write_1h_price = _price(
        "USD per million prompt tokens written to the provider's prompt cache for an hour."
        " Blank: the provider's ratio to the input price (Anthropic 2, OpenAI 1)."
    )
    response_cache = models.JSONField(
        default=dict,
        blank=True,
        help_text='Answers served again to the same request (docs/caching.md), e.g. {"enabled":'
        ' true, "ttl": 3600, "scope": "owner", "nonreproducible": false, "tool_calls": false,'
        ' "semantic": {"threshold": 0.9}}. Empty: off.',
    )
    cache_generation = models.PositiveIntegerField(
        default=0,
        editable=False,
        help_text="Part of every key of its response cache: purging its entries bumps it.",
    )
    created_at = models.DateTimeField(auto_now_add=True)

    objects = AuditedQuerySet["ModelAlias"].as_manager()

    class Meta:
        verbose_name = "model alias"
        verbose_name_plural = "model aliases"
        constraints = [
            models.UniqueConstraint(Lower("public_id"), name="chatparity_alias_public_id_ci"),
        ]

    def __str__(self) -> str:
        return self.public_id

    def save(self, *args: Any, **kwargs: Any) -> None:
        """Save, with its first deployment (``primary``) serving its backend and model."""
        super().save(*args, **kwargs)
        fields = kwargs.get("update_fields")
        if fields is None or {"backend", "backend_id", "model"} & set(fields):
            Deployment.objects.using(self._state.db).update_or_create(
                alias=self, primary=True, defaults={"backend": self.backend, "model": self.model}
            )

    @cached_property
    def provider(self) -> str | None:
        """The provider whose prices its backend's upstream bills by
        (:func:`~chatparity.kinds.price_provider`): None for the local model, a program,
        or an alias without a backend."""
        if self.backend_id is None:
            return None
        return price_provider(self.backend.kind, self.backend.options)

    @cached_property
    def prices(self) -> Prices:
        """Its prices, a blank cache price the provider's ratio to the input price
        (:data:`CACHE_PRICE_RATIOS`)."""
        ratios = CACHE_PRICE_RATIOS.get(self.provider, CACHE_PRICE_RATIOS[None])
        given = (self.cached_input_price, self.cache_write_5m_price, self.cache_write_1h_price)
        input_price = Decimal(self.input_price)
        return Prices(
            input_price,
            Decimal(self.output_price),
            *(
                input_price * ratio if price is None else Decimal(price)
                for price, ratio in zip(given, ratios, strict=True)
            ),
        )

    def cost_of(self, usage: Usage) -> Decimal:
        """USD for ``usage`` at this alias's prices (:meth:`Prices.cost_of`)."""
        return self.prices.cost_of(usage)

    def clean(self) -> None:
        """Default parameters a request could carry, fallbacks naming other aliases,
        parameters to forward that an upstream would not get otherwise, ``max_n``
        within OpenAI's bounds of ``n``."""
        errors = {}
        checks: list[tuple[str, Callable[[], None]]] = [
            ("default_params", lambda: check_default_params(self.default_params)),
            ("fallbacks", self._check_fallbacks),
            ("forwarded_params", lambda: check_forwarded_params(self.forwarded_params)),
            ("response_cache", self._check_response_cache),
        ]
        for field, check in checks:
            try:
                check()
            except ValueError as exc:
                errors[field] = str(exc)
        if self.max_n is not None and not 1 <= self.max_n <= MAX_N:
            errors["max_n"] = f"Give a number of choices from 1 to {MAX_N}, or leave it blank."
        if self.pk is not None and self.backend_id is not None:
            clash = (
                Deployment.objects.db_manager(self._state.db)
                .filter(alias=self, primary=False, backend=self.backend_id, model=self.model)
                .first()
            )
            if clash is not None:
                errors["model"] = (
                    f"Deployment {clash} of this alias serves this backend and model already:"
                    " delete it, or choose another model."
                )
        if errors:
            raise refused(errors)

    def _check_response_cache(self) -> None:
        """Raise ValueError unless the response cache's options are known and in range, and
        a semantic cache's embeddings alias exists."""
        options = parse_cache_options(self.response_cache, app_settings.RESPONSE_CACHE["MAX_TTL"])
        named = options.semantic.embeddings if options.semantic is not None else ""
        if (
            named
            and not ModelAlias.objects.db_manager(self._state.db)
            .filter(public_id__iexact=named)
            .exclude(pk=self.pk)
            .exists()
        ):
            raise ValueError(f"No alias is named {named!r} (semantic.embeddings).")

    def _check_fallbacks(self) -> None:
        """Raise ValueError unless the fallbacks name other aliases, once each."""
        fallbacks = self.fallbacks
        if not isinstance(fallbacks, list) or not all(isinstance(f, str) for f in fallbacks):
            raise ValueError('List the public ids of other aliases, e.g. ["gpt-4o-mini"].')
        named = [fallback.lower() for fallback in fallbacks]
        for fallback, name in zip(fallbacks, named, strict=True):
            if name == self.public_id.lower():
                raise ValueError(f"{fallback!r} is this alias: it cannot fall back to itself.")
            if named.count(name) > 1:
                raise ValueError(f"{fallback!r} is listed twice.")
        found = set(
            ModelAlias.objects.db_manager(self._state.db)
            .exclude(pk=self.pk)
            .annotate(lowered=Lower("public_id"))
            .filter(lowered__in=named)
            .values_list("lowered", flat=True)
        )
        missing = [
            fallback for fallback, name in zip(fallbacks, named, strict=True) if name not in found
        ]
        if missing:
            raise ValueError(f"No alias is named {', '.join(map(repr, missing))}.")


class Deployment(models.Model):
    """One upstream serving an alias: a backend and its model, with a weight, a tier and
    the upstream key's own quota. An alias's first deployment (``primary``) is its own
    backend and model, made and kept with the alias; more may be added."""

    alias = models.ForeignKey(ModelAlias, on_delete=models.CASCADE, related_name="deployments")
    backend = models.ForeignKey(Backend, on_delete=models.PROTECT, related_name="deployments")
    model = models.CharField(
        max_length=200, blank=True, help_text="The upstream model. Blank: the model asked for."
    )
    name = models.CharField(
        max_length=100,
        blank=True,
        help_text="How the log, the dashboard and the metrics name it. Blank: backend/model.",
    )
    weight = models.FloatField(
        default=1.0,
        help_text="Its share of the tier's requests against the others' (fractions honoured):"
        " 0 drains it.",
    )
    tier = models.PositiveSmallIntegerField(
        default=1,
        help_text="Tier 1 serves while any of its deployments is available; tier 2 only"
        " when none is, and so on.",
    )
    requests_per_minute = _limit("Of the upstream key (not any client's). Blank: no limit.")
    tokens_per_minute = _limit("Of the upstream key (not any client's). Blank: no limit.")
    max_in_flight = _limit("Requests it may serve at once. Blank: no limit.")
    enabled = models.BooleanField(default=True)
    primary = models.BooleanField(
        default=False,
        editable=False,
        help_text="The alias's own backend and model, edited on the alias.",
    )

    objects = AuditedQuerySet["Deployment"].as_manager()

    class Meta:
        ordering = ["tier", "-primary", "pk"]
        constraints = [
            models.UniqueConstraint(
                fields=["alias", "backend", "model"], name="chatparity_deployment_once"
            ),
            models.UniqueConstraint(
                fields=["alias"],
                condition=models.Q(primary=True),
                name="chatparity_deployment_one_primary",
            ),
            models.CheckConstraint(
                condition=models.Q(weight__gte=0), name="chatparity_deployment_weight"
            ),
            models.CheckConstraint(
                condition=models.Q(tier__gte=1), name="chatparity_deployment_tier"
            ),
        ]

    def __str__(self) -> str:
        return self.label

    @property
    def label(self) -> str:
        """Its name, else ``backend/model`` (its backend's name alone for no model)."""
        if self.name:
            return self.name
        return f"{self.backend.name}/{self.model}" if self.model else self.backend.name

    @property
    def has_quota(self) -> bool:
        return (
            self.requests_per_minute is not None
            or self.tokens_per_minute is not None
            or self.max_in_flight is not None
        )

    def clean(self) -> None:
        """A finite weight of 0 or more, a tier from 1, a backend serving what the alias's
        own backend serves (chat, embeddings)."""
        errors = {}
        if not (isinstance(self.weight, int | float) and math.isfinite(self.weight)):
            errors["weight"] = "Give a number of 0 or more: 0 drains the deployment."
        elif self.weight < 0:
            errors["weight"] = (
                f"A weight cannot be negative ({self.weight}): give 0 to drain the deployment,"
                " or a positive share."
            )
        if self.tier is not None and self.tier < 1:
            errors["tier"] = "Tiers are numbered from 1 (used first)."
        if self.alias_id is not None and self.backend_id is not None:
            serves = _serves(self.alias.backend.kind)
            if serves and not set(serves) & set(_serves(self.backend.kind)):
                errors["backend"] = (
                    f"Backend {self.backend.name!r} serves neither of what the alias's backend"
                    f" serves ({' nor '.join(serves)}): choose a backend that does."
                )
        if errors:
            raise refused(errors)


def _serves(kind: str) -> tuple[str, ...]:
    """What a backend of ``kind`` serves: ``chat``, ``embeddings`` (none if unknown)."""
    try:
        cls = backend_class(kind)
    except (KeyError, ImportError):
        return ()
    return tuple(name for name, method in (("chat", "stream"), ("embeddings", "embed"))
                 if hasattr(cls, method))  # fmt: skip


def deployments_problem(deployments: Collection[Deployment]) -> str:
    """What is wrong with an alias served by ``deployments`` (enabled or not), in words
    that say what to change; "" when nothing is."""
    serving = [d for d in deployments if d.enabled and d.weight is not None and d.weight > 0]
    if not serving:
        return (
            "No deployment is enabled with a weight above 0: enable one (or give one a"
            " weight), or disable the alias instead."
        )
    tiers = sorted({d.tier for d in deployments if d.tier is not None})
    missing = [tier for tier in range(1, tiers[-1] + 1) if tier not in tiers] if tiers else []
    if missing:
        return (
            f"Tier {missing[0]} has no deployment: number the tiers from 1 without a gap"
            f" (tiers used: {', '.join(map(str, tiers))})."
        )
    return ""


class PlanQuerySet(AuditedQuerySet["Plan"]):
    def for_owner(self, owner_id: int | None) -> Plan | None:
        """The plan of the user ``owner_id``: one given to them, else their groups' plan
        of highest priority (then by name); None without one."""
        if owner_id is None:
            return None
        # Named as the site's user model names them (a model of its own: member, not
        # user), and a user model without groups has plans given to its users only.
        users: Any = Plan._meta.get_field("users")
        given = users.remote_field.through.objects.filter(
            plan=models.OuterRef("pk"), **{users.m2m_reverse_field_name(): owner_id}
        )
        theirs = models.Q(users=owner_id)
        try:
            groups: Any = users.related_model._meta.get_field("groups")
        except FieldDoesNotExist:
            pass
        else:
            theirs |= models.Q(**{f"groups__{groups.related_query_name()}": owner_id})
        plans = self.filter(theirs)
        ordered = plans.annotate(given=models.Exists(given)).order_by("-given", "-priority", "name")
        return ordered.first()


class Plan(models.Model):
    """What staff give users or groups: the limits and budgets of each key its users
    create in the portal, the aliases all their keys may use, and owner budgets that
    all of one user's keys share."""

    KEY_LIMITS = (
        "requests_per_minute", "tokens_per_minute", "max_concurrent", "token_budget",
        "cost_budget", "budget_period",
    )  # fmt: skip

    name = models.CharField(max_length=100, unique=True)
    description = models.TextField(blank=True)
    users: models.ManyToManyField[Any, Any] = models.ManyToManyField(
        settings.AUTH_USER_MODEL,
        blank=True,
        related_name="chatparity_plans",
        help_text="Given to these users directly: before any plan of their groups.",
    )
    groups: models.ManyToManyField[Any, Any] = models.ManyToManyField(
        "auth.Group",
        blank=True,
        related_name="chatparity_plans",
        help_text="Given to the members of these groups.",
    )
    priority = models.PositiveSmallIntegerField(
        default=0, help_text="A user whose groups have several plans gets the highest."
    )
    all_aliases = models.BooleanField(
        default=True, help_text="Its users' keys may use every alias. Off: only those selected."
    )
    allowed_aliases: models.ManyToManyField[ModelAlias, Any] = models.ManyToManyField(
        ModelAlias,
        blank=True,
        related_name="plans",
        help_text="With 'all aliases' off: the only aliases any key of its users may use.",
    )
    requests_per_minute = _limit("Of each key made in the portal. Blank: no limit.")
    tokens_per_minute = _limit("Of each key made in the portal. Blank: no limit.")
    max_concurrent = _limit("Of each key made in the portal. Blank: no limit.")
    token_budget = models.PositiveBigIntegerField(
        null=True, blank=True, help_text="Of each key made in the portal. Blank: no budget."
    )
    cost_budget = models.DecimalField(
        max_digits=12,
        decimal_places=4,
        null=True,
        blank=True,
        help_text="USD, of each key made in the portal. Blank: no budget.",
    )
    budget_period = models.CharField(
        max_length=5, choices=BudgetPeriod.choices, default=BudgetPeriod.MONTH
    )
    owner_token_budget = models.PositiveBigIntegerField(
        null=True,
        blank=True,
        help_text="Tokens all of one user's keys may use together per period. Blank: no budget.",
    )
    owner_cost_budget = models.DecimalField(
        max_digits=12,
        decimal_places=4,
        null=True,
        blank=True,
        help_text="USD all of one user's keys may spend together per period. Blank: no budget.",
    )
    owner_budget_period = models.CharField(
        max_length=5, choices=BudgetPeriod.choices, default=BudgetPeriod.MONTH
    )
    response_cache = _response_cache("its users' keys'")
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    objects = PlanQuerySet.as_manager()

    class Meta:
        ordering = ["-priority", "name"]

    def __str__(self) -> str:
        return self.name

    @property
    def has_owner_budget(self) -> bool:
        return self.owner_token_budget is not None or self.owner_cost_budget is not None

    @property
    def has_key_budget(self) -> bool:
        """Whether each key made under it has a budget (which then also bounds all of a
        user's keys made under it together: see :mod:`chatparity.accounting.limits`)."""
        return self.token_budget is not None or self.cost_budget is not None

    def key_limits(self) -> dict[str, Any]:
        """The limits and budgets a key made in the portal gets."""
        return {name: getattr(self, name) for name in self.KEY_LIMITS}

    def usable_aliases(self) -> models.QuerySet[ModelAlias]:
        """The enabled aliases its users' keys may use."""
        aliases = ModelAlias.objects if self.all_aliases else self.allowed_aliases
        return aliases.filter(enabled=True)

    def alias_ids(self) -> frozenset[int] | None:
        """The aliases its users' keys may use, by id (None: all of them)."""
        if self.all_aliases:
            return None
        return frozenset(self.allowed_aliases.values_list("pk", flat=True))


class Endpoint(models.TextChoices):
    """The ``/v1`` endpoint a logged request was made to."""

    CHAT_COMPLETIONS = "chat.completions", "/v1/chat/completions"
    RESPONSES = "responses", "/v1/responses"
    MESSAGES = "messages", "/v1/messages"
    EMBEDDINGS = "embeddings", "/v1/embeddings"
    COUNT_TOKENS = "messages.count_tokens", "/v1/messages/count_tokens"
    STORED_RESPONSES = "responses.stored", "/v1/responses/{id}"
    MODELS = "models", "/v1/models"


class CacheState(models.TextChoices):
    """What the response cache did for a logged request (blank: its alias has none)."""

    HIT = "hit", "hit"
    SEMANTIC = "semantic", "semantic hit"
    PARTIAL = "partial", "partial hit"
    MISS = "miss", "miss"
    BYPASS = "bypass", "bypass"


CACHE_HITS = frozenset({CacheState.HIT, CacheState.SEMANTIC})
"""The states of a request answered from the cache alone: no backend was asked."""


UNBILLED_ENDPOINTS = frozenset({Endpoint.COUNT_TOKENS, Endpoint.STORED_RESPONSES, Endpoint.MODELS})
"""The endpoints that ask no model for an answer: their rows cost nothing and carry no
tokens, and the latencies reported are the others'."""


class RequestLog(models.Model):
    """One row for every request that got past authentication."""

    endpoint = models.CharField(
        max_length=32, choices=Endpoint.choices, default=Endpoint.CHAT_COMPLETIONS
    )
    completion_id = models.CharField(max_length=64, blank=True)
    request_id = models.CharField(max_length=64)
    api_key = models.ForeignKey(ApiKey, null=True, on_delete=models.SET_NULL)
    key_prefix = models.CharField(max_length=32)
    alias = models.CharField(max_length=200, blank=True)
    backend = models.CharField(max_length=100, blank=True)
    upstream_model = models.CharField(max_length=200, blank=True)
    deployment = models.CharField(
        max_length=200, blank=True, help_text="The deployment of the alias that served it."
    )
    deployments_tried = models.PositiveSmallIntegerField(
        default=0,
        help_text="Deployments asked, the one that served included (fallbacks' too):"
        " more than 1 when one failed before answering.",
    )
    stream = models.BooleanField(default=False)
    n = models.PositiveIntegerField(default=1)
    status_code = models.PositiveSmallIntegerField()
    error_type = models.CharField(max_length=64, blank=True)
    error_code = models.CharField(max_length=64, blank=True)
    cancelled = models.BooleanField(default=False)
    finish_reasons = models.JSONField(default=list, blank=True)
    prompt_tokens = models.PositiveIntegerField(default=0)
    completion_tokens = models.PositiveIntegerField(default=0)
    total_tokens = models.PositiveIntegerField(default=0)
    cached_tokens = models.PositiveIntegerField(
        default=0, help_text="Prompt tokens read from the provider's prompt cache."
    )
    reasoning_tokens = models.PositiveIntegerField(default=0)
    cache_write_5m_tokens = models.PositiveIntegerField(
        default=0, help_text="Prompt tokens written to the provider's prompt cache for 5 minutes."
    )
    cache_write_1h_tokens = models.PositiveIntegerField(
        default=0, help_text="Prompt tokens written to the provider's prompt cache for an hour."
    )
    omitted_tools = models.JSONField(
        default=list,
        blank=True,
        help_text="Hosted tools (web_search, ...) the request asked for that its alias left"
        " out of what the model was offered (CHATPARITY['HOSTED_TOOLS']).",
    )
    usage_counted = models.BooleanField(
        default=False,
        help_text="The tokens were counted by the gateway: the backend reported none, or"
        " numbers it could not believe.",
    )
    time_to_first_token_ms = models.FloatField(null=True, blank=True)
    duration_ms = models.FloatField()
    output_tokens_per_second = models.FloatField(null=True, blank=True)
    cost = models.DecimalField(
        max_digits=14,
        decimal_places=8,  # COST_PRECISION
        default=0,
        help_text="USD, from the alias's prices.",
    )
    cache = models.CharField(max_length=8, choices=CacheState.choices, blank=True)
    cache_note = models.CharField(
        max_length=80, blank=True, help_text="Why the response cache was passed by, or not written."
    )
    cache_similarity = models.FloatField(
        null=True, blank=True, help_text="A semantic hit's: its similarity to the text it matched."
    )
    cost_saved = models.DecimalField(
        max_digits=14,
        decimal_places=8,
        default=0,
        help_text="USD: what the answers served from the response cache would have cost.",
    )
    client_ip = models.GenericIPAddressField(null=True, blank=True)
    user_agent = models.CharField(max_length=500, blank=True)
    request_body = models.JSONField(null=True, blank=True)
    response_body = models.TextField(blank=True)
    created_at = models.DateTimeField(auto_now_add=True, db_index=True)

    class Meta:
        ordering = ["-created_at"]
        # What the admin's filters and searches and the spool's drain look up; each
        # costs bytes per row (docs/history.md), so no more than these. The ids' are
        # hash indexes on PostgreSQL (migration 0011): equality is all they serve, at
        # half a B-tree's size. A key's and an alias's rows are few (the planner reads
        # them by these small indexes) or many (it walks created_at's until a page is
        # full), so neither needs created_at in its index.
        indexes = [
            models.Index(fields=["request_id"], name="chatparity_log_request_id"),
            models.Index(
                fields=["completion_id"],
                name="chatparity_log_completion_id",
                condition=~models.Q(completion_id=""),  # a failure's: one hash for them all
            ),
            models.Index(fields=["alias"], name="chatparity_log_alias"),
            models.Index(
                fields=["created_at"],
                name="chatparity_log_failed_time",
                condition=models.Q(status_code__gte=400)
                | ~models.Q(error_type="")
                | models.Q(cancelled=True),
            ),
        ]

    def __str__(self) -> str:
        return f"{self.request_id} {self.alias} {self.status_code}"


class StoredResponse(models.Model):
    """A response of ``/v1/responses`` made with ``store`` on, and the input it answered:
    readable, deletable and continued (``previous_response_id``) by the key that made it,
    or another key of the same owner, until ``RESPONSES_RETENTION`` runs out."""

    id = models.CharField(max_length=64, primary_key=True)
    api_key = models.ForeignKey(ApiKey, null=True, blank=True, on_delete=models.SET_NULL)
    owner = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL
    )
    previous_response_id = models.CharField(max_length=64, blank=True)
    model = models.CharField(max_length=200)
    status = models.CharField(max_length=16)
    input_items = models.JSONField(
        default=list, help_text="The items this response's request sent as its input."
    )
    response = models.JSONField(help_text="The response object, as the client received it.")
    size = models.PositiveIntegerField(
        default=0,
        help_text="Bytes of its input items and response object, as stored: what"
        ' CHATPARITY["STORED_RESPONSE_BYTES"] bounds.',
    )
    created_at = models.DateTimeField(default=timezone.now, db_index=True)

    class Meta:
        ordering = ["-created_at"]

    def __str__(self) -> str:
        return self.id


# Each decade of the latency histograms' buckets above 10 ms: every step at most 21%
# above the last, so that a percentile can be placed within 10% of either end of its
# bucket (accounting.reports.percentile), and 10, 20, 30 and 50 among them (bounds of the
# coarser histograms before, migration 0019).
DECADE_STEPS = (10, 12, 14, 16, 18, 20, 24, 27, 30, 36, 43, 50, 60, 72, 86)
LONGEST_MS = 600_000  # a backend's default time-out; longer requests share one bucket
# The upper bounds (ms) of the latency histograms' buckets: every millisecond up to 10,
# then DECADE_STEPS in each decade up to LONGEST_MS.
LATENCY_BOUNDS_MS: tuple[int, ...] = (
    *range(1, 10),
    *(
        bound
        for power in range(5)
        for step in DECADE_STEPS
        if (bound := step * 10**power) <= LONGEST_MS
    ),
)
# Each bucket's key in a histogram: its upper bound, then ">" and the last bound for the
# bucket past it.
HISTOGRAM_KEYS = (*map(str, LATENCY_BOUNDS_MS), f">{LONGEST_MS}")


def _count(help_text: str = "") -> models.PositiveBigIntegerField[int, int]:
    return models.PositiveBigIntegerField(default=0, help_text=help_text)


class UsageTotals(models.Model):
    """What the log's rows of one UTC day say, summed: kept when the rows are pruned.

    Written with the rows (``chatparity.accounting.rollups``), in their transaction;
    every report reads these, never the log.
    """

    day = models.DateField(help_text="UTC.")
    requests = _count()
    errors = _count("Answered with an error status, or failed after streaming began.")
    cancelled = _count("The client hung up.")
    prompt_tokens = _count()
    completion_tokens = _count()
    total_tokens = _count()
    cached_tokens = _count()
    reasoning_tokens = _count()
    cache_write_5m_tokens = _count()
    cache_write_1h_tokens = _count()
    cost = models.DecimalField(max_digits=20, decimal_places=8, default=0, help_text="USD.")
    cache_hits = _count("Answered from the response cache alone.")
    cache_misses = _count("Looked up in the response cache and not found (in part, or at all).")
    cost_saved = models.DecimalField(
        max_digits=20, decimal_places=8, default=0, help_text="USD, by the response cache."
    )

    class Meta:
        abstract = True


class DailyUsage(UsageTotals):
    """The totals of one alias through one endpoint, with their latencies."""

    alias = models.CharField(max_length=200, blank=True)
    endpoint = models.CharField(max_length=32, choices=Endpoint.choices)
    duration_ms = models.FloatField(default=0, help_text="Sum of the requests' durations.")
    first_token_ms = models.FloatField(
        default=0, help_text="Sum of the times to first token, over first_tokens requests."
    )
    first_tokens = _count("Requests that sent a first token.")
    # Sparse (a day's requests of one key fall in a few of 83 buckets), and added to by
    # one short upsert: a column per bucket made each upsert a statement of 26 KB.
    duration_histogram = models.JSONField(
        default=dict,
        blank=True,
        help_text='Requests per bucket of duration: {"<upper bound, ms>": requests, ...},'
        f' ">{LONGEST_MS}" past the last; a bucket starts at the bound before its own.',
    )
    first_token_histogram = models.JSONField(
        default=dict,
        blank=True,
        help_text="Requests per bucket of time to first token, as duration_histogram.",
    )

    class Meta:
        abstract = True


class DailyKeyUsage(DailyUsage):
    """One key's requests to one alias through one endpoint on one UTC day."""

    key_prefix = models.CharField(max_length=32, help_text="Kept when the key is deleted.")
    api_key = models.ForeignKey(
        ApiKey, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    owner = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="+",
        help_text="The key's owner when its first request of the day was logged.",
    )

    class Meta:
        verbose_name = "daily usage of a key"
        verbose_name_plural = "daily usage of keys"
        constraints = [
            models.UniqueConstraint(
                fields=["day", "key_prefix", "alias", "endpoint"], name="chatparity_key_day_once"
            )
        ]
        indexes = [
            models.Index(fields=["key_prefix", "day"], name="chatparity_key_usage_key_day"),
            models.Index(fields=["owner", "day"], name="chatparity_key_usage_owner_day"),
        ]

    def __str__(self) -> str:
        return f"{self.day} {self.key_prefix} {self.alias} {self.endpoint}"


class DailyKeyTotal(UsageTotals):
    """One key's requests on one UTC day, every alias and endpoint together: the table of
    keys over a long range reads a row per key and day."""

    key_prefix = models.CharField(max_length=32, help_text="Kept when the key is deleted.")

    class Meta:
        verbose_name = "daily total of a key"
        verbose_name_plural = "daily totals of keys"
        constraints = [
            models.UniqueConstraint(fields=["day", "key_prefix"], name="chatparity_key_total_once")
        ]

    def __str__(self) -> str:
        return f"{self.day} {self.key_prefix}"


class DailyAliasUsage(DailyUsage):
    """All keys' requests to one alias through one endpoint on one UTC day: the site's
    totals, read when a report is not about one key."""

    class Meta:
        verbose_name = "daily usage of an alias"
        verbose_name_plural = "daily usage of aliases"
        constraints = [
            models.UniqueConstraint(
                fields=["day", "alias", "endpoint"], name="chatparity_alias_day_once"
            )
        ]

    def __str__(self) -> str:
        return f"{self.day} {self.alias} {self.endpoint}"


class DailyDeploymentUsage(DailyUsage):
    """All keys' requests to one alias served by one of its deployments through one
    endpoint on one UTC day: the dashboard's split by deployment."""

    deployment = models.CharField(max_length=200, blank=True)

    class Meta:
        verbose_name = "daily usage of a deployment"
        verbose_name_plural = "daily usage of deployments"
        constraints = [
            models.UniqueConstraint(
                fields=["day", "alias", "deployment", "endpoint"],
                name="chatparity_deployment_day_once",
            )
        ]

    def __str__(self) -> str:
        return f"{self.day} {self.alias} {self.deployment} {self.endpoint}"


def check_aliases_added(
    sender: type[models.Model],
    instance: ApiKey | ModelAlias,
    action: str,
    reverse: bool,
    pk_set: set[Any] | None,
    **kwargs: Any,
) -> None:
    """Refuse aliases added to a key for every alias (an ``m2m_changed`` receiver of
    ``ApiKey.allowed_aliases``, from either side): it would still serve every alias."""
    if action != "pre_add" or not pk_set:
        return
    if reverse:  # alias.api_keys.add(*keys)
        every = ApiKey.objects.filter(pk__in=pk_set, all_aliases=True).exists()
    else:
        every = cast(ApiKey, instance).all_aliases
    ApiKey.check_alias_scope(every, pk_set)
