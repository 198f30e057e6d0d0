"""Preemption: the fewest running jobs to stop so that a waiting job can start now.

Who may be stopped for whom (`Victims.why`): a running job that is preemptible or borrowed
(started over quota), not already stopping, never of a higher priority level than the waiting
job. Borrowed work is reclaimed at once. Any other victim must have run `preempt_exempt_s`
since its latest start (the pool's; Slurm's PreemptExemptTime), must rank below the waiting
job in the pool's own order were it stopped now and waiting again (`as_waiting`: so no policy
stops a job that would go straight back ahead of the job that stopped it), and must be
either of a lower priority level, in a higher queue of attained service (under LAS: Tiresias'
2D-LAS), or held by a user (and project) further over its fair share than the waiting job's
by at least `FAIRSHARE_MARGIN` (a lower fair-share factor), so that two users near their
shares do not trade GPUs back and forth. Cheapest first: borrowed work, then lower priority
levels, fewer GPUs, the most recently started (it loses least work), then the lower id.

The search is bounded. Per node it finds the smallest set of candidates holding GPUs there
(by size, then cost) whose GPUs, with the node's free ones, hold the job's part in its
topology (`topology.choose`): every subset of the `NODE_VICTIMS` cheapest (all of them on an
8-GPU node), beyond those candidates added cheapest first; sets larger than the best found
on an earlier node are not tried. It looks at no more than `NODES` nodes, those missing the
fewest GPUs first: at most 64 x 255 `choose` calls, and a failure is remembered for the
pass (jobs ask in the pool's order, so a later job with the same shape, owner and priority
may stop no more victims than an earlier one). A single-node job takes the node with the
smallest set; a gang takes the nodes that hold its part now, then the cheapest sets on
further nodes. The choice is then placed for real on the pass's fleet with those GPUs freed
(`PlacementPass.place_freeing`), so it is a valid, topology-correct placement; victims whose
GPUs it does not use are spared, unless the job needs their host CPUs or memory. Host
resources count like GPUs: a set is enough only when the node's free CPUs and memory with
the victims' (a victim holds its figures on each node of its GPUs) hold the job's part.
Deterministic: every tie goes to the cost order, then the hostname.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import replace
from functools import partial
from itertools import combinations

from scheduling.placement.decisions import Placement, Preemption
from scheduling.placement.engine import PlacementPass, View
from scheduling.placement.fairshare import FairShareTable
from scheduling.placement.fleet import FleetNode, Shape, is_available, matches
from scheduling.placement.hosts import HostAsk, fits_free
from scheduling.placement.policies import PRIORITY_RANK, Fcfs, Las, Policy
from scheduling.placement.snapshot import GpuSlot, JobRequest, RunningJob
from scheduling.placement.text import listing
from scheduling.placement.topology import choose

NODE_VICTIMS = 8
NODES = 64
# Fair share: the waiting job's factor must exceed the victim's by this much (factors are in
# [0, 1]; 0.5 is a holder that used exactly its share).
FAIRSHARE_MARGIN = 0.1

Cost = tuple[bool, int, int, float, int]


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
    ) -> None:
        """`shares` gives the pool's fair-share table (built when first needed); `policy`
        the pool's order (FCFS when None), which a victim must rank below the waiting job in;
        `exempt_s` how long a job runs before it may be stopped for anything but a
        reclaim."""
        self.placement_pass = placement_pass
        self.now = placement_pass.now
        node_of = placement_pass.fleet.node_of
        self.candidates = sorted(
            (
                job
                for job in running
                if (job.preemptible or job.borrowed)
                and not job.stopping
                and job.gpu_ids
                and all(gpu_id in node_of for gpu_id in job.gpu_ids)
            ),
            key=cost,
        )
        self.shares = shares
        self.policy: Policy = policy if policy is not None else Fcfs()
        self.exempt_s = exempt_s
        self._waiting: dict[int, JobRequest] = {}
        self._gone: set[int] = set()
        self._failed: set[tuple[Shape, View, str, str, str]] = set()

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

    def _reason(self, victim: RunningJob, job: JobRequest) -> str | None:
        if PRIORITY_RANK[victim.priority] < PRIORITY_RANK[job.priority]:
            return f"higher priority ({job.priority} over {victim.priority})"
        if isinstance(self.policy, Las):
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
        count, wanted, min_memory, model, requirement, *_ = shape
        host = shape.host
        if not allowed:
            return None
        fleet = self.placement_pass.look(view)
        on_node: dict[FleetNode, list[RunningJob]] = {}
        for victim in allowed:
            for gpu_id in victim.gpu_ids:
                node = fleet.node_of[gpu_id]
                if node.pool is not None and victim not in on_node.setdefault(node, []):
                    on_node[node].append(victim)

        def base(node: FleetNode) -> list[GpuSlot]:
            return [
                gpu
                for gpu in node.free
                if gpu.memory_free_mib >= min_memory and (model is None or gpu.model == model)
            ]

        nodes = sorted(on_node, key=lambda node: (count - len(base(node)), node.index))[:NODES]
        options: list[tuple[int, list[Cost], int, tuple[RunningJob, ...]]] = []
        for node in nodes:
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
                for victim in on_node[node]
            }
            most = options[0][0] if options and wanted == 1 else len(on_node[node])
            fewest = _fewest(
                base(node),
                on_node[node],
                freed,
                count,
                requirement,
                most,
                partial(_covered, node.host.free, ask=host),
            )
            if fewest is not None:
                options.append((len(fewest), [cost(v) for v in fewest], node.index, fewest))
                options.sort(key=lambda option: option[:3])
        if wanted == 1:
            return list(options[0][3]) if options else None
        # A gang: the nodes that hold their part now need no victim.
        ready = {
            node.index
            for node in fleet.nodes
            if node.pool is not None
            and node.host.fits(host)
            and choose(base(node), count, requirement) is not None
        }
        chosen: list[RunningJob] = []
        for _, _, index, fewest in options:
            if len(ready) >= wanted:
                break
            if index not in ready:
                ready.add(index)
                chosen += [victim for victim in fewest if victim not in chosen]
        return chosen if len(ready) >= wanted and chosen else None


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

    def holds(subset: Sequence[RunningJob]) -> bool:
        if len(base) + sum(len(freed[victim.id]) for victim in subset) < count:
            return False
        if not host_holds(subset):
            return False
        gpus = base + [gpu for victim in subset for gpu in freed[victim.id]]
        gpus.sort(key=lambda gpu: (gpu.index, gpu.id))
        return choose(gpus, count, requirement) is not None

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
