"""What the Slurm mirror adds to the pages (``gpuadmin.registry.page_sections``), for
signed-in people: on the fleet page each cluster's state and its nodes, marked as run by Slurm,
with the Slurm job holding each of their GPUs; on a node's or a GPU's page the same for that
node or GPU; on the jobs page Slurm's jobs beside gpuadmin's, as Slurm-web lists them.

The GPUs a Slurm job holds are also answered as its occupants (``holders.gpu_occupants``): an
``Occupant`` of kind ``slurm`` names the Slurm job wherever gpuadmin names a GPU's job.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

from django.db.models import BooleanField, ExpressionWrapper, F, Prefetch, Q
from django.http import HttpRequest

from gpuadmin.access.permissions import signed_in_reader
from gpuadmin.registry import Section
from integrations.slurm.models import SlurmCluster, SlurmJob, SlurmJobGpu, SlurmNode
from inventory.models import Gpu, Node

ORDER = 60  # after the health and scheduling sections
JOBS_SHOWN = 200  # per cluster on the jobs page; the API lists them all
# Pending first, in submission order (a pending job's start time is Slurm's estimate), then the
# others, the latest started first.
JOB_ORDER = (
    ExpressionWrapper(~Q(state="PENDING"), output_field=BooleanField()),
    F("start_time").desc(nulls_last=True),
    "job_id",
)


@dataclass
class HeldGpu:
    """A GPU a Slurm job holds: Slurm's index (the minor number), the catalogued GPU (None:
    the catalog has no GPU of that minor number on that node) and the job."""

    minor_number: int
    gpu: Gpu | None
    job: SlurmJob


@dataclass
class NodeRow:
    row: SlurmNode
    held: list[HeldGpu] = field(default_factory=list)


def _held_by_node(jobs: list[SlurmJob]) -> dict[str, list[HeldGpu]]:
    held: dict[str, list[HeldGpu]] = defaultdict(list)
    for job in jobs:
        for gpu in job.gpus.all():
            held[gpu.node_name].append(HeldGpu(gpu.minor_number, gpu.gpu, job))
    for gpus in held.values():
        gpus.sort(key=lambda one: one.minor_number)
    return held


def _gpus_prefetch() -> Prefetch[Any]:
    return Prefetch("gpus", queryset=SlurmJobGpu.objects.select_related("gpu__node"))


def fleet_section(page: str, obj: Gpu | Node | None, request: HttpRequest) -> Section | None:
    """The clusters (state, last error), and per cluster its nodes with the jobs on their
    GPUs; on a node's page that node's Slurm view, on a GPU's page the Slurm job holding it.
    One query when no cluster is registered, four otherwise."""
    if page not in ("fleet", "node", "gpu") or not signed_in_reader(request):
        return None
    clusters = list(SlurmCluster.objects.all())
    if not clusters:
        return None
    nodes = SlurmNode.objects.select_related("cluster", "node")
    jobs = SlurmJob.objects.filter(gpus__isnull=False).distinct()
    if page == "node" and isinstance(obj, Node):
        nodes = nodes.filter(node=obj)
        jobs = jobs.filter(gpus__gpu__node=obj)
    elif page == "gpu" and isinstance(obj, Gpu):
        nodes = nodes.filter(node=obj.node_id)
        jobs = jobs.filter(gpus__gpu=obj)
    node_rows = list(nodes.order_by("cluster__name", "name"))
    if page != "fleet" and not node_rows:
        return None
    held = _held_by_node(list(jobs.select_related("cluster").prefetch_related(_gpus_prefetch())))
    by_cluster: dict[int, list[NodeRow]] = defaultdict(list)
    for row in node_rows:
        gpus = [one for one in held.get(row.name, []) if one.job.cluster_id == row.cluster_id]
        if page == "gpu" and isinstance(obj, Gpu):
            gpus = [one for one in gpus if one.gpu is not None and one.gpu.pk == obj.pk]
        by_cluster[row.cluster_id].append(NodeRow(row, gpus))
    shown = [cluster for cluster in clusters if page == "fleet" or by_cluster.get(cluster.pk)]
    context = {
        "clusters": [(cluster, by_cluster.get(cluster.pk, [])) for cluster in shown],
        "page": page,
    }
    return Section("slurm/partials/slurm_nodes.html", context, ORDER)


def jobs_section(page: str, obj: Gpu | Node | None, request: HttpRequest) -> Section | None:
    """The jobs page's Slurm jobs, per cluster (``JOB_ORDER``), each with its GPUs on the
    catalog (three queries per cluster)."""
    if page != "jobs" or not signed_in_reader(request):
        return None
    clusters = list(SlurmCluster.objects.all())
    if not clusters:
        return None
    listed = []
    for cluster in clusters:
        jobs = SlurmJob.objects.filter(cluster=cluster)
        rows = list(jobs.prefetch_related(_gpus_prefetch()).order_by(*JOB_ORDER)[:JOBS_SHOWN])
        listed.append((cluster, rows, jobs.count()))
    return Section("slurm/partials/slurm_jobs.html", {"clusters": listed}, ORDER)
