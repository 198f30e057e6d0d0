"""What one placement pass reads: the fleet, the running jobs and the waiting queue."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Literal

Priority = Literal["low", "normal", "high", "critical"]
# "node" asks for no more than every job gets (each node's part on one node); it equals "any".
TopologyRequirement = Literal["any", "numa", "nvlink", "node"]
NodeState = Literal["online", "draining", "offline"]

PolicyName = Literal["fcfs", "priority", "sjf", "fairshare", "las", "qssf"]
# A pool's policy unless an admin picks another (PoolPolicy's default too): predicted
# shortest service first, which orders as "priority" while there is no history to predict from.
DEFAULT_POLICY: PolicyName = "qssf"

PRIORITIES: tuple[Priority, ...] = ("low", "normal", "high", "critical")
TOPOLOGY_REQUIREMENTS: tuple[TopologyRequirement, ...] = ("any", "numa", "nvlink", "node")


@dataclass(frozen=True, slots=True)
class MigSlot:
    """One MIG device (a compute instance filling its GPU instance) on a MIG-mode GPU."""

    id: int
    gpu_id: int
    uuid: str
    profile: str  # GPU instance profile, e.g. "3g.40gb"
    placement_start: int
    placement_size: int
    memory_mib: int
    allocated_to: int | None = None


@dataclass(frozen=True, slots=True)
class GpuSlot:
    """One whole GPU as the scheduler sees it.

    `memory_free_mib` is the live sample (the total when there is none). `nvlink_domain` names
    the set of GPUs joined by NVLink/NVSwitch (one per DGX, e.g. "dgx-a100-01/nvswitch"), None
    without NVLink. `unavailable` is None when schedulable, else a machine code, one of
    `inventory.usability.Reason` ("offline", "unreachable", "missing", "error", "draining",
    "held-outside", "mig", "foreign-process"). `allocated_to` is the running job's id.
    `held_outside` names the work outside gpuadmin holding it ("Slurm job 1234 on hpc"),
    for the waiting reason of the jobs it keeps out.
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
    # The pool its GPUs are shared by (None: no pool). A job runs only in its own pool.
    pool: str | None = None
    # Sharing. A MIG-mode GPU (unavailable == "mig") takes MIG jobs on its free devices, or,
    # when its pool allows dynamic MIG and it has none in use, on new ones the loop creates
    # (`mig_table` names the GPU's MIG placement rules: inventory.nvml.mig_catalog). An MPS
    # GPU (unavailable == "mps") takes MPS shares up to 100 % of its SMs and its memory.
    mig_slots: tuple[MigSlot, ...] = ()
    mig_table: str | None = None
    mps_used_percent: int = 0
    mps_used_memory_mib: int = 0
    mps_jobs: tuple[int, ...] = ()
    held_outside: str = ""

    @property
    def held_as(self) -> str | None:
        """The kind of the work on it now: "gpu" (a job holds it whole), "mig" (a job holds a
        MIG device of it), "mps" (shares of it), None when idle. Its allocations are of one
        kind (the database's sharing trigger), so a grant of another kind waits until they
        end, whatever mode the GPU was switched to meanwhile."""
        if self.allocated_to is not None:
            return "gpu"
        if any(slot.allocated_to is not None for slot in self.mig_slots):
            return "mig"
        return "mps" if self.mps_jobs else None


@dataclass(frozen=True, slots=True)
class NodeInfo:
    """A node's administrative state; only online, reachable nodes receive work."""

    hostname: str
    state: NodeState = "online"
    reachable: bool = True
    # What jobs may be given of the host (its total less what is reserved); None: not known,
    # then not a limit.
    cpus: int | None = None
    memory_mib: int | None = None

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
    pool: str | None = None
    project: str = ""
    # Sharing (then gpus_per_node == node_count == 1): a MIG device of this profile, or an
    # MPS share of `mps_percent` % of one GPU's SMs and `mps_memory_mib` of its memory.
    mig_profile: str | None = None
    mps_percent: int | None = None
    mps_memory_mib: int | None = None
    reservation: int | None = None  # runs only on this reservation's GPUs, in its window
    array: int | None = None  # its JobArray: Snapshot.array_limits caps its running tasks
    attained_service_s: float = 0.0  # GPU-seconds its earlier attempts ran (LAS)
    queued_at: float | None = None  # when its last attempt ended (None: never ran; LAS)
    # Its runtime as history predicts it (scheduling.placement.predict; None: nothing known).
    predicted_runtime_s: float | None = None
    # Host resources on each of its nodes (0: none asked).
    cpus: int = 0
    host_memory_mib: int = 0

    def __post_init__(self) -> None:
        if self.priority not in PRIORITIES:
            raise ValueError(f"job {self.id}: unknown priority {self.priority!r}")
        if self.topology not in TOPOLOGY_REQUIREMENTS:
            raise ValueError(f"job {self.id}: unknown topology {self.topology!r}")
        if self.gpus_per_node < 1 or self.node_count < 1:
            raise ValueError(f"job {self.id}: needs gpus_per_node >= 1 and node_count >= 1")
        if min(self.min_memory_mib, self.cpus, self.host_memory_mib) < 0:
            raise ValueError(
                f"job {self.id}: min_memory_mib, cpus and host_memory_mib must be >= 0"
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

    @property
    def likely_runtime_s(self) -> float | None:
        """How long the job will likely hold its GPUs, for backfill and QSSF: the user's
        estimate, else the prediction from history (never beyond the maximum runtime), else
        the maximum runtime; None when nothing is known."""
        if self.estimated_duration_s is not None:
            return self.estimated_duration_s
        predicted = self.predicted_runtime_s
        if predicted is None:
            return self.max_runtime_s
        if self.max_runtime_s is not None:
            return min(predicted, self.max_runtime_s)
        return predicted


@dataclass(frozen=True, slots=True)
class RunningJob:
    """A job holding GPUs; `expected_end` (epoch seconds: its start plus the user's estimate,
    else its maximum runtime) is None when nobody knows. `predicted_end` is its start plus the
    runtime history predicted for it, set only when its user gave no estimate; backfill
    reads both through `predict.release_at`.

    The rest is what preemption and quotas read: who it belongs to, whether it may be
    preempted (`borrowed`: placed over quota, reclaimed first), and whether a preemption is
    already under way (`stopping`: its GPUs free up within the grace)."""

    id: int
    gpu_ids: tuple[int, ...]
    started_at: float
    expected_end: float | None = None
    predicted_end: float | None = None
    owner: str = ""
    project: str = ""
    pool: str | None = None
    priority: Priority = "normal"
    submitted_at: float = 0.0
    preemptible: bool = False
    borrowed: bool = False
    stopping: bool = False
    array: int | None = None
    attained_service_s: float = 0.0  # GPU-seconds its earlier attempts ran (LAS)
    # Host resources it holds on each node of its GPUs.
    cpus: int = 0
    host_memory_mib: int = 0

    def service_s(self, now: float) -> float:
        """GPU-seconds it has attained by `now`: its earlier attempts' and this one's (each
        GPU it holds counts whole)."""
        return self.attained_service_s + max(0.0, now - self.started_at) * len(self.gpu_ids)


@dataclass(frozen=True, slots=True)
class PoolConfig:
    """One pool's policy (scheduling.models.PoolPolicy as plain values)."""

    policy: PolicyName = DEFAULT_POLICY
    backfill: bool = True
    aging_interval_s: float = 60.0
    fairshare_half_life_s: float = 7 * 24 * 3600.0
    fairshare_weight: float = 10_000.0
    las_thresholds_gpu_s: tuple[float, ...] = (3600.0, 36_000.0)
    allow_borrowing: bool = True
    preemption: bool = True
    # A job is not preempted for priority, share or attained service before it has run this
    # long since its latest start (Slurm's PreemptExemptTime); borrowed GPUs are reclaimed
    # at once.
    preempt_exempt_s: float = 0.0
    # A run is stopped for less attained service only after this long since its latest start
    # (seconds). A job resumed into GPUs a top-queue job cannot use yet would otherwise be
    # stopped the moment that job fits: on Philly at 30 %, 48 % of the default's stops came
    # within 10 minutes of a start.
    las_min_run_s: float = 600.0
    dynamic_mig: bool = False
    # qssf: points (aging intervals) a job gains per halving of its likely GPU-service.
    qssf_points_per_halving: float = 250.0
    # Backfill: a runtime only predicted lets a job onto the head's GPUs while the head has
    # waited fewer than this many aging intervals (math.inf: always).
    prediction_trust_intervals: float = 360.0


@dataclass(frozen=True, slots=True)
class QuotaLimit:
    """A user's or a project's quota in one pool, with what it uses now.

    `holder` is ("user", owner id as text) or ("project", name). None limits: no limit.
    `gpus_in_use` counts whole-GPU equivalents held now; `gpu_hours_used` this period."""

    pool: str | None
    holder: tuple[Literal["user", "project"], str]
    max_gpus: float | None = None
    gpu_hours: float | None = None
    gpus_in_use: float = 0.0
    gpu_hours_used: float = 0.0
    fairshare_weight: float = 1.0
    # For messages: the holder's display name (a username; holder[1] when empty) and the
    # period `gpu_hours` is counted over.
    name: str = ""
    period: Literal["day", "week", "month"] = "month"

    @property
    def gpu_hours_left(self) -> float | None:
        """GPU-hours left this period (None without a GPU-hour limit)."""
        return None if self.gpu_hours is None else max(self.gpu_hours - self.gpu_hours_used, 0.0)


@dataclass(frozen=True, slots=True)
class ReservationWindow:
    """GPUs an approved reservation holds for [start, end) (epoch seconds). Only the
    holder's jobs naming it may run on them inside it; no other job may still hold them at
    `start` (by its maximum runtime)."""

    id: int
    owner: str
    gpu_ids: tuple[int, ...]
    start: float
    end: float


@dataclass(frozen=True, slots=True)
class Snapshot:
    """Everything one pass reads, taken at `now` (epoch seconds). Every GpuSlot.node must be
    the hostname of a NodeInfo."""

    now: float
    nodes: tuple[NodeInfo, ...]
    gpus: tuple[GpuSlot, ...]
    running: tuple[RunningJob, ...] = ()
    queue: tuple[JobRequest, ...] = ()
    # By pool name (None: the GPUs in no pool); a pool not listed uses PoolConfig().
    pools: Mapping[str | None, PoolConfig] = field(default_factory=lambda: MappingProxyType({}))
    quotas: tuple[QuotaLimit, ...] = ()
    # Fair share: decayed GPU-seconds per (pool, holder), holder as in QuotaLimit.
    usage: Mapping[tuple[str | None, tuple[str, str]], float] = field(
        default_factory=lambda: MappingProxyType({})
    )
    reservations: tuple[ReservationWindow, ...] = ()
    # Job arrays with a cap: array id -> tasks that may run at once.
    array_limits: Mapping[int, int] = field(default_factory=lambda: MappingProxyType({}))
