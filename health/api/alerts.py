"""``/api/v1/alerts/`` (list, filter, retrieve; ``POST .../ack/`` for operators and admins)
and ``/api/v1/idle-held/`` (idle-held GPU-hours per user and day).

Every signed-in person reads them, as the fleet pages show GPUs' health and occupants to all;
acknowledging needs the operator role, like acting on GPUs.
"""

from __future__ import annotations

import django_filters
from django.db.models import QuerySet
from django.urls import include, path
from django_filters.rest_framework import DjangoFilterBackend, FilterSet
from drf_spectacular.utils import OpenApiResponse, extend_schema
from rest_framework import mixins, serializers, status, viewsets
from rest_framework.decorators import action
from rest_framework.exceptions import APIException
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.routers import SimpleRouter

from gpuadmin import api
from gpuadmin.access.permissions import IsOperatorOrReadOnly, signed_in
from health import alerts
from health.filters import AlertFilterSet
from health.models import Alert, IdleHeldUsage


class AlertNotFiring(APIException):
    status_code = status.HTTP_409_CONFLICT
    default_detail = "Only a firing alert can be acknowledged."
    default_code = "conflict"


class AlertSerializer(api.ModelSerializer):
    rule = serializers.CharField(source="rule.name", default=None, read_only=True)
    node = serializers.CharField(source="node.hostname", default=None, read_only=True)
    gpu_uuid = serializers.CharField(source="gpu.uuid", default=None, read_only=True)
    gpu_index = serializers.IntegerField(source="gpu.index", default=None, read_only=True)
    acknowledged_by = serializers.CharField(
        source="acknowledged_by.username", default=None, read_only=True
    )

    class Meta:
        model = Alert
        fields = [
            "id",
            "fingerprint",
            "state",
            "severity",
            "summary",
            "rule",
            "node",
            "gpu_uuid",
            "gpu_index",
            "event",
            "labels",
            "opened_at",
            "last_seen_at",
            "resolved_at",
            "acknowledged_by",
            "acknowledged_at",
            "ack_comment",
        ]
        read_only_fields = fields


class AcknowledgeSerializer(api.Serializer):
    comment = serializers.CharField(max_length=2000, required=False, allow_blank=True, default="")


class AlertViewSet(viewsets.ReadOnlyModelViewSet):
    """Alerts, firing first, then the newest."""

    serializer_class = AlertSerializer
    permission_classes = [IsOperatorOrReadOnly]
    pagination_class = api.Pagination
    filter_backends = [DjangoFilterBackend]
    filterset_class = AlertFilterSet

    def get_queryset(self) -> QuerySet[Alert]:
        return Alert.objects.select_related("rule", "node", "gpu", "acknowledged_by").order_by(
            "state", "-opened_at", "-pk"
        )

    @extend_schema(
        request=AcknowledgeSerializer,
        responses={
            200: AlertSerializer,
            409: OpenApiResponse(api.ErrorSerializer, "The alert is resolved."),
        },
    )
    @action(detail=True, methods=["post"])
    def ack(self, request: Request, pk: str) -> Response:
        """Acknowledge a firing alert (by you, now, with an optional comment)."""
        params = AcknowledgeSerializer(data=request.data)
        params.is_valid(raise_exception=True)
        try:
            alert = alerts.acknowledge(
                self.get_object(), signed_in(request), params.validated_data["comment"]
            )
        except alerts.AlertNotFiring as exc:
            raise AlertNotFiring(str(exc)) from None
        return Response(AlertSerializer(self.get_queryset().get(pk=alert.pk)).data)


class IdleHeldFilterSet(FilterSet):
    user = django_filters.CharFilter(field_name="user__username", label="User")
    since = django_filters.DateFilter(field_name="day", lookup_expr="gte", label="Since")
    until = django_filters.DateFilter(field_name="day", lookup_expr="lte", label="Until")

    class Meta:
        model = IdleHeldUsage
        fields = ["user", "since", "until"]


class IdleHeldSerializer(api.ModelSerializer):
    user = serializers.CharField(source="user.username", read_only=True)
    gpu_hours = serializers.SerializerMethodField()

    class Meta:
        model = IdleHeldUsage
        fields = ["user", "day", "gpu_seconds", "gpu_hours"]

    def get_gpu_hours(self, usage: IdleHeldUsage) -> float:
        return round(usage.gpu_seconds / 3600, 3)


class IdleHeldViewSet(mixins.ListModelMixin, viewsets.GenericViewSet):
    """GPU time each user held allocated but idle (the idle-held rule counts it), per day."""

    serializer_class = IdleHeldSerializer
    permission_classes = [IsOperatorOrReadOnly]  # read-only: a write is a 405
    pagination_class = api.Pagination
    filter_backends = [DjangoFilterBackend]
    filterset_class = IdleHeldFilterSet
    queryset = IdleHeldUsage.objects.select_related("user").order_by("-day", "-gpu_seconds")


router = SimpleRouter()
router.register("alerts", AlertViewSet, basename="alert")
router.register("idle-held", IdleHeldViewSet, basename="idle-held")

urlpatterns = [path("api/v1/", include((router.urls, "api"), namespace="health-api-v1"))]
