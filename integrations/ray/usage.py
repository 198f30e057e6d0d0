"""What Ray jobs hold, for gpuadmin's quotas and fair share (``gpuadmin.registry.gpu_use``):
a job submitted to a cluster that has a pool holds its GPUs in that pool, for its owner, from
when Ray took it (Ray's start time) until it ended; a job not yet sent holds them now, for no
time yet. What counts, and why: docs/operations/ray.md, "Quotas and fair share"."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime

from django.db.models import Q

from gpuadmin.registry import GpuUse
from integrations.ray.models import ACTIVE_STATES, RayJob


def gpu_use(since: datetime, now: datetime) -> Iterator[GpuUse]:
    """The GPUs of the Ray jobs that held some at a time in [since, now] (one query)."""
    jobs = RayJob.objects.filter(cluster__pool__isnull=False, gpus__gt=0).filter(
        Q(state__in=ACTIVE_STATES) | Q(started_at__isnull=False, ended_at__gt=since)
    )
    rows = jobs.values_list(
        "cluster__pool__name", "owner_id", "gpus", "state", "started_at", "ended_at"
    )
    for pool, owner_id, gpus, state, started_at, ended_at in rows:
        if state in ACTIVE_STATES:
            yield GpuUse(pool, owner_id, "", gpus, min(started_at or now, now))
        elif started_at is not None:  # the query's: an ended job counts once Ray took it
            yield GpuUse(pool, owner_id, "", gpus, started_at, ended_at)
