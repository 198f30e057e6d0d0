"""Celery tasks of the Ray integration: thin wrappers around its services."""

from __future__ import annotations

from celery import shared_task

from integrations.ray import services


@shared_task(name="ray.poll")
def poll() -> dict[str, int]:
    """Beat's tick (``GPUADMIN_RAY_POLL_S``): read each cluster, follow its active jobs."""
    return services.poll()
