"""Generated fleets and queues of MIG and MPS jobs (hypothesis): the sharing rules hold for
every one, under every packing.

MIG layouts are grown through the simulator's own MIG rules, and every instance the pass asks
to create is replayed on the simulator, which refuses what NVML would refuse.
"""

from __future__ import annotations

from collections import defaultdict
from random import Random

import pynvml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from inventory.nvml.sim import mig as sim_mig
from scheduling.placement import (
    JobRequest,
    MigCreate,
    Placement,
    PoolConfig,
    Reason,
    Snapshot,
)
from scheduling.placement.sharing import PACKINGS, SharingPass
from tests.scheduling.placement.builders import A100_40, A100_80, GB, H100, NOW
from tests.scheduling.placement.sharing_builders import (
    Shares,
    mig_job,
    mps_job,
    sim_block,
    table_of,
)

MODELS = (A100_40, A100_80, H100)
POOLS = (None, "a", "b")
PROFILES = sorted({p.name for model in MODELS for p in table_of(model).profiles})
PASSES = settings(
    max_examples=200,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
WAITING = {
    Reason.SHARE_UNAVAILABLE,
    Reason.MODEL,
    Reason.MEMORY,
    Reason.NODES_UNAVAILABLE,
    Reason.MIG_RECONFIGURING,
}


def random_fleet(rng: Random) -> Shares:
    fleet = Shares(pools={pool: PoolConfig(dynamic_mig=rng.random() < 0.6) for pool in POOLS})
    job_ids = iter(range(900, 10_000))
    for n in range(rng.randint(1, 5)):
        hostname = f"node-{n}"
        fleet.node(
            hostname,
            rng.choices(("online", "draining", "offline"), (8, 1, 1))[0],
            reachable=rng.random() > 0.05,
        )
        for _ in range(rng.randint(1, 4)):
            pool = rng.choice(POOLS)
            unavailable = rng.choices(("share", "error", "offline"), (8, 1, 1))[0]
            model = rng.choice(MODELS)
            if rng.random() < 0.5:
                devices = random_layout(rng, model, job_ids)
                kind = "mig" if unavailable == "share" else unavailable
                fleet.mig(hostname, devices, model, pool=pool, unavailable=kind)
            else:
                shares = []
                used = 0
                while rng.random() < 0.6:
                    percent = rng.randint(1, 60)
                    if used + percent > 100:
                        break
                    used += percent
                    shares.append((next(job_ids), percent, rng.choice((0, 5 * GB, 10 * GB))))
                kind = "mps" if unavailable == "share" else unavailable
                fleet.mps(hostname, shares, model, pool=pool, unavailable=kind)
    fleet.ends = {
        job_id: rng.choice((None, NOW + rng.randint(60, 7200))) for job_id in fleet.running
    }
    return fleet


def random_layout(
    rng: Random, model: str, job_ids: object
) -> list[tuple[str, int] | tuple[str, int, int]]:
    """Devices grown one by one where the simulator accepts them; some busy."""
    table = table_of(model)
    block = sim_block(table, [])
    for _ in range(rng.randint(0, 7)):
        profile = rng.choice(table.profiles)
        try:
            sim_mig.create_gpu_instance(table, block, profile.id, rng.choice(profile.placements))
        except pynvml.NVMLError:
            continue
    devices: list[tuple[str, int] | tuple[str, int, int]] = []
    for gi in block["instances"]:
        name = table.by_id(gi["profile_id"]).name  # type: ignore[union-attr]
        if rng.random() < 0.4:
            devices.append((name, gi["start"], next(job_ids)))  # type: ignore[call-overload]
        else:
            devices.append((name, gi["start"]))
    return devices


def random_jobs(rng: Random) -> list[JobRequest]:
    jobs = []
    for job_id in range(1, rng.randint(1, 40)):
        pool = rng.choice(POOLS)
        model = rng.choice((None, None, *MODELS))
        if rng.random() < 0.5:
            jobs.append(mig_job(job_id, rng.choice(PROFILES), pool=pool, gpu_model=model))
        else:
            memory = rng.choice((0, 0, 10 * GB, 40 * GB, 100 * GB))
            percent = rng.choice((5, 10, 25, 30, 50, 70, 100))
            jobs.append(mps_job(job_id, percent, memory, pool=pool, gpu_model=model))
    return jobs


class Checker:
    """Replays a pass's decisions against the snapshot and the simulator's MIG rules."""

    def __init__(self, snapshot: Snapshot) -> None:
        self.snapshot = snapshot
        self.gpus = {gpu.id: gpu for gpu in snapshot.gpus}
        up = {node.hostname for node in snapshot.nodes if node.schedulable}
        self.usable = {gpu.id for gpu in snapshot.gpus if gpu.node in up}
        self.taken_slots: set[int] = set()
        self.worked: set[int] = {  # GPUs with work on them: no reconfiguring
            gpu.id for gpu in snapshot.gpus if any(s.allocated_to for s in gpu.mig_slots)
        }
        self.created: set[int] = set()
        self.mps_percent = {gpu.id: gpu.mps_used_percent for gpu in snapshot.gpus}
        self.mps_memory = {gpu.id: gpu.mps_used_memory_mib for gpu in snapshot.gpus}

    def eligible(self, job: JobRequest, mode: str) -> list[int]:
        return [
            gpu.id
            for gpu in self.snapshot.gpus
            if gpu.id in self.usable
            and gpu.unavailable == mode
            and gpu.pool == job.pool
            and job.gpu_model in (None, gpu.model)
        ]

    def free_slots(self, job: JobRequest) -> list[int]:
        return [
            slot.id
            for gpu_id in self.eligible(job, "mig")
            if gpu_id not in self.created
            for slot in self.gpus[gpu_id].mig_slots
            if slot.profile == job.mig_profile
            and slot.allocated_to is None
            and slot.id not in self.taken_slots
        ]

    def creatable(self, job: JobRequest, gpu_id: int, start: int) -> bool:
        gpu = self.gpus[gpu_id]
        if gpu_id in self.worked or gpu_id in self.created or gpu.mig_table is None:
            return False
        if not self.snapshot.pools[job.pool].dynamic_mig:
            return False
        table = table_of(gpu.model)
        block = sim_block(table, [(s.profile, s.placement_start) for s in gpu.mig_slots])
        try:
            profile = table.by_name(job.mig_profile or "")
            sim_mig.create_gpu_instance(table, block, profile.id, start)
        except (pynvml.NVMLError, ValueError):
            return False
        return True

    def check(self, job: JobRequest, result: Placement | MigCreate | None) -> None:
        if job.mig_profile:
            self.check_mig(job, result)
        else:
            self.check_mps(job, result)

    def check_mig(self, job: JobRequest, result: Placement | MigCreate | None) -> None:
        free = self.free_slots(job)
        if isinstance(result, Placement):
            [gpu_id] = result.gpu_ids
            assert result.mig_slot in free, "a free device of its profile, in its pool"
            self.taken_slots.add(result.mig_slot)
            self.worked.add(gpu_id)
        elif isinstance(result, MigCreate):
            assert not free, "a free device is used before an instance is created"
            assert result.gpu_id in self.eligible(job, "mig")
            assert self.creatable(job, result.gpu_id, result.placement_start)
            self.created.add(result.gpu_id)
        else:
            assert not free
            assert not any(
                self.creatable(job, gpu_id, start)
                for gpu_id in self.eligible(job, "mig")
                for start in range(8)
            ), "an instance could have been created"

    def check_mps(self, job: JobRequest, result: Placement | MigCreate | None) -> None:
        percent, memory = job.mps_percent or 0, job.mps_memory_mib or 0

        def fits(gpu_id: int) -> bool:
            total = self.gpus[gpu_id].memory_total_mib
            return (
                self.mps_percent[gpu_id] + percent <= 100
                and self.mps_memory[gpu_id] + memory <= total
            )

        assert not isinstance(result, MigCreate)
        eligible = self.eligible(job, "mps")
        if result is None:
            assert not any(fits(gpu_id) for gpu_id in eligible)
            return
        [gpu_id] = result.gpu_ids
        assert gpu_id in eligible and fits(gpu_id)
        assert (result.mps_percent, result.mps_memory_mib) == (percent, memory)
        self.mps_percent[gpu_id] += percent
        self.mps_memory[gpu_id] += memory
        assert self.mps_percent[gpu_id] <= 100


@PASSES
@given(st.randoms(use_true_random=False), st.sampled_from(PACKINGS))
def test_every_decision_is_valid_and_nothing_that_fits_is_turned_down(
    rng: Random, packing: str
) -> None:
    fleet = random_fleet(rng)
    jobs = random_jobs(rng)
    snapshot = fleet.snapshot(*jobs)
    sharing = SharingPass(snapshot, packing=packing)  # type: ignore[arg-type]
    checker = Checker(snapshot)
    results = []
    for job in jobs:
        result = sharing.place(job)
        checker.check(job, result)
        results.append(result)
    # At most one instance per GPU, and never one on a GPU that was given work.
    creates = [r for r in results if isinstance(r, MigCreate)]
    assert len({c.gpu_id for c in creates}) == len(creates)
    given_gpus = {r.gpu_ids[0] for r in results if isinstance(r, Placement) and r.mig_slot}
    assert not given_gpus & {c.gpu_id for c in creates}
    # Every job left waiting is explained.
    for position, (job, result) in enumerate(zip(jobs, results, strict=True), start=1):
        if isinstance(result, Placement):
            continue
        waiting = sharing.explain(job, position)
        assert (waiting.job_id, waiting.position) == (job.id, position)
        assert waiting.reason in WAITING and waiting.message
        assert (waiting.reason == Reason.MIG_RECONFIGURING) == isinstance(result, MigCreate)
        assert waiting.estimated_start is None or waiting.estimated_start >= NOW


@PASSES
@given(st.randoms(use_true_random=False))
def test_the_same_snapshot_gives_the_same_decisions(rng: Random) -> None:
    fleet = random_fleet(rng)
    jobs = random_jobs(rng)
    first = SharingPass(fleet.snapshot(*jobs))
    decisions = [first.place(job) for job in jobs]
    rng.shuffle(fleet.gpus)
    second = SharingPass(fleet.snapshot(*jobs))
    assert [second.place(job) for job in jobs] == decisions


@PASSES
@given(st.randoms(use_true_random=False))
def test_mps_never_passes_100_percent_under_many_jobs(rng: Random) -> None:
    fleet = Shares()
    for n in range(rng.randint(1, 6)):
        fleet.mps(f"node-{n}", [(900 + n, rng.randint(0, 100), 0)])
    jobs = [mps_job(i, rng.randint(1, 100), rng.choice((0, GB, 20 * GB))) for i in range(1, 200)]
    sharing, results = fleet.place(*jobs)
    used: dict[int, int] = defaultdict(int)
    memory: dict[int, int] = defaultdict(int)
    for gpu in fleet.gpus:
        used[gpu.id] = gpu.mps_used_percent
    for job, result in zip(jobs, results, strict=True):
        if isinstance(result, Placement):
            used[result.gpu_ids[0]] += job.mps_percent or 0
            memory[result.gpu_ids[0]] += job.mps_memory_mib or 0
    assert all(percent <= 100 for percent in used.values())
    assert all(mib <= fleet.gpu(gpu_id).memory_total_mib for gpu_id, mib in memory.items())
    # A job turned down had no GPU with room for it at that point; at the end, the measure is
    # never negative.
    assert sharing.unusable_gpus() >= 0
