"""Celery tasks of the inventory app (thin wrappers; see inventory.agent)."""

from __future__ import annotations

from typing import Any

from celery import shared_task

from inventory.agent import scan_this_node


@shared_task(name="inventory.scan_node")
def scan_node() -> dict[str, Any]:
    """Runs on a node agent's queue (``node.<name>``): the node's full NVML scan as JSON."""
    return scan_this_node().to_dict()
