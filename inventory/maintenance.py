"""Maintenance from the GPU and node pages (operators and admins): drain, offline, online,
each with a reason, through the audited state services. The form is a section of those pages
(``gpuadmin.registry.page_sections``, registered in ``InventoryConfig.ready``)."""

from __future__ import annotations

from typing import Any

from django.contrib import messages
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect
from django.views.decorators.http import require_POST

from gpuadmin.access.models import Role
from gpuadmin.access.permissions import role_required, signed_in
from gpuadmin.access.services import at_least
from gpuadmin.registry import Section
from inventory import services
from inventory.forms import StateChangeForm
from inventory.models import Gpu, Node

SECTION_ORDER = 5  # near the top: the state badge's neighbour


def maintenance_section(page: str, obj: Gpu | Node | None, request: HttpRequest) -> Section | None:
    """The maintenance form on a GPU's or node's page, for operators and admins."""
    if obj is None or page not in ("gpu", "node") or not at_least(request.user, Role.OPERATOR):
        return None
    form = StateChangeForm(row=obj)
    return Section(
        "inventory/partials/gpu_maintenance.html",
        {"row": obj, "form": form, "is_gpu": isinstance(obj, Gpu)},
        order=SECTION_ORDER,
    )


@require_POST
@role_required(Role.OPERATOR)
def gpu_state(request: HttpRequest, uuid: str) -> HttpResponse:
    """Change a GPU's state from its page; back to the page with what happened."""
    gpu = get_object_or_404(Gpu.objects.select_related("node"), uuid=uuid)
    _change(request, gpu, services.set_gpu_state)
    return redirect("inventory:gpu-detail", uuid)


@require_POST
@role_required(Role.OPERATOR)
def node_state(request: HttpRequest, hostname: str) -> HttpResponse:
    """Change a node's state from its page; back to the page with what happened."""
    node = get_object_or_404(Node, hostname=hostname)
    _change(request, node, services.set_node_state)
    return redirect("inventory:node-detail", hostname)


def _change(request: HttpRequest, row: Gpu | Node, setter: Any) -> None:
    label = f"GPU {row.index} of {row.node.hostname}" if isinstance(row, Gpu) else row.hostname
    form = StateChangeForm(request.POST, row=row)
    if not form.is_valid():
        messages.error(request, f"{label} not changed: {form.errors.as_text()}")
        return
    state = form.cleaned_data["state"]
    try:
        changed = setter(row, state, actor=signed_in(request), reason=form.cleaned_data["reason"])
    except services.IllegalGpuTransition as exc:
        messages.error(request, f"Not changed: {exc}")
        return
    messages.success(request, f"{label} is now {state}." if changed else f"{label} was {state}.")
