"""What the Ray integration adds to the pages (``gpuadmin.registry.page_sections``), for
signed-in people: on the fleet page each registered cluster's state, GPUs in use and nodes as
the last read found them; on the jobs page the Ray jobs the requester sees (as the API lists
them). The poll reads the clusters: the pages ask none of them, so an unreachable cluster costs
them nothing. The Ray page (``views.clusters``) shows both in full."""

from __future__ import annotations

from typing import Any

from django.http import HttpRequest

from gpuadmin.access.permissions import signed_in, signed_in_reader
from gpuadmin.registry import Section
from integrations.ray.models import RayCluster
from integrations.ray.pages import jobs_context

ORDER = 61  # after the Slurm sections


def fleet_section(page: str, obj: Any, request: HttpRequest) -> Section | None:
    if page != "fleet" or not signed_in_reader(request):
        return None
    clusters = list(RayCluster.objects.all())
    if not clusters:
        return None
    context = {"ray_clusters": clusters, "ray_page_link": True}
    return Section("ray/partials/ray_clusters.html", context, ORDER)


def jobs_section(page: str, obj: Any, request: HttpRequest) -> Section | None:
    """The newest Ray jobs the requester sees, with Ray's message (a queued job's reason),
    coloured as gpuadmin's jobs are."""
    if page != "jobs" or not signed_in_reader(request) or not RayCluster.objects.exists():
        return None
    context = {**jobs_context(signed_in(request)), "ray_page_link": True}
    return Section("ray/partials/ray_jobs.html", context, ORDER)
