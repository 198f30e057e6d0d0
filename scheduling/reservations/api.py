"""``/api/v1/reservations/``: list (filters: state, owner (``me``), pool, node, gpu, since,
until), request, retrieve; ``POST .../approve/`` and ``.../reject/`` for admins,
``.../cancel/`` and ``.../release/`` for the owner, operators and admins
(``gpuadmin.access.services.can_act_on``).

Everyone signed in reads every reservation, as the calendars show them; requesting needs the
user role. ``scheduling.reservations.services`` decides; its refusals are a 400 naming the
field, or a 409 when the reservation's state or the GPUs' bookings do not allow it.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from django.db.models import Prefetch, QuerySet
from django.urls import include, path
from django_filters.rest_framework import DjangoFilterBackend
from drf_spectacular.utils import OpenApiResponse, extend_schema
from rest_framework import mixins, serializers, status, viewsets
from rest_framework.decorators import action
from rest_framework.exceptions import PermissionDenied
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.routers import SimpleRouter

from gpuadmin import api
from gpuadmin.access.permissions import CanSubmit, signed_in
from gpuadmin.access.services import can_act_on, is_admin, role_of
from inventory.models import Gpu, Node, Pool
from scheduling.filters import ReservationFilterSet
from scheduling.jobs.api.serializers import PoolNameField
from scheduling.jobs.api.views import valid
from scheduling.models import Reservation, ReservationGpu
from scheduling.reservations import services as reservations


class ReservationSerializer(api.ModelSerializer):
    owner = serializers.CharField(source="owner.username", read_only=True)
    pool = serializers.CharField(source="pool.name", default=None, read_only=True, allow_null=True)
    node = serializers.CharField(
        source="node.hostname", default=None, read_only=True, allow_null=True
    )
    requested_gpus = serializers.SerializerMethodField(help_text="UUIDs of the GPUs it names.")
    gpus = serializers.SerializerMethodField(help_text="UUIDs of the GPUs it holds (approved).")
    decided_by = serializers.CharField(
        source="decided_by.username", default=None, read_only=True, allow_null=True
    )

    class Meta:
        model = Reservation
        fields = [
            "id",
            "owner",
            "project",
            "pool",
            "gpu_count",
            "gpu_model",
            "node",
            "requested_gpus",
            "gpus",
            "start",
            "end",
            "state",
            "note",
            "message",
            "decided_by",
            "created_at",
            "first_used_at",
            "released_at",
        ]
        read_only_fields = fields

    def get_requested_gpus(self, reservation: Reservation) -> list[str]:
        return [gpu.uuid for gpu in reservation.requested_gpus.all()]

    def get_gpus(self, reservation: Reservation) -> list[str]:
        return [hold.gpu.uuid for hold in reservation.holds.all()]


class ReservationRequestSerializer(api.Serializer):
    gpu_count = serializers.IntegerField(
        min_value=1,
        max_value=reservations.MAX_GPUS,
        required=False,
        help_text="GPUs to book; default: the number of `gpus` named, else 1.",
    )
    start = api.LocalDateTimeField(help_text="Without an offset: in the site's time zone.")
    end = api.LocalDateTimeField(help_text="Exclusive: the GPUs are free again at `end`.")
    pool = PoolNameField(
        slug_field="name",
        queryset=Pool.objects.all(),
        required=False,
        allow_null=True,
        help_text="Pool name; none or ~: the GPUs in no pool.",
    )
    gpu_model = serializers.CharField(
        max_length=100,
        required=False,
        allow_blank=True,
        default="",
        help_text="GPU product name, or an unambiguous part of it (H100).",
    )
    node = serializers.SlugRelatedField(
        slug_field="hostname",
        queryset=Node.objects.all(),
        required=False,
        allow_null=True,
        help_text="Hostname: all GPUs on this node.",
    )
    gpus = serializers.ListField(
        child=serializers.SlugRelatedField(slug_field="uuid", queryset=Gpu.objects.all()),
        required=False,
        max_length=reservations.MAX_GPUS,
        help_text="UUIDs: exactly these GPUs.",
    )
    project = serializers.CharField(max_length=100, required=False, allow_blank=True, default="")
    note = serializers.CharField(max_length=2000, required=False, allow_blank=True, default="")


class ReservationReasonSerializer(api.Serializer):
    reason = serializers.CharField(
        max_length=reservations.REASON_CHARS, required=False, allow_blank=True, default=""
    )


@contextmanager
def reservation_errors() -> Iterator[None]:
    """A 409 for the state or the bookings (a ``ReservationInvalid`` is the API's 400 naming
    the field, as every ``FieldRefusal``)."""
    try:
        yield
    except reservations.ReservationConflict as exc:
        raise api.Conflict(str(exc)) from None


ERRORS = {
    403: OpenApiResponse(api.ErrorSerializer, "Not allowed to act on this reservation."),
    404: OpenApiResponse(api.ErrorSerializer, "No such reservation."),
    409: OpenApiResponse(api.ErrorSerializer, "Its state or the GPUs' bookings refuse it."),
}


class ReservationViewSet(
    mixins.ListModelMixin,
    mixins.RetrieveModelMixin,
    mixins.CreateModelMixin,
    viewsets.GenericViewSet,
):
    """GPU reservations, the latest window first."""

    serializer_class = ReservationSerializer
    permission_classes = [CanSubmit]
    pagination_class = api.Pagination
    filter_backends = [DjangoFilterBackend]
    filterset_class = ReservationFilterSet

    def get_queryset(self) -> QuerySet[Reservation]:
        holds = ReservationGpu.objects.select_related("gpu").order_by("gpu__node_id", "gpu__index")
        return (
            Reservation.objects.select_related("owner", "pool", "node", "decided_by")
            .prefetch_related("requested_gpus", Prefetch("holds", queryset=holds))
            .order_by("-start", "-pk")
        )

    def _body(self, reservation: Reservation) -> dict[str, Any]:
        return ReservationSerializer(self.get_queryset().get(pk=reservation.pk)).data

    @extend_schema(
        request=ReservationRequestSerializer,
        responses={
            201: ReservationSerializer,
            409: OpenApiResponse(api.ErrorSerializer, "Auto-approved, but the GPUs are booked."),
        },
    )
    def create(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        """Request a reservation: approved at once where the pool auto-approves within your
        quota (409 when its GPUs are booked for that window), else it waits for an admin."""
        data = valid(ReservationRequestSerializer, request.data)
        gpus = data.get("gpus", [])
        with reservation_errors():
            reservation = reservations.request(
                signed_in(request),
                data.get("gpu_count"),
                data["start"],
                data["end"],
                pool=data.get("pool"),
                gpu_model=data["gpu_model"],
                node=data.get("node"),
                gpus=gpus,
                project=data["project"],
                note=data["note"],
            )
        return Response(self._body(reservation), status=status.HTTP_201_CREATED)

    @extend_schema(request=None, responses={200: ReservationSerializer, **ERRORS})
    @action(detail=True, methods=["post"])
    def approve(self, request: Request, pk: str) -> Response:
        """Approve a requested reservation (admins): its GPUs are chosen and held."""
        reservation = self._decided(request)
        with reservation_errors():
            reservations.approve(reservation, signed_in(request))
        return Response(self._body(reservation))

    @extend_schema(
        request=ReservationReasonSerializer, responses={200: ReservationSerializer, **ERRORS}
    )
    @action(detail=True, methods=["post"])
    def reject(self, request: Request, pk: str) -> Response:
        """Turn a requested reservation down (admins), with an optional reason."""
        reason = valid(ReservationReasonSerializer, request.data)["reason"]
        reservation = self._decided(request)
        with reservation_errors():
            reservations.reject(reservation, signed_in(request), reason)
        return Response(self._body(reservation))

    @extend_schema(
        request=ReservationReasonSerializer, responses={200: ReservationSerializer, **ERRORS}
    )
    @action(detail=True, methods=["post"])
    def cancel(self, request: Request, pk: str) -> Response:
        """Withdraw a requested reservation, or an approved one before its start."""
        reason = valid(ReservationReasonSerializer, request.data)["reason"]
        reservation = self._acted_on(request)
        with reservation_errors():
            reservations.cancel(reservation, signed_in(request), reason)
        return Response(self._body(reservation))

    @extend_schema(
        request=ReservationReasonSerializer, responses={200: ReservationSerializer, **ERRORS}
    )
    @action(detail=True, methods=["post"])
    def release(self, request: Request, pk: str) -> Response:
        """Give a running reservation's GPUs back now (the rest of its window is free)."""
        reason = valid(ReservationReasonSerializer, request.data)["reason"]
        reservation = self._acted_on(request)
        with reservation_errors():
            reservations.release(reservation, actor=signed_in(request), reason=reason)
        return Response(self._body(reservation))

    def _decided(self, request: Request) -> Reservation:
        reservation = self.get_object()
        if not is_admin(request.user):
            raise PermissionDenied(
                f"Only admins decide on reservations; you are a {role_of(request.user)}."
            )
        return reservation

    def _acted_on(self, request: Request) -> Reservation:
        reservation = self.get_object()
        if not can_act_on(request.user, reservation):
            raise PermissionDenied(
                f"A {role_of(request.user)} cannot act on reservation {reservation.pk}."
            )
        return reservation


router = SimpleRouter()
router.register("reservations", ReservationViewSet, basename="reservation")

urlpatterns = [path("api/v1/", include((router.urls, "api"), namespace="reservation-api-v1"))]
