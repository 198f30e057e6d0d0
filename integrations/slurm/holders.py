"""The catalogued GPUs Slurm's jobs hold (those in ``models.HOLDING`` states): who holds them,
for the pages and the alert rules (the answer to ``gpuadmin.registry.gpu_occupants``), and the
inventory fact that keeps gpuadmin's placement off them (``Gpu.held_outside``, written by each
poll through ``inventory.services.set_held_outside``). See docs/operations/slurm.md, "GPUs a
Slurm job holds".
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from typing import Any

from django.db.models import QuerySet
from django.urls import reverse

from gpuadmin.registry import Occupant, OccupantKind
from integrations.slurm.models import HOLDING, SlurmCluster, SlurmJob, SlurmJobGpu
from inventory import services as inventory


def holder_text(job_id: int, cluster: str) -> str:
    """``Slurm job 1234 on hpc``: ``Gpu.held_outside``, as ``Occupant.label`` writes it."""
    return f"Slurm job {job_id} on {cluster}"


def job_url(cluster: str, job_id: int) -> str:
    """The job's row in the jobs page's Slurm section."""
    return f"{reverse('scheduling:queue')}#slurm-job-{cluster}-{job_id}"


def gpu_occupants(gpu_ids: Collection[int]) -> list[Occupant]:
    """The Slurm job holding each of ``gpu_ids``: the Slurm mirror's answer to
    ``gpuadmin.registry.gpu_occupants`` (one query: every catalogued GPU a Slurm job holds,
    the ids picked here, as scheduling's answer does)."""
    wanted = set(gpu_ids)
    rows = (
        SlurmJobGpu.objects.filter(gpu__isnull=False)
        .filter(job__in=_holding_jobs())
        .values_list("gpu_id", "job__job_id", "job__user", "job__name", "job__cluster__name")
    )
    return [
        Occupant(
            job_id,
            job_url(cluster, job_id),
            user,
            gpu_id,
            name,
            kind=OccupantKind.SLURM,
            cluster=cluster,
        )
        for gpu_id, job_id, user, name, cluster in rows.iterator()
        if gpu_id in wanted
    ]


def held_gpus(cluster: SlurmCluster) -> dict[int, str]:
    """The catalogued GPUs the cluster's jobs hold now, as the mirror has them, each with
    ``holder_text`` (one query)."""
    rows = SlurmJobGpu.objects.filter(job__cluster=cluster, gpu__isnull=False).filter(
        job__in=_holding_jobs()
    )
    return {
        gpu_id: holder_text(job_id, cluster.name)
        for gpu_id, job_id in rows.order_by("gpu_id", "job__job_id").values_list(
            "gpu_id", "job__job_id"
        )
    }


def mark_held(before: Iterable[int], now: Mapping[int, str], *, actor_name: str) -> list[int]:
    """Write what a cluster's jobs hold (``now``, from ``held_gpus``) on the catalog: those
    GPUs held, those it held ``before`` and no longer does released (schedulable again, the
    placement loop woken on commit). The GPUs whose holder changed."""
    holders = dict.fromkeys(before, "") | dict(now)
    return inventory.set_held_outside(holders, actor_name=actor_name)


def _holding_jobs() -> QuerySet[SlurmJob, Any]:
    return SlurmJob.objects.filter(HOLDING).values("pk")
