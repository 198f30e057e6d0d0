"""The alerts pages: ``/alerts/`` (firing first, then the history; filters; acknowledging for
operators and admins; the list polls as an HTMX partial) and ``/alerts/idle/`` (idle-held
GPU-hours per user), and the fleet page's alerts panel (an answer of
``gpuadmin.registry.page_sections``)."""

from __future__ import annotations

from typing import Any

from django.contrib import messages
from django.core.paginator import Paginator
from django.db.models import Case, IntegerField, When
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.shortcuts import get_object_or_404, redirect, render
from django.utils.http import url_has_allowed_host_and_scheme
from django.views.decorators.http import require_GET, require_POST
from django.views.decorators.vary import vary_on_headers

from gpuadmin.access.models import Role
from gpuadmin.access.permissions import role_required, signed_in, signed_in_reader
from gpuadmin.access.services import at_least
from gpuadmin.htmx import HtmxHttpRequest, htmx_partial
from gpuadmin.registry import Section
from health import alerts, rules
from health.choices import SEVERITY_RANK, AlertState
from health.filters import AlertFilterSet
from health.forms import AcknowledgeForm
from health.models import Alert
from inventory.models import Gpu, Node

PAGE_ROWS = 50
PANEL_ROWS = 8
IDLE_DAYS = 7
ACK_ROLE = Role.OPERATOR
WORST_FIRST = Case(
    *(When(severity=severity, then=-rank) for severity, rank in SEVERITY_RANK.items()),
    output_field=IntegerField(),
)


@role_required(Role.VIEWER)
@require_GET
@vary_on_headers("HX-Request")
def alert_list(request: HtmxHttpRequest) -> HttpResponse:
    filterset = AlertFilterSet(
        request.GET,
        queryset=Alert.objects.select_related("rule", "node", "gpu", "acknowledged_by").order_by(
            "state", "-opened_at", "-pk"
        ),
    )
    page = Paginator(filterset.qs, PAGE_ROWS).get_page(request.GET.get("page"))
    query = request.GET.copy()
    query.pop("page", None)
    context: dict[str, Any] = {
        "filterset": filterset,
        "page": page,
        "query": query.urlencode(),
        "can_ack": at_least(request.user, ACK_ROLE),
        "ack_form": AcknowledgeForm(),
        "firing": Alert.objects.filter(state=AlertState.FIRING).count(),
    }
    if htmx_partial(request):
        return render(request, "health/alerts.html#alerts-live", context)
    context["idle"] = rules.idle_held_hours(IDLE_DAYS)[:10]
    context["idle_days"] = IDLE_DAYS
    return render(request, "health/alerts.html", context)


@role_required(ACK_ROLE)
@require_POST
def alert_ack(request: HttpRequest, pk: int) -> HttpResponse:
    alert = get_object_or_404(Alert, pk=pk)
    form = AcknowledgeForm(request.POST)
    if not form.is_valid():
        messages.error(request, f"Not acknowledged: {form.errors.as_text()}")
    else:
        try:
            alerts.acknowledge(alert, signed_in(request), form.cleaned_data["comment"])
            messages.success(request, f"Alert {alert.pk} acknowledged.")
        except alerts.AlertNotFiring as exc:
            messages.error(request, str(exc))
    return _back_to_page(request)


def _back_to_page(request: HttpRequest) -> HttpResponse:
    """Back to the alerts page the form was on (its ``next``: a path of this site, as Django's
    login checks it), else the alerts page."""
    target = request.POST.get("next", "")
    if target.startswith("/") and url_has_allowed_host_and_scheme(
        target, allowed_hosts={request.get_host()}, require_https=request.is_secure()
    ):
        return HttpResponseRedirect(target)
    return redirect("health:alerts")


@role_required(Role.VIEWER)
@require_GET
def idle_held(request: HttpRequest) -> HttpResponse:
    days = IDLE_DAYS * 4 if request.GET.get("range") == "month" else IDLE_DAYS
    return render(
        request, "health/alerts_idle.html", {"idle": rules.idle_held_hours(days), "days": days}
    )


def panel_context() -> dict[str, Any]:
    """The firing alerts, worst first, and how many fire (two queries at most)."""
    firing = Alert.objects.filter(state=AlertState.FIRING)
    rows = list(
        firing.select_related("node", "gpu", "acknowledged_by").order_by(WORST_FIRST, "-opened_at")[
            :PANEL_ROWS
        ]
    )
    count = firing.count() if len(rows) == PANEL_ROWS else len(rows)
    return {"alerts": rows, "firing_count": count}


@role_required(Role.VIEWER)
@require_GET
def alerts_panel(request: HttpRequest) -> HttpResponse:
    """The fleet page's panel alone (it polls itself)."""
    return render(request, "health/partials/alerts_panel.html", panel_context())


def alerts_section(page: str, obj: Gpu | Node | None, request: HttpRequest) -> Section | None:
    """The fleet page's alerts panel, for signed-in people (as the alerts page)."""
    if page != "fleet" or not signed_in_reader(request):
        return None
    return Section("health/partials/alerts_panel.html", panel_context(), order=20)
