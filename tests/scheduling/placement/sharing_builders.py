"""MIG-mode and MPS GPUs for the sharing tests, built in plain Python (no database).

MIG layouts are checked against the simulator's own MIG rules (`inventory.nvml.sim.mig`) as
they are built, so a test can only describe a layout a real GPU could have.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from inventory.nvml.mig_catalog import MigTable, load_table
from inventory.nvml.sim import mig as sim_mig
from scheduling.placement import (
    GpuSlot,
    JobRequest,
    MigCreate,
    MigSlot,
    NodeInfo,
    NodeState,
    Pending,
    Placement,
    PoolConfig,
    ReservationWindow,
    RunningJob,
    Snapshot,
)
from scheduling.placement.sharing import Packing, SharingPass
from tests.scheduling.placement.builders import A100_40, A100_80, H100, MEMORY, NOW

TABLES = {A100_40: "a100-sxm4-40gb", A100_80: "a100-sxm4-80gb", H100: "h100-sxm5-80gb"}

# A MIG device in a layout: (profile, placement start) free, or (profile, start, job id) busy.
Device = tuple[str, int] | tuple[str, int, int]


def table_of(model: str) -> MigTable:
    return load_table(TABLES[model])


def sim_block(table: MigTable, devices: Iterable[tuple[str, int]]) -> dict[str, Any]:
    """The simulator's MIG state of a GPU with these GPU instances (raises on a layout NVML
    refuses)."""
    block: dict[str, Any] = {"current": True, "instances": []}
    for profile, start in devices:
        sim_mig.create_gpu_instance(table, block, table.by_name(profile).id, start)
    return block


@dataclass
class Shares:
    """Nodes created on first use; GPU ids, MIG device ids and running job ids handed out in
    order."""

    nodes: dict[str, NodeInfo] = field(default_factory=dict)
    gpus: list[GpuSlot] = field(default_factory=list)
    running: dict[int, RunningJob] = field(default_factory=dict)
    pools: dict[str | None, PoolConfig] = field(default_factory=dict)
    queue: list[JobRequest] = field(default_factory=list)
    ends: dict[int, float | None] = field(default_factory=dict)
    reservations: list[ReservationWindow] = field(default_factory=list)

    def node(self, hostname: str, state: NodeState = "online", reachable: bool = True) -> None:
        self.nodes[hostname] = NodeInfo(hostname, state, reachable)

    def _gpu(self, hostname: str, model: str, **fields: Any) -> GpuSlot:
        if hostname not in self.nodes:
            self.node(hostname)
        index = sum(gpu.node == hostname for gpu in self.gpus)
        gpu_id = len(self.gpus) + 1
        gpu = GpuSlot(
            id=gpu_id,
            uuid=f"GPU-{hostname}-{index}",
            node=hostname,
            index=index,
            model=model,
            memory_total_mib=MEMORY[model],
            memory_free_mib=MEMORY[model],
            **fields,
        )
        self.gpus.append(gpu)
        return gpu

    def whole(self, hostname: str, model: str = A100_80, *, pool: str | None = None) -> GpuSlot:
        """A GPU that takes whole-GPU jobs only."""
        return self._gpu(hostname, model, pool=pool)

    def mig(
        self,
        hostname: str,
        devices: Sequence[Device] = (),
        model: str = A100_40,
        *,
        pool: str | None = None,
        unavailable: str = "mig",
    ) -> GpuSlot:
        """A MIG-mode GPU with these devices (ids 1000 + n); a busy device's job runs until
        `self.ends[job]` (default: unknown)."""
        table = table_of(model)
        sim_block(table, [(d[0], d[1]) for d in devices])
        first_slot = 1000 + sum(len(gpu.mig_slots) for gpu in self.gpus)
        gpu = self._gpu(hostname, model, pool=pool, unavailable=unavailable)
        slots = []
        for n, device in enumerate(devices):
            profile = table.by_name(device[0])
            holder = device[2] if len(device) == 3 else None
            slots.append(
                MigSlot(
                    id=first_slot + n,
                    gpu_id=gpu.id,
                    uuid=f"MIG-{gpu.uuid}-{n}",
                    profile=profile.name,
                    placement_start=device[1],
                    placement_size=profile.memory_slices,
                    memory_mib=profile.memory_mib,
                    allocated_to=holder,
                )
            )
            if holder is not None:
                self._hold(holder, gpu.id)
        gpu = replace(gpu, mig_slots=tuple(slots), mig_table=table.name)
        self.gpus[-1] = gpu
        return gpu

    def mps(
        self,
        hostname: str,
        shares: Sequence[tuple[int, int, int]] = (),
        model: str = A100_80,
        *,
        pool: str | None = None,
        unavailable: str = "mps",
    ) -> GpuSlot:
        """An MPS GPU with `shares` of (job id, percent, memory MiB)."""
        gpu = self._gpu(
            hostname,
            model,
            pool=pool,
            unavailable=unavailable,
            mps_used_percent=sum(percent for _, percent, _ in shares),
            mps_used_memory_mib=sum(memory for *_, memory in shares),
            mps_jobs=tuple(job_id for job_id, *_ in shares),
        )
        for job_id, *_ in shares:
            self._hold(job_id, gpu.id)
        return gpu

    def _hold(self, job_id: int, gpu_id: int) -> None:
        held = self.running[job_id].gpu_ids if job_id in self.running else ()
        self.running[job_id] = RunningJob(job_id, (*held, gpu_id), NOW - 600, None)

    def snapshot(self, *jobs: JobRequest) -> Snapshot:
        running = tuple(
            replace(job, expected_end=self.ends.get(job.id)) for job in self.running.values()
        )
        return Snapshot(
            NOW,
            tuple(self.nodes.values()),
            tuple(self.gpus),
            running,
            tuple(self.queue) + jobs,
            pools=dict(self.pools),
            reservations=tuple(self.reservations),
        )

    def sharing(self, *jobs: JobRequest, packing: Packing = "fragmentation") -> SharingPass:
        return SharingPass(self.snapshot(*jobs), packing=packing)

    def place(
        self, *jobs: JobRequest, packing: Packing = "fragmentation"
    ) -> tuple[SharingPass, list[Placement | MigCreate | None]]:
        """One pass placing `jobs` in order (they are its queue)."""
        sharing = self.sharing(*jobs, packing=packing)
        return sharing, [sharing.place(job) for job in jobs]

    def pending(self, *jobs: JobRequest) -> Pending:
        """Why the last of `jobs` waits after the others were placed."""
        sharing, results = self.place(*jobs)
        assert not isinstance(results[-1], Placement), results[-1]
        return sharing.explain(jobs[-1], 1)

    def gpu(self, gpu_id: int) -> GpuSlot:
        [gpu] = [gpu for gpu in self.gpus if gpu.id == gpu_id]
        return gpu

    def slot(self, slot_id: int) -> MigSlot:
        [slot] = [slot for gpu in self.gpus for slot in gpu.mig_slots if slot.id == slot_id]
        return slot


def share_job(job_id: int, **fields: Any) -> JobRequest:
    return JobRequest(
        id=job_id,
        owner="alice",
        priority="normal",
        submitted_at=NOW - 10_000 + job_id,
        gpus_per_node=1,
        **fields,
    )


def mig_job(job_id: int, profile: str, **fields: Any) -> JobRequest:
    return share_job(job_id, mig_profile=profile, **fields)


def mps_job(job_id: int, percent: int, memory_mib: int = 0, **fields: Any) -> JobRequest:
    return share_job(job_id, mps_percent=percent, mps_memory_mib=memory_mib, **fields)
