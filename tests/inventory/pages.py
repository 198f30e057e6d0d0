"""Helpers for the inventory page tests: simulated nodes in the catalog, with live samples."""

from __future__ import annotations

import uuid

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
    hostname: str, model: str = "dgx-a100-40gb", *, busy: dict[int, int] | None = None
) -> NodeScan:
    """Discover a simulated node, mark it heard from now and publish its live samples.

    ``busy`` maps GPU indexes to a utilization; each gets one process using 30,000 MiB.
    """
    nvml = SimulatedNvml.from_model(model, node_name=hostname)
    apply_discovery(hostname, scan(nvml))
    for index, util in (busy or {}).items():
        faults.start_process(nvml, None, index, 4000 + index, used_mib=30_000, util=util)
    scanned = scan(nvml, include=("facts", "metrics"))
    Node.objects.filter(hostname=hostname).update(last_heartbeat_at=timezone.now())
    live.publish(hostname, scanned)
    return scanned
