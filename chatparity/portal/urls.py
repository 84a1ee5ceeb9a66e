"""Mount with ``path("portal/", include("chatparity.portal.urls"))``; names are in
``chatparity-portal``."""

from django.urls import path

from . import views

app_name = "chatparity-portal"

urlpatterns = [
    path("", views.keys, name="keys"),
    path("keys/new/", views.create_key, name="create-key"),
    path("keys/<int:pk>/revoke/", views.revoke_key, name="revoke-key"),
    path("usage/", views.usage, name="usage"),
    path("requests/", views.recent_requests, name="requests"),
]
