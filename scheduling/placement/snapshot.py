"""What one placement pass reads: the fleet, the running jobs and the waiting queue."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Priority = Literal["low", "normal", "high", "critical"]
# "node" asks for no more than every job gets (each node's part on one node); it equals "any".
TopologyRequirement = Literal["any", "numa", "nvlink", "node"]
NodeState = Literal["online", "draining", "offline"]

PRIORITIES: tuple[Priority, ...] = ("low", "normal", "high", "critical")
TOPOLOGY_REQUIREMENTS: tuple[TopologyRequirement, ...] = ("any", "numa", "nvlink", "node")


@dataclass(frozen=True, slots=True)
class GpuSlot:
    """One whole GPU as the scheduler sees it.

    `memory_free_mib` is the live sample (the total when there is none). `nvlink_domain` names
    the set of GPUs joined by NVLink/NVSwitch (one per DGX, e.g. "dgx-a100-01/nvswitch"), None
    without NVLink. `unavailable` is None when schedulable, else a machine code, one of
    `inventory.usability.Reason` ("offline", "unreachable", "missing", "error", "draining",
    "mig", "foreign-process"). `allocated_to` is the running job's id.
    """

    id: int
    uuid: str
    node: str
    index: int
    model: str
    memory_total_mib: int
    memory_free_mib: int
    numa_node: int | None = None
    socket: int | None = None
    nvlink_domain: str | None = None
    unavailable: str | None = None
    allocated_to: int | None = None


@dataclass(frozen=True, slots=True)
class NodeInfo:
    """A node's administrative state; only online, reachable nodes receive work."""

    hostname: str
    state: NodeState = "online"
    reachable: bool = True

    @property
    def schedulable(self) -> bool:
        return self.state == "online" and self.reachable


@dataclass(frozen=True, slots=True)
class JobRequest:
    """A waiting job: `node_count` nodes with `gpus_per_node` GPUs each, all or nothing.

    `gpu_model` must match `GpuSlot.model` exactly (None: any model); `min_memory_mib` is the
    free memory each GPU must have (0: any). `topology` constrains each node's part: "numa"
    keeps it in one NUMA node, "nvlink" in one NVLink domain; "any" and "node" add nothing.
    """

    id: int
    owner: str
    priority: Priority
    submitted_at: float
    gpus_per_node: int
    node_count: int = 1
    min_memory_mib: int = 0
    gpu_model: str | None = None
    topology: TopologyRequirement = "any"
    estimated_duration_s: float | None = None
    max_runtime_s: float | None = None
    preemptible: bool = False

    def __post_init__(self) -> None:
        if self.priority not in PRIORITIES:
            raise ValueError(f"job {self.id}: unknown priority {self.priority!r}")
        if self.topology not in TOPOLOGY_REQUIREMENTS:
            raise ValueError(f"job {self.id}: unknown topology {self.topology!r}")
        if self.gpus_per_node < 1 or self.node_count < 1 or self.min_memory_mib < 0:
            raise ValueError(
                f"job {self.id}: needs gpus_per_node >= 1, node_count >= 1, min_memory_mib >= 0"
            )

    @property
    def gpu_count(self) -> int:
        return self.gpus_per_node * self.node_count

    @property
    def expected_runtime_s(self) -> float | None:
        """How long the job is expected to hold its GPUs: the estimate, else the limit."""
        if self.estimated_duration_s is not None:
            return self.estimated_duration_s
        return self.max_runtime_s


@dataclass(frozen=True, slots=True)
class RunningJob:
    """A job holding GPUs; `expected_end` (epoch seconds) is None when nobody knows."""

    id: int
    gpu_ids: tuple[int, ...]
    started_at: float
    expected_end: float | None = None


@dataclass(frozen=True, slots=True)
class Snapshot:
    """Everything one pass reads, taken at `now` (epoch seconds). Every GpuSlot.node must be
    the hostname of a NodeInfo."""

    now: float
    nodes: tuple[NodeInfo, ...]
    gpus: tuple[GpuSlot, ...]
    running: tuple[RunningJob, ...] = ()
    queue: tuple[JobRequest, ...] = ()
