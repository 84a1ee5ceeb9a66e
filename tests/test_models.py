"""Backend and alias rows are checked before they are saved (``full_clean()``, which the
admin and the management API run), each error on the field at fault; a key is for every
alias or for those selected, never both."""

import datetime
from unittest import mock

import pytest
from django.core.checks import Tags, run_checks
from django.core.exceptions import ValidationError
from django.db import transaction
from django.db.models import F

from chatparity.backends import config_errors
from chatparity.conf import DEFAULTS
from chatparity.models import ApiKey, Backend, ModelAlias
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
