"""The test suite's URLs: the admin, the management API, the portal with Django's login
views, and /v1, where a site mounts them."""

from django.contrib import admin
from django.urls import include, path

urlpatterns = [
    path("admin/", admin.site.urls),
    path("api/", include("chatparity.api.urls")),
    path("portal/", include("chatparity.portal.urls")),
    path("accounts/", include("django.contrib.auth.urls")),
    path("", include("chatparity.urls")),
]
