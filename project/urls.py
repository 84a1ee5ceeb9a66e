from django.apps import apps
from django.contrib import admin
from django.urls import include, path
from django.views.generic import TemplateView

urlpatterns = [
    path("", TemplateView.as_view(template_name="index.html"), name="home"),
    path("admin/", admin.site.urls),
    path("api/", include("chatparity.api.urls")),
    path("portal/", include("chatparity.portal.urls")),
    path("", include("chatparity.urls")),
]
if apps.is_installed("chatparity.metrics"):
    urlpatterns.append(path("", include("chatparity.metrics.urls")))
