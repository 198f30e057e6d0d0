"""One placement pass over every pool: admission (array caps, reservations, quotas), the
pool's order, placement with EASY backfill or in strict order, preemption, and a reason for
every job left waiting. The rules: docs/development/design-notes.md, "The placement engine"."""

from __future__ import annotations

import math
from bisect import bisect_left
from collections.abc import Callable
from dataclasses import dataclass, replace
from functools import partial

from scheduling.placement.backfill import Shadow, ends_before, shadow
from scheduling.placement.decisions import (
    MigCreate,
    PassResult,
    Pending,
    Placement,
    Preemption,
    Reason,
)
from scheduling.placement.diagnosis import Diagnosis
from scheduling.placement.engine import EVERYWHERE, PlacementPass, View
from scheduling.placement.fairshare import FairShareTable
from scheduling.placement.fleet import Shape, gpus_by_host, matches
from scheduling.placement.hosts import Hosts
from scheduling.placement.policies import Policy, policy_for
from scheduling.placement.preemption import Victims, stopping_phrase
from scheduling.placement.quotas import ArrayCaps, QuotaBook
from scheduling.placement.reservations import ReservationBook, max_end, moment
from scheduling.placement.sharing import SharingPass, is_sharing
from scheduling.placement.snapshot import GpuSlot, JobRequest, PoolConfig, Snapshot
from scheduling.placement.text import listing

# A set of GPUs placed alone: (pool, active reservation window id or None).
PartitionKey = tuple[str | None, int | None]


@dataclass(frozen=True, slots=True)
class _Hold:
    """A job kept waiting by admission or preemption, with its sentence."""

    reason: Reason
    message: str
    estimated_start: float | None = None


class _Partition:
    """The GPUs of one pool less those of active reservation windows, or those of one active
    window in a pool: one PlacementPass, one head job, and the views its jobs see."""

    def __init__(
        self,
        snapshot: Snapshot,
        scope: str,
        config: PoolConfig,
        book: ReservationBook,
        shares: Callable[[], FairShareTable],
        hosts: Hosts,
        held: dict[int, list[GpuSlot]] | None = None,
        by_host: dict[str, list[GpuSlot]] | None = None,
    ) -> None:
        """`shares`: the pool's fair-share table, when preemption needs it; `hosts`: the
        pass's host CPUs and memory; `held`: GPUs of the pool that active windows hold, by
        window id; `by_host`: `gpus_by_host(snapshot)`, when the planner has it already."""
        self.snapshot = snapshot
        self.shares = shares
        self.held = held or {}
        self.book = book
        self.now = snapshot.now
        self.config = config
        self.placement_pass = PlacementPass(snapshot, scope, hosts, by_host)
        node_of = self.placement_pass.fleet.node_of
        # Upcoming windows over these GPUs; closed[k]: the GPUs of the first k.
        self.upcoming = [w for w in book.upcoming if any(g in node_of for g in w.gpu_ids)]
        self._starts = [window.start for window in self.upcoming]
        self._closed: list[View] = [EVERYWHERE]
        for window in self.upcoming:
            closed = self._closed[-1] | {g for g in window.gpu_ids if g in node_of}
            self._closed.append(frozenset(closed))
        self.head: Shadow | None = None
        self._kept_message: tuple[Shadow, str] | None = None
        # `_held_phrase` by the GPUs a job can use (model, memory): the same for every such job.
        self._held_phrases: dict[tuple[str | None, int], str] = {}
        self._views: dict[tuple[int, bool], View] = {}
        self._never: set[tuple[Shape, int]] = set()
        self._victims: Victims | None = None
        # Why no job was preempted for a waiting job, by its id (`Victims.refusal`).
        self.refused: dict[int, tuple[Reason, str]] = {}

    def closing(self, job: JobRequest) -> int:
        """How many upcoming windows `job` would still run into (by its maximum runtime)."""
        if not self._starts:
            return 0
        return bisect_left(self._starts, max_end(job, self.now))

    def view(self, job: JobRequest) -> View:
        """What `job` may not use: windows it would run into and, under backfill, the head's
        GPUs unless it ends before the head's start (by its expected runtime)."""
        if self.head is None and not self._starts:
            return EVERYWHERE
        closing = self.closing(job)
        keep_off = self.head is not None and not self._ends_before_head(job)
        key = (closing, keep_off)
        if key not in self._views:
            closed = self._closed[closing]
            if keep_off:
                assert self.head is not None
                closed = closed | self.head.gpu_ids
            self._views[key] = closed
        return self._views[key]

    def _ends_before_head(self, job: JobRequest) -> bool:
        assert self.head is not None
        return ends_before(job, self.head, self.now, self.config)

    def become_head(self, job: JobRequest) -> None:
        """Make `job`, which does not fit now, the first waiting job if the working hardware
        can ever hold it (its start is then guaranteed; see backfill)."""
        closing = self.closing(job)
        key = (Shape.of(job), closing)
        if key in self._never:
            return
        fleet = self.placement_pass.look(EVERYWHERE)
        self.head = shadow(fleet, job, self.now, self._closed[closing])
        if self.head is None:
            self._never.add(key)

    def victims(self, policy: Policy) -> Victims:
        """Who preemption may stop here; `policy`: the pool's order (one per pool)."""
        if self._victims is None:
            self._victims = Victims(
                self.placement_pass,
                self.snapshot.running,
                self.shares,
                policy,
                self.config.preempt_exempt_s,
                self.config.preemption,
                self.config.las_min_run_s,
            )
        return self._victims

    def explain(self, job: JobRequest, position: int) -> Pending:
        """Why `job` waits: kept back for the head or by a reservation when it would fit the
        free GPUs; else what the fleet lacks."""
        head = self.head
        if head is not None and head.job_id != job.id and self.placement_pass.fits(job):
            closing = self.closing(job)
            if closing and not self.placement_pass.fits(job, self._closed[closing]):
                return self._reserved(job, position, closing)
            start = None if head.start == math.inf else head.start
            return Pending(job.id, position, Reason.PRIORITY, self._kept_for(head), start, None)
        closing = self.closing(job)
        if closing and self.placement_pass.fits(job):
            return self._reserved(job, position, closing)
        pending = self.placement_pass.explain(job, position)
        if self.held and pending.reason == Reason.RESOURCES_BUSY:
            phrase = self._held_phrase(job)
            if phrase:
                pending = replace(pending, message=f"{pending.message}; {phrase}")
        if job.id in self.refused:
            code, words = self.refused[job.id]
            message = f"{pending.message}; no job is preempted for it: {words}"
            pending = replace(pending, reason=code, message=message)
        return pending

    def _kept_for(self, head: Shadow) -> str:
        """Why a job that fits waits for `head` (the same words for every such job)."""
        if self._kept_message is None or self._kept_message[0] is not head:
            if not self.config.backfill:
                message = f"waits behind job {head.job_id}: this pool starts jobs in queue order"
            elif head.start == math.inf:
                message = f"the GPUs it fits on are kept for job {head.job_id}, first in line"
            elif head.start <= self.now:
                # Not the time: it would change with the clock, and so every waiting job's.
                message = (
                    f"the GPUs it fits on are kept for job {head.job_id}, first in line, due to "
                    "start as soon as its GPUs are let go (the jobs holding them are past their "
                    "expected end)"
                )
            else:
                message = (
                    f"the GPUs it fits on are kept for job {head.job_id}, first in line, due to "
                    f"start by {moment(head.start)}; only jobs that end by then may use them"
                )
            self._kept_message = (head, message)
        return self._kept_message[1]

    def _held_phrase(self, job: JobRequest) -> str:
        """ "reservation 5 holds 8 more GPUs until 2025-06-01 14:00 UTC": the GPUs of the
        pool that active windows hold and `job` could run on (of its model and memory); ""
        when none."""
        key = (job.gpu_model, job.min_memory_mib)
        if key not in self._held_phrases:
            self._held_phrases[key] = self._held_text(*key)
        return self._held_phrases[key]

    def _held_text(self, model: str | None, min_memory_mib: int) -> str:
        fitting = {
            window: count
            for window, gpus in self.held.items()
            if (count := sum(matches(gpu, model, min_memory_mib) for gpu in gpus))
        }
        if not fitting:
            return ""
        windows = sorted((self.book.by_id[i] for i in fitting), key=lambda w: (w.end, w.id))
        gpus = sum(fitting.values())
        until = moment(windows[0].end)
        if len(windows) == 1:
            return f"reservation {windows[0].id} holds {gpus} more GPUs until {until}"
        names = listing([str(window.id) for window in windows])
        return f"reservations {names} hold {gpus} more GPUs, the first until {until}"

    def _reserved(self, job: JobRequest, position: int, closing: int) -> Pending:
        windows = self.upcoming[:closing]
        names = listing([str(w.id) for w in windows])
        who = f"reservation {names} holds" if len(windows) == 1 else f"reservations {names} hold"
        if job.max_runtime_s is None:
            why = "without a maximum runtime it might still run then"
        else:
            why = "by its maximum runtime it would still run then"
        message = f"{who} the GPUs it fits on from {moment(windows[0].start)}, and {why}"
        return Pending(job.id, position, Reason.RESERVATION, message, None, None)


class _Planner:
    def __init__(self, snapshot: Snapshot, policy: Policy | None) -> None:
        # Refuses a malformed snapshot, with or without a queue; a partition of every GPU
        # places on it.
        self.by_host = gpus_by_host(snapshot)
        self.snapshot = snapshot
        self.policy = policy
        self.book = ReservationBook(snapshot.reservations, snapshot.now)
        self.quotas = QuotaBook(snapshot.quotas)
        self.arrays = ArrayCaps(snapshot.array_limits, snapshot.running)
        # One ledger of host CPUs and memory for every pool and the MIG/MPS pass.
        self.hosts = Hosts(snapshot)
        self.gpus: dict[PartitionKey, list[GpuSlot]] = {}
        for gpu in snapshot.gpus:
            window = self.book.active_window(gpu.id)
            self.gpus.setdefault((gpu.pool, None if window is None else window.id), []).append(gpu)
        self.partitions: dict[PartitionKey, _Partition] = {}
        self.shares: dict[str | None, FairShareTable] = {}
        self._sharing: SharingPass | None = None
        self._hardware: dict[str | None, Diagnosis] = {}  # what each pool could ever run
        self.placements: list[Placement] = []
        self.pending: list[Pending] = []
        self.preemptions: list[Preemption] = []
        self.mig_creates: list[MigCreate] = []

    def run(self) -> PassResult:
        by_pool: dict[str | None, list[JobRequest]] = {}
        for job in self.snapshot.queue:
            by_pool.setdefault(job.pool, []).append(job)
        for pool in sorted(by_pool, key=lambda name: (name is not None, name or "")):
            self._pool(pool, by_pool[pool])
        return PassResult(
            tuple(self.placements),
            tuple(self.pending),
            tuple(self.preemptions),
            tuple(self.mig_creates),
        )

    def _pool(self, pool: str | None, jobs: list[JobRequest]) -> None:
        config = self.snapshot.pools.get(pool) or PoolConfig()
        policy = self.policy or policy_for(config, self.snapshot, pool)
        waiting: list[tuple[JobRequest, _Partition | None, _Hold | None]] = []
        # Over-quota work borrows what the jobs within quota leave idle: it is placed after
        # all of them (else a borrower re-queued by a reclaim, being older, would take the
        # reclaimed GPUs again in the next pass and be reclaimed again, for ever).
        borrowers: list[tuple[JobRequest, str]] = []
        limited = bool(self.snapshot.quotas)
        for job in policy.order(jobs, self.snapshot.now):
            admit = job.array is not None or job.reservation is not None
            hold = self._admit(job) if admit else None
            # A job in its own reservation runs on GPUs the reservation holds, which the
            # quotas admitted when it was approved: never over quota, never borrowed.
            quota_bound = limited and job.reservation is None
            over = self.quotas.refusal(job) if hold is None and quota_bound else None
            never = None if over is None else self._never(job, config)
            if never is not None:
                # It could never run here: it says so, not that it is over quota (nor what
                # would start now: nothing over quota would).
                hold, over = _Hold(*never), None
            if over is not None:
                if config.allow_borrowing:
                    borrowers.append((job, over))
                    continue
                hold = _Hold(Reason.QUOTA, over)
            if hold is not None:
                waiting.append((job, None, hold))
                continue
            self._try(pool, config, policy, job, None, waiting)
        for job, over in borrowers:
            self._try(pool, config, policy, job, over, waiting)
        for position, (job, where, hold) in enumerate(waiting, start=1):
            if hold is not None:
                pending = Pending(
                    job.id, position, hold.reason, hold.message, hold.estimated_start, None
                )
            elif where is None:
                pending = self._sharing_pass().explain(job, position)
            else:
                pending = where.explain(job, position)
            self.pending.append(pending)

    def _try(
        self,
        pool: str | None,
        config: PoolConfig,
        policy: Policy,
        job: JobRequest,
        borrowing: str | None,
        waiting: list[tuple[JobRequest, _Partition | None, _Hold | None]],
    ) -> None:
        """Place `job` (borrowing when `borrowing` says why it is over quota), or add it to
        `waiting` with where it waits."""
        if is_sharing(job):
            if not self._share(job, borrowing):
                waiting.append((job, None, None))
            return
        partition = self._partition(pool, job.reservation, config)
        placed, hold = self._place(partition, job, borrowing, policy)
        if not placed:
            waiting.append((job, partition, hold))

    def _never(self, job: JobRequest, config: PoolConfig) -> tuple[Reason, str] | None:
        """Why no state of its pool's hardware could ever run `job` (whole GPUs; its
        reservations' GPUs count: they are the pool's for a while); None when it could."""
        if is_sharing(job):
            return None
        pool = job.pool
        if pool not in self._hardware:
            scope = self._scope(pool, None)
            if [key for key in self.gpus if key[0] == pool] == [(pool, None)]:
                # No window holds any of its GPUs: the pool's partition has them all.
                fleet = self._partition(pool, None, config).placement_pass.fleet
                self._hardware[pool] = Diagnosis(fleet, self.snapshot.now, scope)
            else:
                gpus = [gpu for gpu in self.snapshot.gpus if gpu.pool == pool]
                self._hardware[pool] = Diagnosis.of_hardware(self.snapshot.nodes, gpus, scope)
        return self._hardware[pool].never(Shape.of(job))

    def _admit(self, job: JobRequest) -> _Hold | None:
        """What keeps `job` from running whatever is free: its array's cap, its reservation."""
        capped = self.arrays.refusal(job)
        if capped is not None:
            return _Hold(Reason.ARRAY_LIMIT, capped)
        refused = self.book.refusal(job)
        if refused is not None:
            return _Hold(Reason.RESERVATION, *refused)
        return None

    def _place(
        self, partition: _Partition, job: JobRequest, borrowing: str | None, policy: Policy
    ) -> tuple[bool, _Hold | None]:
        """Place `job` in its view; else preempt for it, or make it the head. Returns whether
        it was placed, and the hold of a job waiting for its victims."""
        if partition.head is not None and not partition.config.backfill:
            return False, None  # strict order: nothing starts behind the head
        view = partition.view(job)
        placement = partition.placement_pass.place(job, view)
        if placement is not None:
            self._started(job, placement, borrowing)
            return True, None
        if borrowing is not None:
            # Over-quota work only borrows idle GPUs: it preempts nothing and holds nothing.
            return False, _Hold(Reason.QUOTA, f"{borrowing}; no idle GPUs it could borrow fit it")
        victims = partition.victims(policy)
        if victims.candidates:
            found = victims.preempt(job, view) if partition.config.preemption else None
            if found is not None:
                preemption, _ = found
                self.preemptions.append(preemption)
                self._charge(job)
                message = f"{stopping_phrase(preemption.victims)} for it: {preemption.reason}"
                return False, _Hold(Reason.PREEMPTING, message)
            refused = victims.refusal(job, view)
            if refused is not None:
                partition.refused[job.id] = refused
        if partition.head is None:
            partition.become_head(job)
        return False, None

    def _share(self, job: JobRequest, borrowing: str | None) -> bool:
        """Route a MIG or MPS job to the sharing pass; whether it was placed."""
        decision = self._sharing_pass().place(job)
        if isinstance(decision, MigCreate):
            self.mig_creates.append(decision)
        elif decision is not None:
            self._started(job, decision, borrowing)
            return True
        return False

    def _started(self, job: JobRequest, placement: Placement, borrowing: str | None) -> None:
        if borrowing is not None:
            placement = replace(
                placement,
                borrowed=True,
                explanation=f"{placement.explanation}; borrowed, preemptible: {borrowing}",
            )
        self.placements.append(placement)
        if borrowing is None and self.snapshot.quotas:
            self.quotas.charge(job)
        if job.array is not None:
            self.arrays.charge(job)

    def _charge(self, job: JobRequest) -> None:
        self.quotas.charge(job)
        self.arrays.charge(job)

    def _partition(self, pool: str | None, window: int | None, config: PoolConfig) -> _Partition:
        key = (pool, window)
        if key not in self.partitions:
            gpus = self.gpus.get(key, [])
            by_host = None
            if len(self.gpus) == 1 and gpus:
                snapshot, by_host = self.snapshot, self.by_host  # every GPU: no copy
            else:
                snapshot = replace(self.snapshot, gpus=tuple(gpus), queue=())
            scope = self._scope(pool, window)
            held = {
                other: gpus
                for (other_pool, other), gpus in self.gpus.items()
                if window is None and other_pool == pool and other is not None
            }
            self.partitions[key] = _Partition(
                snapshot,
                scope,
                config,
                self.book,
                partial(_shares, self.shares, self.snapshot, pool),
                self.hosts,
                held,
                by_host,
            )
        return self.partitions[key]

    def _scope(self, pool: str | None, window: int | None) -> str:
        if window is not None:
            return f"reservation {window}"
        if pool is not None:
            return f"pool {pool}"
        return "the fleet" if {p for p, _ in self.gpus} <= {None} else "the GPUs in no pool"

    def _sharing_pass(self) -> SharingPass:
        if self._sharing is None:
            self._sharing = SharingPass(self.snapshot, hosts=self.hosts)
        return self._sharing


def _shares(
    tables: dict[str | None, FairShareTable], snapshot: Snapshot, pool: str | None
) -> FairShareTable:
    """The pool's fair-share table, made once per pass. A plain function, not the planner's
    method: a partition pointing back at the planner would make the whole pass a reference
    cycle, left to the cyclic garbage collector (a collection walking the whole pass)
    instead of being freed when the pass returns."""
    if pool not in tables:
        tables[pool] = FairShareTable.of(snapshot, pool)
    return tables[pool]


def plan(snapshot: Snapshot, policy: Policy | None = None) -> PassResult:
    """One placement pass over `snapshot`: each pool's queue in its policy's order (`policy`
    overrides every pool's, for benches and tests)."""
    return _Planner(snapshot, policy).run()
