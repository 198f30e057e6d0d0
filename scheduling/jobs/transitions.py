"""Job state transitions: the one owner of a job's state (each change audited in its
transaction), one job at a time (``transition``) or many written together (``Moves``), and
the release of what a job held.

Lock order: a transaction that locks jobs and GPUs locks the jobs first, then the GPUs, each in
id order. A transition locks its job and then the GPUs it releases;
``scheduling.allocations.services.allocate_many`` its jobs and then the GPUs it gives them;
``scheduling.jobs.reports.job_events`` its jobs and then their GPUs, in one ordered statement;
``scheduling.jobs.reports.end_unkillable_stops`` its job, then the nodes it drains, then the GPUs
(``tests/scheduling/test_lock_order.py``).
"""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Collection, Iterable, Sequence
from datetime import datetime
from typing import Any

from django.contrib.auth.models import User
from django.db import connection, transaction
from django.utils import timezone

from gpuadmin.audit.services import (
    audit_event,
    record,
    record_all,
)
from inventory.models import Gpu, Node
from scheduling.loop import dispatch
from scheduling.models import (
    HOLDING_STATES,
    NOT_WAITING,
    TERMINAL_STATES,
    Allocation,
    Job,
    JobState,
)

S = JobState
log = logging.getLogger("gpuadmin.jobs")
# The state machine (seeds 002/003). SCHEDULED may end directly: a short job's end can be
# reported before its start is processed.
TRANSITIONS: dict[str, frozenset[str]] = {
    S.PENDING: frozenset({S.QUEUED, S.CANCELED}),
    S.QUEUED: frozenset({S.PENDING, S.SCHEDULED, S.CANCELED}),
    S.SCHEDULED: frozenset({S.RUNNING, S.QUEUED, S.COMPLETED, S.FAILED, S.CANCELED, S.PREEMPTED}),
    S.RUNNING: frozenset({S.COMPLETED, S.FAILED, S.CANCELED, S.QUEUED, S.PREEMPTED}),
    S.PREEMPTED: frozenset({S.QUEUED, S.CANCELED}),
    S.COMPLETED: frozenset(),
    S.FAILED: frozenset(),
    S.CANCELED: frozenset(),
}

LOOP_ACTOR = "placement-loop"
AGENT_ACTOR = "agent"
HEALTH_ACTOR = "health"  # jobs stopped because the hardware under them failed


class IllegalTransition(ValueError):
    """A state change the state machine does not allow; nothing was written."""


def transition_refusal(job_id: int, state: str, to: str) -> str:
    """Why job ``job_id`` cannot go from ``state`` to ``to`` (the state machine refuses it):
    ``job 12 is already canceled``, ``job 12 already ended: it is completed``, ``job 12
    cannot go from running to pending``."""
    if state == to:
        return f"job {job_id} is already {state}"
    if state in TERMINAL_STATES:
        return f"job {job_id} already ended: it is {state}"
    return f"job {job_id} cannot go from {state} to {to}"


def transition(
    job: Job | int,
    to: str,
    *,
    actor: User | None = None,
    actor_name: str | None = None,
    message: str = "",
    expect: Iterable[str] | None = None,
    **fields: Any,
) -> Job:
    """Move a job to state ``to`` under a row lock, set ``fields``, release its allocations
    when it stops holding GPUs, and audit ``job.<to>``. ``expect`` narrows the states it may
    leave (e.g. only QUEUED for a placement). A job whose cancel was asked for (and is under
    way) is canceled instead of re-queued or failed. Raises ``IllegalTransition``."""
    job_id = job if isinstance(job, int) else job.pk
    with transaction.atomic():
        locked = Job.objects.select_for_update().get(pk=job_id)
        if locked.cancel_requested_at is not None and to in (S.QUEUED, S.FAILED):
            # Stopped for its hardware while its cancel was under way: canceled, as asked.
            to, message = S.CANCELED, f"canceled ({to} as it stopped: {message})"
        before, columns = change_state(locked, to, message, expect, fields)
        locked.save(update_fields=columns)
        if before["state"] in HOLDING_STATES and to not in HOLDING_STATES:
            released = release_allocations(locked)
            if released:
                fields["released_gpus"] = released
        record(
            f"job.{to}",
            actor=actor,
            actor_name=actor_name,
            target=locked,
            before=before,
            after={"state": to, **audited_fields(fields)},
            message=message,
        )
        if to in TERMINAL_STATES or to == S.QUEUED:
            transaction.on_commit(dispatch.wake)
    log.info("job %d: %s -> %s%s", job_id, before["state"], to, f" ({message})" if message else "")
    if not isinstance(job, int):
        job.__dict__.update(locked.__dict__)
    return locked


def change_state(
    locked: Job, to: str, message: str, expect: Iterable[str] | None, fields: dict[str, Any]
) -> tuple[dict[str, Any], list[str]]:
    """Move ``locked`` (its row locked, in memory only) to ``to``, the state machine's rule
    for every transition: what it sets besides ``fields`` (which it completes with them), and
    what it clears. Its ``before`` and the columns to write; ``IllegalTransition``, and
    nothing changed, when the move is not allowed."""
    if expect is not None and locked.state not in expect:
        wanted = " or ".join(sorted(expect))
        raise IllegalTransition(f"job {locked.pk} is {locked.state}, not {wanted}")
    if to not in TRANSITIONS[locked.state]:
        raise IllegalTransition(transition_refusal(locked.pk, locked.state, to))
    before = {"state": locked.state}
    if to in TERMINAL_STATES:
        fields.setdefault("finished_at", timezone.now())
    if to in TERMINAL_STATES or to == S.QUEUED:
        fields.setdefault("pid", None)
        if locked.preempted_by_id is not None:  # its preemption ends with its attempt
            fields.setdefault("preempted_by", None)
            fields.setdefault("preempt_requested_at", None)
        if locked.cancel_requested_at is not None:  # and so does a cancel asked for
            fields.setdefault("cancel_requested_at", None)
    if to not in HOLDING_STATES and locked.ending is not None:  # and the end it waited for
        fields.setdefault("ending", None)
    if message:
        fields["message"] = message
    # A job that stops waiting drops the loop's word on its wait (not audited, like it).
    changes = {**({} if to == S.QUEUED else NOT_WAITING), **fields}
    for name, value in changes.items():
        setattr(locked, name, value)
    locked.state = to
    return before, ["state", *changes]


def audited_fields(fields: dict[str, Any]) -> dict[str, Any]:
    return {name: value for name, value in fields.items() if name != "message"}


def release_allocations(job: Job) -> list[str]:
    """End the job's active allocations (inside the caller's transaction); the GPU UUIDs.

    The GPU rows are locked after the job's (the module's lock order), and the release time
    is the database's statement time: the next allocation of a GPU is written only after this
    transaction commits, so its start is later than this end, on one clock."""
    return release_allocations_of([job.pk]).get(job.pk, [])


def release_allocations_of(job_ids: Collection[int]) -> dict[int, list[str]]:
    """``release_allocations`` for several jobs at once, in one statement: the GPU UUIDs
    released (in GPU order), by job id (a job without active allocations is left out)."""
    with connection.cursor() as cursor:
        cursor.execute(RELEASE_SQL, [list(job_ids)])
        rows = sorted(cursor.fetchall(), key=lambda row: row[1])
    released: dict[int, list[str]] = defaultdict(list)
    for job_id, _, uuid in rows:
        released[job_id].append(uuid)
    return dict(released)


# The GPU rows are locked in id order (as every writer locks them) before the allocations
# end at the statement's time (``Now()``, ``allocated_at``'s clock).
RELEASE_SQL = f"""
    UPDATE {Allocation._meta.db_table} AS allocation
    SET released_at = statement_timestamp()
    FROM (
        SELECT held.id, gpu.id AS gpu_id, gpu.uuid
        FROM {Allocation._meta.db_table} AS held
        JOIN {Gpu._meta.db_table} AS gpu ON gpu.id = held.gpu_id
        WHERE held.job_id = ANY(%s) AND held.released_at IS NULL
        ORDER BY gpu.id
        FOR UPDATE OF gpu
    ) AS active
    WHERE allocation.id = active.id
    RETURNING allocation.job_id, active.gpu_id, active.uuid
"""


# The audit row of an attempt whose end is decided while parts of it may still run
# (``stop_parts``): the job keeps its GPUs until their agents report them gone.
STOPPING = "job.stopping"


def stop_parts(
    locked: Job,
    to: str,
    message: str,
    fields: dict[str, Any],
    nodes: list[str],
    *,
    why: str,
    actor: User | None = None,
    actor_name: str | None = None,
) -> None:
    """The end of ``locked``'s attempt is decided (``to``, with ``message`` and ``fields`` as
    ``change_state`` takes them) while its processes may still run on ``nodes`` (reachable:
    their agents are told to stop them, SIGTERM then SIGKILL after the kill grace). As for a
    cancel, the job keeps its state and every GPU of the attempt until those agents have
    reported their parts gone (``take_end``), so no GPU is given to another job while a
    process of this one dies on it: the end is stored on the job (``Job.ending``) and audited
    ``job.stopping`` (``why``; the decided state, its fields and the nodes waited for; ``since``
    for ``gpuadmin check``). Inside the
    caller's transaction, the job's row locked; the caller tells the agents."""
    locked.ending = {
        "state": to,
        "message": message,
        "fields": fields,
        "nodes": nodes,
        "since": timezone.now(),
    }
    Job.objects.filter(pk=locked.pk).update(ending=locked.ending)
    record(
        STOPPING,
        actor=actor,
        actor_name=actor_name,
        target=locked,
        before={"state": locked.state},
        after={"state": to, **audited_fields(fields), "nodes": nodes},
        message=why,
    )
    log.info("job %d: %s, stopping on %s (%s)", locked.pk, locked.state, ", ".join(nodes), why)


def take_end(locked: Job, gone: Collection[str]) -> tuple[str, str, dict[str, Any]] | None:
    """A stopping job's (``stop_parts``) parts on ``gone`` are over (their agents reported
    them ended, or lost them, or the nodes went silent past the heartbeat grace: their GPUs
    are unschedulable then, ``Node.is_reachable``). The stored end (state, message, fields)
    once no part is left to wait for, else ``None`` with the nodes still waited for stored
    (inside the caller's transaction, the job's row locked)."""
    assert locked.ending is not None, "only a stopping job takes its stored end"
    left = [node for node in locked.ending["nodes"] if node not in gone]
    if left:
        if left != locked.ending["nodes"]:
            locked.ending = {**locked.ending, "nodes": left}
            Job.objects.filter(pk=locked.pk).update(ending=locked.ending)
        return None
    fields = dict(locked.ending["fields"])
    if isinstance(fields.get("finished_at"), str):
        fields["finished_at"] = datetime.fromisoformat(fields["finished_at"])
    return locked.ending["state"], locked.ending["message"], fields


def reachable_parts(job: Job, *, besides: str | None = None) -> list[str]:
    """The nodes (hostnames) whose agents can be told to stop the job's attempt and will
    report its part there gone: those holding its GPUs and heard from within the heartbeat
    grace (``besides``: a node whose part is known gone)."""
    return [
        node.hostname for node in job_nodes(job) if node.hostname != besides and node.is_reachable()
    ]


def job_nodes(job: Job) -> list[Node]:
    return list(
        Node.objects.filter(allocations__job=job, allocations__released_at__isnull=True)
        .distinct()
        .order_by("hostname")
    )


def attempt_hostnames(attempts: Collection[tuple[int, int]]) -> dict[tuple[int, int], list[str]]:
    """The nodes each (job, attempt) was placed on, by hostname in order, released allocations
    included (an attempt that just ended has released its own): one query for them all."""
    rows = (
        Allocation.objects.filter(job_id__in={job_id for job_id, _ in attempts})
        .values_list("job_id", "attempt", "node__hostname")
        .distinct()
        .order_by("node__hostname")
    )
    hostnames: dict[tuple[int, int], list[str]] = defaultdict(list)
    for job_id, attempt, hostname in rows:
        if (job_id, attempt) in attempts:
            hostnames[job_id, attempt].append(hostname)
    return dict(hostnames)


# What an executor outcome makes of the job: retried outcomes re-queue while retries are left.
RETRIED_OUTCOMES = frozenset({"failed", "timed_out", "lost"})


def attempt_end(
    job: Job,
    outcome: str,
    exit_code: int | None,
    message: str,
    *,
    node_stopped: str | None = None,
) -> tuple[str, str, dict[str, Any]]:
    """What the end of the job's current attempt with ``outcome`` makes of it, its message
    and the fields that change with it: a cancel asked for ends it canceled whatever its
    processes made of the signal (unless they completed first); retried outcomes count a
    failure and re-queue it while retries are left (a preemption, a re-layout's or a fault's
    re-queue counts none). A job canceled because its node ``node_stopped`` (its agent
    stopped with its jobs) is re-queued without counting a retry (not its own failure, as on
    a silent node): Slurm's requeue of a batch job on node failure."""
    if outcome == "completed":
        return S.COMPLETED, message, {}
    if outcome == "canceled" and node_stopped is not None and job.cancel_requested_at is None:
        return S.QUEUED, f"requeued: node {node_stopped} stopped", {}
    if outcome == "canceled" or job.cancel_requested_at is not None:
        return S.CANCELED, message or f"canceled ({outcome} as it stopped)", {}
    if outcome not in RETRIED_OUTCOMES:
        return S.FAILED, message or f"{outcome}: exit code {exit_code}", {}
    failures = job.failures + 1
    if failures <= job.max_retries:
        why = message or f"exit code {exit_code}"
        said = f"retry {failures}/{job.max_retries} after attempt {job.attempt} {outcome}: {why}"
        return S.QUEUED, said, {"failures": failures}
    return S.FAILED, message or f"{outcome}: exit code {exit_code}", {"failures": failures}


class Moves:
    """Transitions of locked jobs, decided in memory one after the other (``change_state``, as
    ``transition`` decides them) and written together by ``write``: the jobs in one UPDATE,
    the allocations of those that stopped holding GPUs released in one statement, each
    transition's ``job.<state>`` audit row in one INSERT."""

    def __init__(self, *, actor: User | None = None, actor_name: str | None = None) -> None:
        self.actor, self.actor_name = actor, actor_name
        self.pending: list[tuple[Job, dict[str, Any], str, str, dict[str, Any]]] = []
        self.written: list[tuple[int, str, str, str]] = []  # for ``log``, after the commit

    def add(self, job: Job, to: str, message: str = "", **fields: Any) -> None:
        """Move ``job`` (locked) to ``to`` in memory; a move the state machine refuses is
        left out, as ``transition`` would refuse it."""
        try:
            before, _ = change_state(job, to, message, None, fields)
        except IllegalTransition:
            return
        self.pending.append((job, before, to, message, fields))

    def write(self) -> dict[int, str]:
        """Write what was added since the last write (inside the caller's transaction); the
        state each job reached, by id."""
        if not self.pending:
            return {}
        jobs = {job.pk: job for job, *_ in self.pending}
        columns = {"state"}
        for _, _, to, _, fields in self.pending:
            columns.update(fields)
            if to != S.QUEUED:
                columns.update(NOT_WAITING)
        update_jobs(list(jobs.values()), columns)
        ended = [
            job.pk
            for job, before, to, _, _ in self.pending
            if before["state"] in HOLDING_STATES and to not in HOLDING_STATES
        ]
        released = release_allocations_of(ended) if ended else {}
        rows = []
        for job, before, to, message, fields in self.pending:
            after = {"state": to, **audited_fields(fields)}
            stopped_holding = before["state"] in HOLDING_STATES and to not in HOLDING_STATES
            if stopped_holding and released.get(job.pk):
                after["released_gpus"] = released[job.pk]
            rows.append(
                audit_event(
                    f"job.{to}",
                    actor=self.actor,
                    actor_name=self.actor_name,
                    target=job,
                    before=before,
                    after=after,
                    message=message,
                )
            )
            self.written.append((job.pk, before["state"], to, message))
        record_all(rows)
        if any(to in TERMINAL_STATES or to == S.QUEUED for _, _, to, _, _ in self.pending):
            transaction.on_commit(dispatch.wake)
        reached = {job.pk: to for job, _, to, _, _ in self.pending}
        self.pending = []
        return reached

    def log(self) -> None:
        """The line ``transition`` logs, for each transition written."""
        for job_id, before, to, message in self.written:
            log.info("job %d: %s -> %s%s", job_id, before, to, f" ({message})" if message else "")


def update_jobs(jobs: Sequence[Job], names: Collection[str]) -> None:
    """Write the fields ``names`` of ``jobs`` (locked) as they are in memory, in one
    statement however many (an UPDATE from arrays: ``bulk_update``'s CASE per field and row
    costs several times as much to build and to run)."""
    fields = [field for field in Job._meta.concrete_fields if field.name in names]
    quote = connection.ops.quote_name
    columns = [quote(field.column) for field in fields]
    arrays = [f"%s::{field.db_type(connection)}[]" for field in fields]
    statement = (
        f"UPDATE {quote(Job._meta.db_table)} AS job "
        f"SET {', '.join(f'{column} = new.{column}' for column in columns)} "
        f"FROM unnest(%s::bigint[], {', '.join(arrays)}) AS new (id, {', '.join(columns)}) "
        "WHERE job.id = new.id"
    )
    values = [
        [field.get_db_prep_save(getattr(job, field.attname), connection) for job in jobs]
        for field in fields
    ]
    with connection.cursor() as cursor:
        cursor.execute(statement, [[job.pk for job in jobs], *values])
