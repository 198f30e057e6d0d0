"""Placing jobs on one set of GPUs: best fit by topology, then an explanation for the rest."""

from __future__ import annotations

import heapq
import math
from collections.abc import Iterable, Mapping
from dataclasses import replace
from typing import NamedTuple

from scheduling.placement.decisions import Pending, Placement, TopologyClass
from scheduling.placement.diagnosis import Diagnosis
from scheduling.placement.fleet import Fleet, FleetNode, Held, Pool, Shape
from scheduling.placement.hosts import HostAsk, Hosts
from scheduling.placement.snapshot import GpuSlot, JobRequest, Snapshot
from scheduling.placement.text import gpus_phrase, indexes_phrase, listing, numa_phrase
from scheduling.placement.topology import NodeChoice, choose

# How a candidate node compares, lower first: (rank, free GPUs left, sockets, NUMA nodes, node).
CandidateKey = tuple[int, int, int, int, int]


class Candidate(NamedTuple):
    key: CandidateKey
    node: FleetNode
    choice: NodeChoice


# GPUs kept out of one job's reach (a reservation's, those the first waiting job will need):
# a pass looks at the fleet through a view; the empty view sees every free GPU.
View = frozenset[int]
EVERYWHERE: View = frozenset()


class PlacementPass:
    """The state of one pass over a snapshot: `place` jobs one at a time, best first, then
    `explain` those that did not fit.

    Each job is placed in a view: the free GPUs less those the view keeps out of its reach.
    Free capacity only shrinks during a pass, so a shape that failed once in a view fails
    there for the rest of it; such jobs are turned down from a cache. `scope` names the fleet
    in messages ("the fleet", "pool a100"). A node's part goes only where the node's free
    host CPUs and memory hold it too (`hosts`: the pass's ledger, shared with the other
    pools and the MIG/MPS pass; its own by default).
    """

    def __init__(
        self,
        snapshot: Snapshot,
        scope: str = "the fleet",
        hosts: Hosts | None = None,
        by_host: Mapping[str, list[GpuSlot]] | None = None,
    ) -> None:
        """`by_host`: `fleet.gpus_by_host(snapshot)`, when the caller has it already."""
        self.now = snapshot.now
        self.fleet = Fleet(snapshot, hosts, by_host)
        self.hosts = self.fleet.hosts
        self.scope = scope
        # Per view, the shapes that failed in it (a dict of sets: the hot path is a lookup).
        self._failed: dict[View, set[Shape]] = {EVERYWHERE: set()}
        # Shapes found to fit a view, by the number of placements made (here, and on the
        # host ledger) when they did.
        self._fitted: dict[tuple[Shape, View], tuple[int, int]] = {}
        self._placements = 0
        self._view = EVERYWHERE
        self._withheld: Held = []
        self._diagnosis: Diagnosis | None = None
        self._diagnosed = 0  # the host ledger's changes when it was made

    def place(self, job: JobRequest, view: View = EVERYWHERE) -> Placement | None:
        """Give `job` the best free GPUs of `view` and keep them, or return None when it does
        not fit."""
        shape = Shape.of(job)
        failed = self._failed.get(view)
        if failed is not None and shape in failed:
            return None
        chosen = self._search_in(shape, view)
        if chosen is None:
            return None
        self._take(job, chosen)
        return _placement(job, chosen)

    def fits(self, job: JobRequest, view: View = EVERYWHERE) -> bool:
        """Whether `job` would fit `view` now (nothing is taken)."""
        shape = Shape.of(job)
        if shape in self._failed.get(view, ()):
            return False
        state = (self._placements, len(self.hosts.changes))
        if self._fitted.get((shape, view)) == state:
            return True
        if self._search_in(shape, view) is None:
            return False
        self._fitted[(shape, view)] = state
        return True

    def place_freeing(
        self,
        job: JobRequest,
        view: View,
        freed: Iterable[GpuSlot],
        freed_hosts: Mapping[str, HostAsk] | None = None,
    ) -> Placement | None:
        """Place `job` as if the busy GPUs `freed`, and the host CPUs and memory
        `freed_hosts` (by hostname), were free too (preemption's what-if). The placement is
        kept; the freed GPUs stay out of everyone's reach either way, and so do the freed
        host resources the job does not take."""
        fleet = self.look(view)
        lent: Held = []
        for gpu in freed:
            node = fleet.node_of[gpu.id]
            if node.pool is not None and gpu.unavailable is None:
                lent.append((node, [replace(gpu, memory_free_mib=gpu.memory_total_mib)]))
        fleet.restore(lent)
        hosts = self.hosts.by_name
        freed_hosts = freed_hosts or {}
        for hostname, ask in freed_hosts.items():
            hosts[hostname].add(ask.cpus, ask.memory_mib)
        shape = Shape.of(job)
        chosen = self._search(shape)
        for hostname, ask in freed_hosts.items():
            hosts[hostname].add(-ask.cpus, -ask.memory_mib)
        fleet.withhold(gpu.id for _, gpus in lent for gpu in gpus)
        if chosen is None:
            return None
        self._take(job, chosen, freed_hosts)
        return _placement(job, chosen)

    def look(self, view: View) -> Fleet:
        """The fleet with the free GPUs of `view` out of reach (until another view is used)."""
        if view is not self._view and view != self._view:
            self.fleet.restore(self._withheld)
            self._withheld = self.fleet.withhold(view) if view else []
            self._view = view
        return self.fleet

    def explain(self, job: JobRequest, position: int) -> Pending:
        """Why `job`, which `place` turned down, waits, against the state after the placements
        so far (every free GPU in view). `position` is its 1-based place among the waiting
        jobs."""
        self.look(EVERYWHERE)
        if self._diagnosis is None or self._diagnosed != len(self.hosts.changes):
            self._diagnosis = Diagnosis(self.fleet, self.now, self.scope)
            self._diagnosed = len(self.hosts.changes)
        return self._diagnosis.explain(job, position)

    def _search_in(self, shape: Shape, view: View) -> list[Candidate] | None:
        self.look(view)
        chosen = self._search(shape)
        if chosen is None:
            self._failed.setdefault(view, set()).add(shape)
        return chosen

    def _take(
        self,
        job: JobRequest,
        chosen: list[Candidate],
        freed_hosts: Mapping[str, HostAsk] | None = None,
    ) -> None:
        """Keep the chosen GPUs, and the job's host resources on their nodes. Where its
        victims free some (`freed_hosts`), it takes what is free first and theirs for the
        rest: theirs go to no one else in this pass anyway."""
        runtime = job.likely_runtime_s
        release_at = math.inf if runtime is None else self.now + runtime
        for candidate in chosen:
            self.fleet.take(candidate.node, candidate.choice.gpus, release_at)
        if job.cpus or job.host_memory_mib:
            ask = HostAsk.of(job)
            for candidate in chosen:
                hostname = candidate.node.hostname
                if freed_hosts and hostname in freed_hosts:
                    self.hosts.take((hostname,), _from_free(candidate.node.host.free, ask))
                else:
                    self.hosts.take((hostname,), ask)
        self._placements += 1
        self._diagnosis = None  # it describes the state before this placement

    def _search(self, shape: Shape) -> list[Candidate] | None:
        """The best nodes for `shape`, in hostname order, or None.

        Each pool is searched alone, so that a gang lands on identical machines when it can;
        only when no pool holds it alone are the pools' candidates pooled.
        """
        options: list[list[Candidate]] = []
        everyone: list[Candidate] = []
        for pool in self.fleet.pools:
            found = self._candidates(pool, shape)
            if len(found) >= shape.node_count:
                options.append(heapq.nsmallest(shape.node_count, found))
            everyone += found
        if options:
            best = min(options, key=lambda option: (_score(option), option[0].node.index))
        elif len(everyone) >= shape.node_count:
            best = heapq.nsmallest(shape.node_count, everyone)
        else:
            return None
        return sorted(best, key=lambda candidate: candidate.node.index)

    def _candidates(self, pool: Pool, shape: Shape) -> list[Candidate]:
        """Nodes of `pool` that can hold one node's part of `shape`, enough to include the best
        `node_count` of them: buckets are walked from the fewest free GPUs upwards, and the walk
        stops once `node_count` candidates are found that no unseen node could beat."""
        count, nodes_wanted, min_memory, model, requirement, cpus, memory = shape
        asks_host = bool(cpus or memory)
        host = shape.host
        ideal = pool.ideal((count, requirement, model, min_memory))
        if ideal is None:
            return []
        found: list[Candidate] = []
        # Candidates no unseen node can beat: those at the ideal rank from earlier buckets,
        # and those at the ideal cost from this one.
        unbeatable = 0
        for free_count in range(count, len(pool.buckets)):
            at_ideal_rank = 0
            for index in pool.buckets[free_count]:
                node = self.fleet.nodes[index]
                if asks_host and not node.host.fits(host):
                    continue
                eligible = [
                    gpu
                    for gpu in node.free
                    if gpu.memory_free_mib >= min_memory and (model is None or gpu.model == model)
                ]
                choice = choose(eligible, count, requirement)
                if choice is None:
                    continue
                key = (choice.rank, free_count - count, choice.sockets, choice.numa_nodes, index)
                found.append(Candidate(key, node, choice))
                if choice.cost <= ideal.cost:
                    # Later nodes in this bucket cost at least as much and sort after it.
                    unbeatable += 1
                    if unbeatable >= nodes_wanted:
                        return found
                elif choice.rank <= ideal.rank:
                    at_ideal_rank += 1
            # Nodes in later buckets would leave more GPUs free: they lose to this rank.
            unbeatable += at_ideal_rank
            if unbeatable >= nodes_wanted:
                return found
        return found


def _from_free(free: tuple[int | None, int | None], ask: HostAsk) -> HostAsk:
    """What of `ask` the free figures `free` cover (unknown: all of it)."""
    cpus, memory_mib = free
    return HostAsk(
        ask.cpus if cpus is None else min(ask.cpus, max(cpus, 0)),
        ask.memory_mib if memory_mib is None else min(ask.memory_mib, max(memory_mib, 0)),
    )


def _score(candidates: list[Candidate]) -> tuple[int, int, int, int]:
    """The worst rank, then the totals of free GPUs left, sockets and NUMA nodes."""
    return (
        max(c.key[0] for c in candidates),
        sum(c.key[1] for c in candidates),
        sum(c.key[2] for c in candidates),
        sum(c.key[3] for c in candidates),
    )


def _placement(job: JobRequest, chosen: list[Candidate]) -> Placement:
    gpus = [gpu for candidate in chosen for gpu in candidate.choice.gpus]
    score = _score(chosen)
    if len(chosen) == 1:
        topology_class = chosen[0].choice.topology_class
        explanation = _explain_one(chosen[0])
    else:
        topology_class = TopologyClass.MULTI_NODE
        explanation = _explain_gang(job, chosen, score[1])
    return Placement(
        job_id=job.id,
        by_node=tuple((c.node.hostname, tuple(gpu.id for gpu in c.choice.gpus)) for c in chosen),
        topology_class=topology_class,
        numa_nodes=tuple(sorted({gpu.numa_node for gpu in gpus if gpu.numa_node is not None})),
        score=score,
        explanation=explanation,
    )


_WHERE = {
    TopologyClass.SINGLE: "",
    TopologyClass.NVLINK: " in one NVLink domain",
    TopologyClass.NUMA: " in one NUMA node",
    TopologyClass.SOCKET: " on one socket",
    TopologyClass.NODE: " across sockets",
}
_SOCKETS_SAID = frozenset({TopologyClass.SOCKET, TopologyClass.NODE})


def _explain_one(candidate: Candidate) -> str:
    """E.g. "4 GPUs in one NVLink domain on dgx-01 (GPUs 0-3), NUMA nodes 1 and 3 on one
    socket; best fit: leaves 4 free GPUs on that node" (the sockets once: not again after
    "on one socket" or "across sockets")."""
    gpus: tuple[GpuSlot, ...] = candidate.choice.gpus
    topology_class = candidate.choice.topology_class
    where = _WHERE[topology_class]
    numa = numa_phrase(gpus, with_sockets=topology_class not in _SOCKETS_SAID)
    return (
        f"{gpus_phrase(len(gpus))}{where} on {candidate.node.hostname} "
        f"({indexes_phrase([gpu.index for gpu in gpus])}){numa}; "
        f"best fit: leaves {gpus_phrase(candidate.key[1], 'free ')} on that node"
    )


def _explain_gang(job: JobRequest, chosen: list[Candidate], left: int) -> str:
    """E.g. "16 GPUs on 2 nodes, 8 per node (dgx-01 and dgx-02), each node's GPUs in one
    NVLink domain; best fit: leaves 0 free GPUs on those nodes"."""
    classes = {candidate.choice.topology_class for candidate in chosen}
    worst = max(classes, key=list(TopologyClass).index)
    each = f", each node's GPUs{_WHERE[worst]}" if _WHERE[worst] else ""
    return (
        f"{gpus_phrase(job.gpu_count)} on {len(chosen)} nodes, {job.gpus_per_node} per node "
        f"({listing([candidate.node.hostname for candidate in chosen])}){each}; "
        f"best fit: leaves {gpus_phrase(left, 'free ')} on those nodes"
    )
