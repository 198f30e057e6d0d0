"""Generated snapshots and queues (hypothesis): the invariants hold for every one.

A snapshot is built from a hypothesis-driven `Random` (`st.randoms()`), so a failure shrinks to
a small fleet and queue and hypothesis prints it. Fleets mix models, layouts, busy GPUs, nodes
that are draining, offline or unreachable, and GPUs that cannot take work (MIG mode, missing,
error, a foreign process).
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterable
from dataclasses import replace
from random import Random

import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from scheduling.placement import (
    Fcfs,
    GpuSlot,
    JobRequest,
    NodeInfo,
    PassResult,
    Pending,
    PlacementPass,
    PriorityWithAging,
    Reason,
    RunningJob,
    Snapshot,
    plan,
)
from scheduling.placement.fleet import Fleet
from scheduling.placement.topology import choose
from tests.scheduling.placement.builders import A100_40, A100_80, GB, H100, MEMORY, NOW

MODELS = (A100_40, A100_80, H100)
UNAVAILABLE = ("error", "missing", "mig", "foreign-process", "draining", "offline")
PASSES = settings(
    max_examples=150,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
TAKE = Fleet.take  # the real one, for the deliberately broken variants


def random_snapshot(rng: Random) -> Snapshot:
    nodes, gpus, running = [], [], []
    for n in range(rng.randint(1, 10)):
        hostname = f"node-{rng.randrange(1000):03d}-{n}"
        nodes.append(
            NodeInfo(
                hostname,
                rng.choices(("online", "draining", "offline"), (8, 1, 1))[0],
                reachable=rng.random() > 0.05,
            )
        )
        size = rng.choice((1, 2, 4, 8, 8, 8, 10))
        mixed = rng.random() < 0.1
        model = rng.choice(MODELS)
        layout = rng.choice(("dgx", "pcie", "bridged", "unknown"))
        sockets_known = rng.random() < 0.8
        holder = None
        for index in range(size):
            if rng.random() < 0.3:
                holder = 1 + len(running)
                end = None if rng.random() < 0.2 else NOW + rng.uniform(-600, 7200)
                running.append(RunningJob(holder, (), NOW - 60, end))
            elif rng.random() < 0.5:
                holder = None
            gpu_model = rng.choice(MODELS) if mixed else model
            numa = None if layout == "unknown" else index * 4 // size
            gpus.append(
                GpuSlot(
                    id=len(gpus) + 1,
                    uuid=f"GPU-{hostname}-{index}",
                    node=hostname,
                    index=index,
                    model=gpu_model,
                    memory_total_mib=MEMORY[gpu_model],
                    memory_free_mib=rng.choice((MEMORY[gpu_model], MEMORY[gpu_model], 8 * GB)),
                    numa_node=numa,
                    socket=None if numa is None or not sockets_known else numa // 2,
                    nvlink_domain={
                        "dgx": f"{hostname}/nvswitch",
                        "bridged": f"{hostname}/bridge-{index // 2}",
                    }.get(layout),
                    unavailable=rng.choice(UNAVAILABLE) if rng.random() < 0.08 else None,
                    allocated_to=holder,
                )
            )
    # Hand each running job the GPUs that name it.
    held = defaultdict(list)
    for gpu in gpus:
        if gpu.allocated_to is not None:
            held[gpu.allocated_to].append(gpu.id)
    running = [
        RunningJob(job.id, tuple(held[job.id]), job.started_at, job.expected_end)
        for job in running
        if held[job.id]
    ]
    queue = tuple(
        JobRequest(
            id=1000 + j,
            owner=f"user{rng.randrange(3)}",
            priority=rng.choice(("low", "normal", "high", "critical")),
            submitted_at=NOW - rng.uniform(0, 86_400),
            gpus_per_node=rng.choice((1, 1, 2, 2, 3, 4, 4, 8, 9)),
            node_count=rng.choice((1, 1, 1, 1, 2, 3)),
            min_memory_mib=rng.choice((0, 0, 0, 20 * GB, 70 * GB)),
            gpu_model=rng.choice((None, None, None, *MODELS, "NVIDIA B200")),
            topology=rng.choice(("any", "node", "numa", "nvlink")),
            estimated_duration_s=rng.choice((None, 600.0, 7200.0)),
        )
        for j in range(rng.randint(0, 40))
    )
    return Snapshot(NOW, tuple(nodes), tuple(gpus), tuple(running), queue)


def free_gpus(snapshot: Snapshot) -> dict[str, list[GpuSlot]]:
    """Placeable GPUs per hostname, by index."""
    schedulable = {node.hostname for node in snapshot.nodes if node.schedulable}
    free: dict[str, list[GpuSlot]] = defaultdict(list)
    for gpu in sorted(snapshot.gpus, key=lambda gpu: gpu.index):
        if gpu.node in schedulable and gpu.unavailable is None and gpu.allocated_to is None:
            free[gpu.node].append(gpu)
    return free


def eligible(job: JobRequest, gpus: list[GpuSlot]) -> list[GpuSlot]:
    return [
        gpu
        for gpu in gpus
        if gpu.memory_free_mib >= job.min_memory_mib and job.gpu_model in (None, gpu.model)
    ]


def fits(
    job: JobRequest, gpus: Iterable[GpuSlot], topology: str | None = None, by_total: bool = False
) -> bool:
    """Brute force: whether `job` fits `gpus` (the job's topology unless given; memory free,
    or total when `by_total`)."""
    key = {"numa": "numa_node", "nvlink": "nvlink_domain"}.get(topology or job.topology)
    if job.gpus_per_node == 1:
        key = None
    blocks: dict[str, Counter] = defaultdict(Counter)
    for gpu in gpus:
        memory = gpu.memory_total_mib if by_total else gpu.memory_free_mib
        group = None if key is None else getattr(gpu, key)
        if memory < job.min_memory_mib or job.gpu_model not in (None, gpu.model):
            continue
        if key is None or group is not None:
            blocks[gpu.node][group] += 1
    hosting = sum(max(groups.values()) >= job.gpus_per_node for groups in blocks.values())
    return hosting >= job.node_count


def check(snapshot: Snapshot, result: PassResult, order: list[JobRequest]) -> None:
    gpus = {gpu.id: gpu for gpu in snapshot.gpus}
    nodes = {node.hostname: node for node in snapshot.nodes}
    jobs = {job.id: job for job in snapshot.queue}
    placed = [p.job_id for p in result.placements]
    waiting = [p.job_id for p in result.pending]
    assert sorted(placed + waiting) == sorted(jobs)

    given = {gpu_id: p.job_id for p in result.placements for gpu_id in p.gpu_ids}
    assert len(given) == sum(len(p.gpu_ids) for p in result.placements), "a GPU was given twice"
    for placement in result.placements:
        job = jobs[placement.job_id]
        assert len(placement.nodes) == len(set(placement.nodes)) == job.node_count
        for hostname, ids in placement.by_node:
            assert nodes[hostname].schedulable
            assert len(ids) == job.gpus_per_node
            part = [gpus[i] for i in ids]
            for gpu in part:
                assert gpu.node == hostname
                assert gpu.unavailable is None and gpu.allocated_to is None
                assert gpu.memory_free_mib >= job.min_memory_mib
                assert job.gpu_model in (None, gpu.model)
            if job.topology == "numa" and len(part) > 1:
                assert len({gpu.numa_node for gpu in part}) == 1
                assert part[0].numa_node is not None
            if job.topology == "nvlink" and len(part) > 1:
                assert len({gpu.nvlink_domain for gpu in part}) == 1
                assert part[0].nvlink_domain is not None

    expected = [job.id for job in order if job.id in set(waiting)]
    assert [p.job_id for p in result.pending] == expected
    assert [p.position for p in result.pending] == list(range(1, len(waiting) + 1))
    for waiting_job in result.pending:
        check_pending(snapshot, given, waiting_job)


def check_pending(snapshot: Snapshot, given: dict[int, int], waiting: Pending) -> None:
    """The reason is the first check the job fails; the estimated start is when it would fit."""
    job = next(job for job in snapshot.queue if job.id == waiting.job_id)
    nodes = {node.hostname: node for node in snapshot.nodes}
    hardware = snapshot.gpus
    up = [gpu for gpu in hardware if nodes[gpu.node].schedulable and gpu.unavailable is None]
    free = [gpu for gpu in up if gpu.allocated_to is None and gpu.id not in given]
    if waiting.reason == Reason.PRIORITY:
        # Kept back for the first waiting job (EASY backfill): it would fit the free GPUs.
        assert fits(job, free), f"job {job.id} was kept back though it does not fit"
        return
    assert not fits(job, free), f"job {job.id} could have started"
    exists = any(gpu.model == job.gpu_model for gpu in hardware) or job.gpu_model is None
    assert (waiting.reason == Reason.MODEL) == (not exists)
    large_enough = fits(replace(job, gpus_per_node=1, node_count=1), hardware, "any", True)
    assert (waiting.reason == Reason.TOO_LARGE) == (
        large_enough and not fits(job, hardware, "any", by_total=True)
    )
    if waiting.reason == Reason.TOPOLOGY:
        assert not fits(job, hardware, by_total=True) or fits(job, free, "any")
    if waiting.reason == Reason.NODES_UNAVAILABLE:
        assert fits(job, hardware, by_total=True) and not fits(job, up, by_total=True)
    if waiting.reason == Reason.MEMORY:
        assert not large_enough or fits(job, free, by_total=True)
    if waiting.reason == Reason.RESOURCES_BUSY:
        assert fits(job, up, by_total=True)

    # Busy GPUs free up at their job's expected end, unknown ends never.
    ends = {gpu_id: run.expected_end for run in snapshot.running for gpu_id in run.gpu_ids}
    runtimes = {j.id: j.expected_runtime_s for j in snapshot.queue}
    for gpu_id, job_id in given.items():
        runtime = runtimes[job_id]
        ends[gpu_id] = None if runtime is None else snapshot.now + runtime

    def free_at(moment: float, before: bool = False) -> list[GpuSlot]:
        ended = [
            replace(gpu, memory_free_mib=gpu.memory_total_mib)
            for gpu in up
            if (end := ends.get(gpu.id)) is not None and (end < moment if before else end <= moment)
        ]
        return free + ended

    start = waiting.estimated_start
    if start is None:
        assert not fits(job, free_at(float("inf")))
    else:
        assert start >= snapshot.now and fits(job, free_at(start))
        assert start == snapshot.now or not fits(job, free_at(start, before=True))


def shuffled(snapshot: Snapshot, rng: Random) -> Snapshot:
    def mixed(items: tuple) -> tuple:
        return tuple(rng.sample(items, len(items)))

    return Snapshot(
        snapshot.now,
        mixed(snapshot.nodes),
        mixed(snapshot.gpus),
        mixed(snapshot.running),
        mixed(snapshot.queue),
    )


def keeps_every_invariant(rng: Random) -> None:
    snapshot = random_snapshot(rng)
    policy = PriorityWithAging() if rng.random() < 0.5 else Fcfs()
    result = plan(snapshot, policy)
    check(snapshot, result, policy.order(snapshot.queue, snapshot.now))


@PASSES
@given(rng=st.randoms())
def test_random_passes_keep_every_invariant(rng: Random) -> None:
    keeps_every_invariant(rng)


@pytest.mark.parametrize(
    "broken_take",
    [
        pytest.param(lambda fleet, node, gpus, release_at: None, id="gpus-never-taken"),
        pytest.param(
            lambda fleet, node, gpus, release_at: TAKE(fleet, node, list(gpus)[:1], release_at),
            id="only-first-gpu-taken",
        ),
    ],
)
def test_the_invariants_catch_broken_bookkeeping(
    monkeypatch: pytest.MonkeyPatch, broken_take: object
) -> None:
    """Proof the property test can fail: a fleet that forgets what it handed out is caught."""
    monkeypatch.setattr(Fleet, "take", broken_take)
    search = settings(
        PASSES, max_examples=500, phases=[Phase.generate], report_multiple_bugs=False
    )(given(rng=st.randoms())(keeps_every_invariant))
    with pytest.raises(AssertionError):
        search()


@PASSES
@given(rng=st.randoms())
def test_random_passes_are_deterministic_whatever_the_input_order(rng: Random) -> None:
    snapshot = random_snapshot(rng)
    result = plan(snapshot, PriorityWithAging())
    assert plan(snapshot, PriorityWithAging()) == result
    assert plan(shuffled(snapshot, rng), PriorityWithAging()) == result


@PASSES
@given(rng=st.randoms())
def test_a_single_node_job_gets_the_best_choice_of_all_nodes(rng: Random) -> None:
    """The bucket walk and its early stops find what trying every node would find."""
    snapshot = random_snapshot(rng)
    placement_pass = PlacementPass(snapshot)
    free = free_gpus(snapshot)
    gpus = {gpu.id: gpu for gpu in snapshot.gpus}
    for job in Fcfs().order(snapshot.queue, snapshot.now):
        placement = placement_pass.place(job)
        if job.node_count == 1:
            count = job.gpus_per_node
            choices = {
                host: choose(eligible(job, node_gpus), count, job.topology)
                for host, node_gpus in free.items()
            }
            best = min(
                (
                    (c.rank, len(free[host]) - count, c.sockets, c.numa_nodes, host)
                    for host, c in choices.items()
                    if c is not None
                ),
                default=None,
            )
            found = None if placement is None else (*placement.score, placement.nodes[0])
            assert found == best
        for gpu_id in () if placement is None else placement.gpu_ids:
            free[gpus[gpu_id].node].remove(gpus[gpu_id])
