"""The test suite's URLs with the metrics mounted, as a site adds them."""

from django.urls import include, path

from tests.urls import urlpatterns as site

urlpatterns = [path("", include("chatparity.metrics.urls")), *site]
