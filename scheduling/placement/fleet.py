"""The working state of one pass: the fleet indexed so that best fit is a lookup, not a scan."""

from __future__ import annotations

from bisect import bisect_left, insort
from collections.abc import Iterable, Mapping
from typing import NamedTuple

from scheduling.placement.hosts import Host, HostAsk, Hosts
from scheduling.placement.predict import release_at
from scheduling.placement.snapshot import GpuSlot, JobRequest, NodeInfo, Snapshot
from scheduling.placement.topology import NodeChoice, choose

# Cache key of a pool's best possible choice: (count, requirement, gpu_model, min_memory_mib).
IdealKey = tuple[int, str, str | None, int]
# GPUs out of reach for a while, per node: what `Fleet.withhold` returns and `restore` takes.
Held = list[tuple["FleetNode", list[GpuSlot]]]


class Shape(NamedTuple):
    """Everything placement looks at in a job: jobs of one shape fit or fail alike."""

    gpus_per_node: int
    node_count: int
    min_memory_mib: int
    gpu_model: str | None
    topology: str  # "any", "numa" or "nvlink" ("node" adds nothing to "any")
    # Host CPUs and memory on each node (flat, not a HostAsk: a shape is made per decision).
    cpus: int
    host_memory_mib: int

    @classmethod
    def of(cls, job: JobRequest) -> Shape:
        # tuple.__new__: without the NamedTuple constructor's call (a pass makes one per
        # job several times over).
        return tuple.__new__(
            cls,
            (
                job.gpus_per_node,
                job.node_count,
                job.min_memory_mib,
                job.gpu_model,
                grouping(job.topology),
                job.cpus,
                job.host_memory_mib,
            ),
        )

    @property
    def host(self) -> HostAsk:
        return HostAsk(self.cpus, self.host_memory_mib)


def grouping(topology: str) -> str:
    """What a topology requirement keeps a node's part in: "node" adds nothing to "any"."""
    return "any" if topology == "node" else topology


class FleetNode:
    """One node: all its GPUs, and those still free in this pass (both by GPU index), and
    its host CPUs and memory (shared with the rest of the pass)."""

    __slots__ = ("free", "gpus", "host", "index", "info", "pool")

    def __init__(self, index: int, info: NodeInfo, gpus: list[GpuSlot], host: Host) -> None:
        self.index = index  # position in hostname order: the tie-break between nodes
        self.info = info
        self.host = host
        self.gpus = gpus
        self.free = [gpu for gpu in gpus if is_available(info, gpu) and gpu.held_as is None]
        self.pool: Pool | None = None  # set for schedulable nodes

    @property
    def hostname(self) -> str:
        return self.info.hostname


class Pool:
    """Schedulable nodes with identical hardware (models, memory, NUMA, sockets, NVLink).

    `buckets[n]` lists, in hostname order, the nodes with n free GPUs, so best fit walks the
    buckets upwards from the requested count. The hardware of the first node bounds how good
    any choice in the pool can be, which lets a search stop at the first node that reaches it.
    """

    __slots__ = ("_ideals", "buckets", "hardware")

    def __init__(self, hardware: list[GpuSlot]) -> None:
        self.hardware = hardware
        self.buckets: list[list[int]] = [[] for _ in range(len(hardware) + 1)]
        self._ideals: dict[IdealKey, NodeChoice | None] = {}

    def ideal(self, key: IdealKey) -> NodeChoice | None:
        """The best choice a node of this pool offers when idle; None: it can never hold it."""
        if key not in self._ideals:
            count, requirement, model, min_memory = key
            gpus = [gpu for gpu in self.hardware if matches(gpu, model, min_memory)]
            self._ideals[key] = choose(gpus, count, requirement)
        return self._ideals[key]


def is_available(info: NodeInfo, gpu: GpuSlot) -> bool:
    return info.schedulable and gpu.unavailable is None


def available(info: NodeInfo, gpus: Iterable[GpuSlot]) -> list[GpuSlot]:
    """Those of `gpus` (on the node of `info`) that `is_available`, the node read once."""
    return [gpu for gpu in gpus if gpu.unavailable is None] if info.schedulable else []


def matches(gpu: GpuSlot, model: str | None, min_memory_mib: int) -> bool:
    """Whether the hardware fits (total memory: what the GPU offers once it is idle)."""
    return (model is None or gpu.model == model) and gpu.memory_total_mib >= min_memory_mib


class Fleet:
    """Nodes in hostname order, schedulable ones in pools, and when each busy GPU frees up."""

    def __init__(
        self,
        snapshot: Snapshot,
        hosts: Hosts | None = None,
        by_host: Mapping[str, list[GpuSlot]] | None = None,
    ) -> None:
        """`hosts`: the pass's host ledger when it spans more than this snapshot's GPUs;
        `by_host`: `gpus_by_host(snapshot)`, when the caller has it already."""
        infos = sorted(snapshot.nodes, key=lambda info: info.hostname)
        if by_host is None:
            by_host = gpus_by_host(snapshot)
        self.hosts = hosts or Hosts(snapshot)
        self.nodes = [
            FleetNode(
                i,
                info,
                sorted(by_host[info.hostname], key=lambda g: (g.index, g.id)),
                self.hosts.by_name[info.hostname],
            )
            for i, info in enumerate(infos)
        ]
        self.node_of = {gpu.id: node for node in self.nodes for gpu in node.gpus}
        self.pools: list[Pool] = []
        pools: dict[tuple[object, ...], Pool] = {}
        for node in self.nodes:
            if node.info.schedulable and node.gpus:
                signature = _hardware_signature(node.gpus)
                if signature not in pools:
                    pools[signature] = Pool(node.gpus)
                    self.pools.append(pools[signature])
                node.pool = pools[signature]
                node.pool.buckets[len(node.free)].append(node.index)
        # Unknown ends never come: those GPUs free up at infinity.
        now = snapshot.now
        self.release_at: dict[int, float] = {
            gpu_id: end
            for job in snapshot.running
            for end in (release_at(job, now),)
            for gpu_id in job.gpu_ids
        }

    def take(self, node: FleetNode, gpus: Iterable[GpuSlot], release_at: float) -> None:
        """Allocate `gpus` (free on `node`) until `release_at`, moving the node down a bucket."""
        taken = {gpu.id: release_at for gpu in gpus}
        self._refile(node, [gpu for gpu in node.free if gpu.id not in taken])
        self.release_at.update(taken)

    def withhold(self, gpu_ids: Iterable[int]) -> Held:
        """Take those of `gpu_ids` that are free out of reach, until `restore`."""
        wanted: dict[FleetNode, set[int]] = {}
        for gpu_id in gpu_ids:
            node = self.node_of.get(gpu_id)
            if node is not None and node.pool is not None:
                wanted.setdefault(node, set()).add(gpu_id)
        held: Held = []
        for node, ids in wanted.items():
            out = [gpu for gpu in node.free if gpu.id in ids]
            if out:
                self._refile(node, [gpu for gpu in node.free if gpu.id not in ids])
                held.append((node, out))
        return held

    def restore(self, held: Held) -> None:
        """Make `held` GPUs free again (also: lend busy GPUs for a what-if, see preemption)."""
        for node, gpus in held:
            self._refile(node, sorted(node.free + gpus, key=lambda gpu: (gpu.index, gpu.id)))

    def _refile(self, node: FleetNode, free: list[GpuSlot]) -> None:
        """Set the node's free GPUs, moving it to the bucket of its new free count."""
        assert node.pool is not None, "only schedulable nodes have free GPUs"
        buckets = node.pool.buckets
        old = buckets[len(node.free)]
        del old[bisect_left(old, node.index)]
        node.free = free
        insort(buckets[len(node.free)], node.index)


def gpus_by_host(snapshot: Snapshot) -> dict[str, list[GpuSlot]]:
    """The snapshot's GPUs per hostname; refuses a hostname or GPU listed twice, and a GPU on
    a node the snapshot does not list."""
    by_host: dict[str, list[GpuSlot]] = {info.hostname: [] for info in snapshot.nodes}
    if len(by_host) != len(snapshot.nodes):
        raise ValueError("snapshot lists a hostname twice")
    seen: set[int] = set()
    for gpu in snapshot.gpus:
        if gpu.node not in by_host:
            raise ValueError(f"GPU {gpu.id} is on unknown node {gpu.node!r}")
        if gpu.id in seen:
            raise ValueError(f"snapshot lists GPU {gpu.id} twice")
        seen.add(gpu.id)
        by_host[gpu.node].append(gpu)
    return by_host


def _hardware_signature(gpus: list[GpuSlot]) -> tuple[object, ...]:
    """Per GPU: what placement looks at; NVLink domains renamed by first appearance so that
    identical machines compare equal."""
    domains: dict[str, int] = {}
    return tuple(
        (
            gpu.index,
            gpu.model,
            gpu.memory_total_mib,
            gpu.numa_node,
            gpu.socket,
            None
            if gpu.nvlink_domain is None
            else domains.setdefault(gpu.nvlink_domain, len(domains)),
        )
        for gpu in gpus
    )
