"""Reservations in the back office: read here, decided through ``scheduling.reservations.services``
(approve, reject with a reason, cancel, release a running one), each audited there."""

from __future__ import annotations

from collections.abc import Callable

from django.contrib import admin, messages
from django.contrib.auth.models import User
from django.db.models import QuerySet
from django.http import HttpRequest

from gpuadmin.access.permissions import signed_in
from gpuadmin.admin_actions import Apply, reason_action
from scheduling.models import Reservation, ReservationGpu
from scheduling.reservations import services as reservations


class HoldInline(admin.TabularInline):
    model = ReservationGpu
    fields = ("gpu", "during")
    readonly_fields = fields
    extra = 0
    can_delete = False

    def has_add_permission(self, request: HttpRequest, obj: object = None) -> bool:
        return False


def _with_reason(decide: Callable[[Reservation, User, str], Reservation]) -> Apply:
    """A reason action's step: ``decide`` (``reservations.reject``, ``cancel``, ``_release``) on one
    reservation; the services' refusal is the message."""

    def apply(row: Reservation, reason: str, request: HttpRequest) -> str | None:
        try:
            decide(row, signed_in(request), reason)
        except (reservations.ReservationInvalid, reservations.ReservationConflict) as exc:
            return str(exc)
        return None

    return apply


def _release(reservation: Reservation, actor: User, reason: str) -> Reservation:
    return reservations.release(reservation, actor=actor, reason=reason)


@admin.register(Reservation)
class ReservationAdmin(admin.ModelAdmin):
    list_display = (
        "id",
        "owner",
        "state",
        "gpu_count",
        "pool",
        "gpu_model",
        "node",
        "start",
        "end",
        "first_used_at",
        "decided_by",
    )
    list_filter = ("state", "pool", "node")
    list_select_related = ("owner", "pool", "node", "decided_by")
    search_fields = ("id", "owner__username", "project", "note")
    date_hierarchy = "start"
    inlines = [HoldInline]
    actions = [
        "approve_reservations",
        reason_action(
            "reject_reservations",
            "Reject selected reservations",
            _with_reason(reservations.reject),
            max_length=reservations.REASON_CHARS,
        ),
        reason_action(
            "cancel_reservations",
            "Cancel selected reservations",
            _with_reason(reservations.cancel),
            max_length=reservations.REASON_CHARS,
        ),
        reason_action(
            "release_reservations",
            "Release selected running reservations (the rest of their windows is free)",
            _with_reason(_release),
            max_length=reservations.REASON_CHARS,
        ),
    ]

    @admin.action(description="Approve selected reservations (their GPUs are chosen and held)")
    def approve_reservations(self, request: HttpRequest, queryset: QuerySet[Reservation]) -> None:
        approved = 0
        for reservation in queryset.order_by("start", "pk"):
            try:
                reservations.approve(reservation, signed_in(request))
            except reservations.ReservationConflict as exc:
                self.message_user(request, str(exc), messages.ERROR)
            else:
                approved += 1
        self.message_user(request, f"{approved} approved.", messages.SUCCESS)

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False  # requested through the page or the API, checked by the services

    def has_change_permission(self, request: HttpRequest, obj: object = None) -> bool:
        return obj is None  # the list and its actions, never a form that edits one

    def has_delete_permission(self, request: HttpRequest, obj: object = None) -> bool:
        return False
