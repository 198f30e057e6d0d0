"""What the Ray integration adds to the pages (``gpuadmin.registry.page_sections``), for
signed-in people: on the fleet page each registered cluster's state, GPUs in use and nodes as
the last read found them; on the jobs page the Ray jobs the requester sees (as the API lists
them). The poll reads the clusters: the pages ask none of them, so an unreachable cluster costs
them nothing."""

from __future__ import annotations

from typing import Any

from django.http import HttpRequest

from gpuadmin.access.permissions import signed_in, signed_in_reader
from gpuadmin.registry import Section
from integrations.ray import services
from integrations.ray.models import RayCluster
from scheduling.jobs.pages import STATE_COLOURS

ORDER = 61  # after the Slurm sections
JOBS_SHOWN = 50  # the newest; the API lists them all


def fleet_section(page: str, obj: Any, request: HttpRequest) -> Section | None:
    if page != "fleet" or not signed_in_reader(request):
        return None
    clusters = list(RayCluster.objects.all())
    if not clusters:
        return None
    return Section("ray/partials/ray_clusters.html", {"ray_clusters": clusters}, ORDER)


def jobs_section(page: str, obj: Any, request: HttpRequest) -> Section | None:
    """The newest Ray jobs the requester sees, with Ray's message (a queued job's reason),
    coloured as gpuadmin's jobs are."""
    if page != "jobs" or not signed_in_reader(request) or not RayCluster.objects.exists():
        return None
    jobs = services.visible_jobs(signed_in(request))
    shown = list(jobs[:JOBS_SHOWN])
    context = {
        "ray_jobs": [(job, STATE_COLOURS.get(job.state, "grey")) for job in shown],
        "ray_jobs_total": jobs.count() if len(shown) == JOBS_SHOWN else len(shown),
    }
    return Section("ray/partials/ray_jobs.html", context, ORDER)
