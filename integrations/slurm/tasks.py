"""Celery tasks of the Slurm mirror: thin wrappers around its services."""

from __future__ import annotations

from celery import shared_task

from integrations.slurm import services


@shared_task(name="slurm.poll_clusters")
def poll_clusters() -> list[str]:
    """Beat's tick (``GPUADMIN_SLURM_TICK_S``): poll each cluster whose own interval passed."""
    return services.poll_due()


@shared_task(name=services.DRAIN_TASK)
def drain_node(slurm_node_id: int, reason: str) -> bool:
    """Sent by ``services.drain_for_fenced_gpu`` when health fences a GPU of a Slurm node."""
    return services.drain_node(slurm_node_id, reason)
