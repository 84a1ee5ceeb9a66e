"""Only staff get in: by session or by a DRF token; anyone else is refused."""

from io import StringIO

import pytest
from django.core.management import call_command
from django.test import Client
from rest_framework.authtoken.models import Token

from .helpers import url

ENDPOINTS = [
    ("get", "key-list", ()),
    ("post", "key-list", ()),
    ("get", "key-detail", (1,)),
    ("put", "key-detail", (1,)),
    ("patch", "key-detail", (1,)),
    ("delete", "key-detail", (1,)),
    ("post", "key-revoke", (1,)),
    ("post", "key-reactivate", (1,)),
    ("get", "alias-list", ()),
    ("post", "alias-list", ()),
    ("get", "alias-detail", (1,)),
    ("delete", "alias-detail", (1,)),
    ("get", "backend-list", ()),
    ("post", "backend-list", ()),
    ("get", "backend-detail", (1,)),
    ("delete", "backend-detail", (1,)),
    ("get", "log-list", ()),
    ("get", "log-detail", (1,)),
    ("get", "usage", ()),
    ("get", "usage-latency", ()),
    ("get", "schema", ()),
]

endpoints = pytest.mark.parametrize(("method", "name", "args"), ENDPOINTS)


@endpoints
def test_anonymous_is_asked_to_authenticate(db, client, method, name, args):
    response = getattr(client, method)(url(name, *args))
    assert response.status_code == 401
    assert response["WWW-Authenticate"] == "Token"


@endpoints
def test_authenticated_non_staff_is_forbidden(db, client, django_user_model, method, name, args):
    user = django_user_model.objects.create_user("someone", password="pw")
    client.force_login(user)
    response = getattr(client, method)(url(name, *args))
    assert response.status_code == 403


def test_non_staff_token_is_forbidden(db, client, django_user_model):
    user = django_user_model.objects.create_user("script")
    token = Token.objects.create(user=user)
    response = client.get(url("key-list"), headers={"Authorization": f"Token {token.key}"})
    assert response.status_code == 403


def test_staff_session_gets_in(admin_client):
    assert admin_client.get(url("key-list")).status_code == 200


def test_staff_token_from_drf_create_token_works_without_csrf(admin_user):
    call_command("drf_create_token", admin_user.username, stdout=StringIO())
    token = Token.objects.get(user=admin_user).key
    script = Client(enforce_csrf_checks=True, headers={"Authorization": f"Token {token}"})
    assert script.get(url("key-list")).status_code == 200
    created = script.post(url("key-list"), {"name": "ci"}, content_type="application/json")
    assert created.status_code == 201


def test_wrong_token_is_401(db, client):
    response = client.get(url("key-list"), headers={"Authorization": "Token not-a-token"})
    assert response.status_code == 401


def test_staff_session_needs_the_csrf_token_for_writes(admin_user):
    browser = Client(enforce_csrf_checks=True)
    browser.force_login(admin_user)
    response = browser.post(url("key-list"), {"name": "x"}, content_type="application/json")
    assert response.status_code == 403
    assert "CSRF" in response.json()["detail"]
