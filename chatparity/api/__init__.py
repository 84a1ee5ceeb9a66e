"""The staff-only management API (Django REST framework).

Mount with ``path("api/", include("chatparity.api.urls"))``; needs ``rest_framework``,
``rest_framework.authtoken`` and ``drf_spectacular`` in ``INSTALLED_APPS`` and
``REST_FRAMEWORK["DEFAULT_SCHEMA_CLASS"] = "drf_spectacular.openapi.AutoSchema"``.
"""
