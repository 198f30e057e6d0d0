"""Celery tasks of the inventory app: thin wrappers around inventory.agent and services.

``scan_node``, ``mig_create`` and ``mig_destroy`` run on a node agent's own queue
(``node.<name>``), as orders signed for it (``gpuadmin.access.node_orders.NodeOrder``); the
others run centrally and are what agents send: scans to sync (which register the node) and
heartbeats, believed only from the node they are about (``gpuadmin.access.nodes.speaks_for``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from celery import Task, shared_task
from django.utils.dateparse import parse_datetime

from gpuadmin.access.node_orders import NodeOrder
from gpuadmin.access.nodes import speaks_for
from inventory import services
from inventory.agent import node_backend, scan_this_node
from inventory.nvml import mig_ops
from inventory.nvml.scanner import NodeScan, scan

log = logging.getLogger("gpuadmin.inventory")


@shared_task(name="inventory.scan_node", base=NodeOrder, ignore_result=False)
def scan_node() -> dict[str, Any]:
    """The node's full NVML scan as JSON (runs on the node's agent)."""
    return scan_this_node().to_dict()


@shared_task(name="inventory.heartbeat", bind=True)
def heartbeat(self: Task, hostname: str, sent_at: str) -> None:
    if speaks_for(self, hostname):
        services.record_heartbeat(hostname, parse_datetime(sent_at))


@shared_task(name="inventory.sync_node", bind=True)
def sync_node(
    self: Task,
    hostname: str,
    scan: dict[str, Any],
    sent_at: str,
    model: str,
    agent_version: str,
    nvml_backend: str = "",
    job_account: str = "",
    isolation: dict[str, str] | None = None,
) -> dict[str, int]:
    """Register the node (first time) and apply its agent's scan; returns how many audited
    differences the scan brought. ``nvml_backend`` (``real`` or ``sim``), ``job_account`` and
    ``isolation`` (what confines its jobs: ``{"isolation": ..., "reason": ...}``) stay unknown
    for an agent of an older release that does not send them."""
    if not speaks_for(self, hostname):
        return {"changes": 0}
    services.register_node(
        hostname,
        model=model,
        agent_version=agent_version,
        nvml_backend=nvml_backend,
        job_account=job_account,
    )
    if isolation is not None:
        services.record_node_isolation(hostname, isolation["isolation"], isolation["reason"])
    plan = services.apply_discovery(hostname, NodeScan.from_dict(scan))
    services.record_heartbeat(hostname, parse_datetime(sent_at))
    if plan.changes:  # a rescan that finds nothing new is not worth a line
        log.info(
            "node %s: its scan changed %d thing(s) in the catalog", hostname, len(plan.changes)
        )
    return {"changes": len(plan.changes)}


@shared_task(name="inventory.mig_create", base=NodeOrder, ignore_result=False)
def mig_create(
    gpu_index: int, profile_name: str, placement_start: int | None = None
) -> dict[str, Any]:
    """Create a MIG GPU instance and its full-size compute instance on this node (runs on the
    node's agent). Returns ``{"gi_id", "ci_id", "error": None, "scan"}``, or ``{"error":
    {"message", "code"}, "scan"}`` when NVML refused; ``scan`` is the node's fresh full scan."""

    def create(nvml: Any) -> dict[str, Any]:
        gi_id, ci_id = mig_ops.create_gpu_instance(nvml, gpu_index, profile_name, placement_start)
        return {"gi_id": gi_id, "ci_id": ci_id}

    return _mig_operation(create)


@shared_task(name="inventory.mig_destroy", base=NodeOrder, ignore_result=False)
def mig_destroy(gpu_index: int, gi_id: int) -> dict[str, Any]:
    """Destroy a MIG GPU instance (its compute instances first) on this node (runs on the
    node's agent). Returns ``{"error": None | {"message", "code"}, "scan"}``."""

    def destroy(nvml: Any) -> dict[str, Any]:
        mig_ops.destroy_gpu_instance(nvml, gpu_index, gi_id)
        return {}

    return _mig_operation(destroy)


def _mig_operation(operation: Callable[[Any], dict[str, Any]]) -> dict[str, Any]:
    # The scan is taken whatever happened, so the catalog always learns the node's real layout.
    nvml = node_backend()
    try:
        outcome: dict[str, Any] = {**operation(nvml), "error": None}
    except mig_ops.MigOperationError as err:
        outcome = {"error": {"message": err.message, "code": str(err.code)}}
    outcome["scan"] = scan(nvml).to_dict()
    return outcome
