"""Time placement passes over a synthetic fleet of DGX nodes and a long mixed queue.

    .venv/bin/python bench/placement.py [--nodes 1250] [--jobs 10000] [--runs 5] [--seed 1]

The fleet: DGX A100 40GB/80GB and DGX H100 nodes (8 GPUs, one NVSwitch domain each, real
NUMA/socket layout), some draining, offline or unreachable, a few broken GPUs, and about half
the GPUs held by running jobs with expected ends. The queue: 1, 2, 4 and 8-GPU jobs and 2x8,
4x8 gangs, some asking for a model, 70 GB or a NUMA/NVLink block. A decision is one `place`
call (one job considered). Ends with headline lines `name: value unit`.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections import Counter
from dataclasses import asdict, dataclass
from random import Random

from scheduling.placement import (
    POLICIES,
    GpuSlot,
    JobRequest,
    NodeInfo,
    PlacementPass,
    RunningJob,
    Snapshot,
    plan,
)
from scheduling.placement.snapshot import NodeState, Priority

NOW = 1_750_000_000.0
# (model, MiB, NUMA node per GPU index, socket per NUMA node, share of the fleet)
MACHINES = {
    "dgx-a100-40gb": ("NVIDIA A100-SXM4-40GB", 40960, (3, 3, 1, 1, 7, 7, 5, 5), 4, 0.4),
    "dgx-a100-80gb": ("NVIDIA A100-SXM4-80GB", 81920, (3, 3, 1, 1, 7, 7, 5, 5), 4, 0.4),
    "dgx-h100": ("NVIDIA H100 80GB HBM3", 81559, (0, 0, 0, 0, 1, 1, 1, 1), 1, 0.2),
}
# (gpus per node, nodes, share of the queue)
SHAPES = ((1, 1, 0.30), (2, 1, 0.25), (4, 1, 0.20), (8, 1, 0.13), (8, 2, 0.08), (8, 4, 0.04))
PRIORITIES: tuple[tuple[Priority, int], ...] = (
    ("low", 20),
    ("normal", 60),
    ("high", 15),
    ("critical", 5),
)


@dataclass(frozen=True)
class JobShape:
    """What a job of the benchmarks' mixed queue asks for."""

    gpus_per_node: int
    node_count: int
    topology: str
    priority: str
    min_memory_mib: int
    gpu_model: str | None
    estimated_duration_s: int | None
    max_runtime_s: int | None


def random_job_shape(rng: Random, models: list[str]) -> JobShape:
    """One job of the mix (bench/loop.py queues the same mix in the database)."""
    per_node, nodes, _ = rng.choices(SHAPES, [shape[2] for shape in SHAPES])[0]
    roll = rng.random()
    return JobShape(
        gpus_per_node=per_node,
        node_count=nodes,
        topology="numa" if roll < 0.1 and per_node <= 4 else "nvlink" if roll < 0.25 else "any",
        priority=rng.choices([p for p, _ in PRIORITIES], [w for _, w in PRIORITIES])[0],
        min_memory_mib=71_680 if rng.random() < 0.1 else 0,
        gpu_model=rng.choice(models) if models and rng.random() < 0.25 else None,
        estimated_duration_s=rng.randrange(300, 86_400) if rng.random() < 0.7 else None,
        max_runtime_s=rng.randrange(3600, 172_800) if rng.random() < 0.5 else None,
    )


def build_snapshot(node_count: int, job_count: int, seed: int) -> Snapshot:
    rng = Random(seed)
    kinds = list(MACHINES)
    weights = [MACHINES[kind][4] for kind in kinds]
    nodes, gpus, running = [], [], []
    job_ids = iter(range(1, 10**9))
    for n in range(node_count):
        kind = rng.choices(kinds, weights)[0]
        model, mib, numa, numa_per_socket, _ = MACHINES[kind]
        hostname = f"{kind}-{n:04d}"
        roll = rng.random()
        state: NodeState = "draining" if roll < 0.03 else "offline" if roll < 0.04 else "online"
        nodes.append(NodeInfo(hostname, state, reachable=rng.random() > 0.01))
        # Running jobs fill about half of each node, in blocks of 1, 2, 4 or 8 GPUs.
        holder: list[int | None] = [None] * 8
        index = 0
        while index < 8:
            size = min(rng.choice((1, 2, 4, 8)), 8 - index)
            if rng.random() < 0.5:
                job_id = next(job_ids)
                holder[index : index + size] = [job_id] * size
                end = None if rng.random() < 0.1 else NOW + rng.uniform(60, 86_400)
                gpu_ids = tuple(n * 8 + i for i in range(index, index + size))
                running.append(RunningJob(job_id, gpu_ids, NOW - 3600, end))
            index += size
        for i in range(8):
            gpus.append(
                GpuSlot(
                    id=n * 8 + i,
                    uuid=f"GPU-{n:04d}-{i}",
                    node=hostname,
                    index=i,
                    model=model,
                    memory_total_mib=mib,
                    memory_free_mib=mib if holder[i] is None else 1024,
                    numa_node=numa[i],
                    socket=numa[i] // numa_per_socket,
                    nvlink_domain=f"{hostname}/nvswitch",
                    unavailable="error" if rng.random() < 0.003 else None,
                    allocated_to=holder[i],
                )
            )
    models = [machine[0] for machine in MACHINES.values()]
    queue = []
    for _ in range(job_count):
        shape = random_job_shape(rng, models)
        queue.append(
            JobRequest(
                id=next(job_ids),
                owner=f"user{rng.randrange(50)}",
                submitted_at=NOW - rng.uniform(0, 2 * 86_400),
                **asdict(shape),
            )
        )
    return Snapshot(NOW, tuple(nodes), tuple(gpus), tuple(running), tuple(queue))


def percentile(sorted_values: list[float], fraction: float) -> float:
    return sorted_values[min(len(sorted_values) - 1, round(fraction * (len(sorted_values) - 1)))]


def time_decisions(snapshot: Snapshot, policy_name: str) -> dict[str, float]:
    """One pass, job by job: each `place` and each `explain` timed alone (milliseconds)."""
    started = time.perf_counter()
    placement_pass = PlacementPass(snapshot)
    index_ms = (time.perf_counter() - started) * 1000
    jobs = POLICIES[policy_name]().order(snapshot.queue, snapshot.now)
    placed, turned_down, waiting = [], [], []
    for job in jobs:
        started = time.perf_counter()
        placement = placement_pass.place(job)
        elapsed = (time.perf_counter() - started) * 1000
        if placement is None:
            turned_down.append(elapsed)
            waiting.append(job)
        else:
            placed.append(elapsed)
    started = time.perf_counter()
    for position, job in enumerate(waiting, start=1):
        placement_pass.explain(job, position)
    explain_ms = (time.perf_counter() - started) * 1000
    decisions = sorted(placed + turned_down)
    placed.sort()
    deciding_ms = sum(decisions)
    return {
        "index_ms": index_ms,
        "placed": len(placed),
        "waiting": len(waiting),
        "median_ms": statistics.median(decisions),
        "p99_ms": percentile(decisions, 0.99),
        "max_ms": decisions[-1],
        "placed_median_ms": statistics.median(placed),
        "placed_p99_ms": percentile(placed, 0.99),
        "deciding_ms": deciding_ms,
        "explain_ms": explain_ms,
        "decisions_per_s": len(decisions) / deciding_ms * 1000,
        "placements_per_s": len(placed) / deciding_ms * 1000,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=1250)
    parser.add_argument("--jobs", type=int, default=10_000)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--policy", choices=sorted(POLICIES), default="priority")
    args = parser.parse_args()

    snapshot = build_snapshot(args.nodes, args.jobs, args.seed)
    free = sum(gpu.allocated_to is None and gpu.unavailable is None for gpu in snapshot.gpus)
    down = sum(node.state != "online" or not node.reachable for node in snapshot.nodes)
    print(
        f"{args.nodes} nodes ({down} draining, offline or unreachable), "
        f"{len(snapshot.gpus)} GPUs ({free} free), {len(snapshot.running)} running jobs, "
        f"{args.jobs} waiting jobs, policy {args.policy}, {args.runs} runs"
    )

    policy = POLICIES[args.policy]()
    runs = [time_decisions(snapshot, args.policy) for _ in range(args.runs)]
    passes = []
    for _ in range(args.runs):
        started = time.perf_counter()
        result = plan(snapshot, policy)
        passes.append((time.perf_counter() - started) * 1000)
    reasons = Counter(pending.reason.value for pending in result.pending)
    estimated = sum(pending.estimated_start is not None for pending in result.pending)
    what_ifs = sum(pending.what_if is not None for pending in result.pending)

    def median(name: str) -> float:
        return statistics.median(run[name] for run in runs)

    print(f"placed {len(result.placements)}, waiting {len(result.pending)}: {dict(reasons)}")
    print(f"waiting with an estimated start {estimated}, with a what-if {what_ifs}")
    print(f"{'(medians over runs)':26}{'median':>10}{'p99':>10}{'max':>10}")
    print(
        f"{'decision, any job':26}{median('median_ms'):>8.4f}ms{median('p99_ms'):>8.3f}ms"
        f"{median('max_ms'):>8.3f}ms"
    )
    print(
        f"{'decision, placed job':26}{median('placed_median_ms'):>8.4f}ms"
        f"{median('placed_p99_ms'):>8.3f}ms"
    )
    print(f"{'index the snapshot':26}{median('index_ms'):>8.1f}ms")
    print(f"{'all decisions':26}{median('deciding_ms'):>8.1f}ms")
    print(f"{'explain all waiting jobs':26}{median('explain_ms'):>8.1f}ms")
    print(f"{'full pass (plan)':26}{statistics.median(passes):>8.1f}ms")
    print()
    print(f"placement_decision_median: {median('median_ms'):.4f} ms")
    print(f"placement_decision_p99: {median('p99_ms'):.3f} ms")
    print(f"placed_decision_median: {median('placed_median_ms'):.4f} ms")
    print(f"placed_decision_p99: {median('placed_p99_ms'):.3f} ms")
    print(f"decisions_per_s: {median('decisions_per_s'):.0f} jobs/s")
    print(f"placements_per_s: {median('placements_per_s'):.0f} jobs/s")
    print(f"full_pass_{args.jobs}_jobs: {statistics.median(passes):.0f} ms")


if __name__ == "__main__":
    main()
