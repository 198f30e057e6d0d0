"""Scheduling's answers to what inventory announces and asks (inventory never imports
scheduling)."""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

from django.db import transaction

from health.models import HealthEvent
from health.policies import contained_instance, pid_of
from inventory.models import Gpu
from scheduling.jobs import control, transitions
from scheduling.loop import dispatch
from scheduling.models import RELAYOUT_OPEN_STATES, Allocation, MigRelayout
from scheduling.sharing import relayout


def wake_on_schedulable_gpus(sender: type, gpu_ids: list[int], **kwargs: Any) -> None:
    """GPUs became schedulable (a node undrained or heard from again, a GPU back online,
    recovered or newly discovered): queued jobs may fit now, so the placement loop runs now
    rather than at beat's next backstop pass."""
    transaction.on_commit(dispatch.wake)


def refuse_mig_change_of_taken_gpu(gpu: Gpu, actor_name: str | None) -> str | None:
    """Answer of ``gpuadmin.registry.mig_change_vetoes``: a MIG layout never changes under a
    job that holds the GPU, nor, but by the workflow itself, while a MIG re-layout owns the GPU
    (from its drain to its verification)."""
    job_id = Allocation.objects.active().filter(gpu=gpu).values_list("job_id", flat=True).first()
    if job_id is not None:
        return f"GPU {gpu.index} of {gpu.node.hostname} is allocated to job {job_id}"
    if actor_name != relayout.ACTOR:
        open_one = MigRelayout.objects.filter(gpu=gpu, state__in=RELAYOUT_OPEN_STATES)
        if (pk := open_one.values_list("pk", flat=True).first()) is not None:
            return (
                f"GPU {gpu.index} of {gpu.node.hostname} is being re-laid out (MIG re-layout {pk})"
            )
    return None


def stop_jobs_for_health(
    sender: type,
    gpu_ids: Collection[int],
    action: str = "requeue",
    reason: str = "",
    event_id: int | None = None,
    **kwargs: Any,
) -> list[int]:
    """A recovery policy says the jobs on these GPUs must stop: requeue or fail them (only
    the job of the XID's pid when the event names one of theirs; only the jobs on its MIG GPU
    instance when the error was contained to one)."""
    event = HealthEvent.objects.filter(pk=event_id).first() if event_id is not None else None
    return control.stop_jobs_on_gpus(
        gpu_ids,
        requeue=action != "fail",
        reason=reason or "a health policy stopped it",
        pid=pid_of(event) if event is not None else None,
        gpu_instance_id=contained_instance(event) if event is not None else None,
    )


def requeue_jobs_on_offline_gpus(
    sender: type, gpu_ids: Collection[int], reason: str = "", actor_name: str = "", **kwargs: Any
) -> list[int]:
    """GPUs went offline (an admin, or a policy): their running work is requeued now, with
    inventory's sentence ("GPU 3 of dgx-01 went offline: <why>"), audited as who took them
    offline."""
    return control.stop_jobs_on_gpus(
        gpu_ids,
        requeue=True,
        reason=reason or "its GPU went offline",
        actor_name=actor_name or transitions.HEALTH_ACTOR,
    )
