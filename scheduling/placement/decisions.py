"""What one placement pass decides: placements, and a reason for every job left waiting."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


class TopologyClass(StrEnum):
    """How tightly a placement's GPUs sit, best first (per node; a gang is "multi-node")."""

    SINGLE = "single"
    NVLINK = "nvlink"
    NUMA = "numa"
    SOCKET = "socket"
    NODE = "node"
    MULTI_NODE = "multi-node"


class Reason(StrEnum):
    """Why a job waits; stable machine codes, safe to store."""

    # Enough matching GPUs exist and are up, but too few are free now.
    RESOURCES_BUSY = "resources_busy"
    # The NUMA/NVLink requirement cannot be met (now, or by any node's hardware).
    TOPOLOGY = "topology"
    # No GPU has the requested memory (free now, or at all).
    MEMORY = "memory"
    # No GPU of the requested model exists.
    MODEL = "model"
    # Enough matching hardware exists, but its nodes or GPUs are draining, offline or broken.
    NODES_UNAVAILABLE = "nodes_unavailable"
    # No node (or too few nodes) would hold the job even if the whole fleet were idle (its
    # GPUs, or its host CPUs and memory per node).
    TOO_LARGE = "too_large"
    # Enough matching GPUs are free, but the nodes that have them lack the host CPUs or
    # memory it asks for per node.
    HOST_RESOURCES = "host_resources"
    # It would fit, but the GPUs are kept for a job ahead of it (EASY backfill's reservation).
    PRIORITY = "priority"
    # Its user or project is at its quota (GPUs at once or GPU-hours this period), and the
    # pool does not lend idle GPUs (or none are idle).
    QUOTA = "quota"
    # Its array already runs as many tasks as its %N cap allows.
    ARRAY_LIMIT = "array_limit"
    # A reservation holds the GPUs it would need before it would end (by its maximum
    # runtime), or its own reservation's window has not started.
    RESERVATION = "reservation"
    # Too few GPUs are free, and no running job is preempted for it where stopping some
    # would let it start: those jobs are still within the pool's preempt_exempt_s of their
    # start (the sentence says until when), ...
    PREEMPT_EXEMPT = "preempt_exempt"
    # ... or the pool's order does not rank it ahead of them (or the pool does not preempt),
    PREEMPT_ORDER = "preempt_order"
    # ... or they are not preemptible, or of a higher priority.
    NOT_PREEMPTIBLE = "not_preemptible"
    # Jobs are being preempted for it; it starts when their GPUs are free.
    PREEMPTING = "preempting"
    # A MIG instance is being created for it on an idle GPU.
    MIG_RECONFIGURING = "mig_reconfiguring"
    # No MIG device of its profile is free, or no MPS GPU has room for its share.
    SHARE_UNAVAILABLE = "share_unavailable"
    # The loop's own words, for jobs it keeps out of the engine's queue: the jobs it depends
    # on have not ended as it asks (Slurm's "Dependency"), ...
    DEPENDENCY = "dependency"
    # ... or the scheduler is stopped (an admin's POST /orchestrator/stop): nothing is placed.
    SCHEDULER_STOPPED = "scheduler_stopped"


@dataclass(frozen=True, slots=True)
class Placement:
    """GPUs given to one job. `by_node` pairs each hostname with its GPU ids, hostnames sorted,
    ids in GPU index order.

    `score` is what the choice minimised: (topology rank, free GPUs left on the chosen nodes,
    sockets used, NUMA nodes used), summed over a gang's nodes except the rank, which is the
    worst node's (0: one NVLink domain or a single GPU, 1: one NUMA node, 2: one socket,
    3: anywhere on the node).
    """

    job_id: int
    by_node: tuple[tuple[str, tuple[int, ...]], ...]
    topology_class: TopologyClass
    numa_nodes: tuple[int, ...]
    score: tuple[int, int, int, int]
    explanation: str
    # A MIG device (MigSlot.id) of the one GPU, or an MPS share of it (then by_node names it).
    mig_slot: int | None = None
    mps_percent: int | None = None
    mps_memory_mib: int | None = None
    # Placed over quota on idle GPUs: preemptible, reclaimed first.
    borrowed: bool = False

    @property
    def gpu_ids(self) -> tuple[int, ...]:
        return tuple(gpu_id for _, ids in self.by_node for gpu_id in ids)

    @property
    def nodes(self) -> tuple[str, ...]:
        return tuple(hostname for hostname, _ in self.by_node)


@dataclass(frozen=True, slots=True)
class Pending:
    """A job left waiting. `position` is 1-based among waiting jobs in policy order (None
    for a job kept out of the queue: `Reason.DEPENDENCY`).

    `estimated_start` (epoch seconds) is the earliest time running jobs' expected ends free
    enough GPUs of the job's shape, like `squeue --start`; None when unknown. `what_if` names
    the nearest request that would start now, if any.
    """

    job_id: int
    position: int | None
    reason: Reason
    message: str
    estimated_start: float | None
    what_if: str | None


@dataclass(frozen=True, slots=True)
class Preemption:
    """Stop `victims` (running job ids) so that `job_id` can have `gpu_ids`: the smallest set
    whose GPUs make a valid, topology-correct placement. `reason` says why it may."""

    job_id: int
    victims: tuple[int, ...]
    gpu_ids: tuple[int, ...]
    reason: str


@dataclass(frozen=True, slots=True)
class MigCreate:
    """Ask the agent to create a GPU instance of `profile` at `placement_start` on the idle
    MIG-mode GPU `gpu_id` for job `job_id` (dynamic MIG); the job waits for it."""

    job_id: int
    gpu_id: int
    profile: str
    placement_start: int
    explanation: str


@dataclass(frozen=True, slots=True)
class PassResult:
    """The outcome of one pass: placements in the order they were made, pending in queue order,
    preemptions to start and MIG instances to create."""

    placements: tuple[Placement, ...]
    pending: tuple[Pending, ...]
    preemptions: tuple[Preemption, ...] = ()
    mig_creates: tuple[MigCreate, ...] = ()
