"""The usage dashboard: charts of the request log and a live tail of requests, in the admin.

Opt-in (``pip install 'django-chatparity[dashboard]'``, which brings channels): add
``"chatparity.dashboard"`` to ``INSTALLED_APPS`` after ``"chatparity"``, configure
``CHANNEL_LAYERS``, and serve :data:`chatparity.dashboard.routing.websocket_urlpatterns`
behind channels' ``AuthMiddlewareStack`` for the live tail.
"""
