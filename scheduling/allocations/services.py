"""Allocations: GPUs, MIG devices and MPS shares given to jobs by the placement loop and by
hand. The database refuses what is taken (row locks in id order, partial unique indexes, the
sharing trigger); see ``scheduling.jobs.transitions`` for the lock order.
"""

from __future__ import annotations

import json
import logging
from collections import defaultdict
from collections.abc import Callable, Collection, Mapping, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, NamedTuple

from django.contrib.auth.models import User
from django.db import IntegrityError, connection, transaction
from django.utils import timezone
from redis.exceptions import RedisError

from gpuadmin.audit.services import (
    record_each,
)
from inventory import live
from inventory.models import Gpu, MigInstance
from inventory.usability import Reason as UsabilityReason
from scheduling import placement
from scheduling.jobs.transitions import transition_refusal
from scheduling.models import (
    NOT_WAITING,
    Allocation,
    AllocationKind,
    Job,
    JobState,
    ReservationGpu,
    ReservationState,
)
from scheduling.placement.reservations import ReservationBook

S = JobState
log = logging.getLogger("gpuadmin.jobs")


class AllocationRefused(ValueError):
    """GPUs that could not be given: taken already, unschedulable, or the job is not waiting."""


@dataclass(frozen=True)
class Grant:
    """What one placement gives a QUEUED job: whole GPUs, or one MIG device (``mig_instance``,
    a ``MigInstance`` id) or one MPS share of its one GPU."""

    job_id: int
    gpu_ids: tuple[int, ...]
    placement: dict[str, Any] | None = None  # why these GPUs (``Job.placement``)
    mig_instance: int | None = None
    mps_percent: int | None = None
    mps_memory_mib: int | None = None
    borrowed: bool = False  # placed over its quota on idle GPUs: reclaimed first

    @property
    def kind(self) -> AllocationKind:
        if self.mig_instance is not None:
            return AllocationKind.MIG
        return AllocationKind.GPU if self.mps_percent is None else AllocationKind.MPS


# What the one rule (``Gpu.unusable``) may say of a GPU that takes a grant of each kind: a
# whole GPU nothing at all; a MIG device or an MPS share only that the GPU is shared that way.
_SHARED_AS = {
    AllocationKind.GPU: None,
    AllocationKind.MIG: UsabilityReason.MIG,
    AllocationKind.MPS: UsabilityReason.MPS,
}


@dataclass
class Allocated:
    """What ``allocate_many`` committed: each job granted (SCHEDULED now, its owner's Unix
    account loaded) with its allocations (GPU and node loaded), and why each other was
    refused, by job id."""

    granted: list[tuple[Job, list[Allocation]]] = field(default_factory=list)
    refused: dict[int, str] = field(default_factory=dict)

    def add(self, other: Allocated) -> None:
        self.granted += other.granted
        self.refused.update(other.refused)


def allocate_many(
    grants: Sequence[Grant],
    *,
    actor: User | None = None,
    actor_name: str | None = None,
    manual: bool = False,
    decided_at: datetime | None = None,
    fence: Callable[[], AbstractContextManager[object]] = nullcontext,
) -> Allocated:
    """Commit ``grants`` (each job's all or nothing) in one transaction of a fixed number of
    statements however many there are: the jobs locked, then their GPUs (the module's lock
    order), each in one query in id order; each grant re-checked against
    the one rule with the GPUs' latest live samples and its job still QUEUED; the
    allocations inserted, audited (``allocation.created``), and the jobs made SCHEDULED
    (``job.scheduled``, their attempt counted) in bulk.

    A grant the checks refuse is left out and the others commit. When the database refuses
    the batch (the partial unique index or the sharing trigger: a GPU given meanwhile, or
    twice), nothing of it is written and its grants are committed one by one instead, so that
    one refusal never costs the others.

    ``fence`` is entered around each of those transactions (the placement loop's lease,
    ``loop.passes.fenced``), each one apart: one transaction holding the locks of a grant
    committed one by one while taking the next grant's would lock a job after GPUs, against
    the lock order, and deadlock with an allocation by hand.

    ``decided_at`` (default: now) is the jobs' ``scheduled_at``: the placement loop gives the
    time its pass saw, so that the next pass expects a placed job to end when the pass that
    placed it did (from the commit's time, a second or two later, every waiting job's estimated
    start behind it would move and be rewritten)."""
    try:
        with fence(), transaction.atomic():
            return _allocate(grants, actor, actor_name, manual, decided_at)
    except IntegrityError as exc:
        if len(grants) == 1:
            why = f"a GPU was allocated meanwhile ({exc.__cause__})"
            return Allocated(refused={grants[0].job_id: why})
    outcome = Allocated()
    for grant in grants:
        outcome.add(
            allocate_many(
                [grant],
                actor=actor,
                actor_name=actor_name,
                manual=manual,
                decided_at=decided_at,
                fence=fence,
            )
        )
    return outcome


def _allocate(
    grants: Sequence[Grant],
    actor: User | None,
    actor_name: str | None,
    manual: bool,
    decided_at: datetime | None,
) -> Allocated:
    """``allocate_many``'s transaction (the caller's)."""
    outcome = Allocated()
    jobs = {
        job.pk: job
        for job in Job.objects.select_for_update(of=("self",))
        .filter(pk__in=[grant.job_id for grant in grants])
        .select_related("owner__unix_account")
        .order_by("pk")
    }
    gpu_ids = sorted({gpu_id for grant in grants for gpu_id in grant.gpu_ids})
    gpus = {
        gpu.pk: gpu
        for gpu in Gpu.objects.select_for_update(of=("self",))
        .filter(pk__in=gpu_ids)
        .select_related("node")
        .only(*Gpu.RULE_FIELDS)
        .order_by("pk")
    }
    devices = _mig_devices(grants)
    # Read with the GPU rows locked: a reservation approved meanwhile is committed and seen
    # (its approval locks the rows of the GPUs it holds).
    now = timezone.now()
    book = ReservationBook(reservation_windows(now, gpu_ids), now.timestamp())
    try:
        samples = live.latest_of((gpu.node.hostname, gpu.uuid) for gpu in gpus.values())
    except RedisError as exc:
        why = f"the GPUs' live samples cannot be read: {exc}"
        return Allocated(refused=dict.fromkeys((grant.job_id for grant in grants), why))
    accepted: list[Grant] = []
    for grant in grants:
        refusal = _refusal(grant, jobs.get(grant.job_id), gpus, devices, samples, book)
        if refusal:
            outcome.refused[grant.job_id] = refusal
        else:
            accepted.append(grant)
    if not accepted:
        return outcome
    rows = [
        Allocation(
            job=jobs[grant.job_id],
            gpu=gpus[gpu_id],
            node=gpus[gpu_id].node,
            attempt=jobs[grant.job_id].attempt + 1,
            manual=manual,
            kind=grant.kind,
            mig_instance_id=grant.mig_instance,
            device_uuid=gpus[gpu_id].uuid
            if grant.mig_instance is None
            else devices[grant.mig_instance][1],
            mps_percent=grant.mps_percent,
            mps_memory_mib=grant.mps_memory_mib,
            borrowed=grant.borrowed,
        )
        for grant in accepted
        for gpu_id in sorted(grant.gpu_ids)
    ]
    _insert_allocations(rows)
    record_each(
        "allocation.created",
        ((row.pk, str(row), _allocation_facts(row)) for row in rows),
        target_type=Allocation._meta.label_lower,
        actor=actor,
        actor_name=actor_name,
    )
    scheduled = _schedule([(jobs[grant.job_id], grant) for grant in accepted], decided_at)
    record_each(
        f"job.{S.SCHEDULED}",
        ((job.pk, str(job), after) for job, after in scheduled),
        target_type=Job._meta.label_lower,
        actor=actor,
        actor_name=actor_name,
        before={"state": S.QUEUED},
    )
    held: dict[int, list[Allocation]] = defaultdict(list)
    for row in rows:
        held[row.job_id].append(row)
    outcome.granted += [(jobs[grant.job_id], held[grant.job_id]) for grant in accepted]
    for grant in accepted:
        log.info("job %d: %s -> %s", grant.job_id, S.QUEUED, S.SCHEDULED)
    return outcome


def _insert_allocations(rows: list[Allocation]) -> None:
    """Insert unsaved allocations in one statement, setting their ids and start times (a pass
    inserts thousands: ``bulk_create`` costs several times as much per row). Their start is
    the statement's time, as ``allocated_at``'s default (see ``release_allocations``)."""
    values = [[getattr(row, column) for row in rows] for column in INSERTED_COLUMNS]
    with connection.cursor() as cursor:
        cursor.execute(INSERT_ALLOCATIONS_SQL, values)
        inserted = {(job_id, gpu_id): (pk, at) for pk, job_id, gpu_id, at in cursor.fetchall()}
    for row in rows:
        row.pk, row.allocated_at = inserted[row.job_id, row.gpu_id]


INSERTED_COLUMNS = (
    "job_id",
    "gpu_id",
    "node_id",
    "attempt",
    "manual",
    "kind",
    "mig_instance_id",
    "device_uuid",
    "mps_percent",
    "mps_memory_mib",
    "borrowed",
)
INSERT_ALLOCATIONS_SQL = f"""
    INSERT INTO scheduling_allocation ({", ".join(INSERTED_COLUMNS)}, allocated_at)
    SELECT {", ".join(INSERTED_COLUMNS)}, statement_timestamp()
    FROM unnest(%s::bigint[], %s::bigint[], %s::bigint[], %s::integer[], %s::boolean[],
                %s::text[], %s::bigint[], %s::text[], %s::integer[], %s::integer[],
                %s::boolean[])
        WITH ORDINALITY AS new ({", ".join(INSERTED_COLUMNS)}, n)
    ORDER BY n
    RETURNING id, job_id, gpu_id, allocated_at
"""


def _mig_devices(grants: Sequence[Grant]) -> dict[int, tuple[int, str]]:
    """The MIG devices the grants name: id -> (its GPU's id, its UUID); no query without."""
    ids = [grant.mig_instance for grant in grants if grant.mig_instance is not None]
    if not ids:
        return {}
    rows = MigInstance.objects.filter(pk__in=ids, uuid__isnull=False).values_list(
        "pk", "gpu_id", "uuid"
    )
    return {pk: (gpu_id, str(uuid)) for pk, gpu_id, uuid in rows}


def reservation_windows(
    now: datetime, gpu_ids: Collection[int] | None = None
) -> tuple[placement.ReservationWindow, ...]:
    """The approved reservations that end after ``now`` (of ``gpu_ids`` only, when given), with
    the GPUs each holds there (one query): the placement loop's snapshot, and what the commit
    of a placement checks again."""
    holds = ReservationGpu.objects.filter(
        reservation__state=ReservationState.APPROVED, reservation__end__gt=now
    )
    if gpu_ids is not None:
        holds = holds.filter(gpu_id__in=list(gpu_ids))
    rows = holds.order_by("reservation_id", "gpu_id").values_list(
        "reservation_id",
        "reservation__owner_id",
        "reservation__start",
        "reservation__end",
        "gpu_id",
    )
    gpus: dict[int, list[int]] = defaultdict(list)
    facts: dict[int, tuple[int, datetime, datetime]] = {}
    for reservation_id, owner_id, start, end, gpu_id in rows:
        gpus[reservation_id].append(gpu_id)
        facts[reservation_id] = (owner_id, start, end)
    return tuple(
        placement.ReservationWindow(
            id=pk,
            owner=str(owner_id),
            gpu_ids=tuple(gpus[pk]),
            start=start.timestamp(),
            end=end.timestamp(),
        )
        for pk, (owner_id, start, end) in facts.items()
    )


KIND_WORDS = {
    AllocationKind.GPU: "whole GPUs",
    AllocationKind.MIG: "a MIG device",
    AllocationKind.MPS: "an MPS share",
}


class JobBooker(NamedTuple):
    """A job as the reservation windows see it (``placement.reservations.Booker``)."""

    owner: str
    max_runtime_s: float | None
    reservation: int | None


def _refusal(
    grant: Grant,
    job: Job | None,
    gpus: Mapping[int, Gpu],
    devices: Mapping[int, tuple[int, str]],
    samples: Mapping[str, Mapping[str, Mapping[str, Any]]],
    book: ReservationBook,
) -> str:
    """Why ``grant`` cannot be committed now (its rows locked), or ``""``: the job no longer
    waits, a GPU is gone, out of the job's pool, not usable (the one rule) or not shared as
    the job asked, or the reservation windows close it to the job (the engine's rule)."""
    if job is None:
        return f"job {grant.job_id} no longer exists"
    if job.state != S.QUEUED:
        return transition_refusal(job.pk, job.state, S.SCHEDULED)
    missing = sorted(set(grant.gpu_ids) - set(gpus))
    if missing:
        return f"no GPU with id {', '.join(map(str, missing))}"
    if grant.kind != job.allocation_kind:
        wanted, given = KIND_WORDS[job.allocation_kind], KIND_WORDS[grant.kind]
        return f"job {job.pk} asks for {wanted}, not {given}"
    elsewhere = [
        gpus[gpu_id].uuid
        for gpu_id in sorted(grant.gpu_ids)
        if gpus[gpu_id].pool_in_force_id != job.pool_id
    ]
    if elsewhere:
        return f"GPUs outside the job's pool: {', '.join(elsewhere)}"
    booker = JobBooker(str(job.owner_id), job.max_runtime_s, job.reservation_id)
    reserved = [
        gpus[gpu_id].uuid for gpu_id in sorted(grant.gpu_ids) if book.closed(gpu_id, booker)
    ]
    if reserved:
        if (in_window := book.refusal(booker)) is not None:
            return in_window[0]
        return (
            f"GPUs held by a reservation the job would still run into (by its maximum "
            f"runtime): {', '.join(reserved)}"
        )
    if grant.mig_instance is not None:
        [gpu_id] = grant.gpu_ids
        if devices.get(grant.mig_instance, (None,))[0] != gpu_id:
            return f"MIG device {grant.mig_instance} is no longer a device of GPU {gpu_id}"
    allowed = _SHARED_AS[grant.kind]
    found = []
    for gpu_id in sorted(grant.gpu_ids):
        gpu = gpus[gpu_id]
        why = gpu.unusable(samples.get(gpu.node.hostname, {}).get(gpu.uuid))
        if why is not None and why.code != allowed:
            found.append(f"{gpu.uuid} ({why.message})")
        elif why is None and allowed is not None:
            found.append(f"{gpu.uuid} (it is not shared as {grant.kind})")
    return f"GPUs not usable now: {'; '.join(found)}" if found else ""


def _allocation_facts(row: Allocation) -> dict[str, Any]:
    """An allocation's audited ``after``: its job, GPU and node, and what share of it."""
    facts: dict[str, Any] = {"job": row.job_id, "gpu": row.gpu.uuid, "node": row.node.hostname}
    if row.kind == AllocationKind.MIG:
        facts.update(kind=row.kind, device=row.device_uuid)
    elif row.kind == AllocationKind.MPS:
        facts.update(kind=row.kind, mps_percent=row.mps_percent, mps_memory_mib=row.mps_memory_mib)
    if row.borrowed:
        facts["borrowed"] = True
    return facts


def _schedule(
    granted: list[tuple[Job, Grant]], decided_at: datetime | None
) -> list[tuple[Job, dict[str, Any]]]:
    """Make the granted jobs (locked, QUEUED) SCHEDULED at ``decided_at`` (default: now) in
    one statement, as ``transition`` would: attempt counted, placement stored, the loop's word
    on their wait cleared. Each job (updated in memory too) with its audited ``after``."""
    now = decided_at or timezone.now()
    columns: tuple[list[Any], ...] = ([], [], [], [])
    changed = []
    for job, grant in granted:
        fields = {
            "attempt": job.attempt + 1,
            "scheduled_at": now,
            "placement": grant.placement,
            "borrowed": grant.borrowed,
        }
        placement = None if grant.placement is None else json.dumps(grant.placement)
        row = (job.pk, fields["attempt"], placement, grant.borrowed)
        for column, value in zip(columns, row, strict=True):
            column.append(value)
        job.__dict__.update(NOT_WAITING, state=S.SCHEDULED, **fields)
        changed.append((job, {"state": S.SCHEDULED, **fields}))
    cleared = ", ".join(f"{name} = %s" for name in NOT_WAITING)
    with connection.cursor() as cursor:
        cursor.execute(
            SCHEDULE_SQL.format(cleared=cleared),
            [S.SCHEDULED, now, *NOT_WAITING.values(), *columns, S.QUEUED],
        )
    return changed


SCHEDULE_SQL = """
    UPDATE scheduling_job AS job
    SET state = %s, scheduled_at = %s, {cleared}, attempt = new.attempt,
        placement = new.placement::jsonb, borrowed = new.borrowed
    FROM unnest(%s::bigint[], %s::integer[], %s::text[], %s::boolean[])
        AS new (id, attempt, placement, borrowed)
    WHERE job.id = new.id AND job.state = %s
"""


def allocate(
    job: Job,
    gpu_ids: Collection[int],
    *,
    actor: User | None = None,
    actor_name: str | None = None,
    placement: dict[str, Any] | None = None,
    manual: bool = False,
    mig_instance: int | None = None,
    mps_percent: int | None = None,
    mps_memory_mib: int | None = None,
) -> list[Allocation]:
    """Give the GPUs ``gpu_ids`` to a QUEUED job and make it SCHEDULED, all or nothing
    (``allocate_many`` of one grant): whole, or the MIG device ``mig_instance`` of its one GPU,
    or an MPS share of it (``mps_percent``). The allocations, with their GPU and node loaded,
    and ``job`` updated. Raises ``AllocationRefused`` and writes nothing."""
    grant = Grant(
        job.pk,
        tuple(sorted(set(gpu_ids))),
        placement,
        mig_instance=mig_instance,
        mps_percent=mps_percent,
        mps_memory_mib=mps_memory_mib,
    )
    outcome = allocate_many([grant], actor=actor, actor_name=actor_name, manual=manual)
    if outcome.refused:
        raise AllocationRefused(outcome.refused[job.pk])
    [(granted, rows)] = outcome.granted
    job.__dict__.update(granted.__dict__)
    return rows
