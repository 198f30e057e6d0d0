"""The charts the health app adds to the inventory pages (``gpuadmin.registry.page_sections``):
a GPU's four charts on its page, a node's (one line per GPU) on the node page and the fleet's
utilization on the dashboard. The data comes from the history API (``health.api.history``),
fetched and drawn by ``static/health/charts.js``."""

from __future__ import annotations

from django.http import HttpRequest
from django.urls import reverse

from gpuadmin.registry import Section
from health.history import RANGES
from inventory.models import Gpu, Node

ORDER = 20  # right after the page's own facts and live values


def chart_sections(page: str, obj: Gpu | Node | None, request: HttpRequest) -> Section | None:
    if page == "gpu" and isinstance(obj, Gpu):
        url = reverse("health-history:gpu", args=[obj.uuid])
        context = {"history_url": url, "ranges": RANGES, "mig_enabled": obj.mig_enabled}
        return Section("health/partials/charts.html", context, ORDER)
    if page == "node" and isinstance(obj, Node):
        url = reverse("health-history:node", args=[obj.hostname])
        context = {"history_url": url, "ranges": RANGES, "per_gpu": True}
        return Section("health/partials/charts.html", context, ORDER)
    if page == "fleet":
        url = reverse("health-history:fleet")
        return Section(
            "health/partials/fleet_chart.html", {"history_url": url, "ranges": RANGES}, ORDER
        )
    return None
