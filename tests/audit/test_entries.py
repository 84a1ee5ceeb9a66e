"""The audit trail's entries: one for every change to keys, aliases, backends and plans,
whichever part of the site made it (the admin, the management API, the portal, a
management command, code), with who, from where, and each field before and after;
never a secret."""

import contextlib
import json
from decimal import Decimal
from io import StringIO

from django.contrib.auth.models import Group, User, update_last_login
from django.core.management import call_command
from django.db import transaction
from django.db.models import F
from django.test import Client, TestCase
from django.utils import timezone
from rest_framework.authtoken.models import Token

from chatparity.audit.models import AuditEntry
from chatparity.audit.signals import audit_logged
from chatparity.models import ApiKey, Backend, Deployment, ModelAlias, Plan
from tests.support.users import portal_user

SECRET = "sk-upstream-very-secret-value"


def entries(instance):
    """The entries about ``instance``, oldest first."""
    return list(
        AuditEntry.objects.filter(
            content_type__model=instance._meta.model_name, object_id=str(instance.pk)
        ).order_by("pk")
    )


class AuditTestCase(TestCase):
    @classmethod
    def setUpTestData(cls):
        cls.backend = Backend.objects.create(name="local", kind="local")
        cls.alias = ModelAlias.objects.create(public_id="smollm2", backend=cls.backend)
        cls.admin = User.objects.create_superuser("root", password="pw")


class SourceTests(AuditTestCase):
    def test_the_admin_revoking_a_key(self):
        key, _ = ApiKey.objects.create_key("laptop")
        client = Client(REMOTE_ADDR="203.0.113.7")
        client.force_login(self.admin)
        response = client.post(
            "/admin/chatparity/apikey/", {"action": "revoke", "_selected_action": [key.pk]}
        )
        assert response.status_code == 302
        entry = entries(key)[-1]
        assert (entry.source, entry.actor, entry.actor_name, entry.ip) == (
            "admin", self.admin, "root", "203.0.113.7",
        )  # fmt: skip
        assert (entry.action, entry.object_repr) == ("update", str(key))
        assert entry.changes == {"is_active": {"before": True, "after": False}}

    def test_the_management_api_with_a_token(self):
        token = Token.objects.create(user=self.admin)
        response = Client().patch(
            f"/api/aliases/{self.alias.pk}/",
            {"context_window": 4096, "input_price": "1.5"},
            content_type="application/json",
            headers={"Authorization": f"Token {token.key}"},
        )
        assert response.status_code == 200, response.content
        (entry,) = entries(self.alias)[-1:]
        assert (entry.source, entry.actor, entry.ip) == ("api", self.admin, "127.0.0.1")
        assert entry.changes == {
            "context_window": {"before": None, "after": 4096},
            "input_price": {"before": "0.000000", "after": "1.500000"},
        }

    def test_the_portal_creating_and_revoking_a_key(self):
        alice = portal_user("alice", Plan.objects.create(name="starter"))
        client = Client()
        client.force_login(alice)
        assert client.post("/portal/keys/new/", {"name": "mine"}).status_code == 201
        key = ApiKey.objects.get(owner=alice)
        client.post(f"/portal/keys/{key.pk}/revoke/")
        created, revoked = entries(key)
        assert (created.source, created.actor, created.action) == ("portal", alice, "create")
        assert created.changes["name"] == {"before": None, "after": "mine"}
        assert created.changes["owner"] == {"before": None, "after": "alice"}
        assert (revoked.source, revoked.actor_name, revoked.action) == ("portal", "alice", "update")
        assert revoked.changes == {"is_active": {"before": True, "after": False}}

    def test_a_management_command(self):
        call_command("createapikey", "from-a-command", stdout=StringIO())
        (entry,) = entries(ApiKey.objects.get(name="from-a-command"))
        assert (entry.source, entry.actor, entry.actor_name, entry.ip) == (
            "command", None, "createapikey", None,
        )  # fmt: skip

    def test_the_bootstrap_command(self):
        call_command("chatparity_bootstrap", stdout=StringIO())
        created = ModelAlias.objects.get(public_id="embed-small")
        assert [(e.source, e.actor_name, e.action) for e in entries(created)] == [
            ("command", "chatparity_bootstrap", "create")
        ]

    def test_code_that_declares_nothing(self):
        plan = Plan.objects.create(name="silent")
        (entry,) = entries(plan)
        assert (entry.source, entry.actor, entry.actor_name) == ("code", None, "")


class ChangeTests(AuditTestCase):
    def test_only_the_fields_that_changed(self):
        self.alias.description = "a small model"
        self.alias.save()
        self.alias.save()  # nothing changed: no entry
        (entry,) = entries(self.alias)[-1:]
        assert entry.changes == {"description": {"before": "", "after": "a small model"}}
        assert len(entries(self.alias)) == 2  # its creation and this

    def test_a_related_object_by_its_name(self):
        other = Backend.objects.create(name="upstream", kind="openai", base_url="https://x.test")
        self.alias.backend = other
        self.alias.save()
        assert entries(self.alias)[-1].changes == {
            "backend": {"before": "local", "after": "upstream"}
        }

    def test_an_aliass_deployments_added_and_changed(self):
        other = Backend.objects.create(name="upstream", kind="openai", base_url="https://x.test")
        deployment = Deployment.objects.create(
            alias=self.alias, backend=other, model="m", weight=0.5
        )
        deployment.weight = 2
        deployment.save()
        created, changed = entries(deployment)
        assert created.action == "create"
        assert created.object_repr == "upstream/m"
        assert created.changes["alias"] == {"before": None, "after": "smollm2"}
        assert changed.changes == {"weight": {"before": 0.5, "after": 2.0}}

    def test_a_deletion_keeps_what_the_object_was(self):
        plan = Plan.objects.create(name="gone", owner_token_budget=5000)
        pk = plan.pk
        plan.delete()
        entry = AuditEntry.objects.filter(object_id=str(pk), action="delete").get()
        assert entry.object_repr == "gone"
        assert entry.changes["owner_token_budget"] == {"before": 5000, "after": None}

    def test_a_keys_aliases_before_and_after(self):
        other = ModelAlias.objects.create(public_id="other", backend=self.backend)
        key, _ = ApiKey.objects.create_key("scoped", all_aliases=False)
        key.allowed_aliases.set([self.alias])
        key.allowed_aliases.set([other])
        changes = [entry.changes for entry in entries(key)[1:]]
        assert changes == [
            {"allowed_aliases": {"before": [], "after": ["smollm2"]}},
            {"allowed_aliases": {"before": ["smollm2"], "after": []}},
            {"allowed_aliases": {"before": [], "after": ["other"]}},
        ]

    def test_plan_members_changed_from_either_side(self):
        plan = Plan.objects.create(name="pro")
        user = User.objects.create_user("erin")
        group = Group.objects.create(name="team")
        plan.users.add(user)
        group.chatparity_plans.add(plan)
        user.chatparity_plans.clear()
        changes = [entry.changes for entry in entries(plan)[1:]]
        assert changes == [
            {"users": {"before": [], "after": ["erin"]}},
            {"groups": {"before": [], "after": ["team"]}},
            {"users": {"before": ["erin"], "after": []}},
        ]

    def test_deleting_a_user_group_or_alias_records_what_lost_it(self):
        # Their deletion empties a key's owner and a plan's members with a plain UPDATE
        # and DELETE, which send no signal of the key's or the plan's own.
        erin, frank = User.objects.create_user("erin"), User.objects.create_user("frank")
        group = Group.objects.create(name="team")
        other = ModelAlias.objects.create(public_id="other", backend=self.backend)
        plan = Plan.objects.create(name="pro", all_aliases=False)
        plan.users.add(erin, frank)
        plan.groups.add(group)
        plan.allowed_aliases.add(self.alias, other)
        key, _ = ApiKey.objects.create_key("erins", owner=erin, all_aliases=False)
        key.allowed_aliases.add(self.alias, other)
        client = Client()
        client.force_login(self.admin)
        deleted = client.post(f"/admin/auth/user/{erin.pk}/delete/", {"post": "yes"})
        assert deleted.status_code == 302
        group.delete()
        other.delete()
        owner = entries(key)[-2]
        assert (owner.source, owner.actor_name) == ("admin", "root")
        assert owner.changes == {"owner": {"before": "erin", "after": None}}
        assert entries(key)[-1].changes == {
            "allowed_aliases": {"before": ["other", "smollm2"], "after": ["smollm2"]}
        }
        assert [entry.changes for entry in entries(plan)[-3:]] == [
            {"users": {"before": ["erin", "frank"], "after": ["frank"]}},
            {"groups": {"before": ["team"], "after": []}},
            {"allowed_aliases": {"before": ["other", "smollm2"], "after": ["smollm2"]}},
        ]

    def test_a_change_rolled_back_leaves_no_entry_and_sends_nothing(self):
        sent = []
        audit_logged.connect(lambda entry, **kw: sent.append(entry), weak=False, dispatch_uid="t")
        self.addCleanup(audit_logged.disconnect, dispatch_uid="t")
        before = AuditEntry.objects.count()
        with self.captureOnCommitCallbacks(execute=True):
            try:
                with transaction.atomic():
                    Plan.objects.create(name="rolled back")
                    raise RuntimeError
            except RuntimeError:
                pass
        assert AuditEntry.objects.count() == before
        assert sent == []

    def test_the_signal_carries_each_committed_entry(self):
        sent = []
        audit_logged.connect(lambda entry, **kw: sent.append(entry), weak=False, dispatch_uid="t")
        self.addCleanup(audit_logged.disconnect, dispatch_uid="t")
        with self.captureOnCommitCallbacks(execute=True):
            plan = Plan.objects.create(name="forwarded", cost_budget=Decimal("3"))
        assert sent == entries(plan)
        assert sent[0].changes["cost_budget"] == {"before": None, "after": "3"}


class SecretTests(AuditTestCase):
    """Neither a backend's secret, nor a key's plaintext or hash, is in any entry."""

    def all_entries_text(self):
        return json.dumps(list(AuditEntry.objects.values()), default=str)

    def test_a_backends_secret_set_changed_and_cleared_in_the_admin(self):
        client = Client()
        client.force_login(self.admin)
        form = {"name": "up", "kind": "openai", "base_url": "https://up.test/v1",
                "options": "{}", "timeout": "60", "enabled": "on"}  # fmt: skip
        added = client.post("/admin/chatparity/backend/add/", {**form, "secret": SECRET})
        assert added.status_code == 302
        backend = Backend.objects.get(name="up")
        url = f"/admin/chatparity/backend/{backend.pk}/change/"
        assert client.post(url, {**form, "secret": SECRET + "-2"}).status_code == 302
        assert client.post(url, {**form, "clear_secret": "on"}).status_code == 302
        created, changed, cleared = entries(backend)
        assert created.changes["secret"] == {"before": None, "after": "(secret)"}
        assert changed.changes == {"secret": {"before": "(secret)", "after": "(secret)"}}
        assert cleared.changes == {"secret": {"before": "(secret)", "after": ""}}
        assert SECRET not in self.all_entries_text()

    def test_a_credential_in_a_backends_extra_headers(self):
        # An Azure-style upstream takes its key in a header of the backend's options.
        backend = Backend.objects.create(
            name="azure", kind="openai", base_url="https://azure.test/v1",
            options={"headers": {"api-key": SECRET}, "retries": 1},
        )  # fmt: skip
        backend.options = {"headers": {"api-key": SECRET + "-2", "x-team": "a"}, "retries": 1}
        backend.save()
        pk = backend.pk
        backend.delete()
        created, changed, deleted = entries(Backend(pk=pk))
        masked = {"api-key": "(secret)"}
        assert created.changes["options"]["after"] == {"headers": masked, "retries": 1}
        assert changed.changes["options"] == {
            "before": {"headers": masked, "retries": 1},
            "after": {"headers": {**masked, "x-team": "(secret)"}, "retries": 1},
        }
        assert deleted.changes["options"]["before"]["headers"] == {**masked, "x-team": "(secret)"}
        assert SECRET not in self.all_entries_text()

    def test_a_keys_plaintext_and_hash(self):
        key, plaintext = ApiKey.objects.create_key("laptop")
        (entry,) = entries(key)
        assert entry.changes["hashed_key"] == {"before": None, "after": "(secret)"}
        assert entry.changes["prefix"] == {"before": None, "after": key.prefix}
        text = self.all_entries_text()
        assert plaintext not in text
        assert key.hashed_key not in text


class BulkChangeTests(AuditTestCase):
    """A queryset's update() and delete() on keys, aliases, backends and plans leave an
    entry for each row they change, as save() and delete() do."""

    def test_a_revoke_by_update_leaves_an_entry(self):
        key, _ = ApiKey.objects.create_key("laptop")
        assert ApiKey.objects.filter(pk=key.pk).update(is_active=False) == 1
        entry = entries(key)[-1]
        assert (entry.action, entry.source, entry.object_repr) == ("update", "code", str(key))
        assert entry.changes == {"is_active": {"before": True, "after": False}}

    def test_an_entry_for_each_row_changed_and_none_for_one_already_so(self):
        on = [Backend.objects.create(name=f"on{n}", kind="local") for n in range(2)]
        off = Backend.objects.create(name="off", kind="local", enabled=False)
        assert Backend.objects.filter(name__in=["on0", "on1", "off"]).update(enabled=False) == 3
        for backend in on:
            assert entries(backend)[-1].changes == {"enabled": {"before": True, "after": False}}
        assert len(entries(off)) == 1  # its creation only

    def test_an_expression_is_recorded_as_the_values_it_gave(self):
        plan = Plan.objects.create(name="pro", priority=3)
        Plan.objects.update(priority=F("priority") + 2)
        assert entries(plan)[-1].changes == {"priority": {"before": 3, "after": 5}}

    def test_bulk_update_and_an_update_through_a_related_manager(self):
        owner = User.objects.create_user("erin")
        key, _ = ApiKey.objects.create_key("erins", owner=owner)
        owner.apikey_set.update(requests_per_minute=60)
        self.alias.description = "small"
        ModelAlias.objects.bulk_update([self.alias], ["description"])
        assert entries(key)[-1].changes == {"requests_per_minute": {"before": None, "after": 60}}
        assert entries(self.alias)[-1].changes == {"description": {"before": "", "after": "small"}}

    def test_a_secret_set_by_update_is_never_shown(self):
        Backend.objects.filter(pk=self.backend.pk).update(secret=SECRET)
        assert entries(self.backend)[-1].changes == {"secret": {"before": "", "after": "(secret)"}}
        assert SECRET not in json.dumps(list(AuditEntry.objects.values()), default=str)

    def test_an_update_rolled_back_leaves_no_entry(self):
        before = AuditEntry.objects.count()
        with contextlib.suppress(RuntimeError), transaction.atomic():
            ModelAlias.objects.update(enabled=False)
            raise RuntimeError
        assert AuditEntry.objects.count() == before

    def test_stamping_a_key_as_used_is_no_change_and_costs_no_query(self):
        # The log writer stamps last_used_at with update(): one statement, as before.
        key, _ = ApiKey.objects.create_key("laptop")
        with self.assertNumQueries(1):
            ApiKey.objects.filter(pk=key.pk).update(last_used_at=timezone.now())
        assert len(entries(key)) == 1

    def test_a_queryset_delete_leaves_an_entry_for_each_row(self):
        keys = [ApiKey.objects.create_key(f"k{n}")[0] for n in range(2)]
        ApiKey.objects.filter(pk__in=[key.pk for key in keys]).delete()
        for key in keys:
            assert entries(key)[-1].action == "delete"
            assert entries(key)[-1].changes["name"] == {"before": key.name, "after": None}


class UserAccessTests(AuditTestCase):
    """What gives a user access or takes it away: their groups (a plan, the portal's
    permission) and whether they may sign in; nothing else of theirs."""

    def test_a_user_who_joins_a_plan_giving_group_leaves_an_entry(self):
        plan = Plan.objects.create(name="team plan")
        team = Group.objects.create(name="team")
        team.chatparity_plans.add(plan)
        erin = User.objects.create_user("erin")
        assert Plan.objects.for_owner(erin.pk) is None
        erin.groups.add(team)
        assert Plan.objects.for_owner(erin.pk) == plan
        (entry,) = entries(erin)
        assert (entry.action, entry.object_repr) == ("update", "erin")
        assert entry.changes == {"groups": {"before": [], "after": ["team"]}}

    def test_from_the_groups_side_too(self):
        team = Group.objects.create(name="team")
        erin, frank = User.objects.create_user("erin"), User.objects.create_user("frank")
        team.user_set.add(erin, frank)
        team.user_set.remove(frank)
        team.user_set.clear()
        assert [e.changes["groups"] for e in entries(erin)] == [
            {"before": [], "after": ["team"]},
            {"before": ["team"], "after": []},
        ]
        assert [e.changes["groups"] for e in entries(frank)] == [
            {"before": [], "after": ["team"]},
            {"before": ["team"], "after": []},
        ]

    def test_in_the_admin_with_who_did_it(self):
        team = Group.objects.create(name="team")
        erin = User.objects.create_user("erin")
        client = Client(REMOTE_ADDR="203.0.113.9")
        client.force_login(self.admin)
        form = {
            "username": "erin", "is_active": "on", "groups": [team.pk],
            "date_joined_0": "2025-01-01", "date_joined_1": "00:00:00",
        }  # fmt: skip
        assert client.post(f"/admin/auth/user/{erin.pk}/change/", form).status_code == 302
        (entry,) = entries(erin)
        assert (entry.source, entry.actor_name, entry.ip) == ("admin", "root", "203.0.113.9")
        assert entry.changes == {"groups": {"before": [], "after": ["team"]}}

    def test_deactivating_and_reactivating_a_user(self):
        erin = User.objects.create_user("erin")
        erin.is_active = False
        erin.save()
        erin.is_active = True
        erin.save(update_fields=["is_active"])
        assert [e.changes for e in entries(erin)] == [
            {"is_active": {"before": True, "after": False}},
            {"is_active": {"before": False, "after": True}},
        ]

    def test_deleting_a_group_records_what_its_members_lost(self):
        team = Group.objects.create(name="team")
        erin = User.objects.create_user("erin")
        erin.groups.add(team)
        team.delete()
        assert entries(erin)[-1].changes == {"groups": {"before": ["team"], "after": []}}

    def test_a_users_creation_sign_in_and_other_changes_leave_none(self):
        erin = User.objects.create_user("erin", password="pw")
        erin.first_name = "Erin"
        erin.save()
        with self.assertNumQueries(1):  # the last login stamped: nothing read before it
            update_last_login(None, erin)
        assert entries(erin) == []

    def test_the_admin_filters_entries_about_users(self):
        erin = User.objects.create_user("erin")
        erin.groups.add(Group.objects.create(name="team"))
        client = Client()
        client.force_login(self.admin)
        listing = client.get("/admin/chatparity_audit/auditentry/", {"type": "user"})
        assert listing.status_code == 200
        assert list(listing.context["cl"].result_list) == entries(erin)
