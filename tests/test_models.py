"""Backend and alias rows are checked before they are saved (``full_clean()``, which the
admin and the management API run), each error on the field at fault; a key is for every
alias or for those selected, never both."""

import datetime
import math
from unittest import mock

import pytest
from django.core.checks import Tags, run_checks
from django.core.exceptions import ValidationError
from django.db import transaction

from chatparity.backends import config_errors
from chatparity.conf import DEFAULTS
from chatparity.models import ApiKey, Backend, Deployment, ModelAlias, deployments_problem
from tests.configs import BAD_ALIASES, BAD_BACKENDS, GOOD_ALIAS, GOOD_BACKENDS
from tests.scripted import SCRIPTED
from tests.support.migrating import MigratingTestCase

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
            " 'backoff', 'connect_timeout', 'headers', 'pass_error_text', 'retries', 'wire_api'.",
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


class MigrationTests(MigratingTestCase):
    """0017 makes each alias an alias of one deployment: its backend and model."""

    BEFORE = [("chatparity", "0016_unbilled_endpoints")]

    def test_each_alias_becomes_an_alias_of_its_own_deployment(self):
        old = self.migrate(self.BEFORE)
        backend = old.get_model("chatparity", "Backend").objects.create(name="b", kind="local")
        aliases = old.get_model("chatparity", "ModelAlias").objects
        aliases.create(public_id="one", backend=backend, model="m1")
        aliases.create(public_id="two", backend=backend, model="")
        self.migrate(self.latest())
        rows = Deployment.objects.order_by("alias__public_id").values_list(
            "alias__public_id", "backend__name", "model", "primary", "weight", "tier", "enabled"
        )
        assert list(rows) == [
            ("one", "b", "m1", True, 1.0, 1, True),
            ("two", "b", "", True, 1.0, 1, True),
        ]


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
