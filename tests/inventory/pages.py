"""Helpers for the inventory page tests: simulated nodes in the catalog, with live samples."""

from __future__ import annotations

import uuid
from collections.abc import Callable

from django.utils import timezone

from inventory import live
from inventory.models import Node
from inventory.nvml.scanner import NodeScan, scan
from inventory.nvml.sim import SimulatedNvml, faults
from inventory.services import apply_discovery


def unique_host(prefix: str = "dgx") -> str:
    """Hostnames are unique per test: the live samples live in a Redis shared by the run."""
    return f"{prefix}-{uuid.uuid4().hex[:6]}"


def add_node(
    hostname: str,
    model: str = "dgx-a100-40gb",
    *,
    busy: dict[int, int] | None = None,
    prepare: Callable[[SimulatedNvml], object] | None = None,
) -> NodeScan:
    """Discover a simulated node, mark it heard from now and publish its live samples (the
    sections an agent samples: facts, metrics and health counters).

    ``busy`` maps GPU indexes to a utilization; each gets one process (pid 4000 + index)
    using 30,000 MiB. ``prepare`` gets the simulator before the sample (to inject faults).
    """
    nvml = SimulatedNvml.from_model(model, node_name=hostname)
    apply_discovery(hostname, scan(nvml))
    for index, util in (busy or {}).items():
        faults.start_process(nvml, None, index, 4000 + index, used_mib=30_000, util=util)
    if prepare is not None:
        prepare(nvml)
    scanned = scan(nvml, include=("facts", "metrics", "health"))
    Node.objects.filter(hostname=hostname).update(last_heartbeat_at=timezone.now())
    live.publish(hostname, scanned)
    return scanned
