"""deployments/: an alias's deployments, each with its state now; a change that would
leave the alias nothing to serve it is a 400 that says what to change."""

import pytest
from asgiref.sync import async_to_sync

from chatparity.accounting import deployments as shared
from chatparity.accounting.deployments import Outcome
from chatparity.models import Backend, Deployment

from .helpers import url

pytestmark = pytest.mark.django_db
JSON = "application/json"


@pytest.fixture
def other(db):
    return Backend.objects.create(name="other", kind="local")


def test_an_alias_is_listed_with_its_own_deployment(admin_client, alias):
    (listed,) = admin_client.get(url("deployment-list")).json()
    assert listed["alias"] == "smollm2"
    assert (listed["backend"], listed["model"], listed["primary"]) == ("local", "SmolLM2", True)
    assert (listed["weight"], listed["tier"], listed["enabled"]) == (1.0, 1, True)
    assert listed["state"]["in_flight"] == 0
    assert listed["state"]["cooling_until"] is None


def test_create_update_delete_a_deployment(admin_client, alias, other):
    created = admin_client.post(
        url("deployment-list"),
        {"alias": "SMOLLM2", "backend": "other", "model": "m2", "weight": 0.25, "tier": 2,
         "requests_per_minute": 60, "max_in_flight": 4},
        content_type=JSON,
    )  # fmt: skip
    assert created.status_code == 201, created.content
    deployment = Deployment.objects.get(pk=created.json()["id"])
    assert (deployment.alias, deployment.weight, deployment.max_in_flight) == (alias, 0.25, 4)
    changed = admin_client.patch(
        url("deployment-detail", deployment.pk), {"weight": 3}, content_type=JSON
    )
    assert changed.status_code == 200
    assert admin_client.get(url("deployment-list"), {"alias": "other"}).json() == []
    assert len(admin_client.get(url("deployment-list"), {"alias": "smollm2"}).json()) == 2
    assert admin_client.delete(url("deployment-detail", deployment.pk)).status_code == 204


def test_the_state_shows_a_cooldown(admin_client, alias):
    own = Deployment.objects.get()
    async_to_sync(shared.told)(own, Outcome(failed=True, retry_after=60))
    state = admin_client.get(url("deployment-detail", own.pk)).json()["state"]
    assert state["cooling_until"] is not None
    assert (state["failures"], state["requests"], state["error_share"]) == (0, 1, 1.0)


@pytest.mark.parametrize(
    ("change", "words"),
    [
        ({"weight": -1}, "cannot be negative"),
        ({"weight": 0}, "No deployment is enabled with a weight above 0"),
        ({"enabled": False}, "No deployment is enabled with a weight above 0"),
        ({"tier": 2}, "Tier 1 has no deployment"),
        ({"model": "elsewhere"}, "change its backend and model on the alias"),
    ],
)
def test_a_change_that_could_not_serve_the_alias_is_a_400(admin_client, alias, change, words):
    own = Deployment.objects.get()
    response = admin_client.patch(url("deployment-detail", own.pk), change, content_type=JSON)
    assert response.status_code == 400
    assert words in str(response.json())
    own.refresh_from_db()
    assert (own.weight, own.enabled, own.tier, own.model) == (1.0, True, 1, "SmolLM2")


def test_a_tier_left_empty_by_a_deletion_is_a_400(admin_client, alias, other):
    second = Deployment.objects.create(alias=alias, backend=other, tier=2)
    third = Deployment.objects.create(alias=alias, backend=other, model="x", tier=3)
    response = admin_client.delete(url("deployment-detail", second.pk))
    assert response.status_code == 400
    assert "Tier 2 has no deployment" in str(response.json())
    assert admin_client.delete(url("deployment-detail", third.pk)).status_code == 204


def test_the_aliass_own_deployment_is_never_deleted_here(admin_client, alias):
    own = Deployment.objects.get()
    response = admin_client.delete(url("deployment-detail", own.pk))
    assert response.status_code == 409
    assert "the alias's own deployment" in response.json()["detail"]


def test_an_alias_says_how_it_routes(admin_client, alias):
    response = admin_client.patch(
        url("alias-detail", alias.pk),
        {"routing": "least_busy", "sticky_sessions": "off"},
        content_type=JSON,
    )
    assert response.status_code == 200
    assert (response.json()["routing"], response.json()["sticky_sessions"]) == ("least_busy", "off")
