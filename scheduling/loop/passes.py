"""The placement loop: snapshot -> engine -> decisions committed in batches.

Woken on commit by submit/cancel/finish and other state changes (``dispatch.wake``, coalesced
through a Redis key so a burst of submissions wakes it once), and by beat as a backstop. One
pass runs at a time: the loop's lease (``gpuadmin.leases``, a row, not a session lock, so that
it holds behind PgBouncer's transaction pooling) serialises passes across workers, and each of
a pass's commits is fenced by it (a pass that lost it, its worker stalled past the lease's
time to live, commits nothing more). The engine
(``scheduling.placement``) is pure; this module makes job arrays' next tasks jobs
(``scheduling.jobs.arrays``), turns the database into its ``Snapshot`` (a
fixed number of queries, whatever the fleet's and the queue's sizes) and its decisions back
into the database: placements ``COMMIT_BATCH`` at a time (``allocation_services.allocate_many``,
which the database can refuse, one decision at a time), preemptions (``scheduling.loop.preemption``)
and MIG instances to create (``scheduling.sharing.services``), then each waiting job's word where it
changed.
"""

from __future__ import annotations

import contextlib
import gc
import logging
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from datetime import datetime
from functools import partial

from django.conf import settings
from django.db import connection, transaction
from redis.exceptions import RedisError

from gpuadmin.leases import services as leases
from inventory import live
from scheduling import placement
from scheduling.allocations import services as allocation_services
from scheduling.jobs import arrays, transitions
from scheduling.loop import preemption
from scheduling.loop.dispatch import (
    defer_wake,
    pass_done,
    pass_running,
    send_placed,
    wake,
    wake_key,
)
from scheduling.loop.snapshot import Wait, epoch_datetime, read_pass_input
from scheduling.models import (
    Job,
    JobState,
    PoolPolicy,
    SchedulerSettings,
)
from scheduling.sharing import services as sharing

log = logging.getLogger("gpuadmin.placement")


# The placement loop's lease (``gpuadmin.leases``), one per central queue.
def lease_name() -> str:
    return f"placement-pass:{settings.GPUADMIN_CENTRAL_QUEUE}"


# How long the mark set by ``stop_placing`` lasts at most (the stack that set it died).
STOPPING_TTL_S = 300
# Placements committed per transaction: a handful of statements each, however many. Larger
# batches pay fewer round trips but hold their GPU rows' locks longer (a job's end waits for
# them); 250 commit in about a tenth of a second.
COMMIT_BATCH = 250


@dataclass
class PassSummary:
    placed: int = 0
    refused: int = 0
    waiting: int = 0
    skipped: str = ""
    duration_ms: float = 0.0
    dispatched: list[int] = field(default_factory=list)
    # Milliseconds per phase: split, snapshot, plan, commit (placements and dispatch),
    # save_pending.
    phase_ms: dict[str, float] = field(default_factory=dict)
    pending_saved: int = 0  # waiting jobs whose stored reason, position, ... changed
    preempting: int = 0  # running jobs asked to stop for a waiting one
    mig_requested: int = 0  # MIG instances asked of agents for waiting jobs
    split: int = 0  # job arrays' tasks made jobs (``arrays.split_due``)


# The loop's lease while this thread holds it.
_holding = threading.local()


def _held() -> leases.Held | None:
    held: leases.Held | None = getattr(_holding, "lease", None)
    return held


@contextmanager
def _hold(held: leases.Held) -> Iterator[None]:
    _holding.lease = held
    try:
        with leases.holding(held):
            yield
    finally:
        _holding.lease = None


@contextmanager
def pass_lock() -> Iterator[None]:
    """Hold the placement loop's lease (waits for a pass on another worker to end, or for a
    dead worker's lease to expire); nests in this thread."""
    if _held() is not None:
        yield
        return
    with _hold(leases.take(lease_name(), settings.GPUADMIN_LEASE_TTL_S)):
        yield


def fenced() -> contextlib.AbstractContextManager[None]:
    """A transaction for what a pass decided: it commits only while the pass still holds the
    loop's lease (``leases.fenced``). Outside a pass (a test, a bench), what the callee does
    on its own."""
    held = _held()
    return contextlib.nullcontext() if held is None else leases.fenced(held)


def stopping_key() -> str:
    """Set while the stack stops (``stop_placing``), one per central queue."""
    return f"gpuadmin:placement:stopping:{settings.GPUADMIN_CENTRAL_QUEUE}"


def stop_placing() -> None:
    """No pass places anything from now on (``gpuadmin up`` stops, before its agents): a
    mark that every pass reads under the loop's lease, then the lease taken once, so that a
    pass already running has committed what it placed when this returns (its jobs reach the
    agents, still running, or are re-queued by ``reports.requeue_unconfirmed``)."""
    live.client().set(stopping_key(), "1", ex=STOPPING_TTL_S)
    with pass_lock():
        pass


def resume_placing() -> None:
    """Passes place again (``gpuadmin up`` starts, or has stopped its worker)."""
    live.client().delete(stopping_key())


def placing_stopped() -> bool:
    """Whether ``stop_placing`` holds passes back (not when Redis cannot say: the stack that
    set it needs Redis as much)."""
    try:
        return bool(live.client().exists(stopping_key()))
    except RedisError:
        return False


def run_pass() -> PassSummary:
    """One placement pass: its placements committed in batches (a refused one never costs
    the others), its preemptions and MIG instances asked for, and each waiting job's word
    stored where it changed."""
    started = time.perf_counter()
    with pass_lock(), _no_cyclic_gc():
        with suppress(RedisError):
            live.client().delete(wake_key())  # wakes from now on ask for a new pass
        summary = PassSummary()
        config = SchedulerSettings.load()
        if placing_stopped():
            summary.skipped = "the stack is stopping"
        elif not config.enabled:
            summary.skipped = "the scheduler is stopped"
            # Its arrays' tasks are made jobs as ever, queued while it is stopped.
            summary.split = arrays.split_due(fence=fenced)
            with fenced():
                summary.pending_saved = explain_stopped()
        else:
            try:
                _place_and_explain(summary)
            except leases.LeaseLost as exc:  # the pass that took it over places instead
                log.warning("placement pass stopped: %s", exc)
                summary.skipped = "another worker took the loop's lease over"
    summary.duration_ms = (time.perf_counter() - started) * 1000
    if summary.refused or (summary.placed and arrays.unsplit_arrays().exists()):
        wake()  # refused decisions are retried, an array's next tasks made, by the next pass
    changed = (
        summary.placed
        or summary.refused
        or summary.pending_saved
        or summary.preempting
        or summary.mig_requested
        or summary.split
    )
    log.log(
        logging.INFO if changed else logging.DEBUG,  # beat's idle backstop passes are quiet
        "placement pass: %d array tasks made jobs, %d placed, %d refused, %d waiting, "
        "%d preempting, %d MIG instances asked for in %.0f ms%s",
        summary.split,
        summary.placed,
        summary.refused,
        summary.waiting,
        summary.preempting,
        summary.mig_requested,
        summary.duration_ms,
        f" ({summary.skipped})" if summary.skipped else "",
    )
    return summary


def _place_and_explain(summary: PassSummary) -> None:
    """The pass proper: snapshot, engine, commits, each waiting job's word. What it reads and
    decides is gone when it returns, before the cyclic garbage collector runs again: it
    would otherwise walk all of it once more."""
    clock = _PhaseClock(summary.phase_ms)
    summary.split = arrays.split_due(fence=fenced)  # as Slurm splits a pending array
    clock.lap("split")
    read = read_pass_input()
    clock.lap("snapshot")
    result = placement.plan(read.snapshot)
    clock.lap("plan")
    summary.dispatched, summary.refused = commit_placements(
        result.placements, read.slots, epoch_datetime(read.snapshot.now)
    )
    summary.placed = len(summary.dispatched)
    summary.preempting = start_preemptions(result.preemptions, read.snapshot)
    for creation in result.mig_creates:
        with fenced():
            sharing.request_mig_instance(creation)
    summary.mig_requested = len(result.mig_creates)
    clock.lap("commit")
    pending = (*result.pending, *read.dependent)
    summary.pending_saved = save_pending(pending, read.waiting, read.snapshot.now)
    clock.lap("save_pending")
    summary.waiting = len(result.pending)


def run_woken_pass() -> PassSummary | None:
    """The pass that a wake (``dispatch.wake``) or beat asks for, unless another pass runs:
    a worker process never waits on another's pass, and stays free for the agents' reports.
    A wake while this pass runs sends no task but is left to it (``pass_running``), as is one
    whose task finds it running; either asks again once this pass is done (``pass_done``),
    so a job's end during a pass still gets a pass after it. (A worker that dies in its pass
    leaves such a wake to beat's backstop pass.)"""
    defer_wake()
    held = leases.try_take(lease_name(), settings.GPUADMIN_LEASE_TTL_S)
    if held is None:
        return None
    pass_running()
    with _hold(held):
        summary = run_pass()  # holds the lease already (``pass_lock`` nests)
    pass_done()
    return summary


@contextmanager
def _no_cyclic_gc() -> Iterator[None]:
    """Hold the cyclic garbage collector off: a pass makes tens of thousands of objects
    (rows, slots, requests, decisions) that all live until its end, and each collection
    would walk them all again for nothing (a large part of a pass at 10,000 GPUs). Reference
    counting still frees what dies; a collection may run afterwards."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


class _PhaseClock:
    """Writes the milliseconds since the previous lap into ``phases`` under each lap's name."""

    def __init__(self, phases: dict[str, float]) -> None:
        self.phases = phases
        self.last = time.perf_counter()

    def lap(self, name: str) -> None:
        now = time.perf_counter()
        self.phases[name] = (now - self.last) * 1000
        self.last = now


# --------------------------------------------------------------------------- decisions


def commit_placements(
    decisions: Sequence[placement.Placement],
    slots: Mapping[int, placement.GpuSlot],
    decided_at: datetime | None = None,
) -> tuple[list[int], int]:
    """Commit the decisions ``COMMIT_BATCH`` at a time (``allocation_services.allocate_many``: one
    transaction each, a refused decision never costs the others; the jobs scheduled at
    ``decided_at``, the time the pass saw) and send each batch's jobs
    to their nodes' agents once it commits. The ids of the jobs placed, and how many
    decisions the database (or a newer state) refused."""
    placed: list[int] = []
    refused = 0
    for start in range(0, len(decisions), COMMIT_BATCH):
        grants = [_grant(decision, slots) for decision in decisions[start : start + COMMIT_BATCH]]
        outcome = allocation_services.allocate_many(
            grants, actor_name=transitions.LOOP_ACTOR, decided_at=decided_at, fence=fenced
        )
        for job_id, why in outcome.refused.items():
            log.info("placement of job %d refused: %s", job_id, why)
        # Committed, so this runs now (or when a transaction the caller holds commits); the
        # jobs carry their owner's account and new attempt, the rows their GPU and node.
        transaction.on_commit(partial(send_placed, outcome.granted))
        placed += [job.pk for job, _ in outcome.granted]
        refused += len(outcome.refused)
    return placed, refused


def _grant(
    decision: placement.Placement, slots: Mapping[int, placement.GpuSlot]
) -> allocation_services.Grant:
    """A decision as what ``allocate_many`` commits, with why these GPUs (``Job.placement``)."""
    why = {
        "topology_class": str(decision.topology_class),
        "numa_nodes": list(decision.numa_nodes),
        "score": list(decision.score),
        "explanation": decision.explanation,
        "nodes": {hostname: [slots[pk].index for pk in ids] for hostname, ids in decision.by_node},
    }
    return allocation_services.Grant(
        job_id=decision.job_id,
        gpu_ids=decision.gpu_ids,
        placement=why,
        mig_instance=decision.mig_slot,
        mps_percent=decision.mps_percent,
        mps_memory_mib=decision.mps_memory_mib,
        borrowed=decision.borrowed,
    )


def start_preemptions(
    decisions: Sequence[placement.Preemption], snapshot: placement.Snapshot
) -> int:
    """Start each preemption with its pool's signal and grace (``preemption.preempt``); the
    number of victims marked now."""
    if not decisions:
        return 0
    pools = {job.id: job.pool for job in snapshot.queue}
    signals = _preempt_signals()
    marked = 0
    for decision in decisions:
        signal, grace_s = signals.get(pools.get(decision.job_id), _DEFAULT_SIGNAL)
        with fenced():
            victims = preemption.preempt(
                decision, signal=signal, grace_s=grace_s, actor_name=transitions.LOOP_ACTOR
            )
        marked += len(victims)
    return marked


_DEFAULT_SIGNAL = (PoolPolicy().preempt_signal, PoolPolicy().preempt_grace_s)


def _preempt_signals() -> dict[str | None, tuple[str, int]]:
    """Each pool's preemption signal and grace, by pool name (a pool without a policy row
    has the defaults); one query."""
    rows = PoolPolicy.objects.values_list("pool__name", "preempt_signal", "preempt_grace_s")
    return {pool: (signal, grace_s) for pool, signal, grace_s in rows}


def save_pending(
    pending: Sequence[placement.Pending], stored: Mapping[int, Wait], now: float
) -> int:
    """Store each waiting job's reason, position, estimated start and what-if where they
    differ from the ``stored`` word (the values the pass read), in one statement that also
    skips rows equal in the database, or none at all: a pass re-explains thousands of jobs
    and most keep their word. Not state changes, so not audited. The number of rows written.

    An estimated start the engine puts at ``now`` (enough GPUs would be free already: their
    jobs are past their expected end) keeps the moment stored when it was first reached, so
    that an unchanged queue is not rewritten because the clock moved."""
    rows = []
    for p in pending:
        before = stored.get(p.job_id)
        start = _estimated_start(p.estimated_start, before[3] if before else None, now)
        row = (str(p.reason), p.message, p.position, start, p.what_if or "")
        if row != before:
            rows.append((p.job_id, *row))
    if not rows:
        return 0
    columns = [list(column) for column in zip(*rows, strict=True)]
    columns[4] = [epoch_datetime(start) for start in columns[4]]
    with fenced(), connection.cursor() as cursor:
        cursor.execute(SAVE_PENDING_SQL, [*columns, JobState.QUEUED])
        return cursor.rowcount


# What every queued job says while the scheduler is stopped (``explain_stopped``).
STOPPED_REASON = "the scheduler is stopped: nothing is placed until an admin starts it again"


def explain_stopped() -> int:
    """Every queued job's word while the scheduler is stopped (``SchedulerSettings.enabled``
    off): that reason, no position, estimate or what-if; one statement, which leaves the rows
    that say so already. The number of rows written. The first pass after it starts again
    gives each its own word."""
    code = placement.Reason.SCHEDULER_STOPPED
    return (
        Job.objects.filter(state=JobState.QUEUED)
        .exclude(pending_code=code, pending_reason=STOPPED_REASON)
        .update(
            pending_code=code,
            pending_reason=STOPPED_REASON,
            queue_position=None,
            estimated_start_at=None,
            what_if="",
        )
    )


def _estimated_start(estimate: float | None, stored: float | None, now: float) -> float | None:
    """The estimate to store (epoch seconds): to the second, or ``stored`` when both are
    reached already."""
    if estimate is None:
        return None
    if estimate <= now and stored is not None and stored <= now:
        return stored
    return float(round(estimate))


SAVE_PENDING_SQL = """
    UPDATE scheduling_job AS job
    SET pending_code = new.code, pending_reason = new.reason, queue_position = new.position,
        estimated_start_at = new.start, what_if = new.what_if
    FROM unnest(%s::bigint[], %s::text[], %s::text[], %s::integer[], %s::timestamptz[],
                %s::text[]) AS new (id, code, reason, position, start, what_if)
    WHERE job.id = new.id AND job.state = %s
      AND (job.pending_code, job.pending_reason, job.queue_position, job.estimated_start_at,
           job.what_if) IS DISTINCT FROM (new.code, new.reason, new.position, new.start,
                                          new.what_if)
"""
