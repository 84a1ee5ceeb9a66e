"""Prometheus metrics of the gateway (``pip install 'django-chatparity[metrics]'``).

Add ``"chatparity.metrics"`` to INSTALLED_APPS and ``path("",
include("chatparity.metrics.urls"))`` to the URLconf: ``GET /metrics`` answers the
scrapers that ``CHATPARITY["METRICS"]`` allows (a token, or their networks).
"""
