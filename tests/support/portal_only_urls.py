"""The URLs of a site that mounts the portal but not chatparity's API."""

from django.urls import include, path

urlpatterns = [path("portal/", include("chatparity.portal.urls"))]
