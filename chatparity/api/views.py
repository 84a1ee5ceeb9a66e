"""Views of the management API: thin viewsets over the serializers and :mod:`chatparity.reports`."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, TypeVar

from django.db.models import Model, ProtectedError, QuerySet
from drf_spectacular.utils import extend_schema, extend_schema_view
from drf_spectacular.views import SpectacularAPIView
from rest_framework import status, viewsets
from rest_framework.authentication import (
    BaseAuthentication,
    SessionAuthentication,
    TokenAuthentication,
)
from rest_framework.decorators import action
from rest_framework.exceptions import APIException
from rest_framework.filters import BaseFilterBackend, SearchFilter
from rest_framework.pagination import BasePagination, LimitOffsetPagination
from rest_framework.permissions import IsAdminUser
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.serializers import BaseSerializer
from rest_framework.views import APIView

from .. import reports
from ..models import ApiKey, Backend, ModelAlias, RequestLog
from . import serializers

if TYPE_CHECKING:
    from rest_framework.permissions import _PermissionClass  # only in the stubs

_M = TypeVar("_M", bound=Model)
_Query = TypeVar("_Query", bound=serializers.LogFilterSerializer)


class StaffAPIView(APIView):
    """Staff users only, by session or ``Authorization: Token <token>``.

    Set here rather than taken from the host's ``REST_FRAMEWORK`` defaults, which a
    reusable app cannot know.
    """

    # Token first: its WWW-Authenticate header makes an anonymous request a 401, not a 403.
    authentication_classes: Sequence[type[BaseAuthentication]] = (
        TokenAuthentication,
        SessionAuthentication,
    )
    permission_classes: Sequence[_PermissionClass] = (IsAdminUser,)


class InUse(APIException):
    """409: the row is still referenced, so deleting it would break or widen something."""

    status_code = status.HTTP_409_CONFLICT
    default_detail = "Still in use."
    default_code = "protected"


class StaffModelViewSet(StaffAPIView, viewsets.ModelViewSet[_M]):
    """CRUD for staff; unpaginated; deleting a row something still points at is a 409."""

    pagination_class: type[BasePagination] | None = None
    filter_backends: Sequence[type[BaseFilterBackend]] = ()

    def perform_destroy(self, instance: _M) -> None:
        try:
            instance.delete()
        except ProtectedError as error:
            raise InUse(
                f"{instance} is still used by {len(error.protected_objects)} object(s);"
                " delete or reassign them first."
            ) from error


def parse_query(request: Request, serializer_class: type[_Query]) -> _Query:
    """The query parameters validated by ``serializer_class``; bad ones are a 400.

    An empty parameter (``?alias=``, as an HTML form sends it) counts as absent.
    """
    # A plain dict, not the QueryDict: from form-like input DRF reads an absent boolean as false.
    params = {name: value for name, value in request.query_params.items() if value != ""}
    query = serializer_class(data=params)
    query.is_valid(raise_exception=True)
    return query


class ApiKeyViewSet(StaffModelViewSet[ApiKey]):
    """API keys. Creating one returns its plaintext once; nothing else ever shows it."""

    queryset = ApiKey.objects.prefetch_related("allowed_aliases").order_by("-created_at", "-pk")
    filter_backends = (SearchFilter,)
    search_fields = ["name", "prefix"]

    def get_serializer_class(self) -> type[BaseSerializer[ApiKey]]:
        if self.action == "create":
            return serializers.ApiKeyCreateSerializer
        return serializers.ApiKeySerializer

    @extend_schema(request=None, responses=serializers.ApiKeySerializer)
    @action(detail=True, methods=["post"])
    def revoke(self, request: Request, pk: str | None = None) -> Response:
        """Deactivate the key: requests made with it are refused."""
        return self._set_active(False)

    @extend_schema(request=None, responses=serializers.ApiKeySerializer)
    @action(detail=True, methods=["post"])
    def reactivate(self, request: Request, pk: str | None = None) -> Response:
        """Activate the key again."""
        return self._set_active(True)

    def _set_active(self, active: bool) -> Response:
        key = self.get_object()
        key.is_active = active
        key.save(update_fields=["is_active"])
        return Response(self.get_serializer(key).data)


class ModelAliasViewSet(StaffModelViewSet[ModelAlias]):
    """Model aliases: the public model ids clients ask for."""

    queryset = ModelAlias.objects.select_related("backend").order_by("public_id")
    serializer_class = serializers.ModelAliasSerializer

    def perform_destroy(self, instance: ModelAlias) -> None:
        # A key whose scope loses its last alias would be allowed every alias.
        scoped = ApiKey.objects.filter(allowed_aliases=instance).count()
        if scoped:
            raise InUse(
                f"{instance} is in the scope of {scoped} API key(s); remove it from them first."
            )
        super().perform_destroy(instance)


class BackendViewSet(StaffModelViewSet[Backend]):
    """Backends. Their secret can be written but is never shown."""

    queryset = Backend.objects.order_by("name")
    serializer_class = serializers.BackendSerializer


class LogPagination(LimitOffsetPagination):
    default_limit = 50
    max_limit = 1000


@extend_schema_view(list=extend_schema(parameters=[serializers.RequestLogFilterSerializer]))
class RequestLogViewSet(StaffAPIView, viewsets.ReadOnlyModelViewSet[RequestLog]):
    """The request log, newest first."""

    queryset = RequestLog.objects.order_by("-created_at", "-pk")
    serializer_class = serializers.RequestLogSerializer
    pagination_class = LogPagination

    def get_queryset(self) -> QuerySet[RequestLog]:
        rows = super().get_queryset()
        if self.action != "list":
            return rows
        return parse_query(self.request, serializers.RequestLogFilterSerializer).filter_rows(rows)


class UsageView(StaffAPIView):
    """Usage totals from :func:`chatparity.reports.usage`."""

    @extend_schema(
        parameters=[serializers.UsageFilterSerializer],
        responses=serializers.UsageRowSerializer(many=True),
    )
    def get(self, request: Request) -> Response:
        """Requests, errors, cancellations and tokens per day, key and/or alias."""
        query = parse_query(request, serializers.UsageFilterSerializer)
        rows = query.filter_rows(RequestLog.objects.all())
        totals = reports.usage(rows, query.validated_data["group_by"])
        return Response(serializers.UsageRowSerializer(totals, many=True).data)


class LatencyView(StaffAPIView):
    """Latency percentiles from :func:`chatparity.reports.latency_by_alias`."""

    @extend_schema(
        parameters=[serializers.LogFilterSerializer],
        responses=serializers.LatencyRowSerializer(many=True),
    )
    def get(self, request: Request) -> Response:
        """Per alias: requests, error rate, p50/p95 duration and time to first token."""
        rows = parse_query(request, serializers.LogFilterSerializer).filter_rows(
            RequestLog.objects.all()
        )
        latency = reports.latency_by_alias(rows)
        return Response(serializers.LatencyRowSerializer(latency, many=True).data)


class SchemaView(StaffAPIView, SpectacularAPIView):
    """The OpenAPI 3 document of the site's REST API, this one included."""
