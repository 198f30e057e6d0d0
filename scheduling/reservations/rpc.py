"""The gRPC API's Reservations service (``gpuadmin.v1.Reservations``,
protos/gpuadmin/v1/reservations.proto): the REST API's /api/v1/reservations/ over gRPC, with
its serializers, its FilterSet and ``scheduling.reservations.services``."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any

import grpc
from django.db.models import QuerySet
from rest_framework.exceptions import ValidationError

from gpuadmin.access.models import Role
from gpuadmin.access.services import can_act_on, role_of
from gpuadmin.rpc.calls import Call, Refused, filtered, rpc
from gpuadmin.v1 import reservations_pb2 as pb
from gpuadmin.v1 import reservations_pb2_grpc
from scheduling.filters import ReservationFilterSet
from scheduling.jobs.api.views import valid
from scheduling.models import Reservation
from scheduling.reservations import api
from scheduling.reservations import services as reservations

SERVICE = "gpuadmin.v1.Reservations"
PAGE_SIZE = 50
MAX_PAGE_SIZE = 500


def all_reservations() -> QuerySet[Reservation]:
    """Every reservation with what its message shows, as the REST API reads them."""
    return api.ReservationViewSet().get_queryset()


def reservation_message(reservation: Reservation) -> pb.Reservation:
    """``reservation`` as the REST API shows it, as a ``gpuadmin.v1.Reservation``."""
    data: Mapping[str, Any] = api.ReservationSerializer(reservation).data
    message = pb.Reservation(
        id=data["id"],
        owner=data["owner"],
        project=data["project"],
        pool=data["pool"] or "",
        gpu_count=data["gpu_count"],
        gpu_model=data["gpu_model"],
        node=data["node"] or "",
        requested_gpus=data["requested_gpus"],
        gpus=data["gpus"],
        state=data["state"],
        note=data["note"],
        message=data["message"],
        decided_by=data["decided_by"] or "",
    )
    for name in ("start", "end", "created_at"):
        if data[name] is not None:
            getattr(message, name).FromDatetime(datetime.fromisoformat(data[name]))
    return message


def found(reservation_id: int) -> Reservation:
    reservation = all_reservations().filter(pk=reservation_id).first()
    if reservation is None:
        said = f"No reservation {reservation_id}."
        raise Refused(grpc.StatusCode.NOT_FOUND, said, field="id")
    return reservation


def conflicts(exc: reservations.ReservationConflict) -> Refused:
    """The REST API's 409: the reservation's state or the GPUs' bookings refuse it."""
    return Refused(grpc.StatusCode.FAILED_PRECONDITION, str(exc))


def page_offset(token: str) -> int:
    if token and not (token.isdecimal() and int(token) < 2**31):
        raise Refused(
            grpc.StatusCode.INVALID_ARGUMENT,
            "page_token: give the next_page_token of the page before",
            field="page_token",
        )
    return int(token or 0)


class ReservationsServicer(reservations_pb2_grpc.ReservationsServicer):
    """``gpuadmin.v1.Reservations``: read by everyone; requested and canceled as through the
    REST API."""

    @rpc(Role.VIEWER)
    def ListReservations(
        self, request: pb.ListReservationsRequest, call: Call
    ) -> pb.ListReservationsResponse:
        size = request.page_size or PAGE_SIZE
        if not 0 < size <= MAX_PAGE_SIZE:
            said = f"page_size: from 1 to {MAX_PAGE_SIZE}"
            raise Refused(grpc.StatusCode.INVALID_ARGUMENT, said, field="page_size")
        data = {
            "state": list(request.states),
            "owner": request.owner,
            "pool": request.pool,
            "node": request.node,
            "gpu": request.gpu,
        }
        chosen = filtered(ReservationFilterSet, data, all_reservations(), call.user)
        offset = page_offset(request.page_token)
        page = list(chosen[offset : offset + size + 1])
        more = len(page) > size
        return pb.ListReservationsResponse(
            reservations=[reservation_message(reservation) for reservation in page[:size]],
            next_page_token=str(offset + size) if more else "",
        )

    @rpc(Role.VIEWER)
    def GetReservation(self, request: pb.GetReservationRequest, call: Call) -> pb.Reservation:
        return reservation_message(found(request.id))

    @rpc(Role.USER)
    def RequestReservation(
        self, request: pb.RequestReservationRequest, call: Call
    ) -> pb.Reservation:
        body: dict[str, Any] = {
            "gpu_model": request.gpu_model,
            "project": request.project,
            "note": request.note,
        }
        for name in ("start", "end"):
            if not request.HasField(name):
                raise ValidationError({name: ["This field is required."]})
            body[name] = getattr(request, name).ToDatetime().isoformat() + "Z"
        if request.HasField("gpu_count"):
            body["gpu_count"] = request.gpu_count
        if request.HasField("pool"):
            body["pool"] = request.pool
        if request.node:
            body["node"] = request.node
        if request.gpus:
            body["gpus"] = list(request.gpus)
        data = valid(api.ReservationRequestSerializer, body)
        try:
            reservation = reservations.request(
                call.user,
                data.get("gpu_count"),
                data["start"],
                data["end"],
                pool=data.get("pool"),
                gpu_model=data["gpu_model"],
                node=data.get("node"),
                gpus=data.get("gpus", []),
                project=data["project"],
                note=data["note"],
            )
        except reservations.ReservationConflict as exc:
            raise conflicts(exc) from None
        return reservation_message(found(reservation.pk))

    @rpc(Role.USER)
    def CancelReservation(self, request: pb.CancelReservationRequest, call: Call) -> pb.Reservation:
        reservation = found(request.id)
        if not can_act_on(call.user, reservation):
            said = f"A {role_of(call.user)} cannot act on reservation {reservation.pk}."
            raise Refused(grpc.StatusCode.PERMISSION_DENIED, said)
        reason = valid(api.ReservationReasonSerializer, {"reason": request.reason})["reason"]
        try:
            reservations.cancel(reservation, call.user, reason)
        except reservations.ReservationConflict as exc:
            raise conflicts(exc) from None
        return reservation_message(found(reservation.pk))


def add_to(server: grpc.Server) -> list[str]:
    """Add the service to ``server``; the names of what it added (for reflection, health)."""
    reservations_pb2_grpc.add_ReservationsServicer_to_server(ReservationsServicer(), server)
    return [SERVICE]
