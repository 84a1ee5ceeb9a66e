"""schema/: the OpenAPI document, staff only, generated without warnings."""

import pytest
from django.core.management import call_command
from drf_spectacular.drainage import GENERATOR_STATS

from .helpers import url

PATHS = {
    "/api/keys/", "/api/keys/{id}/", "/api/keys/{id}/revoke/", "/api/keys/{id}/reactivate/",
    "/api/aliases/", "/api/aliases/{id}/", "/api/backends/", "/api/backends/{id}/",
    "/api/plans/", "/api/plans/{id}/",
    "/api/logs/", "/api/logs/{id}/", "/api/usage/", "/api/usage/latency/", "/api/responses/",
    "/api/responses/{id}/",
}  # fmt: skip


def test_schema_endpoint_lists_the_paths(admin_client):
    response = admin_client.get(url("schema"), {"format": "json"})
    assert response.status_code == 200
    document = response.json()
    assert document["openapi"].startswith("3.")
    assert set(document["paths"]) >= PATHS


def test_schema_documents_a_plans_members_by_id_and_name(admin_client):
    document = admin_client.get(url("schema"), {"format": "json"}).json()
    plan = document["components"]["schemas"]["Plan"]["properties"]
    assert plan["users"]["items"]["type"] == "integer"
    assert plan["groups"]["items"]["type"] == "string"
    assert plan["allowed_aliases"]["items"]["type"] == "string"
    assert {"get", "post"} <= set(document["paths"]["/api/plans/"])
    assert {"get", "put", "patch", "delete"} <= set(document["paths"]["/api/plans/{id}/"])


def test_schema_documents_the_write_only_secret_and_the_log_filters(admin_client):
    document = admin_client.get(url("schema"), {"format": "json"}).json()
    backend = document["components"]["schemas"]["Backend"]["properties"]
    assert backend["secret"]["writeOnly"] is True
    assert backend["has_secret"]["readOnly"] is True
    params = {param["name"] for param in document["paths"]["/api/logs/"]["get"]["parameters"]}
    assert params >= {
        "key", "alias", "endpoint", "status", "stream", "cancelled", "since", "until", "limit",
    }  # fmt: skip
    listed = document["paths"]["/api/responses/"]["get"]["parameters"]
    assert {param["name"] for param in listed} >= {"key", "model", "status", "limit", "offset"}
    assert "delete" in document["paths"]["/api/responses/{id}/"]
    assert "post" not in document["paths"]["/api/responses/"]


@pytest.mark.django_db
def test_spectacular_validates_without_warnings(tmp_path):
    GENERATOR_STATS.reset()  # warnings of earlier generations in this process are not ours
    call_command("spectacular", "--validate", "--fail-on-warn", "--file", str(tmp_path / "s.yml"))
    assert "/api/usage/latency/" in (tmp_path / "s.yml").read_text()
