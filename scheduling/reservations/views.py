"""Reservation pages: the list with the request form, pending approvals (admins) and the
actions (approve, reject, cancel, release), and the week calendars of a node and of a GPU.

Everyone signed in reads every reservation (the calendars show them anyway); requesting
needs the user role, approving and rejecting the admin role, cancelling and releasing
``gpuadmin.access.services.can_act_on``. ``scheduling.reservations.services`` decides; a calendar's
week changes by HTMX (the table alone, the URL pushed).
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.utils import timezone
from django.views.decorators.http import require_GET, require_http_methods, require_POST
from django.views.decorators.vary import vary_on_headers

from gpuadmin.access.models import Role
from gpuadmin.access.permissions import role_required, signed_in
from gpuadmin.access.services import can_act_on, can_submit, is_admin
from gpuadmin.htmx import HtmxHttpRequest, htmx_partial
from inventory.models import Gpu, Node
from scheduling.filters import ReservationFilterSet
from scheduling.models import Reservation, ReservationState
from scheduling.reservations import pages as reservation_pages
from scheduling.reservations import services as reservations
from scheduling.reservations.forms import ReservationForm


@login_required
@require_http_methods(["GET", "POST"])
def reservation_list(request: HttpRequest) -> HttpResponse:
    """The reservations the filters select (by default those not over yet), the requests
    waiting for an admin (admins), and the request form (a POST requests one)."""
    user = signed_in(request)
    now = timezone.now()
    form = ReservationForm(request.POST if request.method == "POST" else None)
    if request.method == "POST":
        if not can_submit(user):
            raise PermissionDenied("Viewers cannot request reservations.")
        if form.is_valid():
            try:
                reservation = reservations.request(user, **form.request())
            except reservations.ReservationInvalid as exc:
                form.add_refusal(exc)
            except reservations.ReservationConflict as exc:
                form.add_error(None, str(exc))
            else:
                messages.success(
                    request,
                    f"Reservation {reservation.pk} {reservation.get_state_display().lower()}.",
                )
                return redirect("reservations:list")
    query = request.GET.copy()
    if not query:
        query["since"] = now.isoformat()  # what is not over yet
    filterset = ReservationFilterSet(
        query, queryset=reservation_pages.with_details(Reservation.objects.all()), request=request
    )
    shown = list(filterset.qs.order_by("start", "pk")[: reservation_pages.LIST_LIMIT + 1])
    pending = Reservation.objects.none()
    if is_admin(user):
        pending = Reservation.objects.filter(state=ReservationState.REQUESTED).order_by("start")
    context = {
        "filterset": filterset,
        "rows": reservation_pages.rows(shown[: reservation_pages.LIST_LIMIT], user, now),
        "more": len(shown) > reservation_pages.LIST_LIMIT,
        "pending": reservation_pages.rows(reservation_pages.with_details(pending), user, now),
        "form": form,
        "can_submit": can_submit(user),
    }
    return render(request, "scheduling/reservations.html", context)


def _acted_on(request: HttpRequest, pk: int) -> Reservation:
    reservation = get_object_or_404(Reservation, pk=pk)
    if not can_act_on(request.user, reservation):
        raise PermissionDenied("Only its owner, operators and admins can change a reservation.")
    return reservation


def _act(request: HttpRequest, change: Callable[[], object], done: str) -> HttpResponse:
    """Make ``change`` (a call of the services); say how it went on the list."""
    try:
        change()
    except (reservations.ReservationInvalid, reservations.ReservationConflict) as exc:
        messages.error(request, str(exc))
    else:
        messages.success(request, done)
    return redirect("reservations:list")


@role_required(Role.ADMIN)
@require_POST
def reservation_approve(request: HttpRequest, pk: int) -> HttpResponse:
    reservation = get_object_or_404(Reservation, pk=pk)
    return _act(
        request,
        partial(reservations.approve, reservation, signed_in(request)),
        f"Reservation {pk} approved.",
    )


@role_required(Role.ADMIN)
@require_POST
def reservation_reject(request: HttpRequest, pk: int) -> HttpResponse:
    reservation = get_object_or_404(Reservation, pk=pk)
    reason = request.POST.get("reason", "")
    return _act(
        request,
        partial(reservations.reject, reservation, signed_in(request), reason),
        f"Reservation {pk} rejected.",
    )


@login_required
@require_POST
def reservation_cancel(request: HttpRequest, pk: int) -> HttpResponse:
    reservation = _acted_on(request, pk)
    return _act(
        request,
        partial(reservations.cancel, reservation, signed_in(request)),
        f"Reservation {pk} canceled.",
    )


@login_required
@require_POST
def reservation_release(request: HttpRequest, pk: int) -> HttpResponse:
    reservation = _acted_on(request, pk)
    return _act(
        request,
        partial(reservations.release, reservation, actor=signed_in(request)),
        f"Reservation {pk} released: its GPUs are free now.",
    )


def _calendar(request: HtmxHttpRequest, gpus: list[Gpu], context: dict) -> HttpResponse:
    now = timezone.now()
    day = reservation_pages.parse_day(request.GET.get("week"), now)
    context["week"] = reservation_pages.week(gpus, day, signed_in(request), now)
    if htmx_partial(request):
        return render(request, "scheduling/calendar.html#calendar-week", context)
    return render(request, "scheduling/calendar.html", context)


@login_required
@require_GET
@vary_on_headers("HX-Request")
def node_calendar(request: HtmxHttpRequest, hostname: str) -> HttpResponse:
    """A week of the node's GPUs: their reservations and the jobs on them now."""
    node = get_object_or_404(Node, hostname=hostname)
    gpus = list(node.gpus.present().select_related("node").order_by("index"))
    return _calendar(request, gpus, {"node": node, "title": node.hostname})


@login_required
@require_GET
@vary_on_headers("HX-Request")
def gpu_calendar(request: HtmxHttpRequest, uuid: str) -> HttpResponse:
    """A week of one GPU: its reservations and the jobs on it now."""
    gpu = get_object_or_404(Gpu.objects.select_related("node"), uuid=uuid)
    return _calendar(
        request,
        [gpu],
        {"node": gpu.node, "gpu": gpu, "title": f"{gpu.node.hostname} GPU {gpu.index}"},
    )
