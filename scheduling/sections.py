"""The allocation history on the GPU page (``inventory.signals.page_sections_requested``):
every job the GPU was given to, newest first, with its user and dates; the last
``ALLOCATION_HISTORY`` on the page, the rest through ``/api/v1/allocations/?gpu=<uuid>``."""

from __future__ import annotations

from typing import Any

from django.urls import reverse
from django.utils.http import urlencode

from inventory.models import Gpu, Node
from inventory.pages.common import Section
from scheduling.models import Allocation
from scheduling.pages import state_colour

ORDER = 40  # after the charts and the health events
ALLOCATION_HISTORY = 50


def allocation_section(
    sender: Any, *, page: str, obj: Gpu | Node | None = None, **kwargs: Any
) -> Section | None:
    """Receiver of ``page_sections_requested``: the GPU's allocations (two queries)."""
    if page != "gpu" or not isinstance(obj, Gpu):
        return None
    allocations = Allocation.objects.filter(gpu=obj)
    rows = list(
        allocations.select_related("job", "job__owner").order_by("-allocated_at", "-pk")[
            :ALLOCATION_HISTORY
        ]
    )
    context = {
        "allocations": [(allocation, state_colour(allocation.job.state)) for allocation in rows],
        "total": allocations.count(),
        "limit": ALLOCATION_HISTORY,
        "all_url": f"{reverse('scheduling-api-v1:allocation-list')}?{urlencode({'gpu': obj.uuid})}",
    }
    return Section("scheduling/partials/gpu_allocations.html", context, ORDER)
