"""The test suite's URLs: the admin, the management API and /v1, where a site mounts them."""

from django.contrib import admin
from django.urls import include, path

urlpatterns = [
    path("admin/", admin.site.urls),
    path("api/", include("chatparity.api.urls")),
    path("", include("chatparity.urls")),
]
