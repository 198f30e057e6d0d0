"""What runs on a node agent: its NVML backend and its Celery queue name."""

from __future__ import annotations

from django.conf import settings

from inventory.nvml import open_backend
from inventory.nvml.scanner import NodeScan, scan


def node_queue(node_name: str) -> str:
    """The Celery queue only that node's agent consumes."""
    return f"node.{node_name}"


def scan_this_node() -> NodeScan:
    """Scan the agent's own GPUs: real NVML, or the simulated machine model it was given."""
    if settings.GPUADMIN_NVML == "sim":
        backend = open_backend(
            "sim",
            sim_model=settings.GPUADMIN_SIM_MODEL or None,
            sim_fleet=None if settings.GPUADMIN_SIM_MODEL else settings.GPUADMIN_SIM_FLEET,
            node_name=settings.GPUADMIN_NODE_NAME,
            state_dir=str(settings.GPUADMIN_SIM_STATE_DIR),
        )
    else:
        backend = open_backend("real")
    return scan(backend)
