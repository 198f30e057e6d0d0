"""Preemption: the fewest running jobs to stop so that a waiting job can start now.

Who may be stopped for whom, the cost order and the bounded search:
docs/development/design-notes.md, "Preemption search".
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace
from functools import partial
from itertools import combinations

from scheduling.placement.decisions import Placement, Preemption, Reason
from scheduling.placement.engine import PlacementPass, View
from scheduling.placement.fairshare import FairShareTable
from scheduling.placement.fleet import Fleet, FleetNode, Shape, is_available, matches
from scheduling.placement.hosts import HostAsk, fits_free
from scheduling.placement.policies import PRIORITY_RANK, Fcfs, Las, Policy, Qssf
from scheduling.placement.reservations import moment
from scheduling.placement.snapshot import GpuSlot, JobRequest, PoolConfig, RunningJob
from scheduling.placement.text import listing, plural
from scheduling.placement.topology import choose

NODE_VICTIMS = 8
NODES = 64
# Fair share: the waiting job's factor must exceed the victim's by this much (factors are in
# [0, 1]; 0.5 is a holder that used exactly its share).
FAIRSHARE_MARGIN = 0.1

Cost = tuple[bool, int, int, float, int]
# Why no job was preempted for a waiting one, most hopeful first: what it waits for.
REFUSALS = (Reason.PREEMPT_EXEMPT, Reason.PREEMPT_ORDER, Reason.NOT_PREEMPTIBLE)
# How many (shape, owner, priority) a pass works out `Victims.refusal` for per partition, in
# the pool's order: each looks at up to `NODES` nodes, and a queue has thousands.
EXPLAINED = 64


def cost(job: RunningJob) -> Cost:
    rank = PRIORITY_RANK[job.priority]
    return (not job.borrowed, rank, len(job.gpu_ids), -job.started_at, job.id)


def as_waiting(victim: RunningJob, now: float) -> JobRequest:
    """`victim` as it would wait if stopped at `now` (queued from `now`): its attained
    service with this attempt's, its runtime (estimate, else limit; history's prediction) as
    a whole, so that the pool's policy can rank it among the waiting jobs."""
    expected = None if victim.expected_end is None else victim.expected_end - victim.started_at
    predicted = None if victim.predicted_end is None else victim.predicted_end - victim.started_at
    return JobRequest(
        id=victim.id,
        owner=victim.owner,
        priority=victim.priority,
        submitted_at=victim.submitted_at,
        gpus_per_node=max(1, len(victim.gpu_ids)),
        estimated_duration_s=expected,
        preemptible=victim.preemptible,
        pool=victim.pool,
        project=victim.project,
        array=victim.array,
        attained_service_s=victim.service_s(now),
        queued_at=now,
        predicted_runtime_s=predicted,
    )


class Victims:
    """The running jobs of one set of GPUs that preemption may stop, cheapest first; those
    chosen in this pass are gone for the rest of it."""

    def __init__(
        self,
        placement_pass: PlacementPass,
        running: Iterable[RunningJob],
        shares: Callable[[], FairShareTable],
        policy: Policy | None = None,
        exempt_s: float = 0.0,
        enabled: bool = True,
        las_min_run_s: float = PoolConfig().las_min_run_s,
    ) -> None:
        """`shares` gives the pool's fair-share table (built when first needed); `policy`
        the pool's order (FCFS when None), which a victim must rank below the waiting job in;
        `exempt_s` how long a job runs before it may be stopped for anything but a
        reclaim; `enabled` whether the pool preempts at all (else only `refusal` is asked);
        `las_min_run_s` how long a job runs before it may be stopped for less attained
        service (the pool's `PoolConfig.las_min_run_s`)."""
        self.placement_pass = placement_pass
        self.now = placement_pass.now
        node_of = placement_pass.fleet.node_of
        # Every running job of these GPUs that is not already stopping, cheapest first.
        self.holders = sorted(
            (
                job
                for job in running
                if not job.stopping
                and job.gpu_ids
                and all(gpu_id in node_of for gpu_id in job.gpu_ids)
            ),
            key=cost,
        )
        self.candidates = [job for job in self.holders if job.preemptible or job.borrowed]
        self.shares = shares
        self.policy: Policy = policy if policy is not None else Fcfs()
        self.exempt_s = exempt_s
        self.enabled = enabled
        self.las_min_run_s = las_min_run_s
        self._waiting: dict[int, JobRequest] = {}
        self._gone: set[int] = set()
        self._failed: set[tuple[Shape, View, str, str, str]] = set()
        self._refusals: dict[tuple[Shape, View, str, str, str], tuple[Reason, str] | None] = {}
        self._holders_by_node: dict[View, dict[FleetNode, list[RunningJob]]] = {}

    def why(self, victim: RunningJob, job: JobRequest) -> str | None:
        """Why `job` may stop `victim`, or None when it may not."""
        if PRIORITY_RANK[victim.priority] > PRIORITY_RANK[job.priority]:
            return None
        if victim.borrowed:
            return "reclaims GPUs lent over quota"
        if self.now - victim.started_at < self.exempt_s:
            return None
        reason = self._reason(victim, job)
        if reason is None or not self.ranks_below(victim, job):
            return None
        return reason

    def blocker(self, victim: RunningJob, job: JobRequest) -> Reason | None:
        """What keeps `job` from stopping `victim` (one of `REFUSALS`), or None when it may.
        The exemption is named only where the rest would allow it."""
        if not (victim.preemptible or victim.borrowed):
            return Reason.NOT_PREEMPTIBLE
        if PRIORITY_RANK[victim.priority] > PRIORITY_RANK[job.priority]:
            return Reason.NOT_PREEMPTIBLE
        if not self.enabled:
            return Reason.PREEMPT_ORDER
        if victim.borrowed:
            return None
        if self._reason(victim, job) is None or not self.ranks_below(victim, job):
            return Reason.PREEMPT_ORDER
        if self.now - victim.started_at < self.exempt_s:
            return Reason.PREEMPT_EXEMPT
        return None

    def words(self, code: Reason, victim: RunningJob, job: JobRequest) -> str:
        """`blocker`'s `code` for `victim` as a sentence."""
        if code == Reason.PREEMPT_EXEMPT:
            until = moment(victim.started_at + self.exempt_s)
            return (
                f"{victim.priority}-priority job {victim.id} is exempt from preemption until "
                f"{until} (preempt_exempt_s {self.exempt_s:g})"
            )
        if code == Reason.PREEMPT_ORDER:
            if not self.enabled:
                return "its pool's policy does not preempt"
            return (
                f"the pool's order does not rank it ahead of job {victim.id} "
                f"({victim.priority} priority)"
            )
        if victim.preemptible or victim.borrowed:
            return (
                f"job {victim.id} is of a higher priority ({victim.priority} over {job.priority})"
            )
        return f"{victim.priority}-priority job {victim.id} is not preemptible"

    def refusal(self, job: JobRequest, view: View) -> tuple[Reason, str] | None:
        """Why no job is stopped for `job` in `view` (after `preempt` found none, or where the
        pool does not preempt): the first of `REFUSALS` that, were the running jobs it names
        stopped too, would let `job` start, with the words for those jobs (the cheapest named,
        exempt ones by the end of their exemption); None when stopping the running jobs here
        would not (it waits for something else). Remembered for the later jobs of the same
        shape, owner and priority, like a failed search; worked out for the first `EXPLAINED`
        of them in a pass (the rest: None)."""
        shape = Shape.of(job)
        key = (shape, view, job.priority, job.owner, job.project)
        if key not in self._refusals:
            if len(self._refusals) >= EXPLAINED:
                return None
            self._refusals[key] = self._refusal(shape, job, view)
        return self._refusals[key]

    def _refusal(self, shape: Shape, job: JobRequest, view: View) -> tuple[Reason, str] | None:
        count, wanted, _, _, requirement, *_ = shape
        fleet, nodes = self._nodes(shape, view)
        # Where the pool does not preempt, that is the one reason to give.
        codes = REFUSALS if self.enabled else (Reason.PREEMPT_ORDER,)
        found: dict[int, Reason | None] = {}

        def level(holder: RunningJob) -> int:
            """0: it may be stopped; else 1 + its blocker's place in `codes` (len + 1: never)."""
            if holder.id not in found:
                found[holder.id] = self.blocker(holder, job)
            code = found[holder.id]
            return 0 if code is None else codes.index(code) + 1 if code in codes else len(codes) + 1

        # A gang: the nodes that hold their part now need no victim.
        ready = self._ready(shape, fleet) if wanted > 1 else set()
        by_level: list[tuple[int, _Node]] = []
        for node in nodes:
            if node.index in ready:
                continue
            for at in range(len(codes) + 1):
                subset = [holder for holder in node.victims if level(holder) <= at]
                if _holds(node.base, subset, node.freed, count, requirement, node.host_holds):
                    by_level.append((at, node))
                    break
        by_level.sort(key=lambda pair: pair[0])
        needed = wanted - len(ready)
        if needed < 1 or len(by_level) < needed:
            return None
        chosen = by_level[:needed]
        at = chosen[-1][0]
        if at == 0:
            return None  # stopping who may be stopped would do: it waits for something else
        code = codes[at - 1]
        named = sorted(
            {
                h.id: h for _, node in chosen for h in node.victims if found.get(h.id) == code
            }.values(),
            key=lambda h: (h.started_at, h.id) if code == Reason.PREEMPT_EXEMPT else cost(h),
        )
        words = self.words(code, named[0], job)
        if len(named) > 1:
            more = len(named) - 1
            words += f", and {plural(more, 'more job')} likewise"
        return code, words

    def _reason(self, victim: RunningJob, job: JobRequest) -> str | None:
        if PRIORITY_RANK[victim.priority] < PRIORITY_RANK[job.priority]:
            return f"higher priority ({job.priority} over {victim.priority})"
        if (
            isinstance(self.policy, (Las, Qssf))
            and self.now - victim.started_at >= self.las_min_run_s
        ):
            mine = self.policy.queue(job, self.now)
            theirs = self.policy.queue(self._as_waiting(victim), self.now)
            if mine < theirs:
                return f"less attained service (queue {mine} before queue {theirs})"
        shares = self.shares()
        mine_f = shares.factor(job.owner, job.project)
        theirs_f = shares.factor(victim.owner, victim.project)
        if mine_f >= theirs_f + FAIRSHARE_MARGIN:
            return f"under its fair share (factor {mine_f:.2f} over {theirs_f:.2f})"
        return None

    def ranks_below(self, victim: RunningJob, job: JobRequest) -> bool:
        """Whether `victim`, stopped now and waiting again, would come after `job` in the
        pool's order."""
        again = self._as_waiting(victim)
        return self.policy.order((again, job), self.now)[0] is job

    def _as_waiting(self, victim: RunningJob) -> JobRequest:
        if victim.id not in self._waiting:
            self._waiting[victim.id] = as_waiting(victim, self.now)
        return self._waiting[victim.id]

    def preempt(self, job: JobRequest, view: View) -> tuple[Preemption, Placement] | None:
        """Stop the fewest candidates for `job` in `view`: the preemption, and the placement
        it makes (already taken on the pass's fleet), or None. Jobs ask in the pool's order
        (a failure is remembered for the later jobs of the same shape, owner and priority)."""
        shape = Shape.of(job)
        key = (shape, view, job.priority, job.owner, job.project)
        if key in self._failed:
            return None
        allowed = {
            victim.id: (victim, why)
            for victim in self.candidates
            if victim.id not in self._gone
            and not view.intersection(victim.gpu_ids)
            and (why := self.why(victim, job)) is not None
        }
        found = self._search(shape, view, [victim for victim, _ in allowed.values()])
        if found is None:
            self._failed.add(key)
            return None
        freed = [self._gpu(gpu_id) for victim in found for gpu_id in victim.gpu_ids]
        node_of = self.placement_pass.fleet.node_of
        on: dict[str, list[RunningJob]] = {}
        for victim in found:
            for hostname in {node_of[gpu_id].hostname for gpu_id in victim.gpu_ids}:
                on.setdefault(hostname, []).append(victim)
        hosts = self.placement_pass.hosts.by_name
        free_before = {hostname: hosts[hostname].free for hostname in on}
        freed_hosts = {hostname: _held(victims) for hostname, victims in on.items()}
        placement = self.placement_pass.place_freeing(job, view, freed, freed_hosts)
        if placement is None:
            self._failed.add(key)
            return None
        used = set(placement.gpu_ids)
        victims = [victim for victim in found if used.intersection(victim.gpu_ids)]
        ask = shape.host
        for hostname in placement.nodes:
            # The job's host resources come from what was free, then from its victims there.
            for victim in sorted(on.get(hostname, ()), key=cost):
                mine = [v for v in victims if v in on[hostname]]
                if _covered(free_before[hostname], mine, ask):
                    break
                if victim not in victims:
                    victims.append(victim)
        self._gone.update(victim.id for victim in found)
        reason = "; ".join(sorted({allowed[victim.id][1] for victim in victims}))
        ids = tuple(sorted(victim.id for victim in victims))
        return Preemption(job.id, ids, placement.gpu_ids, reason), placement

    def _gpu(self, gpu_id: int) -> GpuSlot:
        node = self.placement_pass.fleet.node_of[gpu_id]
        return next(gpu for gpu in node.gpus if gpu.id == gpu_id)

    def _search(
        self, shape: Shape, view: View, allowed: list[RunningJob]
    ) -> list[RunningJob] | None:
        count, wanted, _, _, requirement, *_ = shape
        if not allowed:
            return None
        fleet, nodes = self._nodes(shape, view, allowed)
        options: list[tuple[int, list[Cost], int, tuple[RunningJob, ...]]] = []
        for node in nodes:
            most = options[0][0] if options and wanted == 1 else len(node.victims)
            fewest = _fewest(
                node.base, node.victims, node.freed, count, requirement, most, node.host_holds
            )
            if fewest is not None:
                options.append((len(fewest), [cost(v) for v in fewest], node.index, fewest))
                options.sort(key=lambda option: option[:3])
        if wanted == 1:
            return list(options[0][3]) if options else None
        # A gang: the nodes that hold their part now need no victim.
        ready = self._ready(shape, fleet)
        chosen: list[RunningJob] = []
        for _, _, index, fewest in options:
            if len(ready) >= wanted:
                break
            if index not in ready:
                ready.add(index)
                chosen += [victim for victim in fewest if victim not in chosen]
        return chosen if len(ready) >= wanted and chosen else None

    def _nodes(
        self,
        shape: Shape,
        view: View,
        allowed: list[RunningJob] | None = None,
    ) -> tuple[Fleet, list[_Node]]:
        """The pass's fleet in `view`, and the nodes where `allowed` (None: every running job
        not yet chosen) hold GPUs, those missing the fewest GPUs first (at most `NODES`)."""
        count, _, min_memory, model, *_ = shape
        fleet = self.placement_pass.look(view)
        if allowed is None:
            if view not in self._holders_by_node:
                self._holders_by_node[view] = _by_node(
                    fleet, [h for h in self.holders if not (view and view.intersection(h.gpu_ids))]
                )
            on_node = self._holders_by_node[view]
        else:
            on_node = _by_node(fleet, allowed)
        bases = {node: _free(node, model, min_memory) for node in on_node}
        nearest = sorted(on_node, key=lambda node: (count - len(bases[node]), node.index))
        found = []
        for node in nearest:
            victims = [victim for victim in on_node[node] if victim.id not in self._gone]
            if not victims:
                continue
            usable = [
                gpu
                for gpu in node.gpus
                if is_available(node.info, gpu) and matches(gpu, model, min_memory)
            ]
            freed = {
                victim.id: [
                    replace(gpu, memory_free_mib=gpu.memory_total_mib)
                    for gpu in usable
                    if gpu.id in victim.gpu_ids
                ]
                for victim in victims
            }
            holds = partial(_covered, node.host.free, ask=shape.host)
            found.append(_Node(node.info.hostname, node.index, bases[node], victims, freed, holds))
            if len(found) == NODES:
                break
        return fleet, found

    def _ready(self, shape: Shape, fleet: Fleet) -> set[int]:
        """The nodes (indexes) that hold a gang's part now."""
        count, _, min_memory, model, requirement, *_ = shape
        return {
            node.index
            for node in fleet.nodes
            if node.pool is not None
            and node.host.fits(shape.host)
            and choose(_free(node, model, min_memory), count, requirement) is not None
        }


def _by_node(fleet: Fleet, jobs: Iterable[RunningJob]) -> dict[FleetNode, list[RunningJob]]:
    """The nodes of a pool where `jobs` hold GPUs, with those jobs (in their order)."""
    on_node: dict[FleetNode, dict[int, RunningJob]] = {}
    for job in jobs:
        for gpu_id in job.gpu_ids:
            node = fleet.node_of[gpu_id]
            if node.pool is not None:
                on_node.setdefault(node, {})[job.id] = job
    return {node: list(held.values()) for node, held in on_node.items()}


def _free(node: FleetNode, model: str | None, min_memory: int) -> list[GpuSlot]:
    """The node's free GPUs of the model with the memory free."""
    return [
        gpu
        for gpu in node.free
        if gpu.memory_free_mib >= min_memory and (model is None or gpu.model == model)
    ]


@dataclass(frozen=True, slots=True)
class _Node:
    """A node where preemption may free GPUs: its free GPUs of the job's kind (`base`), the
    victims there and the GPUs each would free, and whether host resources hold the part."""

    hostname: str
    index: int
    base: list[GpuSlot]
    victims: list[RunningJob]
    freed: dict[int, list[GpuSlot]]
    host_holds: Callable[[Sequence[RunningJob]], bool]


def _holds(
    base: list[GpuSlot],
    subset: Sequence[RunningJob],
    freed: dict[int, list[GpuSlot]],
    count: int,
    requirement: str,
    host_holds: Callable[[Sequence[RunningJob]], bool],
) -> bool:
    """Whether `base` with the GPUs `subset` frees hold `count` GPUs in `requirement`, and the
    node's host resources with theirs hold the part."""
    if len(base) + sum(len(freed[victim.id]) for victim in subset) < count:
        return False
    if not host_holds(subset):
        return False
    gpus = base + [gpu for victim in subset for gpu in freed[victim.id]]
    gpus.sort(key=lambda gpu: (gpu.index, gpu.id))
    return choose(gpus, count, requirement) is not None


def _fewest(
    base: list[GpuSlot],
    candidates: Sequence[RunningJob],
    freed: dict[int, list[GpuSlot]],
    count: int,
    requirement: str,
    most: int,
    host_holds: Callable[[Sequence[RunningJob]], bool],
) -> tuple[RunningJob, ...] | None:
    """The smallest subset of `candidates` (cheapest first among equals), of at most `most`,
    whose freed GPUs with `base` hold `count` GPUs in `requirement`, and whose freed host
    resources with the node's free ones hold its part (`host_holds`): every subset of the
    first `NODE_VICTIMS`, else candidates added cheapest first."""

    holds = partial(
        _holds, base, freed=freed, count=count, requirement=requirement, host_holds=host_holds
    )
    if not holds(candidates):
        return None
    first = candidates[:NODE_VICTIMS]
    for size in range(1, min(most, len(first)) + 1):
        for subset in combinations(first, size):
            if holds(subset):
                return subset
    for size in range(len(first) + 1, min(most, len(candidates)) + 1):
        if holds(candidates[:size]):
            return tuple(candidates[:size])
    return None


def _held(victims: Iterable[RunningJob]) -> HostAsk:
    """The host resources `victims` hold on one node (each holds its figures once there)."""
    chosen = list(victims)
    return HostAsk(sum(v.cpus for v in chosen), sum(v.host_memory_mib for v in chosen))


def _covered(
    free: tuple[int | None, int | None], victims: Sequence[RunningJob], ask: HostAsk
) -> bool:
    """Whether a node's free host resources `free`, with those `victims` hold there, hold
    `ask`."""
    if not (ask.cpus or ask.memory_mib):
        return True
    cpus, memory_mib = free
    lent = _held(victims)
    return fits_free(
        (
            None if cpus is None else cpus + lent.cpus,
            None if memory_mib is None else memory_mib + lent.memory_mib,
        ),
        ask,
    )


def stopping_phrase(victims: Sequence[int]) -> str:
    """ "job 5 is being preempted", "jobs 5 and 9 are being preempted" """
    if len(victims) == 1:
        return f"job {victims[0]} is being preempted"
    return f"jobs {listing([str(i) for i in victims], 8)} are being preempted"
