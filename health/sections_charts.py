"""The charts the health app adds to the inventory pages (``page_sections_requested``):
a GPU's four charts on its page, a node's (one line per GPU) on the node page and the fleet's
utilization on the dashboard. The data comes from the history API (``health.api.history``),
fetched and drawn by ``static/health/charts.js``."""

from __future__ import annotations

from typing import Any

from django.urls import reverse

from health.history import RANGES
from inventory.models import Gpu, Node
from inventory.pages.common import Section

ORDER = 20  # right after the page's own facts and live values


def chart_sections(
    sender: Any, *, page: str, obj: Gpu | Node | None = None, **kwargs: Any
) -> Section | None:
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
