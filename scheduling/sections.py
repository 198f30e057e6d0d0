"""Scheduling's sections of the GPU and node pages (``gpuadmin.registry.page_sections``):
the GPU's allocation history (every job the GPU was given to, newest first, with its user and
dates; the last ``ALLOCATION_HISTORY`` on the page, the rest through
``/api/v1/allocations/?gpu=<uuid>``), and the GPU's or node's coming reservations with a link
to its week calendar."""

from __future__ import annotations

from django.db.models.functions import Now
from django.http import HttpRequest
from django.urls import reverse
from django.utils.http import urlencode

from gpuadmin.access.permissions import signed_in_reader
from gpuadmin.registry import Section
from inventory.models import Gpu, Node
from scheduling.jobs.pages import state_colour
from scheduling.models import Allocation, Reservation, ReservationGpu, ReservationState
from scheduling.sharing import services as sharing

ORDER = 40  # after the charts and the health events
ALLOCATION_HISTORY = 50


def allocation_section(page: str, obj: Gpu | Node | None, request: HttpRequest) -> Section | None:
    """The GPU's allocations, each with its share,
    and on an MPS-shared GPU what its shares take now (two queries, three with MPS)."""
    if page != "gpu" or not isinstance(obj, Gpu):
        return None
    allocations = Allocation.objects.filter(gpu=obj)
    rows = list(
        allocations.select_related("job", "job__owner").order_by("-allocated_at", "-pk")[
            :ALLOCATION_HISTORY
        ]
    )
    context = {
        "allocations": [(allocation, state_colour(allocation.job.state)) for allocation in rows],
        "total": allocations.count(),
        "limit": ALLOCATION_HISTORY,
        "all_url": f"{reverse('scheduling-api-v1:allocation-list')}?{urlencode({'gpu': obj.uuid})}",
        "mps": _mps_use(obj) if obj.mps_shared else None,
    }
    return Section("scheduling/partials/gpu_allocations.html", context, ORDER)


def _mps_use(gpu: Gpu) -> dict[str, int]:
    """What the MPS shares on ``gpu`` take now, as the database counts them (at most 100 %)."""
    percent, memory_mib, jobs = sharing.mps_use([gpu.pk]).get(gpu.pk, (0, 0, ()))
    return {"percent": percent, "free": 100 - percent, "memory_mib": memory_mib, "jobs": len(jobs)}


RESERVATIONS_ORDER = 45  # after the allocation history
RESERVATIONS_SHOWN = 10


def reservation_section(page: str, obj: Gpu | Node | None, request: HttpRequest) -> Section | None:
    """The GPU's or the node's reservations that are
    not over, soonest first, and a link to its week calendar (two queries), for signed-in
    people (as the reservation pages)."""
    if not signed_in_reader(request):
        return None
    if isinstance(obj, Gpu) and page == "gpu":
        holds = ReservationGpu.objects.filter(gpu=obj)
        calendar = reverse("reservations:gpu-calendar", args=[obj.uuid])
    elif isinstance(obj, Node) and page == "node":
        holds = ReservationGpu.objects.filter(gpu__node=obj)
        calendar = reverse("reservations:node-calendar", args=[obj.hostname])
    else:
        return None
    coming = Reservation.objects.filter(
        pk__in=holds.values("reservation_id"), state=ReservationState.APPROVED, end__gt=Now()
    ).select_related("owner")
    context = {
        "reservations": list(coming.order_by("start", "pk")[:RESERVATIONS_SHOWN]),
        "total": coming.count(),
        "calendar_url": calendar,
    }
    return Section("scheduling/partials/reservations_section.html", context, RESERVATIONS_ORDER)
