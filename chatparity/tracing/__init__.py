"""OpenTelemetry traces of the gateway (``pip install 'django-chatparity[tracing]'``).

Add ``"chatparity.tracing"`` to INSTALLED_APPS and configure OpenTelemetry's SDK
(a TracerProvider and its exporter) in the site: each ``/v1`` request is then one
span, following OpenTelemetry's GenAI semantic conventions, with child spans for its
admission, each backend call (whose upstream HTTP request carries ``traceparent``)
and its log write. Not installed, nothing of it runs.
"""
