"""The health back office. Quarantines and circuit-breaker trips are read-only here; people
act on them through actions that ask for a reason (release a quarantine, reset the breaker),
audited through ``health.quarantine``."""

from __future__ import annotations

from django.contrib import admin
from django.http import HttpRequest

from gpuadmin.access.permissions import signed_in
from gpuadmin.admin_actions import reason_action
from health import quarantine
from health.models import BreakerTrip, Quarantine
from inventory.models import STATE_REASON_CHARS


class ReadOnlyAdmin(admin.ModelAdmin):
    """Rows the health services write; people only look (and act through actions)."""

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: object = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: object = None) -> bool:
        return False


def _release(row: Quarantine, reason: str, request: HttpRequest) -> str | None:
    if quarantine.release(row, actor=signed_in(request), reason=reason):
        return None
    return f"{row}: already closed"


def _reset(row: BreakerTrip, reason: str, request: HttpRequest) -> str | None:
    if row.reset_at is None and quarantine.reset_breaker(signed_in(request), reason=reason):
        return None
    return f"{row}: already reset"


@admin.register(Quarantine)
class QuarantineAdmin(ReadOnlyAdmin):
    list_display = (
        "gpu",
        "state",
        "gpu_state",
        "cause",
        "opened_at",
        "probation_until",
        "closed_at",
    )
    list_filter = ("state", "gpu_state", "gpu__node")
    list_select_related = ("gpu__node", "cause__gpu__node", "cause__node")
    search_fields = ("gpu__uuid", "gpu__node__hostname", "note")
    actions = [
        reason_action(
            "release_quarantines",
            "Release selected quarantines (GPUs back in service)",
            _release,
            max_length=STATE_REASON_CHARS,
        )
    ]


@admin.register(BreakerTrip)
class BreakerTripAdmin(ReadOnlyAdmin):
    list_display = ("tripped_at", "falling", "fleet", "reset_at", "reset_by")
    list_select_related = ("reset_by",)
    actions = [
        reason_action(
            "reset_breaker",
            "Reset the circuit breaker (automatic fencing back on)",
            _reset,
            max_length=STATE_REASON_CHARS,
        )
    ]
