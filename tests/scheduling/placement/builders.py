"""Small fleets and jobs for placement tests, built in plain Python (no database)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from scheduling.placement import (
    Fcfs,
    GpuSlot,
    JobRequest,
    NodeInfo,
    NodeState,
    PassResult,
    Pending,
    Placement,
    Policy,
    RunningJob,
    Snapshot,
    plan,
)

NOW = 1_700_000_000.0
A100_40 = "NVIDIA A100-SXM4-40GB"
A100_80 = "NVIDIA A100-SXM4-80GB"
H100 = "NVIDIA H100 80GB HBM3"
MEMORY = {A100_40: 40_960, A100_80: 81_920, H100: 81_559}
GB = 1024
# GPU index -> NUMA node. DGX A100: NUMA 0-3 are socket 0, 4-7 socket 1; DGX H100: NUMA n is
# socket n.
DGX_A100_NUMA = (3, 3, 1, 1, 7, 7, 5, 5)
DGX_H100_NUMA = (0, 0, 0, 0, 1, 1, 1, 1)


@dataclass
class Fleet:
    """Nodes added one by one; GPU ids are handed out in order from 1."""

    nodes: list[NodeInfo] = field(default_factory=list)
    gpus: list[GpuSlot] = field(default_factory=list)
    running: list[RunningJob] = field(default_factory=list)

    def dgx(
        self,
        hostname: str,
        model: str = A100_80,
        *,
        busy: Iterable[int] = (),
        busy_until: float | None = None,
        state: NodeState = "online",
        reachable: bool = True,
        broken: Iterable[int] = (),
        pool: str | None = None,
    ) -> list[GpuSlot]:
        """A DGX: 8 GPUs in one NVSwitch domain with the real NUMA/socket layout. `busy` GPU
        indexes are held by one running job until `busy_until`; `broken` ones report "error";
        its GPUs are in `pool`."""
        numa = DGX_H100_NUMA if model == H100 else DGX_A100_NUMA
        return self.machine(
            hostname,
            model,
            numa=numa,
            sockets=list(numa) if model == H100 else [n // 4 for n in numa],
            nvlink=[f"{hostname}/nvswitch"] * 8,
            busy=busy,
            busy_until=busy_until,
            state=state,
            reachable=reachable,
            broken=broken,
            pool=pool,
        )

    def machine(
        self,
        hostname: str,
        model: str,
        *,
        numa: Sequence[int | None],
        sockets: Sequence[int | None],
        nvlink: Sequence[str | None],
        busy: Iterable[int] = (),
        busy_until: float | None = None,
        state: NodeState = "online",
        reachable: bool = True,
        broken: Iterable[int] = (),
        memory_free: dict[int, int] | None = None,
        pool: str | None = None,
    ) -> list[GpuSlot]:
        """Any machine: one entry per GPU index in `numa`, `sockets` and `nvlink`."""
        self.nodes.append(NodeInfo(hostname, state, reachable))
        broken = set(broken)
        gpus = [
            GpuSlot(
                id=len(self.gpus) + index + 1,
                uuid=f"GPU-{hostname}-{index}",
                node=hostname,
                index=index,
                model=model,
                memory_total_mib=MEMORY[model],
                memory_free_mib=(memory_free or {}).get(index, MEMORY[model]),
                numa_node=numa[index],
                socket=sockets[index],
                nvlink_domain=nvlink[index],
                unavailable="error" if index in broken else None,
                pool=pool,
            )
            for index in range(len(numa))
        ]
        self.gpus += gpus
        busy = list(busy)
        if busy:
            self.run(hostname, busy, busy_until)
        return gpus

    def run(
        self, hostname: str, busy: Iterable[int], until: float | None, **fields: Any
    ) -> RunningJob:
        """A running job (ids from 900) holding GPUs `busy` of `hostname` until `until`,
        submitted and started 10 minutes ago (after every `job`), with any other RunningJob
        `fields` (owner, priority, preemptible ...)."""
        job_id = 900 + len(self.running)
        busy = set(busy)
        held = []
        for position, gpu in enumerate(self.gpus):
            if gpu.node == hostname and gpu.index in busy:
                self.gpus[position] = replace(gpu, allocated_to=job_id)
                held.append(gpu.id)
        running = RunningJob(job_id, tuple(held), NOW - 600, until, submitted_at=NOW - 600)
        self.running.append(replace(running, **fields))
        return self.running[-1]

    def pcie(self, hostname: str, model: str = A100_80, **options: Any) -> list[GpuSlot]:
        """A PCIe box without NVLink: 8 GPUs, NUMA 0,0,1,1,2,2,3,3, sockets 0,0,0,0,1,1,1,1."""
        return self.machine(
            hostname,
            model,
            numa=[i // 2 for i in range(8)],
            sockets=[i // 4 for i in range(8)],
            nvlink=[None] * 8,
            **options,
        )

    def snapshot(self, *jobs: JobRequest, **fields: Any) -> Snapshot:
        """A snapshot of the fleet with `jobs` queued and any other Snapshot `fields`."""
        snapshot = Snapshot(NOW, tuple(self.nodes), tuple(self.gpus), tuple(self.running), jobs)
        return replace(snapshot, **fields)

    def plan(self, *jobs: JobRequest, policy: Policy | None = None, **fields: Any) -> PassResult:
        """One pass, FCFS unless `policy` or `fields` name pools (then each pool's policy)."""
        if policy is None and "pools" not in fields:
            policy = Fcfs()
        return plan(self.snapshot(*jobs, **fields), policy)


def job(job_id: int, gpus: int = 1, nodes: int = 1, **fields: Any) -> JobRequest:
    """A normal-priority job submitted in id order, `gpus` per node on `nodes` nodes."""
    request = JobRequest(
        id=job_id,
        owner="alice",
        priority="normal",
        submitted_at=NOW - 10_000 + job_id,
        gpus_per_node=gpus,
        node_count=nodes,
    )
    return replace(request, **fields)


def placed(result: PassResult, job_id: int) -> Placement:
    [placement] = [p for p in result.placements if p.job_id == job_id]
    return placement


def pending(result: PassResult, job_id: int) -> Pending:
    [waiting] = [p for p in result.pending if p.job_id == job_id]
    return waiting


def indexes(fleet: Fleet, placement: Placement) -> dict[str, list[int]]:
    """GPU indexes per hostname, the way people read a placement."""
    by_id = {gpu.id: gpu for gpu in fleet.gpus}
    return {host: [by_id[i].index for i in ids] for host, ids in placement.by_node}
