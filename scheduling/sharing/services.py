"""The database side of GPU sharing: the MIG devices and MPS shares the placement loop's
snapshot shows, and the MIG instances the loop asks agents to create (dynamic MIG).

The placement engine decides (``scheduling.placement.sharing``); this module reads what it
decides on and carries out its ``MigCreate`` decisions. The integrity of shares is the
database's (migration 0006's allocation guard: MIG devices once each, MPS at most 100 %).
"""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Collection, Mapping

from celery import current_app
from django.contrib.postgres.aggregates import ArrayAgg
from django.db import transaction
from django.db.models import BigIntegerField, OuterRef, Subquery, Sum, Value
from redis.exceptions import RedisError

from gpuadmin.audit.services import record
from inventory import live
from inventory.models import Gpu, MigInstance
from inventory.services import (
    MIG_TASK_TIMEOUT_S,
    AgentTimedOut,
    MigChangeRefused,
    create_mig_instance,
)
from scheduling import placement
from scheduling.loop import dispatch
from scheduling.models import Allocation, AllocationKind

log = logging.getLogger("gpuadmin.placement")

LOOP_ACTOR = "placement-loop"


def mig_slots(
    gpu_ids: Collection[int], holders: Mapping[int, int] | None = None
) -> dict[int, tuple[placement.MigSlot, ...]]:
    """The MIG devices of ``gpu_ids`` (a compute instance filling its GPU instance, with a
    UUID), each with the job of its active allocation; by GPU id, in placement order.
    ``holders``: the job of each device's active MIG allocation, by MigInstance pk, when the
    caller read them already (the placement loop reads every active allocation: a subquery
    per device costs its snapshot tens of milliseconds); else the query reads them. One
    query."""
    devices = MigInstance.objects.filter(gpu_id__in=gpu_ids, uuid__isnull=False)
    if holders is None:
        holder = Allocation.objects.active().filter(
            kind=AllocationKind.MIG, mig_instance=OuterRef("pk")
        )
        devices = devices.annotate(allocated_to=Subquery(holder.values("job_id")[:1]))
    else:
        devices = devices.annotate(allocated_to=Value(None, output_field=BigIntegerField()))
    rows = devices.order_by("gpu_id", "placement_start", "gi_id", "ci_id").values_list(
        "pk",
        "gpu_id",
        "uuid",
        "profile_name",
        "ci_profile_name",
        "placement_start",
        "placement_size",
        "memory_mib",
        "allocated_to",
    )
    slots: dict[int, list[placement.MigSlot]] = defaultdict(list)
    for pk, gpu_id, uuid, profile, ci_profile, start, size, memory, job_id in rows:
        if ci_profile and ci_profile != profile:
            continue  # a compute instance of part of its GPU instance: not a whole device
        slots[gpu_id].append(
            placement.MigSlot(
                id=pk,
                gpu_id=gpu_id,
                uuid=str(uuid),
                profile=profile,
                placement_start=start,
                placement_size=size,
                memory_mib=memory,
                allocated_to=job_id if holders is None else holders.get(pk),
            )
        )
    return {gpu_id: tuple(found) for gpu_id, found in slots.items()}


def mps_use(gpu_ids: Collection[int] | None = None) -> dict[int, tuple[int, int, tuple[int, ...]]]:
    """What the active MPS shares take of each GPU that has any (of ``gpu_ids``; None: all):
    (percent of its SMs, MiB of memory limits, the jobs holding them in id order). One query."""
    shares = Allocation.objects.active().filter(kind=AllocationKind.MPS)
    if gpu_ids is not None:
        shares = shares.filter(gpu_id__in=gpu_ids)
    rows = (
        shares.values("gpu_id")
        .annotate(
            percent=Sum("mps_percent"),
            memory=Sum("mps_memory_mib"),
            jobs=ArrayAgg("job_id", order_by="job_id"),
        )
        .order_by("gpu_id")
    )
    return {
        row["gpu_id"]: (row["percent"] or 0, row["memory"] or 0, tuple(row["jobs"])) for row in rows
    }


# How long a MIG instance asked for a GPU keeps further asks for that GPU away (the agent
# answers within inventory.services.MIG_TASK_TIMEOUT_S; a pass in between sees no device yet).
_ASK_TTL_S = int(MIG_TASK_TIMEOUT_S * 2)


def _asked_key(gpu_id: int) -> str:
    return f"gpuadmin:mig-create:{gpu_id}"


def request_mig_instance(decision: placement.MigCreate) -> None:
    """Ask the agent of the decision's GPU to create its MIG instance, once the caller's
    transaction commits (the central worker waits for the agent, not the loop). A GPU already
    asked within the agent's timeout is not asked again; one that is no longer idle (an active
    allocation) is refused here, as inventory refuses one that runs processes. The new device
    appears through the agent's fresh scan, and a later pass places the job on it."""
    if Allocation.objects.active().filter(gpu_id=decision.gpu_id).exists():
        log.info("no MIG instance for job %d: GPU %d is in use", decision.job_id, decision.gpu_id)
        return
    try:
        fresh = live.client().set(
            _asked_key(decision.gpu_id), str(decision.job_id), nx=True, ex=_ASK_TTL_S
        )
    except RedisError as exc:
        log.warning("cannot note the MIG instance asked for GPU %d: %s", decision.gpu_id, exc)
        return
    if not fresh:
        return
    args = (decision.gpu_id, decision.profile, decision.placement_start, decision.job_id)
    transaction.on_commit(
        lambda: current_app.send_task("scheduling.create_mig_instance", args=args)
    )


def create_requested_instance(gpu_id: int, profile: str, placement_start: int, job_id: int) -> bool:
    """Create the instance ``request_mig_instance`` asked for (the central worker's task),
    audited by inventory as ``gpu.mig_instance_created`` with the loop as actor, or
    ``gpu.mig_instance_refused`` saying why not; the loop is woken either way. ``True`` when
    it was made."""
    gpu = Gpu.objects.select_related("node").get(pk=gpu_id)
    try:
        create_mig_instance(gpu, profile, placement_start=placement_start, actor_name=LOOP_ACTOR)
    except (MigChangeRefused, AgentTimedOut) as exc:
        with transaction.atomic():
            record(
                "gpu.mig_instance_refused",
                actor_name=LOOP_ACTOR,
                target=gpu,
                target_id=gpu.uuid,
                after={"profile_name": profile, "placement_start": placement_start, "job": job_id},
                message=f"for job {job_id}: {exc}",
            )
        made = False
    else:
        made = True
    try:
        live.client().delete(_asked_key(gpu_id))
    except RedisError as exc:  # the key expires by itself
        log.warning("cannot clear the MIG instance asked for GPU %d: %s", gpu_id, exc)
    dispatch.wake()
    return made
