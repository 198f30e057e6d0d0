"""What gpuadmin reads of a Slurm cluster, whatever slurmrestd version said it.

GPU indexes are Slurm's: the devices' minor numbers (``/dev/nvidia<N>`` of ``gres.conf``'s
``File=``), not NVML's indexes; the catalog maps them to GPUs by ``Gpu.minor_number``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime

# A job holds the GPUs of its ``gpus`` while it runs, is suspended (its processes and their GPU
# memory stay) or completes (its epilog runs): one of these base states, or the COMPLETING
# flag. Slurm's answer may still list a finished job's GPUs; they are free.
HOLDING_STATES = ("RUNNING", "SUSPENDED", "COMPLETING")
HOLDING_FLAG = "COMPLETING"


def holds_gpus(state: str, flags: tuple[str, ...] | list[str]) -> bool:
    """Whether a job of this base state and these flags holds its GPUs (``HOLDING_STATES``)."""
    return state in HOLDING_STATES or HOLDING_FLAG in flags


@dataclass(frozen=True)
class SlurmNode:
    name: str
    # Slurm's base state and its flags, upper case: ("IDLE",), ("MIXED", "DRAIN"), ("DOWN",
    # "NOT_RESPONDING"): v0.0.38 gives ``state`` and ``state_flags``, v0.0.40+ one list.
    states: tuple[str, ...]
    reason: str = ""
    reason_set_by: str = ""
    reason_changed_at: datetime | None = None
    partitions: tuple[str, ...] = ()
    cpus: int = 0
    alloc_cpus: int = 0
    real_memory_mib: int = 0
    alloc_memory_mib: int = 0
    gpus: int = 0  # GPUs declared as GRES (``gres``: gpu:8, gpu:a100:8)
    gpus_used: tuple[int, ...] = ()  # indexes in use (``gres_used``: gpu:2(IDX:0-1))


@dataclass(frozen=True)
class SlurmPartition:
    name: str
    nodes: tuple[str, ...]
    state: str = "UP"
    total_cpus: int = 0
    total_nodes: int = 0


@dataclass(frozen=True)
class SlurmJob:
    job_id: int
    name: str
    user: str
    # Slurm's base state, upper case (PENDING, RUNNING, COMPLETED, ...), and its flags.
    state: str
    state_flags: tuple[str, ...] = ()
    reason: str = ""  # state_reason: Priority, Resources, ... ("None" read as "")
    partition: str = ""
    account: str = ""
    nodes: tuple[str, ...] = ()
    # GPU indexes (minor numbers) held on each node, from gres_detail: {"n1": (0, 1)}
    gpus: dict[str, tuple[int, ...]] = field(default_factory=dict)
    gpus_requested: int = 0  # GPUs asked for in all (tres_per_*, tres_req_str)
    cpus: int = 0
    array_job_id: int | None = None
    array_task_id: int | None = None
    submit_time: datetime | None = None
    start_time: datetime | None = None  # of a pending job: Slurm's expected start, if any
    end_time: datetime | None = None
    time_limit_min: int | None = None  # None: unlimited

    @property
    def holds_gpus(self) -> bool:
        """It holds its ``gpus`` now (``HOLDING_STATES``)."""
        return holds_gpus(self.state, self.state_flags)


@dataclass(frozen=True)
class ClusterState:
    """One poll's answer: what the server said, and the API version that said it."""

    version: str
    nodes: tuple[SlurmNode, ...]
    partitions: tuple[SlurmPartition, ...]
    jobs: tuple[SlurmJob, ...]
