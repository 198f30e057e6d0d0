"""The MIG re-layout section of the GPU page (``gpuadmin.registry.page_sections``):
the GPU's re-layouts with their steps, polled live every 2 s while one is open, and for admins
the form that asks for one and the button that cancels one still draining. The work is
``scheduling.sharing.relayout``'s; these views only ask it."""

from __future__ import annotations

from typing import Any

from django import forms
from django.contrib import messages
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.urls import reverse
from django.views.decorators.http import require_GET, require_POST

from gpuadmin.access.models import Role
from gpuadmin.access.permissions import role_required, signed_in, signed_in_reader
from gpuadmin.access.services import is_admin
from gpuadmin.registry import Section
from inventory.models import Gpu, Node
from inventory.nvml import mig_catalog
from scheduling.models import RELAYOUT_OPEN_STATES, MigRelayout
from scheduling.sharing import relayout

ORDER = 35  # before the allocation history
SHOWN = 5
TEMPLATE = "scheduling/partials/mig_relayout.html"


class RelayoutForm(forms.Form):
    layout_name = forms.ChoiceField(label="Layout")
    custom_layout = forms.CharField(
        label="Custom layout",
        required=False,
        max_length=relayout.LAYOUT_CHARS,
        help_text="With “custom”: profiles, each @start where it must sit, e.g. "
        "3g.20gb@4, 2g.10gb, 1g.5gb@6.",
    )
    preempt = forms.BooleanField(
        label="Preempt its jobs now (else wait for them to end)", required=False
    )

    def __init__(self, table: mig_catalog.MigTable, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        names = (*relayout.layout_names(table), relayout.CUSTOM)
        layout_name = self.fields["layout_name"]
        assert isinstance(layout_name, forms.ChoiceField)
        layout_name.choices = [(name, name) for name in names]


def _context(request: HttpRequest, gpu: Gpu) -> dict[str, Any] | None:
    table = mig_catalog.table_for_gpu(gpu.name)
    if table is None or not gpu.mig_capable:
        return None
    rows = list(MigRelayout.objects.filter(gpu=gpu).select_related("requested_by")[:SHOWN])
    return {
        "gpu": gpu,
        "relayouts": rows,
        "live": any(row.state in RELAYOUT_OPEN_STATES for row in rows),
        "live_url": reverse("relayout:gpu-section", args=[gpu.uuid]),
        "form": RelayoutForm(table) if is_admin(request.user) and gpu.mig_enabled else None,
        "steps": list(RELAYOUT_OPEN_STATES),
    }


def relayout_section(page: str, obj: Gpu | Node | None, request: HttpRequest) -> Section | None:
    """A MIG-capable GPU's re-layouts (one query),
    for signed-in people (as its poll)."""
    if page != "gpu" or not isinstance(obj, Gpu) or not signed_in_reader(request):
        return None
    context = _context(request, obj)
    return None if context is None else Section(TEMPLATE, context, ORDER)


@role_required(Role.VIEWER)
@require_GET
def gpu_section(request: HttpRequest, uuid: str) -> HttpResponse:
    """The section alone, for its 2 s poll."""
    gpu = get_object_or_404(Gpu.objects.select_related("node"), uuid=uuid)
    context = _context(request, gpu)
    if context is None:
        return HttpResponse(status=204)
    return render(request, TEMPLATE, context)


@role_required(Role.ADMIN)
@require_POST
def request_relayout(request: HttpRequest, uuid: str) -> HttpResponse:
    gpu = get_object_or_404(Gpu.objects.select_related("node"), uuid=uuid)
    table = mig_catalog.table_for_gpu(gpu.name)
    back = redirect("inventory:gpu-detail", uuid=uuid)
    if table is None:
        messages.error(request, f"GPU {gpu.index} of {gpu.node.hostname} has no MIG profiles.")
        return back
    form = RelayoutForm(table, request.POST)
    if not form.is_valid():
        for field, errors in form.errors.items():
            messages.error(request, f"{field}: {' '.join(str(error) for error in errors)}")
        return back
    name = form.cleaned_data["layout_name"]
    try:
        item = relayout.request(
            gpu,
            name,
            actor=signed_in(request),
            layout=relayout.asked_layout(name, form.cleaned_data["custom_layout"]),
            preempt=form.cleaned_data["preempt"],
        )
    except relayout.RelayoutRefused as exc:
        messages.error(request, f"{exc.field}: {exc.message}")
    else:
        messages.success(request, f"MIG re-layout {item.pk} to {name} started: the GPU drains.")
    return back


@role_required(Role.ADMIN)
@require_POST
def cancel_relayout(request: HttpRequest, pk: int) -> HttpResponse:
    item = get_object_or_404(MigRelayout.objects.select_related("gpu"), pk=pk)
    try:
        relayout.cancel(item, actor=signed_in(request))
    except relayout.RelayoutRefused as exc:
        messages.error(request, exc.message)
    else:
        messages.success(request, f"MIG re-layout {pk} canceled: the GPU is available again.")
    return redirect("inventory:gpu-detail", uuid=item.gpu.uuid)
