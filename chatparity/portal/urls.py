"""Mount with ``path("portal/", include("chatparity.portal.urls"))``; names are in
``chatparity-portal``. A site without a sign-in page of its own sets
``LOGIN_URL = "chatparity-portal:login"``."""

from django.urls import path

from . import playground, views

app_name = "chatparity-portal"

urlpatterns = [
    path("", views.keys, name="keys"),
    path("keys/new/", views.create_key, name="create-key"),
    path("keys/<int:pk>/revoke/", views.revoke_key, name="revoke-key"),
    path("usage/", views.usage, name="usage"),
    path("requests/", views.recent_requests, name="requests"),
    path("playground/", playground.page, name="playground"),
    path("playground/key/", playground.new_key, name="playground-key"),
    path("playground/request/", playground.request_usage, name="playground-request"),
    path("login/", views.SignIn.as_view(), name="login"),
    path("logout/", views.SignOut.as_view(), name="logout"),
]
