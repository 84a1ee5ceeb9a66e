"""Mount with ``path("api/", include("chatparity.api.urls"))``; names are in ``chatparity-api``."""

from django.urls import path
from rest_framework.routers import SimpleRouter

from . import views

app_name = "chatparity-api"

# SimpleRouter: DefaultRouter's browsable root view would use the host's permission defaults.
router = SimpleRouter()
router.register("keys", views.ApiKeyViewSet, basename="key")
router.register("aliases", views.ModelAliasViewSet, basename="alias")
router.register("backends", views.BackendViewSet, basename="backend")
router.register("deployments", views.DeploymentViewSet, basename="deployment")
router.register("plans", views.PlanViewSet, basename="plan")
router.register("logs", views.RequestLogViewSet, basename="log")
router.register("responses", views.StoredResponseViewSet, basename="response")

urlpatterns = [
    *router.urls,
    path("usage/", views.UsageView.as_view(), name="usage"),
    path("usage/latency/", views.LatencyView.as_view(), name="usage-latency"),
    path("usage/deployments/", views.DeploymentLatencyView.as_view(), name="usage-deployments"),
    path("schema/", views.SchemaView.as_view(), name="schema"),
]
