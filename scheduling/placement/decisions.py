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
    # No node (or too few nodes) would hold the job even if the whole fleet were idle.
    TOO_LARGE = "too_large"


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

    @property
    def gpu_ids(self) -> tuple[int, ...]:
        return tuple(gpu_id for _, ids in self.by_node for gpu_id in ids)

    @property
    def nodes(self) -> tuple[str, ...]:
        return tuple(hostname for hostname, _ in self.by_node)


@dataclass(frozen=True, slots=True)
class Pending:
    """A job left waiting. `position` is 1-based among waiting jobs in policy order.

    `estimated_start` (epoch seconds) is the earliest time running jobs' expected ends free
    enough GPUs of the job's shape, like `squeue --start`; None when unknown. `what_if` names
    the nearest request that would start now, if any.
    """

    job_id: int
    position: int
    reason: Reason
    message: str
    estimated_start: float | None
    what_if: str | None


@dataclass(frozen=True, slots=True)
class PassResult:
    """The outcome of one pass: placements in the order they were made, pending in queue order."""

    placements: tuple[Placement, ...]
    pending: tuple[Pending, ...]
