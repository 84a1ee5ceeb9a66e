"""plans/: CRUD of the plans the admin edits, with its permissions and its audit trail:
users by id, groups by name, aliases by public id; every alias or those selected,
never both."""

import pytest
from django.contrib.auth.models import Group, User
from django.test import Client

from chatparity.audit.models import AuditEntry
from chatparity.models import ModelAlias, Plan

from .helpers import url

pytestmark = pytest.mark.django_db
JSON = "application/json"
FIELDS = {
    "id", "name", "description", "users", "groups", "priority", "all_aliases",
    "allowed_aliases", "requests_per_minute", "tokens_per_minute", "max_concurrent",
    "token_budget", "cost_budget", "budget_period", "owner_token_budget",
    "owner_cost_budget", "owner_budget_period", "created_at", "updated_at",
}  # fmt: skip


@pytest.fixture
def members():
    erin = User.objects.create_user("erin")
    team = Group.objects.create(name="team")
    frank = User.objects.create_user("frank")
    frank.groups.add(team)
    return erin, team, frank


def create(client, **body):
    response = client.post(url("plan-list"), body, content_type=JSON)
    assert response.status_code == 201, response.content
    return response.json()


def test_a_plan_made_through_the_api_is_its_members_plan(admin_client, members, alias):
    erin, _, frank = members
    created = create(
        admin_client, name="pro", users=[erin.pk], groups=["team"], all_aliases=False,
        allowed_aliases=["SMOLLM2"], requests_per_minute=60, owner_cost_budget="25.5",
        owner_budget_period="day",
    )  # fmt: skip
    assert set(created) == FIELDS
    assert (created["users"], created["groups"], created["allowed_aliases"]) == (
        [erin.pk], ["team"], ["smollm2"],
    )  # fmt: skip
    assert (created["owner_cost_budget"], created["owner_budget_period"]) == ("25.5000", "day")
    plan = Plan.objects.get(pk=created["id"])
    assert Plan.objects.for_owner(erin.pk) == plan
    assert Plan.objects.for_owner(frank.pk) == plan
    assert plan.key_limits()["requests_per_minute"] == 60
    assert plan.alias_ids() == frozenset({alias.pk})


def test_list_highest_priority_first_retrieve_update_delete(admin_client, members):
    low = Plan.objects.create(name="low")
    high = Plan.objects.create(name="high", priority=5)
    listed = admin_client.get(url("plan-list")).json()
    assert [plan["name"] for plan in listed] == ["high", "low"]
    assert admin_client.get(url("plan-detail", low.pk)).json()["name"] == "low"
    patched = admin_client.patch(
        url("plan-detail", low.pk), {"groups": ["team"], "priority": 9}, content_type=JSON
    )
    assert patched.status_code == 200, patched.content
    low.refresh_from_db()
    assert (low.priority, list(low.groups.values_list("name", flat=True))) == (9, ["team"])
    assert admin_client.delete(url("plan-detail", high.pk)).status_code == 204
    assert not Plan.objects.filter(pk=high.pk).exists()


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"name": "x", "allowed_aliases": ["smollm2"]}, "allowed_aliases"),  # every alias too
        ({"name": "x", "all_aliases": False, "allowed_aliases": ["nope"]}, "allowed_aliases"),
        ({"name": "x", "groups": ["nobody"]}, "groups"),
        ({"name": "x", "users": [987654]}, "users"),
        ({"name": "x", "owner_budget_period": "week"}, "owner_budget_period"),
        ({"name": "x", "owner_cost_budget": "0.00001"}, "owner_cost_budget"),  # 4 decimals
        ({"name": "taken"}, "name"),
    ],
)
def test_a_bad_plan_is_a_400_on_its_field(admin_client, alias, body, field):
    Plan.objects.create(name="taken")
    response = admin_client.post(url("plan-list"), body, content_type=JSON)
    assert response.status_code == 400
    assert field in response.json()
    assert not Plan.objects.filter(name="x").exists()


def test_every_alias_again_needs_the_selection_emptied(admin_client, alias):
    plan = Plan.objects.create(name="scoped", all_aliases=False)
    plan.allowed_aliases.add(alias)
    detail = url("plan-detail", plan.pk)
    refused = admin_client.patch(detail, {"all_aliases": True}, content_type=JSON)
    assert refused.status_code == 400
    assert "allowed_aliases" in refused.json()
    widened = admin_client.patch(
        detail, {"all_aliases": True, "allowed_aliases": []}, content_type=JSON
    )
    assert widened.status_code == 200
    plan.refresh_from_db()
    assert (plan.all_aliases, plan.alias_ids()) == (True, None)


def test_changes_are_audited_as_the_api_s_with_who_made_them(members):
    erin, _, _ = members
    staff = User.objects.create_superuser("root")
    client = Client(REMOTE_ADDR="198.51.100.4")
    client.force_login(staff)
    created = client.post(url("plan-list"), {"name": "pro", "users": [erin.pk]}, JSON).json()
    client.patch(url("plan-detail", created["id"]), {"owner_token_budget": 1000}, JSON)
    client.delete(url("plan-detail", created["id"]))
    trail = AuditEntry.objects.filter(content_type__model="plan", object_id=str(created["id"]))
    assert [(e.action, e.source, e.actor_name, e.ip) for e in trail.order_by("pk")] == [
        ("create", "api", "root", "198.51.100.4"),
        ("update", "api", "root", "198.51.100.4"),  # its users
        ("update", "api", "root", "198.51.100.4"),  # its owner budget
        ("delete", "api", "root", "198.51.100.4"),
    ]
    changes = [entry.changes for entry in trail.order_by("pk")]
    assert changes[1] == {"users": {"before": [], "after": ["erin"]}}
    assert changes[2] == {"owner_token_budget": {"before": None, "after": 1000}}


def test_deleting_a_plan_takes_it_from_its_members(admin_client, members):
    erin, _, _ = members
    plan = Plan.objects.create(name="pro")
    plan.users.add(erin)
    assert admin_client.delete(url("plan-detail", plan.pk)).status_code == 204
    assert Plan.objects.for_owner(erin.pk) is None
    assert ModelAlias.objects.count() == 0  # nothing else went with it
