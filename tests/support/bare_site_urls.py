"""The URLs of a site as ``django-admin startproject`` makes it, with the portal added
as docs/site-users.md says: the portal, chatparity's API under ``llm/``, and no sign-in
views of the site's own."""

from django.urls import include, path

urlpatterns = [
    path("portal/", include("chatparity.portal.urls")),
    path("llm/", include("chatparity.urls")),
]
