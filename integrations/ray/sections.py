"""What the Ray integration adds to the fleet page (``gpuadmin.registry.page_sections``), for
signed-in people: each registered cluster's state, GPUs in use and nodes as the last read found
them (the poll reads the clusters; the page asks none of them, so an unreachable cluster costs
it nothing)."""

from __future__ import annotations

from typing import Any

from django.http import HttpRequest

from gpuadmin.access.permissions import signed_in_reader
from gpuadmin.registry import Section
from integrations.ray.models import RayCluster

ORDER = 61  # after the Slurm clusters


def fleet_section(page: str, obj: Any, request: HttpRequest) -> Section | None:
    if page != "fleet" or not signed_in_reader(request):
        return None
    clusters = list(RayCluster.objects.all())
    if not clusters:
        return None
    return Section("ray/partials/ray_clusters.html", {"ray_clusters": clusters}, ORDER)
