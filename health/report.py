"""What ``/api/v1/health/`` (and ``gpuadmin health``) reports of a GPU, a node or the fleet:
each GPU's state and reason with its open quarantine and the health counters of its live
sample (the fleet page's row), and the recent health events named by the XID catalog."""

from __future__ import annotations

import dataclasses

from django.db.models import Exists, OuterRef, Q

from health.models import HealthEvent, Quarantine
from health.sections import EventRow, event_rows
from inventory.choices import GpuState
from inventory.models import Gpu, Node
from inventory.pages.fleet import GpuRow, gpu_rows

DEFAULT_EVENTS = 20
MAX_EVENTS = 500
OPEN_QUARANTINE = Q(closed_at__isnull=True)


@dataclasses.dataclass(frozen=True)
class GpuHealth:
    row: GpuRow  # its state, status, live sample and counters as the fleet page reads them
    quarantine: Quarantine | None  # open


@dataclasses.dataclass(frozen=True)
class HealthReport:
    gpus: list[GpuHealth]
    events: list[EventRow]  # newest first


def health_report(
    *, gpu: Gpu | None = None, node: Node | None = None, events: int = DEFAULT_EVENTS
) -> HealthReport:
    """One GPU's health, a node's (every GPU of it), or the fleet's: the GPUs that need a
    look (not available, missing, or with an open quarantine) and the fleet's latest events.
    Four queries and one round trip to Redis."""
    gpus = Gpu.objects.select_related("node").order_by("node__hostname", "index", "pk")
    found = HealthEvent.objects.select_related("gpu", "node", "policy")
    if gpu is not None:
        gpus, found = gpus.filter(pk=gpu.pk), found.filter(gpu=gpu)
    elif node is not None:
        gpus, found = gpus.filter(node=node), found.filter(node=node)
    else:
        quarantined = Exists(Quarantine.objects.filter(OPEN_QUARANTINE, gpu=OuterRef("pk")))
        gpus = gpus.filter(
            ~Q(state=GpuState.AVAILABLE) | Q(missing_since__isnull=False) | quarantined
        )
    rows = gpu_rows(gpus)
    open_ones = Quarantine.objects.filter(OPEN_QUARANTINE, gpu_id__in=rows)
    held = {
        quarantine.gpu_id: quarantine
        for quarantine in open_ones.select_related("gpu__node", "cause__gpu__node", "policy")
    }
    return HealthReport(
        [GpuHealth(row, held.get(pk)) for pk, row in rows.items()],
        event_rows(found[:events]),
    )
