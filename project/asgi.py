"""ASGI entry point: ``uvicorn project.asgi:application --lifespan off`` (or daphne)."""

import gc
import os

from channels.auth import AuthMiddlewareStack
from channels.routing import ProtocolTypeRouter, URLRouter
from django.contrib.staticfiles.handlers import ASGIStaticFilesHandler
from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "project.settings")

# The example project serves its own static files (the admin's, the dashboard's);
# a production deployment serves them from STATIC_ROOT in front of the workers.
http = ASGIStaticFilesHandler(get_asgi_application())  # also sets Django up

from chatparity.asgi import FastPath  # noqa: E402
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

# What start-up loaded (Django, the apps, the URLconf) lives as long as the
# process: out of the garbage collector's way, full collections stop rescanning
# it (they took about 60 ms each under load).
gc.freeze()
