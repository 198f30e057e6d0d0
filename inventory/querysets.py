"""Reusable filters for inventory rows."""

from __future__ import annotations

from datetime import datetime, timedelta

from django.conf import settings
from django.db import models
from django.utils import timezone

from inventory.choices import GpuState, NodeState


def heartbeat_cutoff(now: datetime | None = None) -> datetime:
    """Heartbeats older than this mean the node is unreachable."""
    return (now or timezone.now()) - timedelta(seconds=settings.GPUADMIN_HEARTBEAT_GRACE_S)


class NodeQuerySet(models.QuerySet):
    def reachable(self, now: datetime | None = None) -> NodeQuerySet:
        return self.filter(last_heartbeat_at__gte=heartbeat_cutoff(now))

    def unreachable(self, now: datetime | None = None) -> NodeQuerySet:
        return self.exclude(last_heartbeat_at__gte=heartbeat_cutoff(now))


class GpuQuerySet(models.QuerySet):
    def present(self) -> GpuQuerySet:
        """GPUs the last scan of their node saw."""
        return self.filter(missing_since__isnull=True)

    def missing(self) -> GpuQuerySet:
        return self.filter(missing_since__isnull=False)

    def on_node(self, hostname: str) -> GpuQuerySet:
        return self.filter(node__hostname=hostname)

    def schedulable(self, now: datetime | None = None) -> GpuQuerySet:
        """Present, available, error-free GPUs on online nodes whose agent is reachable."""
        return self.present().filter(
            state=GpuState.AVAILABLE,
            error_message="",
            node__state=NodeState.ONLINE,
            node__last_heartbeat_at__gte=heartbeat_cutoff(now),
        )
