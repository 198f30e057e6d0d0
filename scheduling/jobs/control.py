"""Job control: release, cancel (one job, waiting jobs, an array or some of its tasks), hold
and release a whole array, stop the jobs on failed GPUs, and change a job's priority.

What is done to an array is done with its row locked, as the placement loop locks it to make
jobs of its tasks (``arrays.split_due``): a split running at the same moment either comes
first (and its jobs are seen here) or sees the change whole (a task canceled is never made,
a hold or release is the state of the tasks it makes).
"""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from functools import partial
from typing import Any

from django.contrib.auth.models import User
from django.db import transaction
from django.db.models import QuerySet
from django.utils import timezone

from gpuadmin.audit.services import (
    audit_event,
    record,
    record_all,
)
from scheduling.jobs import queries, slurm
from scheduling.jobs.limits import JobRejected, parse_array
from scheduling.jobs.transitions import (
    HEALTH_ACTOR,
    TRANSITIONS,
    IllegalTransition,
    Moves,
    attempt_end,
    reachable_parts,
    stop_parts,
    transition,
)
from scheduling.loop import dispatch
from scheduling.models import (
    HOLDING_STATES,
    NOT_WAITING,
    TERMINAL_STATES,
    Job,
    JobArray,
    JobState,
    Priority,
)

S = JobState
log = logging.getLogger("gpuadmin.jobs")


def release_job(job: Job, *, actor: User) -> Job:
    """Let a held (PENDING) job into the queue; the placement loop is woken on commit."""
    return transition(job, S.QUEUED, actor=actor, expect=[S.PENDING], message="released")


def hold_job(job: Job, *, actor: User) -> Job:
    """Hold a queued job (Slurm's ``scontrol hold``): it stays PENDING, never placed, until it
    is released. A job on GPUs or ended cannot be held."""
    return transition(job, S.PENDING, actor=actor, expect=[S.QUEUED], message="held")


def cancel_job(job: Job, *, actor: User, reason: str = "", kill: bool = False) -> Job:
    """Cancel a job. A waiting one ends at once. One that holds GPUs is signalled through its
    reachable nodes' agents and keeps its GPUs until they report its processes gone (SIGTERM,
    then SIGKILL after the grace; a gang's: every part, ``transitions.stop_parts``), so the
    next job never shares a GPU with a dying one. A part on an unreachable node cannot be
    signalled nor waited for (its node's GPUs are unschedulable meanwhile, and its agent stops
    it when it comes back, ``reports.cancel_strays``): a job with no reachable node ends at
    once. A job already stopping (``Job.ending``) ends as decided then. With ``kill`` (the
    seed's force kill, ``gpuadmin jobs kill``) its processes get SIGKILL at once, no grace,
    even when a cancel is already under way (its grace is cut short)."""
    message = reason or f"{'killed' if kill else 'canceled'} by {actor.get_username()}"
    stop: dict[str, Any] = {"signal": "SIGKILL", "grace_s": 0} if kill else {}
    job.refresh_from_db()  # decide on the stored state and attempt, never a stale copy
    hostnames = reachable_parts(job) if job.state in HOLDING_STATES else []
    if hostnames:
        with transaction.atomic():
            # A cancel overrides a preemption under way, and no later pass may start one: its
            # end is a cancel, not a re-queue (``attempt_end``).
            Job.objects.filter(pk=job.pk).update(
                preempted_by=None, preempt_requested_at=None, cancel_requested_at=timezone.now()
            )
            record(
                "job.cancel_requested",
                actor=actor,
                target=job,
                before={"state": job.state},
                after=stop or None,
                message=message,
            )
            transaction.on_commit(lambda: dispatch.send_cancel(job, hostnames, message, **stop))
        return job
    return transition(job, S.CANCELED, actor=actor, message=message)


def cancel_waiting(
    messages: Mapping[int, str], *, actor: User | None = None, actor_name: str | None = None
) -> list[int]:
    """Cancel those of the jobs ``messages`` names (id -> why) that still wait (held or
    queued), as ``transition`` would one by one, but in one transaction of a fixed number of
    statements (one UPDATE per distinct message, one audit insert of ``job.canceled`` rows)
    whatever their number; the loop is woken on commit. The ids canceled: a job that moved on
    meanwhile is left alone (placed jobs end through their agents: ``cancel_job``)."""
    waiting = [state for state in (S.PENDING, S.QUEUED) if S.CANCELED in TRANSITIONS[state]]
    with transaction.atomic():
        jobs = list(
            Job.objects.select_for_update()
            .filter(pk__in=list(messages), state__in=waiting)
            .only("pk", "name", "state")
            .order_by("pk")
        )
        if not jobs:
            return []
        now = timezone.now()
        by_message: dict[str, list[int]] = defaultdict(list)
        for job in jobs:
            by_message[messages[job.pk]].append(job.pk)
        for message, ids in by_message.items():
            Job.objects.filter(pk__in=ids).update(
                state=S.CANCELED, finished_at=now, pid=None, message=message, **NOT_WAITING
            )
        record_all(
            [
                audit_event(
                    f"job.{S.CANCELED}",
                    actor=actor,
                    actor_name=actor_name,
                    target=job,
                    before={"state": job.state},
                    after={"state": S.CANCELED, "finished_at": now, "pid": None},
                    message=messages[job.pk],
                )
                for job in jobs
            ]
        )
        transaction.on_commit(dispatch.wake)
    log.info("%d waiting jobs canceled", len(jobs))
    return [job.pk for job in jobs]


@dataclass(frozen=True)
class ArrayCanceled:
    canceled: list[int]  # tasks canceled now (those that were waiting, mostly)
    canceling: list[int]  # tasks on GPUs: their agents stop them (``cancel_job``)
    unsplit: int = 0  # tasks not made jobs yet, that never will be


def cancel_array(array: JobArray, *, actor: User) -> ArrayCanceled:
    """Cancel every unfinished task of ``array`` (Slurm's ``scancel`` of an array job): its
    tasks not made jobs yet are never made (``array.canceled``, audited, with their number),
    the waiting ones are canceled at once (``cancel_waiting``), those on GPUs through their
    agents."""
    message = f"array {array.pk} canceled by {actor.get_username()}"
    with transaction.atomic():
        # Locked: a placement pass splitting it waits, then sees it canceled.
        locked = JobArray.objects.select_for_update().get(pk=array.pk)
        unsplit = 0 if locked.canceled_at is not None else locked.unsplit
        if unsplit:
            record(
                "array.canceled",
                actor=actor,
                target=locked,
                before={"state": locked.unsplit_state, "unsplit": unsplit},
                after={"state": S.CANCELED},
                message=message,
            )
        if locked.canceled_at is None:
            locked.canceled_at = timezone.now()
            locked.save(update_fields=["canceled_at"])
    canceled, canceling = _cancel_jobs(array.tasks.all(), message, actor)
    return ArrayCanceled(canceled, canceling, unsplit)


def task_indexes(array: JobArray, tasks: str) -> list[int]:
    """The indexes ``tasks`` names (Slurm's array syntax without the cap: ``3-7,9``), each
    one of ``array``'s; ``JobRejected`` naming ``tasks`` otherwise."""
    parsed = parse_array(tasks, field="tasks")
    if parsed.max_running is not None:
        raise JobRejected("tasks", "no %N cap here: only indexes, e.g. 3-7,9")
    outside = set(parsed.indexes).difference(queries.array_indexes(array))
    if outside:
        raise JobRejected(
            "tasks",
            f"array {array.pk} [{array.spec}] has no task {slurm.compact_indexes(outside)}",
        )
    return list(parsed.indexes)


def cancel_tasks(array: JobArray, tasks: str, *, actor: User) -> ArrayCanceled:
    """Cancel the tasks of ``array`` that ``tasks`` names (Slurm's ``scancel 12_[3-7]``; see
    ``task_indexes``): those not made jobs yet are recorded on the array
    (``canceled_tasks``, audited ``array.tasks_canceled`` naming them) and never made, its
    jobs among them are canceled as ``cancel_array`` cancels them (the waiting ones at once,
    those on GPUs through their agents). Tasks already ended are left alone."""
    indexes = task_indexes(array, tasks)
    named = slurm.compact_indexes(indexes)
    message = f"array {array.pk} tasks [{named}] canceled by {actor.get_username()}"
    with transaction.atomic():
        # Locked, as the splitter locks it: a task is either a job by now (canceled below)
        # or recorded here before a split could make it.
        locked = JobArray.objects.select_for_update().get(pk=array.pk)
        wanted = set(indexes)
        unsplit = (
            [index for index in queries.unsplit_indexes(locked) if index in wanted]
            if locked.canceled_at is None
            else []
        )
        if unsplit:
            record(
                "array.tasks_canceled",
                actor=actor,
                target=locked,
                before={"state": locked.unsplit_state},
                after={"state": S.CANCELED, "tasks": slurm.compact_indexes(unsplit)},
                message=message,
            )
            locked.canceled_tasks = sorted([*locked.canceled_tasks, *unsplit])
            locked.save(update_fields=["canceled_tasks"])
    canceled, canceling = _cancel_jobs(array.tasks.filter(array_index__in=indexes), message, actor)
    return ArrayCanceled(canceled, canceling, len(unsplit))


def _cancel_jobs(tasks: QuerySet[Job], message: str, actor: User) -> tuple[list[int], list[int]]:
    """Cancel the unfinished ones of ``tasks``: the waiting ones at once (``cancel_waiting``),
    those on GPUs through their agents (``cancel_job``). The ids canceled, and those being
    stopped."""
    tasks = tasks.exclude(state__in=TERMINAL_STATES)
    waiting = list(tasks.filter(state__in=(S.PENDING, S.QUEUED)).values_list("pk", flat=True))
    canceled = cancel_waiting(dict.fromkeys(waiting, message), actor=actor)
    canceling: list[int] = []
    for task in tasks.exclude(pk__in=canceled).order_by("pk"):
        try:
            cancel_job(task, actor=actor, reason=message)
        except IllegalTransition:  # it ended meanwhile
            continue
        (canceled if task.is_terminal else canceling).append(task.pk)
    return canceled, canceling


@dataclass(frozen=True)
class ArrayHeld:
    """What holding or releasing a whole array did."""

    jobs: list[int]  # its tasks made jobs that were held (released)
    unsplit: int  # its tasks not made jobs yet, to be made held (queued) from now on


def hold_array(array: JobArray, *, actor: User) -> ArrayHeld:
    """Hold every waiting task of ``array`` (Slurm's ``scontrol hold`` of an array job): its
    queued jobs become pending, its tasks not made jobs yet are made held. Tasks on GPUs or
    ended are left alone. ``IllegalTransition`` for a canceled array, or one with no task to
    hold."""
    return _hold_or_release(array, held=True, actor=actor)


def release_array(array: JobArray, *, actor: User) -> ArrayHeld:
    """Let every held task of ``array`` into the queue (Slurm's ``scontrol release`` of an
    array job): its pending jobs become queued, its tasks not made jobs yet are made queued.
    ``IllegalTransition`` for a canceled array, or one with no held task."""
    return _hold_or_release(array, held=False, actor=actor)


def _hold_or_release(array: JobArray, *, held: bool, actor: User) -> ArrayHeld:
    """Hold (``held``) or release ``array``: its flag for the tasks not made jobs yet (audited
    ``array.held``/``array.released`` naming them), and its waiting jobs moved as
    ``transition`` moves one (``transitions.Moves``: one UPDATE and one audit insert of
    ``job.<state>`` rows whatever their number); the loop is woken on commit of a release."""
    verb, frm, to = ("hold", S.QUEUED, S.PENDING) if held else ("release", S.PENDING, S.QUEUED)
    message = f"array {array.pk} {'held' if held else 'released'} by {actor.get_username()}"
    with transaction.atomic():
        # Locked, as the splitter locks it: the tasks it made are seen here, the ones it makes
        # next are made in the state set here.
        locked = JobArray.objects.select_for_update().get(pk=array.pk)
        if locked.canceled_at is not None:
            raise IllegalTransition(f"array {array.pk} is canceled: nothing to {verb}")
        unsplit = queries.unsplit_indexes(locked) if locked.held != held else ()
        jobs = list(locked.tasks.select_for_update().filter(state=frm).order_by("pk"))
        if not jobs and not unsplit:
            waiting = "held" if not held else "queued"
            raise IllegalTransition(f"array {array.pk} has no {waiting} task to {verb}")
        if locked.held != held:
            record(
                f"array.{'held' if held else 'released'}",
                actor=actor,
                target=locked,
                before={"held": locked.held},
                after={"held": held, "tasks": slurm.compact_indexes(unsplit)},
                message=message,
            )
            locked.held = held
            locked.save(update_fields=["held"])
        moves = Moves(actor=actor)
        for job in jobs:
            moves.add(job, to, message)
        moves.write()  # woken on commit for the queued ones
        if not held and unsplit:
            transaction.on_commit(dispatch.wake)  # the tasks to come are made queued
    log.info("array %d: %s, %d jobs and %d tasks to come", array.pk, verb, len(jobs), len(unsplit))
    return ArrayHeld([job.pk for job in jobs], len(unsplit))


def stop_jobs_on_gpus(
    gpu_ids: Collection[int],
    *,
    requeue: bool,
    reason: str,
    pid: int | None = None,
    actor_name: str = HEALTH_ACTOR,
    gpu_instance_id: int | None = None,
) -> list[int]:
    """Stop now the jobs holding any of ``gpu_ids`` because the hardware under them failed (a
    health policy, or the GPUs went offline) or is reconfigured (a MIG re-layout that preempts,
    as ``actor_name``): requeue them (their next placement is their next
    attempt) or fail their run, which counts against their retries as a non-zero exit does
    (``attempt_end``: re-queued while retries are left), with ``reason`` in the job's message,
    and their processes canceled through their reachable nodes' agents: as for a cancel, a job
    keeps its GPUs until those agents report its processes gone (``transitions.stop_parts``),
    and ends at once when none of its nodes is reachable (their GPUs are unschedulable then; a
    returning agent stops what it still runs, ``reports.cancel_strays``). A job already being
    canceled or stopped ends as decided then. With ``pid``: only the job whose
    process it is, when one of them is. With ``gpu_instance_id`` (an error contained to one
    MIG GPU instance): only the jobs holding a MIG device of that instance. A job that already
    moved on is left alone; the ids of the jobs stopped."""
    on_instance = (
        {} if gpu_instance_id is None else {"allocations__mig_instance__gi_id": gpu_instance_id}
    )
    holding = Job.objects.filter(
        state__in=HOLDING_STATES,
        allocations__gpu_id__in=gpu_ids,
        allocations__released_at__isnull=True,
        **on_instance,
    )
    jobs = list(holding.distinct().order_by("pk"))
    if pid is not None and any(job.pid == pid for job in jobs):
        jobs = [job for job in jobs if job.pid == pid]
    stopped = []
    for job in jobs:
        with transaction.atomic():
            current = holding.filter(pk=job.pk).select_for_update(of=("self",)).first()
            if current is None:
                continue  # ended, or requeued and placed elsewhere, since the query
            hostnames = reachable_parts(current)
            stopped.append(job.pk)
            if hostnames and (
                current.ending is not None or current.cancel_requested_at is not None
            ):
                continue  # its stop is under way on every node, its end decided by it
            to, message, fields = (
                (S.QUEUED, reason, {}) if requeue else attempt_end(current, "failed", None, reason)
            )
            if not hostnames:
                transition(current, to, actor_name=actor_name, message=message, **fields)
                continue
            stop_parts(current, to, message, fields, hostnames, why=message, actor_name=actor_name)
            transaction.on_commit(partial(dispatch.send_cancel, current, hostnames, message))
    return stopped


def set_priority(job: Job, priority: str, *, actor: User) -> Job:
    """Change a waiting job's priority (audited ``job.priority_changed``)."""
    if priority not in Priority.values:
        raise JobRejected("priority", f"must be one of {', '.join(Priority.values)}")
    with transaction.atomic():
        locked = Job.objects.select_for_update().get(pk=job.pk)
        if locked.state not in (S.PENDING, S.QUEUED):
            raise IllegalTransition(
                f"job {job.pk} is {locked.state}: only a waiting job's priority can change"
            )
        if locked.priority != priority:
            record(
                "job.priority_changed",
                actor=actor,
                target=locked,
                before={"priority": locked.priority},
                after={"priority": priority},
            )
            locked.priority = priority
            locked.save(update_fields=["priority"])
            transaction.on_commit(dispatch.wake)
    job.priority = priority
    return locked
