"""Inventory pages: the fleet dashboard, GPU detail, MIG and topology pages.

Each page is one template; the live regions are ``{% partialdef %}`` blocks that the same view
renders alone for HTMX requests (not boosted ones), polled every 2 s while the tab is visible.
"""

from __future__ import annotations

from django.contrib import messages
from django.contrib.admin.views.decorators import staff_member_required
from django.db.models import Q
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.shortcuts import get_object_or_404, redirect, render
from django.urls import reverse
from django.views.decorators.http import require_GET, require_POST
from django.views.decorators.vary import vary_on_headers
from django_htmx.http import HttpResponseStopPolling

from gpuadmin.audit.models import AuditEvent
from gpuadmin.htmx import HtmxHttpRequest, htmx_partial
from inventory import live, pages, services
from inventory.forms import MigCreateForm
from inventory.models import Gpu, GpuLink, Node

AUDIT_HISTORY = 50


@require_GET
@vary_on_headers("HX-Request")
def dashboard(request: HtmxHttpRequest) -> HttpResponse:
    """Every node in view as a card of its GPUs with their live values; filters in the URL."""
    filters = pages.FleetFilters.from_query(request.GET)
    nodes = list(filters.nodes())
    rows, summary = pages.fleet_rows(nodes, live.latest(node.hostname for node in nodes))
    context = {"nodes": rows, "summary": summary, "filters": filters}
    if htmx_partial(request):
        if not nodes:
            return HttpResponseStopPolling()  # nothing in view to refresh
        return render(request, "inventory/dashboard.html#refresh", context)
    context["filter_fields"] = pages.filter_fields(filters)
    return render(request, "inventory/dashboard.html", context)


@require_GET
@vary_on_headers("HX-Request")
def gpu_detail(request: HtmxHttpRequest, uuid: str) -> HttpResponse:
    """A GPU's facts, live values, MIG layout, links to its peers and audit history."""
    gpu = get_object_or_404(
        Gpu.objects.select_related("node", "node__pool", "pool", "owner"), uuid=uuid
    )
    node = gpu.node
    sample = live.latest([node.hostname])[node.hostname].get(gpu.uuid)
    context = {"gpu": gpu, "row": pages.GpuRow(gpu, node.is_reachable(), sample, node.state)}
    if htmx_partial(request):
        if gpu.is_missing:
            return HttpResponseStopPolling()  # a GPU gone from its node publishes no samples
        return render(request, "inventory/gpu_detail.html#gpu-live", context)
    links = {
        link.gpu_b_id if link.gpu_a_id == gpu.pk else link.gpu_a_id: link
        for link in GpuLink.objects.filter(Q(gpu_a=gpu) | Q(gpu_b=gpu))
    }
    peers = [
        (peer, pages.link_cell(gpu, peer, links.get(peer.pk)))
        for peer in node.gpus.present().exclude(pk=gpu.pk).order_by("index")
    ]
    context.update(
        mig=pages.mig_layout(gpu, gpu.mig_instances.all()) if gpu.mig_capable else None,
        peers=peers,
        events=AuditEvent.objects.filter(target_type="inventory.gpu", target_id=gpu.uuid)[
            :AUDIT_HISTORY
        ]
        if request.user.is_staff
        else [],
    )
    return render(request, "inventory/gpu_detail.html", context)


@require_GET
def node_mig(request: HttpRequest, hostname: str) -> HttpResponse:
    """The node's MIG-capable GPUs: instances drawn on the slices, and what still fits."""
    node = get_object_or_404(Node, hostname=hostname)
    layouts = [pages.mig_layout(gpu, gpu.mig_instances.all()) for gpu in pages.mig_gpus(node)]
    if request.user.is_staff:
        for layout in layouts:
            layout.create_form = MigCreateForm(gpu=layout.gpu)
    return render(request, "inventory/node_mig.html", {"node": node, "layouts": layouts})


def _back_to_mig_page(gpu: Gpu) -> HttpResponseRedirect:
    url = reverse("inventory:node-mig", args=[gpu.node.hostname])
    return redirect(f"{url}#mig-gpu{gpu.index}")


@require_POST
@staff_member_required
def mig_create(request: HttpRequest, uuid: str) -> HttpResponse:
    """Create a MIG GPU instance through the node's agent (admins); back to the MIG page."""
    gpu = get_object_or_404(Gpu.objects.select_related("node"), uuid=uuid)
    form = MigCreateForm(request.POST, gpu=gpu)
    if not form.is_valid():
        messages.error(request, f"GPU {gpu.index}: {form.errors.as_text()}")
        return _back_to_mig_page(gpu)
    profile = form.cleaned_data["profile_name"]
    try:
        services.create_mig_instance(
            gpu, profile, actor=request.user, placement_start=form.cleaned_data["placement_start"]
        )
    except (services.MigChangeRefused, services.AgentTimedOut) as exc:
        messages.error(request, f"{profile} not created on GPU {gpu.index}: {exc}")
    else:
        messages.success(request, f"Created a {profile} instance on GPU {gpu.index}.")
    return _back_to_mig_page(gpu)


@require_POST
@staff_member_required
def mig_destroy(request: HttpRequest, uuid: str, gi_id: int) -> HttpResponse:
    """Destroy a MIG GPU instance through the node's agent (admins); back to the MIG page."""
    gpu = get_object_or_404(Gpu.objects.select_related("node"), uuid=uuid)
    try:
        services.destroy_mig_instance(gpu, gi_id, actor=request.user)
    except (services.MigChangeRefused, services.AgentTimedOut) as exc:
        messages.error(request, f"GPU instance {gi_id} of GPU {gpu.index} not destroyed: {exc}")
    else:
        messages.success(request, f"Destroyed GPU instance {gi_id} of GPU {gpu.index}.")
    return _back_to_mig_page(gpu)


@require_GET
def node_topology(request: HttpRequest, hostname: str) -> HttpResponse:
    """The node's ``nvidia-smi topo -m`` matrix with NUMA and CPU affinity."""
    node = get_object_or_404(Node, hostname=hostname)
    gpus = list(node.gpus.present().order_by("index"))
    context = {
        "node": node,
        "rows": pages.topology_rows(gpus, node.links.all()),
        "legend": pages.LINK_CLASSES,
        "nvlink_rates": pages.NVLINK_GBPS_PER_LINK,
    }
    return render(request, "inventory/node_topology.html", context)
