"""The staff-only management API (Django REST framework).

Opt-in (``pip install 'django-chatparity[api]'``, which brings djangorestframework and
drf-spectacular): add ``"chatparity.api"`` to ``INSTALLED_APPS`` beside ``rest_framework``,
``rest_framework.authtoken`` and ``drf_spectacular``, set
``REST_FRAMEWORK["DEFAULT_SCHEMA_CLASS"] = "drf_spectacular.openapi.AutoSchema"``, and mount
``path("api/", include("chatparity.api.urls"))``.
"""
