"""What node agents report about their jobs: starts and ends recorded (usage, gang parts,
retries, preempted jobs requeued), and the reconciliation of what an agent says it runs. No
job's process outlives what is decided here: the part of a gang that ends its attempt has the
others stopped, and an attempt a returning agent runs that gpuadmin ended there is stopped.
No GPU is given twice meanwhile: a job whose end is decided while parts of it still run keeps
its GPUs until their agents report them gone (``transitions.stop_parts``).
"""

from __future__ import annotations

import logging
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from functools import partial
from typing import Any

from django.conf import settings
from django.contrib.postgres.expressions import ArraySubquery
from django.db import connection, transaction
from django.db.models import (
    Case,
    CharField,
    DurationField,
    ExpressionWrapper,
    F,
    IntegerField,
    OuterRef,
    Q,
    QuerySet,
    Subquery,
    Value,
    When,
)
from django.db.models.fields.json import KT
from django.db.models.functions import Cast, Coalesce, Greatest
from django.utils import timezone

from gpuadmin.audit.models import AuditEvent
from gpuadmin.audit.services import (
    audit_event,
    record,
    record_all,
)
from inventory.choices import NodeState
from inventory.models import Gpu, Node
from inventory.services import set_node_state
from scheduling.agent.wire import (
    ExecutorEvent,
    FinalState,
    JobFinished,
    JobStarted,
    executor_id,
    parse_executor_id,
    time_limit_message,
)
from scheduling.jobs import ray
from scheduling.jobs.transitions import (
    AGENT_ACTOR,
    LOOP_ACTOR,
    IllegalTransition,
    Moves,
    attempt_end,
    attempt_hostnames,
    job_nodes,
    reachable_parts,
    stop_parts,
    take_end,
    transition,
)
from scheduling.loop import dispatch
from scheduling.models import (
    HOLDING_STATES,
    TERMINAL_STATES,
    Allocation,
    Job,
    JobState,
)

S = JobState
log = logging.getLogger("gpuadmin.jobs")


def job_event(event: ExecutorEvent) -> None:
    """What an agent's executor reported (``scheduling.job_event``): ``job_events`` of one."""
    job_events([event])


@dataclass
class Recorded:
    """What ``job_events`` made of a batch: the state each job reached, by id, and the
    executor ids of the events refused because their job attempt was not placed on the node
    that sent them."""

    reached: dict[int, str] = field(default_factory=dict)
    not_placed_there: list[str] = field(default_factory=list)


def job_events(
    events: Sequence[ExecutorEvent],
    *,
    sender: str | None = None,
    node_stopped: Collection[str] = (),
) -> Recorded:
    """What an agent's executor reported, in the order it happened (``scheduling.job_events``: an
    agent sends together the events that pile up), recorded in one transaction of a fixed number of
    statements however many events: the jobs locked in id order (with the attempts placed on node
    ``sender``, when given: an event about a job attempt placed elsewhere is refused, not believed);
    each event's transition decided on its job as the state machine has it then (``change_state``: a
    start SCHEDULED -> RUNNING, an end as ``attempt_end`` says); the jobs written in one UPDATE; the
    GPUs of those that stopped holding them released in one statement; every transition audited, in
    one INSERT. An end adds its run's CPU time and peak memory to the job's earlier runs' (retries
    and preempted runs count too); a multi-node gang's parts add theirs with statements of their own
    (``_add_gang_part``). A stale report (another attempt, or a job that moved on) changes nothing.
    A gang's part whose end ends the attempt while its parts on other reachable nodes run on
    makes the job stop (``transitions.stop_parts``: its end decided and stored, its GPUs held);
    the report of the last of them takes that end (``take_end``), whatever they said.
    The end of a preempted job takes ``_requeue_preempted``'s path, in the same transaction: its
    GPUs are released by a statement of their own, so when others end with it, all their GPUs are
    locked first, in id order (the module's lock order). ``node_stopped``: the executor ids of the
    jobs that ``sender``'s agent stopped because it stopped (``--stop-jobs-on-exit``): their cancel
    is the node's stop, not a user's (``attempt_end``)."""
    reports = []
    for event in events:
        job_id, attempt = parse_executor_id(event.job_id)
        reports.append((job_id, attempt, event))
    recorded = Recorded()
    reached = recorded.reached
    locking = Job.objects.select_for_update(of=("self",)).filter(
        pk__in={job_id for job_id, _, _ in reports}
    )
    if sender is not None:
        placed = Allocation.objects.filter(job=OuterRef("pk"), node__hostname=sender)
        locking = locking.annotate(placed_there=ArraySubquery(placed.values("attempt")))
    with transaction.atomic():
        jobs = {job.pk: job for job in locking.order_by("pk")}
        if len(jobs) > 1 and any(job.preempted_by_id is not None for job in jobs.values()):
            _lock_held_gpus(list(jobs))
        moves = Moves(actor_name=AGENT_ACTOR)
        gang_parts: list[tuple[int, int, JobFinished]] = []
        gang_ends: dict[int, tuple[Job, str | None, str]] = {}  # job, the part's node, why
        stopping: set[int] = set()  # jobs whose parts on other nodes are waited for
        for job_id, attempt, event in reports:
            job = jobs.get(job_id)
            if sender is not None and attempt not in getattr(job, "placed_there", ()):
                recorded.not_placed_there.append(event.job_id)
                continue
            if job is None:
                continue
            # A gang's parts end one by one, each on its node: their usage adds up.
            gang = job.node_count > 1 and sender is not None
            if job.attempt != attempt:
                # A part stopped after its attempt ended (``_cancel_other_parts``) may report
                # once the job was re-queued and placed again: its usage still counts.
                if gang and isinstance(event, JobFinished) and attempt < job.attempt:
                    gang_parts.append((job_id, attempt, event))
                continue
            if isinstance(event, JobStarted):
                if job.state == S.SCHEDULED:
                    moves.add(job, S.RUNNING, pid=event.pid, started_at=event.started_at)
                continue
            if job.state not in HOLDING_STATES:
                if gang:
                    gang_parts.append((job_id, attempt, event))
                continue
            if gang:  # the run's usage: by part (else added to its earlier runs' below)
                gang_parts.append((job_id, attempt, event))
            if job.ending is not None:
                # Its end was decided while parts of it still ran: this one is gone (the
                # central side's own report speaks for every node).
                end = take_end(job, job.ending["nodes"] if sender is None else {sender})
                if end is None:
                    continue
                to, message, fields = end
                fields.setdefault("exit_code", event.exit_code)
            else:
                to, message, fields = _decide_end(job, event, event.job_id in node_stopped, sender)
                told = job.preempted_by_id is not None or job.cancel_requested_at is not None
                if job.node_count > 1 and not told:
                    # Its other parts run on unless told (a preemption's or a cancel's stop
                    # was sent to every node of the attempt already).
                    gang_ends[job_id] = (job, sender, event.message or event.state)
                others = reachable_parts(job, besides=sender) if gang else []
                if others:
                    why = gang_end_message(sender, event.message or event.state)
                    stop_parts(job, to, message, fields, others, why=why, actor_name=AGENT_ACTOR)
                    stopping.add(job_id)
                    continue
            if to == S.PREEMPTED:
                reached.update(moves.write())
                if not gang:
                    _add_usage(job_id, event)
                if (state := _requeue_preempted(job_id, fields.get("exit_code"))) is not None:
                    reached[job_id] = state
                del jobs[job_id]  # its row changed under this copy; later reports are stale
                continue
            if not gang:
                fields["cpu_seconds"] = _total(job.cpu_seconds, event.cpu_seconds)
                fields["max_memory_bytes"] = _peak(job.max_memory_bytes, event.max_memory_bytes)
            moves.add(job, to, message, **fields)
        reached.update(moves.write())
        ended = [
            end
            for job_id, end in gang_ends.items()
            if job_id in stopping or reached.get(job_id) in ATTEMPT_OVER
        ]
        if ended:
            _cancel_other_parts(ended)
        for job_id, attempt, event in gang_parts:
            assert sender is not None, "a gang's part is reported by its node"
            _add_gang_part(job_id, attempt, sender, event)
    moves.log()
    return recorded


# The states a job's attempt ends in (re-queued: its next placement is its next attempt).
ATTEMPT_OVER = frozenset({*TERMINAL_STATES, S.QUEUED})


def _decide_end(
    job: Job, event: JobFinished, node_stopped: bool, sender: str | None
) -> tuple[str, str, dict[str, Any]]:
    """What the end ``event`` reports makes of the job's attempt (its state, message and
    fields): a preempted job's end (unless it completed first) is its preemption
    (``_requeue_preempted``, PREEMPTED standing for it), else ``attempt_end``'s (the node
    ``sender`` stopped it when ``node_stopped``). A Ray application's status is its
    entrypoint's, on the head (as Ray's own jobs): a worker that leaves its cluster first
    ends the attempt as any gang's part does, but never as a success."""
    preempted = job.preempted_by_id is not None and job.cancel_requested_at is None
    if preempted and event.state != "completed":
        return S.PREEMPTED, "", {"exit_code": event.exit_code}
    outcome: str = event.state
    said = event.message
    if outcome == "completed" and job.ray and sender is not None:
        head = ray.head_of(node.hostname for node in job_nodes(job))
        if sender != head:
            outcome, said = "failed", f"its Ray worker on {sender} ended before the entrypoint"
    to, message, fields = attempt_end(
        job,
        outcome,
        event.exit_code,
        said,
        node_stopped=sender if node_stopped else None,
    )
    fields["exit_code"] = event.exit_code
    if to != S.QUEUED:
        fields["finished_at"] = event.finished_at
    return to, message, fields


def gang_end_message(node: str | None, why: str) -> str:
    """What the agents of a gang's other nodes are told, and the job's audit says, when its
    part on ``node`` ended its attempt (``why``)."""
    where = f"its part on {node} ended" if node else "its attempt ended"
    return f"stopped: {where} ({why})"


def _cancel_other_parts(ended: Sequence[tuple[Job, str | None, str]]) -> None:
    """The attempt of each multi-node gang of ``ended`` (the job, the node whose part's end
    ended it, why it ended) is over: the agents of its other nodes are told to stop their
    parts, once the caller's transaction commits, as Slurm kills a job's other steps when its
    batch step ends; their GPUs are already released. The nodes are read from the attempt's
    allocations, released ones included, in one query. A part's end reported by the central
    side (no node) tells every node of the attempt."""
    hostnames = attempt_hostnames({(job.pk, job.attempt) for job, _, _ in ended})
    for job, sender, why in ended:
        others = [host for host in hostnames.get((job.pk, job.attempt), ()) if host != sender]
        if not others:
            continue
        message = gang_end_message(sender, why)
        transaction.on_commit(partial(dispatch.send_cancel, job, others, message))


# The audit row of one node's part of a multi-node gang's usage.
GANG_PART_USAGE = "job.part_usage"


def _add_gang_part(job_id: int, attempt: int, node: str, event: JobFinished) -> None:
    """Add the usage of a gang's part that ended on ``node`` to its job (CPU seconds summed,
    the largest peak memory kept; inside the caller's transaction, the job locked), audited
    ``job.part_usage``, that row also telling a repeated report (counted once per node and
    attempt)."""
    cpu, memory = event.cpu_seconds, event.max_memory_bytes
    if cpu is None and memory is None:
        return
    part = {"attempt": attempt, "node": node}
    counted = AuditEvent.objects.filter(
        event_type=GANG_PART_USAGE,
        target_type=Job._meta.label_lower,
        target_id=str(job_id),
        after__contains=part,
    )
    if counted.exists():
        return
    _add_usage(job_id, event)
    after = {**part, "cpu_seconds": cpu, "max_memory_bytes": memory}
    record(
        GANG_PART_USAGE,
        actor_name=AGENT_ACTOR,
        target_type=Job._meta.label_lower,
        target_id=job_id,
        after=after,
    )


def _add_usage(job_id: int, event: JobFinished) -> None:
    """Add what a run (or a gang's part) used to its job's: CPU seconds summed over its runs,
    the largest peak memory kept (one statement; the job locked by the caller)."""
    cpu, memory = event.cpu_seconds, event.max_memory_bytes
    Job.objects.filter(pk=job_id).update(
        cpu_seconds=F("cpu_seconds") if cpu is None else Coalesce(F("cpu_seconds"), 0.0) + cpu,
        max_memory_bytes=F("max_memory_bytes")
        if memory is None
        else Greatest(F("max_memory_bytes"), Value(memory)),  # NULL is not the greatest
    )


def _total(before: float | None, run: float | None) -> float | None:
    return before if run is None else (before or 0.0) + run


def _peak(before: int | None, run: int | None) -> int | None:
    return before if run is None else max(before or 0, run)


def _lock_held_gpus(job_ids: Collection[int]) -> None:
    """Lock the GPUs these jobs hold, in id order, in one statement (inside the caller's
    transaction, the jobs locked)."""
    with connection.cursor() as cursor:
        cursor.execute(LOCK_HELD_GPUS_SQL, [list(job_ids)])


LOCK_HELD_GPUS_SQL = f"""
    SELECT gpu.id FROM {Gpu._meta.db_table} AS gpu
    WHERE gpu.id IN (
        SELECT gpu_id FROM {Allocation._meta.db_table}
        WHERE job_id = ANY(%s) AND released_at IS NULL
    )
    ORDER BY gpu.id
    FOR UPDATE
"""


def job_started(job_id: int, attempt: int, pid: int, at: datetime) -> bool:
    """The agent started attempt ``attempt``: SCHEDULED -> RUNNING. ``False`` for a stale
    report (another attempt, or the job already moved on)."""
    event = JobStarted(executor_id(job_id, attempt), pid, at)
    return job_events([event]).reached.get(job_id) == S.RUNNING


def job_finished(
    job_id: int, attempt: int, outcome: str, exit_code: int | None, message: str, at: datetime
) -> str | None:
    """The agent says attempt ``attempt`` ended (``completed``, ``failed``, ``timed_out``,
    ``canceled`` or ``lost``). Re-queues while retries are left; the new state, or ``None``
    for a stale report."""
    event = JobFinished(executor_id(job_id, attempt), FinalState(outcome), exit_code, at, message)
    return job_events([event]).reached.get(job_id)


def _requeue_preempted(job_id: int, exit_code: int | None) -> str | None:
    """A preempted job's attempt ended (whatever the signal made of it): PREEMPTED (audited
    ``job.preempted`` with its ``preemptions`` counted, its GPUs released, the preemption's
    message kept), then back in the queue for its next attempt, which does not count against
    its retries."""
    try:
        with transaction.atomic():
            counted = Job.objects.select_for_update().values_list("preemptions", flat=True)
            preempted = counted.get(pk=job_id) + 1
            transition(
                job_id,
                S.PREEMPTED,
                actor_name=AGENT_ACTOR,
                exit_code=exit_code,
                preemptions=preempted,
            )
            transition(job_id, S.QUEUED, actor_name=AGENT_ACTOR)
    except IllegalTransition:
        return None
    return S.QUEUED


def end_stops_on_silent_nodes() -> list[int]:
    """The stopping jobs stop waiting for their parts on nodes silent past the heartbeat grace
    (beat, with ``requeue_unconfirmed``): those agents cannot report, the nodes' GPUs are
    unschedulable while they are silent, and a returning agent stops what it still runs
    (``cancel_strays``), as for a cancel of a job on a silent node. A job left with none to
    wait for ends: its stored end (``transitions.stop_parts``), else as its cancel or
    preemption asked (``_end_unreported``), its GPUs released. The ids of the jobs that
    ended."""
    silent = set(Node.objects.unreachable().values_list("hostname", flat=True))
    stopping = Job.objects.filter(STOP_RECORDED, state__in=HOLDING_STATES)
    ended = []
    for job_id in stopping.order_by("pk").values_list("pk", flat=True):
        with transaction.atomic():
            locked = stopping.select_for_update().filter(pk=job_id).first()
            if locked is None:
                continue  # ended meanwhile
            if locked.ending is not None:
                end = take_end(locked, silent)
                if end is None:
                    continue  # it still waits for a reachable node
                _end_as_stored(locked, end)
            elif reachable_parts(locked):
                continue  # its agents report its processes gone
            else:
                _end_unreported(locked, "its nodes went silent before reporting it gone")
        ended.append(job_id)
    return ended


def _end_as_stored(locked: Job, end: tuple[str, str, dict[str, Any]]) -> None:
    """``locked`` (its row locked) takes the end its stop stored (``take_end``)."""
    to, message, fields = end
    if to == S.PREEMPTED:
        _requeue_preempted(locked.pk, fields.get("exit_code"))
    else:
        transition(locked, to, actor_name=LOOP_ACTOR, message=message, **fields)


def _end_unreported(locked: Job, why: str) -> None:
    """``locked`` (its row locked), stopping with no end stored, ends without its agents'
    reports (``why`` they will not come): canceled for a cancel (``why`` its message),
    re-queued for a preemption, else (past its time limit) as its agents' report of a time-out
    would end it."""
    if locked.cancel_requested_at is not None:
        transition(locked, S.CANCELED, actor_name=LOOP_ACTOR, message=f"canceled: {why}")
    elif locked.preempt_requested_at is not None:
        _requeue_preempted(locked.pk, None)
    else:
        assert locked.max_runtime_s is not None  # stopping_jobs: its time limit passed
        said = time_limit_message(locked.max_runtime_s)
        to, message, fields = attempt_end(locked, FinalState.TIMED_OUT, None, said)
        if to != S.QUEUED:
            fields["finished_at"] = timezone.now()
        transition(locked, to, actor_name=LOOP_ACTOR, message=message, **fields)


# A stop asked for (a cancel, a preemption) or an end decided (``Job.ending``): the job holds
# its GPUs until its agents report its processes gone.
STOP_RECORDED = (
    Q(ending__isnull=False)
    | Q(cancel_requested_at__isnull=False)
    | Q(preempt_requested_at__isnull=False)
)


def stopping_jobs(now: datetime | None = None) -> QuerySet[Job]:
    """The jobs whose stop is under way at ``now``: recorded (``STOP_RECORDED``), or running
    past their time limit (their agents stop them then), their GPUs held until their agents
    report their processes gone. Each carries ``time_limit_at`` (when a running job's agents
    stop it for its time limit; None without one) and ``preempt_grace_s`` (the grace its
    preemption gave it, as its ``job.preempt_requested`` row recorded it; None when it is not
    being preempted), for ``stop_began`` and ``stop_grace_s``."""
    limit = ExpressionWrapper(F("max_runtime_s") * Value(timedelta(seconds=1)), DurationField())
    asked = AuditEvent.objects.filter(
        target_type=Job._meta.label_lower,
        target_id=Cast(OuterRef("pk"), CharField()),
        event_type="job.preempt_requested",
    ).order_by("-time", "-pk")
    grace = Subquery(asked.values(grace=Cast(KT("after__grace_s"), IntegerField()))[:1])
    return (
        Job.objects.filter(state__in=HOLDING_STATES)
        .annotate(
            time_limit_at=Case(When(state=S.RUNNING, then=F("started_at") + limit)),
            preempt_grace_s=Case(
                When(
                    preempt_requested_at__isnull=False,
                    then=grace,
                )
            ),
        )
        .filter(STOP_RECORDED | Q(time_limit_at__lt=now or timezone.now()))
    )


def stop_began(job: Job, now: datetime) -> datetime | None:
    """When ``job`` (of ``stopping_jobs``) had its processes told to stop: its cancel or
    preemption, its end decided (``Job.ending``'s ``since``) or its time limit passed (before
    ``now``), the earliest (a canceled or preempted gang whose first part ended stores its end
    then, its other parts told at the cancel or preemption); ``None`` when no stop is under
    way."""
    times = [at for at in (job.cancel_requested_at, job.preempt_requested_at) if at is not None]
    if job.ending is not None:
        since = job.ending["since"]
        times.append(since if isinstance(since, datetime) else datetime.fromisoformat(since))
    limit: datetime | None = job.time_limit_at  # type: ignore[attr-defined]  # annotated
    if limit is not None and limit < now:
        times.append(limit)
    return min(times, default=None)


def stop_grace_s(job: Job) -> int:
    """How long ``job`` (of ``stopping_jobs``) gave its processes between the stop's signal and
    SIGKILL: the kill grace (``GPUADMIN_JOB_KILL_GRACE_S``), or its preemption's own grace
    where longer (the pool's time to checkpoint)."""
    preempt_grace_s: int | None = job.preempt_grace_s  # type: ignore[attr-defined]  # annotated
    return max(settings.GPUADMIN_JOB_KILL_GRACE_S, preempt_grace_s or 0)


def stop_overdue_at(job: Job, now: datetime) -> datetime | None:
    """When ``job``'s stop is overdue (the one rule: beat's ``end_unkillable_stops`` acts on
    it, ``gpuadmin check`` reports a stop still under way a beat period later): the stop's
    grace (``stop_grace_s``: SIGTERM, or a preemption's signal, to SIGKILL) and
    ``GPUADMIN_UNKILLABLE_TIMEOUT_S`` after it began, as Slurm's UnkillableStepTimeout;
    ``None`` when no stop is under way."""
    began = stop_began(job, now)
    if began is None:
        return None
    grace_s = stop_grace_s(job) + settings.GPUADMIN_UNKILLABLE_TIMEOUT_S
    return began + timedelta(seconds=grace_s)


def overdue_stops(now: datetime | None = None, *, slack: timedelta = timedelta()) -> list[Job]:
    """The ``stopping_jobs`` overdue (``stop_overdue_at``) by more than ``slack`` at ``now``,
    in id order."""
    now = now or timezone.now()
    return [
        job
        for job in stopping_jobs(now).order_by("pk")
        if (overdue := stop_overdue_at(job, now)) is not None and overdue < now - slack
    ]


def unkillable_reason(job_id: int) -> str:
    """Why a node is drained by ``end_unkillable_stops`` (its ``state_reason``, and the
    sentence of its audit row): Slurm's "Kill task failed", with the job and the timeout."""
    timeout = settings.GPUADMIN_UNKILLABLE_TIMEOUT_S
    return (
        f"Kill task failed: the processes of job {job_id} were not reported gone "
        f"{timeout} s after SIGKILL (GPUADMIN_UNKILLABLE_TIMEOUT_S)"
    )


def end_unkillable_stops() -> list[int]:
    """Stops overdue (``stop_overdue_at``) whose nodes are still heard from, their agents
    never reporting the processes gone (stuck in the driver after SIGKILL, or the agent's
    executor wedged): as Slurm after UnkillableStepTimeout, each node still waited for is
    drained (``inventory.services.set_node_state``, audited, the reason naming the job and the
    timeout), so no job is placed on its GPUs until an admin resumes it, and the job takes
    its end as if they had reported: its decided end (``take_end``), canceled for a cancel,
    re-queued for a preemption, timed out for a time limit, its GPUs released. A node already
    draining or offline is left as it is (it takes no work either). A silent node is not
    drained: ``end_stops_on_silent_nodes`` stops waiting for it. The job's row is locked first (then
    its nodes', then its GPUs'), and a report that ended it meanwhile wins: nothing is drained
    then. Beat, with ``requeue_unconfirmed``; the ids of the jobs ended."""
    ended = []
    for job_id in [job.pk for job in overdue_stops()]:
        with transaction.atomic():
            now = timezone.now()
            locked = stopping_jobs(now).select_for_update().filter(pk=job_id).first()
            overdue = stop_overdue_at(locked, now) if locked is not None else None
            if locked is None or overdue is None or overdue >= now:
                continue  # ended, or stopped again, meanwhile
            reachable = reachable_parts(locked)
            waited = (
                reachable
                if locked.ending is None
                else [node for node in locked.ending["nodes"] if node in reachable]
            )
            if not waited:
                continue  # only silent nodes left: end_stops_on_silent_nodes' to end
            reason = unkillable_reason(job_id)
            drained = [
                node.hostname
                for node in Node.objects.filter(hostname__in=waited).order_by("hostname")
                if set_node_state(node, NodeState.DRAINING, actor_name=LOOP_ACTOR, reason=reason)
            ]
            log.warning(
                "job %d: its processes on %s not reported gone %d s after SIGKILL; drained: %s",
                job_id,
                ", ".join(waited),
                settings.GPUADMIN_UNKILLABLE_TIMEOUT_S,
                ", ".join(drained) or "none (already draining or offline)",
            )
            if locked.ending is not None:
                end = take_end(locked, waited)
                if end is None:
                    continue  # it still waits for a silent node (the other sweep's)
                _end_as_stored(locked, end)
            else:
                _end_unreported(
                    locked,
                    f"its processes on {', '.join(waited)} were not reported gone "
                    f"{settings.GPUADMIN_UNKILLABLE_TIMEOUT_S} s after SIGKILL; "
                    f"{'node' if len(waited) == 1 else 'nodes'} drained",
                )
        ended.append(job_id)
    return ended


def reconcile_node_jobs(hostname: str, running: set[tuple[int, int]]) -> list[int]:
    """A (re)started agent says which (job, attempt) it runs: a job RUNNING on that node that
    it does not know was lost with the previous agent (fails, or re-queues while retries are
    left; a gang's other parts are stopped, as for any part's end); one SCHEDULED there longer
    than ``GPUADMIN_SCHEDULED_CONFIRM_S`` that it does not run is re-queued
    (``requeue_unconfirmed``: one placed since may still be in its queue). An attempt it runs
    that gpuadmin no longer places there is stopped (``cancel_strays``). Returns the ids of
    the jobs lost or re-queued."""
    lost = requeue_unconfirmed(hostname, running)
    jobs = Job.objects.filter(
        state=S.RUNNING,
        allocations__node__hostname=hostname,
        allocations__released_at__isnull=True,
    ).distinct()
    message = f"the agent of {hostname} restarted and no longer runs it"
    now = timezone.now()
    gone = [
        JobFinished(executor_id(pk, attempt), FinalState.LOST, None, now, message)
        for pk, attempt in jobs.order_by("pk").values_list("pk", "attempt")
        if (pk, attempt) not in running
    ]
    if gone:
        lost.extend(job_events(gone, sender=hostname).reached)
    cancel_strays(hostname, running)
    return lost


# The audit row of an attempt that an agent ran after gpuadmin had ended it there.
STRAY_CANCELED = "job.stray_canceled"


def cancel_strays(hostname: str, running: Collection[tuple[int, int]]) -> list[tuple[int, int]]:
    """The attempts among ``running`` (what the agent of ``hostname`` says it runs) that
    gpuadmin no longer places on that node (ended, re-queued, or placed elsewhere while the
    agent was away, its cancel never delivered: ``control.stop_jobs_on_gpus`` signals only
    reachable nodes) are told to stop there, on commit, each audited ``job.stray_canceled``
    with the job's state and message as the reason; their later ends are stale reports. The
    (job, attempt) told to stop."""
    placed = set(
        Allocation.objects.active()
        .filter(node__hostname=hostname, job_id__in={job_id for job_id, _ in running})
        .values_list("job_id", "attempt")
    )
    strays = sorted(set(running) - placed)
    if not strays:
        return []
    jobs = Job.objects.in_bulk({job_id for job_id, _ in strays})
    rows = []
    sends = []
    for job_id, attempt in strays:
        job = jobs.get(job_id)
        if job is None:
            why = "the job no longer exists"
        else:
            state = job.state if job.attempt == attempt else f"{job.state} (attempt {job.attempt})"
            why = f"the job is {state}" + (f": {job.message}" if job.message else "")
        message = f"gpuadmin ended this attempt while the agent of {hostname} was away: {why}"
        rows.append(
            audit_event(
                STRAY_CANCELED,
                actor_name=AGENT_ACTOR,
                target_type=Job._meta.label_lower,
                target_id=job_id,
                after={"attempt": attempt, "node": hostname},
                message=message,
            )
        )
        # Its id and that attempt: what the agent's cancel names (the job may be on another).
        sends.append(
            partial(dispatch.send_cancel, Job(pk=job_id, attempt=attempt), [hostname], message)
        )
    with transaction.atomic():
        record_all(rows)
        for send in sends:
            transaction.on_commit(send)
    log.warning(
        "node %s runs attempts gpuadmin ended: %s, told to stop",
        hostname,
        ", ".join(executor_id(*pair) for pair in strays),
    )
    return strays


def unconfirmed_jobs(now: datetime | None = None) -> QuerySet[Job]:
    """Jobs SCHEDULED longer than ``GPUADMIN_SCHEDULED_CONFIRM_S``: no agent has reported
    them started (the message that carried them was lost, or their agent stopped or went
    silent). ``gpuadmin check`` reports them; ``requeue_unconfirmed`` re-queues them."""
    bound = timedelta(seconds=settings.GPUADMIN_SCHEDULED_CONFIRM_S)
    return Job.objects.filter(state=S.SCHEDULED, scheduled_at__lt=(now or timezone.now()) - bound)


def requeue_unconfirmed(
    hostname: str | None = None, running: Collection[tuple[int, int]] = ()
) -> list[int]:
    """Re-queue the ``unconfirmed_jobs`` (only those placed on ``hostname``, when given, but
    not the (job, attempt) its agent says it ``running``): audited, with the reason as the
    job's message ("requeued: dgx-01 did not start it within 120 s"), its GPUs released, not
    counted against its retries, and its agents asked to cancel that attempt should its
    message still arrive (``scheduling.agent.jobs.cancel_job``: it then never starts). The ids
    re-queued."""
    jobs = unconfirmed_jobs()
    if hostname is not None:
        jobs = jobs.filter(
            allocations__node__hostname=hostname, allocations__released_at__isnull=True
        )
    bound = settings.GPUADMIN_SCHEDULED_CONFIRM_S
    requeued = []
    for job_id, attempt in jobs.distinct().order_by("pk").values_list("pk", "attempt"):
        if (job_id, attempt) in running:
            continue
        with transaction.atomic():
            locked = unconfirmed_jobs().select_for_update().filter(pk=job_id, attempt=attempt)
            job = locked.first()
            if job is None:
                continue  # started, or moved on, since the query
            hostnames = [node.hostname for node in job_nodes(job)]
            message = f"requeued: {', '.join(hostnames)} did not start it within {bound} s"
            job = transition(job, S.QUEUED, actor_name=LOOP_ACTOR, message=message)
            transaction.on_commit(partial(dispatch.send_cancel, job, hostnames, message))
        requeued.append(job_id)
    return requeued
