"""Reusable filters for inventory rows."""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime, timedelta

from django.conf import settings
from django.db import models
from django.db.models import Q
from django.db.models.functions import Coalesce
from django.utils import timezone

from inventory import live, usability
from inventory.choices import GpuState, NodeState


def heartbeat_cutoff(now: datetime | None = None) -> datetime:
    """Heartbeats older than this mean the node is unreachable."""
    return (now or timezone.now()) - timedelta(seconds=settings.GPUADMIN_HEARTBEAT_GRACE_S)


class NodeQuerySet(models.QuerySet):
    def reachable(self, now: datetime | None = None) -> NodeQuerySet:
        return self.filter(last_heartbeat_at__gte=heartbeat_cutoff(now))

    def unreachable(self, now: datetime | None = None) -> NodeQuerySet:
        return self.exclude(last_heartbeat_at__gte=heartbeat_cutoff(now))


def pool_name() -> Coalesce:
    """The name of the pool a GPU belongs to: its own pool, else its node's (NULL: none)."""
    return Coalesce("pool__name", "node__pool__name")


def pool_is(**lookup: object) -> Q:
    """GPUs whose pool matches ``lookup`` (Pool's fields, e.g. ``name="a100"``; nothing: the
    GPUs in no pool), their own pool or, when they have none, their node's."""
    if not lookup:
        return Q(pool__isnull=True, node__pool__isnull=True)
    own = {f"pool__{field}": value for field, value in lookup.items()}
    node = {f"node__pool__{field}": value for field, value in lookup.items()}
    return Q(**own) | Q(pool__isnull=True, **node)


class GpuQuerySet(models.QuerySet):
    def present(self) -> GpuQuerySet:
        """GPUs the last scan of their node saw."""
        return self.filter(missing_since__isnull=True)

    def missing(self) -> GpuQuerySet:
        return self.filter(missing_since__isnull=False)

    def on_node(self, hostname: str) -> GpuQuerySet:
        return self.filter(node__hostname=hostname)

    def schedulable(self, now: datetime | None = None) -> GpuQuerySet:
        """GPUs whose stored rows give no reason they cannot take a whole-GPU job
        (``usability.stored_unusable``): present, available, error-free, held by no work
        outside gpuadmin, neither in MIG mode nor shared through MPS, on online nodes whose
        agent is reachable. The live sample may
        still refuse them (``free``, ``usability.sample_unusable``)."""
        return (
            self.present()
            .filter(
                state=GpuState.AVAILABLE,
                error_message="",
                mig_enabled=False,
                mps_shared=False,
                held_outside="",
                node__state=NodeState.ONLINE,
                node__last_heartbeat_at__gte=heartbeat_cutoff(now),
            )
            .exclude(  # usability.refuses_unconfined_jobs
                node__nvml_backend=usability.REAL_NVML,
                node__isolation=usability.ISOLATION_NONE,
                node__allow_unconfined=False,
            )
        )

    def free(
        self, held: Iterable[int] | models.QuerySet, now: datetime | None = None
    ) -> GpuQuerySet:
        """Schedulable GPUs that no job holds (``held``: the ids of GPUs under an active
        allocation, which only the app above inventory knows) and whose latest live sample
        shows neither an NVML error nor a process (``usability.sample_unusable``)."""
        gpus = self.schedulable(now).exclude(pk__in=held)
        hostnames = gpus.order_by().values_list("node__hostname", flat=True).distinct()
        refused = {
            uuid
            for samples in live.latest(hostnames).values()
            for uuid, sample in samples.items()
            if usability.sample_unusable(sample, allocated=False)
        }
        return gpus.exclude(uuid__in=refused)
