"""``/api/v1/quarantines/`` (the GPUs health fenced; ``POST .../release/`` puts one back in
service: operators and admins, as for any GPU maintenance) and ``/api/v1/breaker/`` (the
circuit breaker; ``POST /api/v1/breaker/reset/`` turns automatic fencing back on: admins)."""

from __future__ import annotations

from django.conf import settings
from django.urls import include, path
from django_filters.rest_framework import DjangoFilterBackend
from drf_spectacular.utils import OpenApiResponse, extend_schema
from rest_framework import mixins, serializers, viewsets
from rest_framework.decorators import action
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.routers import SimpleRouter
from rest_framework.views import APIView

from gpuadmin import api
from gpuadmin.access.permissions import IsAdminOrReadOnly, IsOperatorOrReadOnly, signed_in
from health import quarantine
from health.models import BreakerTrip, Quarantine
from inventory.models import STATE_REASON_CHARS, Gpu


class QuarantineSerializer(api.ModelSerializer):
    gpu_uuid = serializers.CharField(source="gpu.uuid", read_only=True)
    gpu_index = serializers.IntegerField(source="gpu.index", read_only=True)
    node = serializers.CharField(source="gpu.node.hostname", read_only=True)
    cause = serializers.CharField(source="cause.__str__", read_only=True)
    policy = serializers.CharField(source="policy.name", default=None, read_only=True)
    gpu_state = serializers.CharField(
        source="gpu.state", read_only=True, help_text="The GPU's state now."
    )
    fenced_to = serializers.CharField(
        source="gpu_state",
        read_only=True,
        help_text="The state health put the GPU in (probation returns it only from there).",
    )
    waiting_for = serializers.SerializerMethodField(
        help_text='What an open quarantine waits for, in a sentence ("" once closed).'
    )

    def get_waiting_for(self, row: Quarantine) -> str:
        return quarantine.waiting_for(row)

    class Meta:
        model = Quarantine
        fields = [
            "id",
            "node",
            "gpu_uuid",
            "gpu_index",
            "state",
            "gpu_state",
            "fenced_to",
            "waiting_for",
            "cause",
            "policy",
            "opened_at",
            "fault_cleared_at",
            "probation_until",
            "reset_required",
            "reset_at",
            "closed_at",
            "note",
        ]
        read_only_fields = fields


class ReasonSerializer(api.Serializer):
    reason = serializers.CharField(max_length=STATE_REASON_CHARS, help_text="Why (audited).")


class BreakerTripSerializer(api.ModelSerializer):
    reset_by = serializers.CharField(source="reset_by.username", default=None, read_only=True)

    class Meta:
        model = BreakerTrip
        fields = ["id", "tripped_at", "falling", "fleet", "reset_at", "reset_by"]
        read_only_fields = fields


class BreakerSerializer(api.Serializer):
    open = serializers.BooleanField(help_text="Automatic fencing is off until an admin resets.")
    trip = BreakerTripSerializer(allow_null=True)
    limit = serializers.FloatField(help_text="GPUs that may be fenced within the window.")
    window_s = serializers.IntegerField()


NOT_OPEN = {409: OpenApiResponse(api.ErrorSerializer, "Nothing to do: it is closed already.")}


class QuarantineViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, viewsets.GenericViewSet):
    """Quarantines, newest first; ``?state=`` filters (``fenced``, ``probation``, ``held``,
    ``returned``, ``released``)."""

    queryset = Quarantine.objects.select_related("gpu__node", "cause__gpu__node", "policy")
    serializer_class = QuarantineSerializer
    permission_classes = [IsOperatorOrReadOnly]
    pagination_class = api.Pagination
    filter_backends = [DjangoFilterBackend]
    filterset_fields = {"state": ["exact"]}

    @extend_schema(request=ReasonSerializer, responses={200: QuarantineSerializer, **NOT_OPEN})
    @action(detail=True, methods=["post"], filter_backends=[], pagination_class=None)
    def release(self, request: Request, pk: str) -> Response:
        """Put the GPU back in service (if it is still as health left it) and close the
        quarantine as released, with a reason (audited): a held, flapping GPU needs this."""
        row = self.get_object()
        body = ReasonSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        if not quarantine.release(row, actor=signed_in(request), reason=body.data["reason"]):
            row.refresh_from_db(fields=["state"])
            raise api.Conflict(f"Quarantine {row.pk} is {row.state}: closed already.")
        return Response(QuarantineSerializer(row).data)


def breaker_body() -> dict[str, object]:
    return {
        "open": (trip := quarantine.breaker_open()) is not None,
        "trip": trip,
        "limit": quarantine.breaker_limit(Gpu.objects.present().count()),
        "window_s": settings.GPUADMIN_BREAKER_WINDOW_S,
    }


class BreakerView(APIView):
    permission_classes = [IsAdminOrReadOnly]

    @extend_schema(responses={200: BreakerSerializer})
    def get(self, request: Request) -> Response:
        """The circuit breaker: open (automatic fencing off) or not, and its limit now."""
        return Response(BreakerSerializer(breaker_body()).data)


class BreakerResetView(APIView):
    permission_classes = [IsAdminOrReadOnly]

    @extend_schema(request=ReasonSerializer, responses={200: BreakerSerializer, **NOT_OPEN})
    def post(self, request: Request) -> Response:
        """Reset the tripped circuit breaker (admins): automatic fencing back on (audited)."""
        body = ReasonSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        if not quarantine.reset_breaker(signed_in(request), reason=body.data["reason"]):
            raise api.Conflict("The circuit breaker is not open.")
        return Response(BreakerSerializer(breaker_body()).data)


router = SimpleRouter()
router.register("quarantines", QuarantineViewSet, basename="quarantine")

urlpatterns = [
    path("api/v1/", include((router.urls, "health-quarantine"), namespace="health-quarantine")),
    path("api/v1/breaker/", BreakerView.as_view(), name="api-breaker"),
    path("api/v1/breaker/reset/", BreakerResetView.as_view(), name="api-breaker-reset"),
]
