"""Inventory pages: the fleet dashboard, the GPU page (its passport), the node page, MIG and
topology pages. The apps above inventory add sections to the first three
(``inventory.pages.sections``).

Each page is one template; the live regions are ``{% partialdef %}`` blocks that the same view
renders alone for HTMX requests (not boosted ones), polled every 2 s while the tab is visible;
the poll brings what the catalog says of the page's GPUs (state badges) out of band.
"""

from __future__ import annotations

from collections import defaultdict

from django.contrib import messages
from django.contrib.messages.storage.base import Message
from django.db.models import Q
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.shortcuts import get_object_or_404, redirect, render
from django.urls import reverse
from django.views.decorators.http import require_GET, require_POST
from django.views.decorators.vary import vary_on_headers
from django_htmx.http import HttpResponseStopPolling

from gpuadmin.access.models import Role
from gpuadmin.access.permissions import role_required, signed_in
from gpuadmin.access.services import is_admin
from gpuadmin.audit.models import AuditEvent
from gpuadmin.htmx import HtmxHttpRequest, htmx_partial
from inventory import live, services
from inventory.filters import GpuFilterSet
from inventory.forms import MigCreateForm
from inventory.models import Gpu, GpuLink, Node
from inventory.occupancy import Occupancy
from inventory.pages import fleet, mig, topology
from inventory.pages.sections import requested_sections

AUDIT_HISTORY = 50


@require_GET
@vary_on_headers("HX-Request")
def dashboard(request: HtmxHttpRequest) -> HttpResponse:
    """Every node in view as a card of its GPUs with their live values; filters in the URL.
    The sections other apps add (charts, alerts) come with the full page, not the poll."""
    # The API's FilterSet: a query string selects the same GPUs here and in /api/v1/gpus/.
    filterset = GpuFilterSet(request.GET, queryset=Gpu.objects.all())
    poll = htmx_partial(request)
    nodes = fleet.dashboard_nodes(filterset.qs, filtered=filterset.active, live_only=poll)
    samples = live.latest(node.hostname for node, _ in nodes)
    rows, summary = fleet.node_rows(nodes, samples)
    context = {"nodes": rows, "summary": summary, "filterset": filterset}
    if poll:
        if not nodes:
            return HttpResponseStopPolling()  # nothing in view to refresh
        context.update(poll_rows=fleet.poll_rows_html(rows))
        return render(request, "inventory/dashboard.html#refresh", context)
    context.update(
        legend=fleet.STATUS_MEANINGS, sections=requested_sections("fleet", None, request)
    )
    return render(request, "inventory/dashboard.html", context)


@require_GET
@vary_on_headers("HX-Request")
def gpu_detail(request: HtmxHttpRequest, uuid: str) -> HttpResponse:
    """The GPU's passport: facts, service state and why, live values (processes, MIG devices,
    ECC and remap counters), MIG layout and history, links to its peers, the sections other
    apps add (health events, allocations, charts) and, for admins, its audit history."""
    gpu = get_object_or_404(
        Gpu.objects.select_related("node", "node__pool", "pool", "owner"), uuid=uuid
    )
    node = gpu.node
    sample = live.latest([node.hostname])[node.hostname].get(gpu.uuid)
    # Its occupant too, so a job's own processes are not taken for foreign ones.
    row = fleet.GpuRow(
        gpu, node.is_reachable(), sample, node.state, Occupancy([gpu.pk]), node.refuses_unconfined
    )
    context = {"gpu": gpu, "row": row}
    if htmx_partial(request):
        if gpu.is_missing:
            return HttpResponseStopPolling()  # a GPU gone from its node publishes no samples
        return render(request, "inventory/gpu_detail.html#gpu-poll", context)
    links = {
        link.gpu_b_id if link.gpu_a_id == gpu.pk else link.gpu_a_id: link
        for link in GpuLink.objects.filter(Q(gpu_a=gpu) | Q(gpu_b=gpu))
    }
    peers = [
        (peer, topology.link_cell(gpu, peer, links.get(peer.pk)))
        for peer in node.gpus.present().exclude(pk=gpu.pk).order_by("index")
    ]
    admin = is_admin(request.user)
    context.update(
        mig=mig.mig_layout(gpu, gpu.mig_instances.all(), row.occupancy)
        if gpu.mig_capable
        else None,
        mig_history=mig.mig_history(gpu) if gpu.mig_capable else None,
        peers=peers,
        nvlink_peers=sum(1 for _, cell in peers if cell.css == "nv"),
        sections=requested_sections("gpu", gpu, request),
        is_admin=admin,
        events=_audit_history("inventory.gpu", gpu.uuid) if admin else None,  # for admins
    )
    return render(request, "inventory/gpu_detail.html", context)


def _audit_history(target_type: str, target_id: str) -> list[AuditEvent]:
    return list(
        AuditEvent.objects.filter(target_type=target_type, target_id=target_id)[:AUDIT_HISTORY]
    )


@require_GET
@vary_on_headers("HX-Request")
def node_detail(request: HtmxHttpRequest, hostname: str) -> HttpResponse:
    """A node: its facts, service state and why, its GPUs with their live values (polled),
    links to its topology and MIG pages, the sections other apps add (charts, health events)
    and, for admins, its audit history."""
    nodes = Node.objects.select_related("pool", "owner").annotate(has_mig=fleet.has_mig())
    node = get_object_or_404(nodes, hostname=hostname)
    gpus = fleet.dashboard_gpus(node.gpus.all()).get(node.pk, [])
    [card], summary = fleet.node_rows([(node, gpus)], live.latest([node.hostname]))
    context = {"node": node, "card": card, "summary": summary}
    if htmx_partial(request):
        return render(request, "inventory/node_detail.html#node-poll", context)
    admin = is_admin(request.user)
    context.update(
        legend=fleet.STATUS_MEANINGS,
        sections=requested_sections("node", node, request),
        events=_audit_history("inventory.node", str(node.pk)) if admin else None,
    )
    return render(request, "inventory/node_detail.html", context)


# A message's extra tag naming the GPU whose MIG card shows it.
_ABOUT_GPU = "gpu:"


@require_GET
def node_mig(request: HttpRequest, hostname: str) -> HttpResponse:
    """The node's MIG-capable GPUs: instances drawn on the slices, and what still fits; the
    outcome of an admin's change shows on the card of the GPU it concerns."""
    node = get_object_or_404(Node, hostname=hostname)
    gpus = list(mig.mig_gpus(node))
    occupancy = Occupancy([gpu.pk for gpu in gpus])  # asked once for the page
    layouts = [mig.mig_layout(gpu, gpu.mig_instances.all(), occupancy) for gpu in gpus]
    about_gpu: dict[str, list[Message]] = defaultdict(list)
    elsewhere = []
    for message in messages.get_messages(request):
        if message.extra_tags.startswith(_ABOUT_GPU):
            about_gpu[message.extra_tags.removeprefix(_ABOUT_GPU)].append(message)
        else:
            elsewhere.append(message)
    for layout in layouts:
        layout.messages = about_gpu.pop(layout.gpu.uuid, [])
        if is_admin(request.user):
            layout.create_form = MigCreateForm(gpu=layout.gpu)
    elsewhere += [message for left in about_gpu.values() for message in left]
    return render(
        request,
        "inventory/node_mig.html",
        {"node": node, "layouts": layouts, "messages": elsewhere},
    )


def _back_to_mig_page(
    request: HttpRequest, gpu: Gpu, level: int, message: str
) -> HttpResponseRedirect:
    """To the GPU's card on its node's MIG page, which shows ``message`` at its top."""
    messages.add_message(request, level, message, extra_tags=_ABOUT_GPU + gpu.uuid)
    url = reverse("inventory:node-mig", args=[gpu.node.hostname])
    return redirect(f"{url}#mig-gpu{gpu.index}")


@require_POST
@role_required(Role.ADMIN)
def mig_create(request: HttpRequest, uuid: str) -> HttpResponse:
    """Create a MIG GPU instance through the node's agent (admins); back to the MIG page."""
    gpu = get_object_or_404(Gpu.objects.select_related("node"), uuid=uuid)
    form = MigCreateForm(request.POST, gpu=gpu)
    if not form.is_valid():
        return _back_to_mig_page(
            request, gpu, messages.ERROR, f"GPU {gpu.index}: {form.errors.as_text()}"
        )
    profile = form.cleaned_data["profile_name"]
    try:
        services.create_mig_instance(
            gpu,
            profile,
            actor=signed_in(request),
            placement_start=form.cleaned_data["placement_start"],
        )
    except (services.MigChangeRefused, services.AgentTimedOut) as exc:
        return _back_to_mig_page(
            request, gpu, messages.ERROR, f"{profile} not created on GPU {gpu.index}: {exc}"
        )
    return _back_to_mig_page(
        request, gpu, messages.SUCCESS, f"Created a {profile} instance on GPU {gpu.index}."
    )


@require_POST
@role_required(Role.ADMIN)
def mig_destroy(request: HttpRequest, uuid: str, gi_id: int) -> HttpResponse:
    """Destroy a MIG GPU instance through the node's agent (admins); back to the MIG page."""
    gpu = get_object_or_404(Gpu.objects.select_related("node"), uuid=uuid)
    try:
        services.destroy_mig_instance(gpu, gi_id, actor=signed_in(request))
    except (services.MigChangeRefused, services.AgentTimedOut) as exc:
        return _back_to_mig_page(
            request,
            gpu,
            messages.ERROR,
            f"GPU instance {gi_id} of GPU {gpu.index} not destroyed: {exc}",
        )
    return _back_to_mig_page(
        request, gpu, messages.SUCCESS, f"Destroyed GPU instance {gi_id} of GPU {gpu.index}."
    )


@require_GET
def node_topology(request: HttpRequest, hostname: str) -> HttpResponse:
    """The node's ``nvidia-smi topo -m`` matrix with NUMA and CPU affinity and its NICs."""
    node = get_object_or_404(Node, hostname=hostname)
    gpus = list(node.gpus.present().order_by("index"))
    rows = topology.topology_rows(gpus, node.links.all(), nic_links=node.nic_links.all())
    context = {
        "node": node,
        "rows": rows,
        "legend": topology.LINK_CLASSES,
        "has_nvlink": topology.has_nvlink(rows),
        "has_mig": any(gpu.mig_capable for gpu in gpus),
    }
    return render(request, "inventory/node_topology.html", context)
