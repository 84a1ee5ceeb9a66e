"""ASGI entry point: ``uvicorn project.asgi:application --lifespan off`` (or daphne)."""

import os

from channels.auth import AuthMiddlewareStack
from channels.routing import ProtocolTypeRouter, URLRouter
from django.contrib.staticfiles.handlers import ASGIStaticFilesHandler
from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "project.settings")

# The example project serves its own static files (the admin's, the dashboard's);
# a production deployment serves them from STATIC_ROOT in front of the workers.
http = ASGIStaticFilesHandler(get_asgi_application())  # also sets Django up

from chatparity.asgi import FastPath, tune_gc_for_serving  # noqa: E402
from chatparity.dashboard.routing import websocket_urlpatterns  # noqa: E402

application = ProtocolTypeRouter(
    {
        # /v1 straight to chatparity, in front of Django's handler and middleware.
        "http": FastPath(http),
        # Each route checks its Origin itself (chatparity.dashboard.routing.SameOriginValidator):
        # scheme, host and port as Django's CSRF check (channels' own validator: the host only).
        "websocket": AuthMiddlewareStack(URLRouter(websocket_urlpatterns)),
    }
)

# What start-up loaded lives as long as the process: frozen, out of the collector's way.
tune_gc_for_serving()
