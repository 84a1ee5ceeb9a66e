"""Views of the management API: thin viewsets over the serializers and
:mod:`chatparity.accounting.reports`."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, TypeVar

from asgiref.sync import async_to_sync
from django.db.models import Model, ProtectedError, QuerySet
from drf_spectacular.utils import extend_schema, extend_schema_view
from drf_spectacular.views import SpectacularAPIView
from rest_framework import mixins, status, viewsets
from rest_framework.authentication import (
    BaseAuthentication,
    SessionAuthentication,
    TokenAuthentication,
)
from rest_framework.decorators import action
from rest_framework.exceptions import APIException, ValidationError
from rest_framework.filters import BaseFilterBackend, SearchFilter
from rest_framework.pagination import BasePagination, CursorPagination, LimitOffsetPagination
from rest_framework.permissions import DjangoModelPermissions, IsAdminUser
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.serializers import BaseSerializer
from rest_framework.utils.urls import replace_query_param
from rest_framework.views import APIView

from ..accounting import catalog, deployments, reports
from ..accounting.limits import Unavailable
from ..models import ApiKey, Backend, Deployment, ModelAlias, Plan, RequestLog, StoredResponse
from . import serializers

if TYPE_CHECKING:
    from rest_framework.permissions import _PermissionClass  # only in the stubs

_M = TypeVar("_M", bound=Model)
_Query = TypeVar("_Query", bound=BaseSerializer[Any])

_READ = ["%(app_label)s.view_%(model_name)s"]
_CHANGE = ["%(app_label)s.change_%(model_name)s"]


class ModelPermissions(DjangoModelPermissions):
    """Django's model permissions, as in the admin: view to read, add, change or delete to write.

    DRF's own class lets anyone read; here GET, HEAD and OPTIONS need the view permission.
    """

    perms_map = {**DjangoModelPermissions.perms_map, "GET": _READ, "HEAD": _READ, "OPTIONS": _READ}


class ChangePermission(ModelPermissions):
    """For actions that POST a change to an existing row (revoke a key) rather than add one."""

    perms_map = {**ModelPermissions.perms_map, "POST": _CHANGE}


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


class PermittedAPIView(StaffAPIView):
    """Staff users holding the model permission the method needs on the view's ``queryset``
    (superusers hold them all)."""

    permission_classes = (IsAdminUser, ModelPermissions)


class InUse(APIException):
    """409: the row is still referenced, so deleting it would break something."""

    status_code = status.HTTP_409_CONFLICT
    default_detail = "Still in use."
    default_code = "protected"


class CatalogMissing(APIException):
    """501: the [prices] extra is not installed."""

    status_code = status.HTTP_501_NOT_IMPLEMENTED
    default_detail = "The genai-prices catalog is not installed."
    default_code = "catalog_missing"


class StaffModelViewSet(PermittedAPIView, viewsets.ModelViewSet[_M]):
    """CRUD for staff holding the model permissions; unpaginated; deleting a row
    something still points at is a 409."""

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
    @action(detail=True, methods=["post"], permission_classes=[IsAdminUser, ChangePermission])
    def revoke(self, request: Request, pk: str | None = None) -> Response:
        """Deactivate the key: requests made with it are refused."""
        return self._set_active(False)

    @extend_schema(request=None, responses=serializers.ApiKeySerializer)
    @action(detail=True, methods=["post"], permission_classes=[IsAdminUser, ChangePermission])
    def reactivate(self, request: Request, pk: str | None = None) -> Response:
        """Activate the key again."""
        return self._set_active(True)

    def _set_active(self, active: bool) -> Response:
        key = self.get_object()
        key.is_active = active
        key.save(update_fields=["is_active"])
        return Response(self.get_serializer(key).data)


class ModelAliasViewSet(StaffModelViewSet[ModelAlias]):
    """Model aliases: the public model ids clients ask for.

    Deleting one takes it out of every key's scope: a key limited to it is then
    limited to its other aliases, or to none (keys for all aliases say so by a flag).
    """

    queryset = ModelAlias.objects.select_related("backend").order_by("public_id")
    serializer_class = serializers.ModelAliasSerializer

    @extend_schema(request=None, responses=serializers.ModelAliasSerializer)
    @action(
        detail=True,
        methods=["post"],
        url_path="fill-prices",
        permission_classes=[IsAdminUser, ChangePermission],
    )
    def fill_prices(self, request: Request, pk: str | None = None) -> Response:
        """Set the alias's prices to the genai-prices catalog's for its upstream model (a
        price the catalog has none of blank: the provider's ratio). 400 when the catalog
        does not know the model, 501 when it is not installed."""
        alias = self.get_object()
        try:
            found = catalog.fill(alias)
        except catalog.CatalogMissing as missing:
            raise CatalogMissing(str(missing)) from None
        if found is None:
            shown = alias.model or alias.public_id
            raise ValidationError({"model": [f"The catalog does not know {shown!r}."]})
        alias.save(update_fields=list(catalog.PRICE_FIELDS))
        return Response(self.get_serializer(alias).data)


class DeploymentViewSet(StaffModelViewSet[Deployment]):
    """Deployments of the aliases: where each alias's requests are routed
    (docs/routing.md). ``?alias=<public id>`` lists one alias's."""

    queryset = Deployment.objects.select_related("alias", "backend").order_by(
        "alias__public_id", "tier", "-primary", "pk"
    )
    serializer_class = serializers.DeploymentSerializer

    def get_queryset(self) -> QuerySet[Deployment]:
        rows = super().get_queryset()
        alias = self.request.query_params.get("alias")
        return rows.filter(alias__public_id__iexact=alias) if alias else rows

    def get_serializer_context(self) -> dict[str, Any]:
        """With the state now of the deployments shown (none when writing)."""
        context = super().get_serializer_context()
        if self.request.method in ("GET", "HEAD"):
            context["snapshots"] = self._snapshots()
        return context

    def _snapshots(self) -> dict[int, deployments.Snapshot]:
        if self.action == "retrieve":
            rows = [self.get_object()]
        else:
            rows = list(self.filter_queryset(self.get_queryset()))
        by_alias: dict[int, list[Deployment]] = {}
        for row in rows:
            by_alias.setdefault(row.alias_id, []).append(row)
        snapshots = {}
        for alias_id, group in by_alias.items():
            try:
                snapshots[alias_id] = async_to_sync(deployments.snapshot)(
                    group, alias_id, samples="stream"
                )
            except Unavailable:
                continue
        return snapshots

    def perform_destroy(self, instance: Deployment) -> None:
        if instance.primary:
            raise InUse(
                "This is the alias's own deployment: change the alias's backend, or disable"
                " this deployment, or delete the alias."
            )
        serializers.check_group(instance.alias, instance, deleted=True)
        super().perform_destroy(instance)


class BackendViewSet(StaffModelViewSet[Backend]):
    """Backends. Their secret can be written but is never shown."""

    queryset = Backend.objects.order_by("name")
    serializer_class = serializers.BackendSerializer


class PlanViewSet(StaffModelViewSet[Plan]):
    """Plans, highest priority first, as in the admin: who has them (users, groups), the
    aliases their keys may use, the limits of each key made in the portal, the budgets
    all of one user's keys share. Deleting one takes it from its users: their keys made
    in the portal then serve only under another plan of theirs."""

    queryset = Plan.objects.prefetch_related("users", "groups", "allowed_aliases").order_by(
        "-priority", "name"
    )
    serializer_class = serializers.PlanSerializer


class LogPagination(LimitOffsetPagination):
    default_limit = 50
    max_limit = 1000


class LogCursorPagination(CursorPagination):
    """Pages of the request log, newest first, each read from where the last ended:
    page 20,000 costs what the first does (an offset would read every row before it),
    and rows logged meanwhile neither shift nor repeat a page."""

    ordering = ("-created_at", "-pk")
    page_size = 50
    page_size_query_param = "limit"
    max_page_size = 1000


@extend_schema_view(list=extend_schema(parameters=[serializers.RequestLogFilterSerializer]))
class RequestLogViewSet(PermittedAPIView, viewsets.ReadOnlyModelViewSet[RequestLog]):
    """The request log, newest first, in pages that follow ``next`` (a cursor)."""

    queryset = RequestLog.objects.order_by("-created_at", "-pk")
    serializer_class = serializers.RequestLogSerializer
    pagination_class = LogCursorPagination

    def get_queryset(self) -> QuerySet[RequestLog]:
        rows = super().get_queryset()
        if self.action != "list":
            return rows
        return parse_query(self.request, serializers.RequestLogFilterSerializer).filter_rows(rows)


@extend_schema_view(list=extend_schema(parameters=[serializers.StoredResponseFilterSerializer]))
class StoredResponseViewSet(
    PermittedAPIView,
    mixins.ListModelMixin,
    mixins.RetrieveModelMixin,
    mixins.DestroyModelMixin,
    viewsets.GenericViewSet[StoredResponse],
):
    """Responses of ``/v1/responses`` kept with ``store``, newest first: read with the
    view permission, deleted with the delete permission, never written here. The list
    leaves out their input items and response objects; one response shows them."""

    queryset = StoredResponse.objects.select_related("api_key").order_by("-created_at", "-pk")
    pagination_class = LogPagination

    def get_serializer_class(self) -> type[BaseSerializer[StoredResponse]]:
        if self.action == "list":
            return serializers.StoredResponseSerializer
        return serializers.StoredResponseDetailSerializer

    def get_queryset(self) -> QuerySet[StoredResponse]:
        rows = super().get_queryset()
        if self.action != "list":
            return rows
        query = parse_query(self.request, serializers.StoredResponseFilterSerializer)
        return query.filter_rows(rows)


class ReportView(PermittedAPIView):
    """A report over the request log (its daily rollups): needs the log's view permission."""

    queryset = RequestLog.objects.none()  # whose permissions it needs


class UsageView(ReportView):
    """Usage totals from :func:`chatparity.accounting.reports.usage`."""

    @extend_schema(
        parameters=[serializers.UsageFilterSerializer],
        responses=serializers.UsagePageSerializer,
    )
    def get(self, request: Request) -> Response:
        """Requests, errors, cancellations, tokens (the prompt's cache reads and writes
        among them) and cost per day, key, alias and/or endpoint, in pages of groups in
        their order that follow ``next``."""
        query = parse_query(request, serializers.UsageFilterSerializer)
        dimensions, limit = query.validated_data["group_by"], query.validated_data["limit"]
        # One more than the page: whether a next page exists, without counting the groups.
        groups = reports.usage(
            query.log_filter(), dimensions, after=query.validated_data.get("after"), limit=limit + 1
        )
        page, more = groups[:limit], len(groups) > limit
        link = None
        if more:
            position = reports.group_position(page[-1], dimensions)
            cursor = serializers.usage_cursor(position, dimensions)
            link = replace_query_param(request.build_absolute_uri(), "cursor", cursor)
        return Response(
            {"next": link, "results": serializers.UsageRowSerializer(page, many=True).data}
        )


class LatencyView(ReportView):
    """Latency percentiles from :func:`chatparity.accounting.reports.latency_by_alias`."""

    @extend_schema(
        parameters=[serializers.LogFilterSerializer],
        responses=serializers.LatencyRowSerializer(many=True),
    )
    def get(self, request: Request) -> Response:
        """Per alias: requests, error rate, p50/p95 duration and time to first token."""
        log_filter = parse_query(request, serializers.LogFilterSerializer).log_filter()
        latency = reports.latency_by_alias(log_filter)
        return Response(serializers.LatencyRowSerializer(latency, many=True).data)


class DeploymentLatencyView(ReportView):
    """Latency by deployment from :func:`chatparity.accounting.reports.latency_by_deployment`."""

    @extend_schema(
        parameters=[serializers.LogFilterSerializer],
        responses=serializers.DeploymentLatencyRowSerializer(many=True),
    )
    def get(self, request: Request) -> Response:
        """Per alias and deployment: requests, error rate, p50/p95 duration and time to
        first token, of every key (``key`` is not asked)."""
        log_filter = parse_query(request, serializers.LogFilterSerializer).log_filter()
        latency = reports.latency_by_deployment(log_filter)
        return Response(serializers.DeploymentLatencyRowSerializer(latency, many=True).data)


class SchemaView(StaffAPIView, SpectacularAPIView):
    """The OpenAPI 3 document of the site's REST API, this one included: any staff user."""
