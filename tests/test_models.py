"""Backend and alias rows are checked before they are saved (``full_clean()``, which the
admin and the management API run), each error on the field at fault; a key is for every
alias or for those selected, never both."""

import datetime
import math
from decimal import Decimal
from unittest import mock

import pytest
from django.core.checks import Tags, run_checks
from django.core.exceptions import ValidationError
from django.db import transaction
from django.db.models import F

from chatparity.backends import config_errors
from chatparity.conf import DEFAULTS
from chatparity.models import (
    ApiKey,
    Backend,
    Deployment,
    ModelAlias,
    Prices,
    deployments_problem,
)
from chatparity.protocol.events import Usage
from chatparity.signals import rows_updated
from tests.configs import BAD_ALIASES, BAD_BACKENDS, GOOD_ALIAS, GOOD_BACKENDS
from tests.scripted import SCRIPTED

pytestmark = pytest.mark.django_db


def refusal(row) -> dict[str, list[str]]:
    """The errors ``row.full_clean()`` raises, by field."""
    with pytest.raises(ValidationError) as raised:
        row.full_clean()
    return raised.value.message_dict


def backend(**fields) -> Backend:
    return Backend(**{"name": "new", "kind": "local", "timeout": 30, **fields})


class TestBackend:
    @pytest.mark.parametrize(("fields", "field", "words"), BAD_BACKENDS)
    def test_a_bad_row_is_refused_on_its_field(self, fields, field, words):
        errors = refusal(backend(**fields))
        assert list(errors) == [field]
        assert words in errors[field][0]

    @pytest.mark.parametrize("fields", GOOD_BACKENDS)
    def test_a_good_row_passes(self, fields):
        backend(**fields).full_clean()

    def test_each_field_at_fault_is_named_at_once(self):
        errors = refusal(backend(kind="openai", options={"retries": "2"}, timeout=-1))
        assert sorted(errors) == ["base_url", "options", "timeout"]

    def test_a_command_backend_connects_to_no_url(self, settings):
        settings.CHATPARITY = {"COMMANDS": {"cli": {"argv": ["printf", "%s", "{prompt}"]}}}
        cli = backend(kind="command", options={"command": "cli"})
        cli.full_clean()
        cli.base_url = "https://example.com/v1"
        assert "leave the base URL blank" in refusal(cli)["base_url"][0]

    def test_a_kind_not_configured_is_refused(self, settings):
        settings.CHATPARITY = {"BACKEND_CLASSES": {"mine": "x.Mine"}}  # with the defaults
        configured = ", ".join(sorted([*DEFAULTS["BACKEND_CLASSES"], "mine"]))
        assert config_errors("nowhere", "", {}) == {
            "kind": f"'nowhere' is not a kind in CHATPARITY[\"BACKEND_CLASSES\"] ({configured})."
        }

    def test_a_kind_whose_class_cannot_be_imported_is_refused(self, settings):
        settings.CHATPARITY = {"BACKEND_CLASSES": {"local": "nowhere.LocalBackend"}}
        (error,) = refusal(backend())["kind"]
        assert error.startswith("The class serving 'local' backends cannot be imported")

    def test_a_kind_whose_class_has_no_checks_takes_any_url_and_options(self, settings):
        settings.CHATPARITY = SCRIPTED
        assert config_errors("scripted", "anything", {"script": ["Hi"], "more": 1}) == {}
        assert "options" in config_errors("scripted", "", ["not", "an", "object"])


@pytest.fixture
def spare():
    local = Backend.objects.create(name="local", kind="local")
    return ModelAlias.objects.create(public_id="spare", backend=local)


def alias(spare, **fields) -> ModelAlias:
    return ModelAlias(public_id="new", backend=spare.backend, **fields)


class TestModelAlias:
    @pytest.mark.parametrize(("fields", "field", "words"), BAD_ALIASES)
    def test_a_bad_row_is_refused_on_its_field(self, spare, fields, field, words):
        errors = refusal(alias(spare, **fields))
        assert list(errors) == [field]
        assert words in errors[field][0]

    def test_a_good_row_passes(self, spare):
        alias(spare, **GOOD_ALIAS).full_clean()
        alias(spare).full_clean()  # no defaults, fallbacks or forwarded parameters

    def test_two_aliases_may_fall_back_on_each_other(self, spare):
        # Only the requested alias's fallbacks are tried, never theirs: no loop can form.
        spare.fallbacks = ["new"]
        spare.save()
        alias(spare, fallbacks=["spare"]).full_clean()

    def test_an_alias_renamed_is_not_its_own_fallback_under_its_old_name(self, spare):
        spare.public_id, spare.fallbacks = "renamed", ["spare"]
        assert "No alias is named 'spare'" in refusal(spare)["fallbacks"][0]


def test_stored_rows_that_would_be_refused_are_reported_by_check_database(spare):
    Backend.objects.create(name="typo", kind="openai", base_url="https://example.com/v1",
                           options={"retry": 3})  # fmt: skip
    ModelAlias.objects.create(public_id="broken", backend=spare.backend, fallbacks=["nowhere"])
    found = run_checks(tags=[Tags.database], databases=["default"])
    assert [(m.id, m.msg) for m in found if m.id == "chatparity.W040"] == [
        (
            "chatparity.W040",
            "backend 'typo': options: Unknown option(s) 'retry'; this kind of backend takes"
            " 'backoff', 'cache_ttl', 'connect_timeout', 'headers', 'pass_error_text',"
            " 'retries', 'wire_api'.",
        ),
        ("chatparity.W040", "model alias 'broken': fallbacks: No alias is named 'nowhere'."),
    ]


class TestDeployment:
    """A deployment's own fields; an alias's deployments together."""

    @pytest.fixture
    def group(self, spare, settings):
        settings.CHATPARITY = SCRIPTED
        return spare

    def deployment(self, alias, **fields):
        return Deployment(alias=alias, backend=alias.backend, model="other", **fields)

    @pytest.mark.parametrize(
        ("fields", "field", "words"),
        [
            ({"weight": -0.5}, "weight", "A weight cannot be negative (-0.5): give 0 to drain"),
            ({"weight": math.nan}, "weight", "Give a number of 0 or more"),
            ({"weight": math.inf}, "weight", "Give a number of 0 or more"),
            ({"tier": 0}, "tier", "numbered from 1"),
        ],
    )
    def test_a_bad_deployment_is_refused_on_its_field(self, group, fields, field, words):
        errors = refusal(self.deployment(group, **fields))
        assert words in errors[field][0]

    def test_a_deployment_serves_what_the_aliass_backend_serves(self, group):
        embedder = Backend.objects.create(name="embedder", kind="embedder")
        refused = Deployment(alias=group, backend=embedder, model="x")
        assert (
            "serves neither of what the alias's backend serves (chat)"
            in (refusal(refused)["backend"][0])
        )
        self.deployment(group, weight=0.001, tier=2).full_clean()

    def test_the_same_backend_and_model_twice_is_refused(self, group):
        self.deployment(group).save()
        assert "already exists" in refusal(self.deployment(group))["__all__"][0]

    def test_an_aliass_backend_and_model_another_deployment_has_is_refused(self, group):
        self.deployment(group).save()
        group.model = "other"
        assert "serves this backend and model already" in refusal(group)["model"][0]

    @pytest.mark.parametrize(
        ("rows", "words"),
        [
            ([], "No deployment is enabled"),
            ([{"enabled": False}, {"weight": 0}], "No deployment is enabled"),
            ([{}, {"tier": 3}], "Tier 2 has no deployment: number the tiers from 1 without a gap"),
            ([{"tier": 2}], "Tier 1 has no deployment"),
            ([{}, {"tier": 2, "enabled": False}], ""),  # a tier all disabled: served by tier 1
            ([{"weight": 0}, {"weight": 0.0001}], ""),
        ],
    )
    def test_deployments_that_could_not_serve_their_alias_say_what_to_change(self, rows, words):
        problem = deployments_problem([Deployment(**fields) for fields in rows])
        assert words in problem if words else problem == ""

    def test_an_aliass_own_deployment_is_made_and_kept_with_it(self, group):
        (own,) = Deployment.objects.filter(alias=group)
        assert (own.backend, own.model, own.primary, own.weight, own.tier) == (
            group.backend, "", True, 1.0, 1,
        )  # fmt: skip
        group.model = "renamed"
        group.save(update_fields=["model"])
        own.refresh_from_db()
        assert own.model == "renamed"
        group.description = "other fields leave it alone"
        with mock.patch.object(Deployment.objects, "update_or_create") as touched:
            group.save(update_fields=["description"])
        touched.assert_not_called()

    def test_deployments_that_could_not_serve_are_reported_by_check_database(self, group):
        Deployment.objects.filter(alias=group).update(tier=2)
        found = run_checks(tags=[Tags.database], databases=["default"])
        assert [(m.id, m.msg) for m in found if m.id == "chatparity.W041"] == [
            ("chatparity.W041", "model alias 'spare': Tier 1 has no deployment: number the tiers"
             " from 1 without a gap (tiers used: 2)."),
        ]  # fmt: skip

    def test_blank_cache_prices_over_deployments_of_another_provider_are_reported(self, db):
        chat = Backend.objects.create(name="oai", kind="openai", base_url="https://o.test/v1")
        messages = Backend.objects.create(
            name="ant", kind="openai", base_url="https://a.test/v1",
            options={"wire_api": "messages"},
        )  # fmt: skip
        mixed = ModelAlias.objects.create(public_id="mixed", backend=chat, model="m")
        Deployment.objects.create(alias=mixed, backend=messages, model="m")

        def reported():
            found = run_checks(tags=[Tags.database], databases=["default"])
            return [m.msg for m in found if m.id == "chatparity.W042"]

        assert reported() == [
            "model alias 'mixed': its blank cached_input_price, cache_write_5m_price,"
            " cache_write_1h_price take the ratios of its own backend's provider (openai)"
            " for every request, also those served by ant/m, whose upstream bills by"
            " another's."
        ]
        ModelAlias.objects.filter(pk=mixed.pk).update(
            cached_input_price=1, cache_write_5m_price=1, cache_write_1h_price=1
        )
        assert reported() == []


class TestApiKeyExpiry:
    def test_a_key_expires_at_the_instant_it_names(self):
        instant = datetime.datetime(2026, 1, 1, 12, 0, tzinfo=datetime.UTC)
        key = ApiKey(expires_at=instant)
        with mock.patch("django.utils.timezone.now", return_value=instant):
            assert key.is_expired
        before = instant - datetime.timedelta(microseconds=1)
        with mock.patch("django.utils.timezone.now", return_value=before):
            assert not key.is_expired

    def test_a_key_without_an_expiry_never_expires(self):
        assert not ApiKey(expires_at=None).is_expired


class TestApiKeyScope:
    def test_aliases_added_to_a_key_for_every_alias_are_refused_from_either_side(self, spare):
        key, _ = ApiKey.objects.create_key("every")
        # Each in a transaction of its own, as the site's autocommit gives it.
        with pytest.raises(ValidationError, match="all_aliases"), transaction.atomic():
            key.allowed_aliases.set([spare])
        with pytest.raises(ValidationError, match="all_aliases"), transaction.atomic():
            spare.api_keys.add(key)
        assert not key.allowed_aliases.exists()

    def test_a_key_limited_to_aliases_takes_them_from_either_side(self, spare):
        key, _ = ApiKey.objects.create_key("scoped", all_aliases=False)
        other = ModelAlias.objects.create(public_id="other", backend=spare.backend)
        key.allowed_aliases.add(spare)
        other.api_keys.add(key)
        assert set(key.allowed_aliases.all()) == {spare, other}

    def test_a_key_opened_to_every_alias_keeps_no_selection_to_revive(self, spare):
        key, _ = ApiKey.objects.create_key("scoped", all_aliases=False)
        key.allowed_aliases.add(spare)
        key.all_aliases = True
        key.save()
        assert not key.allowed_aliases.exists()
        key.all_aliases = False
        key.save()
        assert not key.allowed_aliases.exists()  # limited anew: to none, not to spare


def priced_alias(wire_api=None, kind="openai", **prices) -> ModelAlias:
    """An alias of a backend of ``kind`` speaking ``wire_api`` (unsaved), at ``prices``."""
    options = {} if wire_api is None else {"wire_api": wire_api}
    serving = Backend(name="priced", kind=kind, base_url="https://upstream.test/v1",
                      options=options)  # fmt: skip
    serving.pk = 1
    return ModelAlias(public_id="priced", backend=serving, **prices)


# Anthropic's prices of claude-sonnet-4-5, OpenAI's of gpt-4o-mini and gpt-5 (USD per
# million tokens), as published and in genai-prices' catalog.
SONNET = {"input_price": Decimal(3), "output_price": Decimal(15)}
GPT_4O_MINI = {"input_price": Decimal("0.15"), "output_price": Decimal("0.6")}
GPT_5 = {"input_price": Decimal("1.25"), "output_price": Decimal(10),
         "cached_input_price": Decimal("0.125")}  # fmt: skip
USD = Decimal("1e-8")


class TestCost:
    """``ModelAlias.cost_of``: the provider's formula, to 1e-8 USD, worked examples."""

    def test_anthropic_every_kind_of_input_token_at_its_own_price(self):
        # What Anthropic reports: input_tokens 345, cache_read_input_tokens 10,000,
        # cache_creation 5m 1,500 and 1h 500, output_tokens 678 (thinking among them).
        usage = Usage(12_345, 678, cached_tokens=10_000, reasoning_tokens=200,
                      cache_write_5m_tokens=1_500, cache_write_1h_tokens=500)  # fmt: skip
        cost = priced_alias("messages", **SONNET).cost_of(usage)
        # 345 x $3 + 10,000 x $0.30 + 1,500 x $3.75 + 500 x $6 + 678 x $15, per million
        assert cost.quantize(USD) == Decimal("0.02283000")
        assert cost == (345 * 3 + 10_000 * Decimal("0.3") + 1_500 * Decimal("3.75")
                        + 500 * 6 + 678 * 15) / Decimal(10**6)  # fmt: skip

    @pytest.mark.parametrize(
        ("kind", "per_million"),
        [("cached_tokens", "0.3"), ("cache_write_5m_tokens", "3.75"),
         ("cache_write_1h_tokens", "6")],
    )  # fmt: skip
    def test_anthropic_reads_and_each_lifetime_of_write_apart(self, kind, per_million):
        usage = Usage(1_000_000, 0, **{kind: 1_000_000})
        assert priced_alias("messages", **SONNET).cost_of(usage) == Decimal(per_million)

    def test_openai_cached_input_at_half_the_input_price_when_blank(self):
        # gpt-4o-mini: prompt_tokens 12,345 with prompt_tokens_details.cached_tokens 10,240.
        usage = Usage(12_345, 678, cached_tokens=10_240)
        cost = priced_alias("chat", **GPT_4O_MINI).cost_of(usage)
        # 2,105 x $0.15 + 10,240 x $0.075 + 678 x $0.60, per million
        assert cost.quantize(USD) == Decimal("0.00149055")

    def test_openai_reasoning_tokens_are_part_of_the_completion_priced_once(self):
        # gpt-5 on the Responses API: input 2,048 (1,024 cached), output 1,500 of which
        # 1,200 reasoning.
        usage = Usage(2_048, 1_500, cached_tokens=1_024, reasoning_tokens=1_200)
        cost = priced_alias("responses", **GPT_5).cost_of(usage)
        # 1,024 x $1.25 + 1,024 x $0.125 + 1,500 x $10, per million
        assert cost.quantize(USD) == Decimal("0.01640800")

    def test_without_cache_tokens_the_cost_is_prompt_and_completion_as_before(self):
        for alias in (priced_alias("messages", **SONNET), priced_alias("chat", **GPT_5),
                      priced_alias(kind="local", **SONNET)):  # fmt: skip
            usage = Usage(1_234, 567)
            expected = (1_234 * alias.input_price + 567 * alias.output_price) / Decimal(10**6)
            assert alias.cost_of(usage) == expected

    def test_a_price_set_on_the_alias_is_used_over_the_providers_ratio(self):
        # claude-opus-5-5 reads its cache at a twentieth of the input price, not a tenth.
        alias = priced_alias("messages", input_price=Decimal(4), output_price=Decimal(20),
                             cached_input_price=Decimal("0.2"))  # fmt: skip
        assert alias.cost_of(Usage(1_000_000, 0, cached_tokens=1_000_000)) == Decimal("0.2")
        free = priced_alias("messages", **SONNET, cache_write_1h_price=Decimal(0))
        assert free.cost_of(Usage(1_000, 0, cache_write_1h_tokens=1_000)) == 0  # 0 is no blank

    def test_cache_tokens_past_the_prompt_are_never_priced_below_themselves(self):
        usage = Usage(100, 0, cached_tokens=1_000_000)
        assert priced_alias("messages", **SONNET).cost_of(usage) == Decimal("0.3")


class TestBlankCachePrices:
    """A blank cache price is the provider's ratio to the input price, the provider being
    whose API the alias's backend speaks."""

    def ratios(self, alias):
        prices = alias.prices
        return tuple(
            price / prices.input
            for price in (prices.cached_input, prices.cache_write_5m, prices.cache_write_1h)
        )

    def test_anthropics_behind_its_messages_api(self):
        assert self.ratios(priced_alias("messages", **SONNET)) == (
            Decimal("0.1"), Decimal("1.25"), Decimal(2),
        )  # fmt: skip

    @pytest.mark.parametrize("wire_api", [None, "chat", "responses"])
    def test_openais_behind_its_apis(self, wire_api):
        assert self.ratios(priced_alias(wire_api, **SONNET)) == (Decimal("0.5"), 1, 1)

    @pytest.mark.parametrize("kind", ["local", "command", "not-configured"])
    def test_every_input_token_alike_for_a_backend_of_no_provider(self, kind):
        assert self.ratios(priced_alias(kind=kind, **SONNET)) == (1, 1, 1)
        assert ModelAlias(**SONNET).provider is None  # no backend at all

    def test_a_sites_own_kind_names_its_provider(self, settings):
        settings.CHATPARITY = SCRIPTED
        alias = priced_alias(kind="scripted", **SONNET)
        alias.backend.options = {"provider": "anthropic"}
        assert self.ratios(alias) == (Decimal("0.1"), Decimal("1.25"), Decimal(2))


class TestDearest:
    """What a request can be charged at most: every prompt token of the dearest kind."""

    def test_anthropic_every_prompt_token_written_for_an_hour(self):
        prices = priced_alias("messages", **SONNET).prices
        assert prices.dearest(1_000, 10) == Usage(1_000, 10, cache_write_1h_tokens=1_000)
        assert prices.cost_of(prices.dearest(1_000_000, 0)) == 6

    def test_openai_plain_input_when_no_cache_price_is_dearer(self):
        prices = priced_alias("chat", **GPT_4O_MINI).prices
        assert prices.dearest(1_000, 10) == Usage(1_000, 10)

    def test_whichever_price_is_dearest(self):
        odd = priced_alias("chat", input_price=1, output_price=1,
                           cached_input_price=Decimal(3))  # fmt: skip
        assert odd.prices.dearest(7, 0) == Usage(7, 0, cached_tokens=7)


def test_prices_are_journalled_and_read_back_whole():
    prices = priced_alias("messages", **SONNET).prices
    assert Prices.from_journal(prices.journalled) == prices
    # An older journal kept input and output: every input token at the input price.
    older = Prices.from_journal(["3", "15"])
    assert older.cost_of(Usage(1_000_000, 0, cache_write_1h_tokens=1_000_000)) == 3


class TestAuditedQuerySet:
    """update() on keys, aliases, backends and plans says what it changed, as save()
    does (the audit trail listens)."""

    @pytest.fixture
    def announced(self):
        heard = []

        def hear(sender, **kwargs):
            heard.append((sender, kwargs["before"], kwargs["after"]))

        rows_updated.connect(hear, dispatch_uid="test")
        yield heard
        rows_updated.disconnect(dispatch_uid="test")

    def test_an_update_announces_each_row_before_and_after(self, db, announced):
        one = Backend.objects.create(name="one", kind="local", timeout=5)
        two = Backend.objects.create(name="two", kind="local", timeout=9)
        assert Backend.objects.update(timeout=F("timeout") * 2) == 2
        assert announced == [
            (
                Backend,
                {one.pk: {"timeout": 5}, two.pk: {"timeout": 9}},
                {one.pk: {"timeout": 10}, two.pk: {"timeout": 18}},
            )
        ]

    def test_a_stamp_or_no_row_matched_announces_nothing(self, db, announced):
        key, _ = ApiKey.objects.create_key("k")
        ApiKey.objects.filter(pk=key.pk).update(last_used_at=datetime.datetime.now(datetime.UTC))
        ApiKey.objects.filter(name="nobody").update(is_active=False)
        assert announced == []

    def test_a_sliced_queryset_is_refused_as_django_refuses_it(self, db):
        with pytest.raises(TypeError, match="slice"):
            ModelAlias.objects.all()[:1].update(enabled=False)


def test_the_prompt_caches_parameters_leave_the_aliases_forwarded_lists(transactional_db):
    """They are forwarded to every upstream now: an alias listing one would be refused."""
    from django.db import connection
    from django.db.migrations.executor import MigrationExecutor

    executor = MigrationExecutor(connection)
    name = next(
        key for key in executor.loader.graph.nodes if key[1].endswith("_alias_cache_breakpoints")
    )
    (before,) = executor.loader.graph.node_map[name].parents
    executor.migrate([before.key])
    state = executor.loader.project_state(before.key)
    backend = state.apps.get_model("chatparity", "Backend").objects.create(name="b", kind="openai")
    alias = state.apps.get_model("chatparity", "ModelAlias").objects.create(
        public_id="a", backend=backend, forwarded_params=["prompt_cache_key", "store"]
    )
    executor.loader.build_graph()
    executor.migrate(executor.loader.graph.leaf_nodes("chatparity"))
    assert ModelAlias.objects.get(pk=alias.pk).forwarded_params == ["store"]
