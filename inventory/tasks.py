"""Celery tasks of the inventory app: thin wrappers around inventory.agent and services.

``scan_node`` runs on a node agent's own queue (``node.<name>``); the others run centrally and
are what agents send: scans to sync (which register the node) and heartbeats.
"""

from __future__ import annotations

from typing import Any

from celery import shared_task
from django.utils.dateparse import parse_datetime

from inventory import services
from inventory.agent import scan_this_node
from inventory.nvml.scanner import NodeScan


@shared_task(name="inventory.scan_node")
def scan_node() -> dict[str, Any]:
    """The node's full NVML scan as JSON (runs on the node's agent)."""
    return scan_this_node().to_dict()


@shared_task(name="inventory.heartbeat", ignore_result=True)
def heartbeat(hostname: str, sent_at: str) -> None:
    services.record_heartbeat(hostname, parse_datetime(sent_at))


@shared_task(name="inventory.sync_node")
def sync_node(
    hostname: str, scan: dict[str, Any], sent_at: str, model: str, agent_version: str
) -> dict[str, int]:
    """Register the node (first time) and apply its agent's scan; returns how many audited
    differences the scan brought."""
    services.register_node(hostname, model=model, agent_version=agent_version)
    plan = services.apply_discovery(hostname, NodeScan.from_dict(scan))
    services.record_heartbeat(hostname, parse_datetime(sent_at))
    return {"changes": len(plan.changes)}
