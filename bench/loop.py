"""Time the placement loop's real passes: database snapshot, engine, commits, pending reasons.

    .venv/bin/python bench/loop.py [--nodes 1250] [--jobs 10000] [--runs 5] [--seed 1]
                                   [--policy priority]

Creates a throwaway database on the configured PostgreSQL server (DATABASE_URL, or the
embedded one) and loads ``--nodes`` simulated DGX nodes through the agents' discovery sync
(NUMA, socket, NVSwitch links and MIG as a scan reports them; live samples published to Redis,
heartbeats fresh). About half the schedulable GPUs are then held by running jobs (blocks of 1,
2, 4 or 8 GPUs given through ``services.allocate`` and started like an agent reports it), and
``--jobs`` jobs are queued in bulk with their ``job.submitted`` audit rows, shaped like
bench/placement.py's queue (1, 2, 4, 8-GPU jobs and 2x8, 4x8 gangs).

Then ``scheduling.loop.run_pass()`` runs as the central worker runs it: the first pass places
what fits and writes every waiting job's reason; then ``--runs`` blocked passes (nothing fits
any more: the steady cost of re-explaining the queue); then ``--runs`` placing passes, each
after the previous one's jobs were put back in the queue (an audited SCHEDULED -> QUEUED
transition that releases their GPUs). Prints each phase (snapshot, plan, commit, save_pending)
as medians over the runs, checks the scheduler's invariants (``gpuadmin check``) before and
after, and ends with headline lines ``name: value unit``.

Dispatch is real: each placement sends ``scheduling.run_job`` to the node's Celery queue
``node.bench-<pid>-NNNN``, which no agent consumes; the central queue is ``bench-loop-<pid>``.
Those queues, the live samples and the wake key are deleted from Redis at the end.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections import Counter
from datetime import timedelta
from random import Random
from typing import TYPE_CHECKING

from common import delete_redis_keys, load_sim_fleet, throwaway_database
from placement import random_job_shape

if TYPE_CHECKING:  # Django is set up inside main()
    from django.contrib.auth.models import User

    from scheduling.loop import PassSummary
    from scheduling.models import Job

QUEUE = f"bench-loop-{os.getpid()}"
PHASES = ("snapshot", "plan", "commit", "save_pending")
OWNERS = 50
BENCH_ACTOR = "bench"


def job_rows(rng: Random, count: int, owners: list[User], models: list[str]) -> list[Job]:
    """``count`` unsaved QUEUED jobs of the mixed shapes of bench/placement.py."""
    from scheduling.models import Job, JobState

    jobs = []
    for _ in range(count):
        shape = random_job_shape(rng, models)
        jobs.append(
            Job(
                owner=rng.choice(owners),
                command=["python", "train.py"],
                state=JobState.QUEUED,
                gpu_count=shape.gpus_per_node,
                node_count=shape.node_count,
                min_gpu_memory_mib=shape.min_memory_mib,
                gpu_model=shape.gpu_model or "",
                topology=shape.topology,
                priority=shape.priority,
                estimated_duration_s=shape.estimated_duration_s,
                max_runtime_s=shape.max_runtime_s,
            )
        )
    return jobs


def enqueue(rng: Random, jobs: list[Job]) -> list[Job]:
    """Store ``jobs`` QUEUED, submitted over the last two days, each with the ``job.submitted``
    audit row ``services.submit_job`` writes: the same rows, in bulk."""
    from django.db import transaction
    from django.utils import timezone

    from gpuadmin.audit.models import AuditEvent
    from scheduling.models import Job

    now = timezone.now()
    with transaction.atomic():
        jobs = Job.objects.bulk_create(jobs, batch_size=1000)
        for job in jobs:  # submitted_at is auto_now_add: spread it afterwards
            job.submitted_at = now - timedelta(seconds=rng.uniform(0, 2 * 86_400))
        Job.objects.bulk_update(jobs, ["submitted_at"], batch_size=1000)
        AuditEvent.objects.bulk_create(
            (
                AuditEvent(
                    time=job.submitted_at,
                    event_type="job.submitted",
                    actor=job.owner,
                    actor_name=job.owner.get_username(),
                    target_type="scheduling.job",
                    target_id=str(job.pk),
                    object_repr=str(job)[:200],
                    after={
                        "state": job.state,
                        "gpu_count": job.gpu_count,
                        "node_count": job.node_count,
                        "priority": job.priority,
                    },
                )
                for job in jobs
            ),
            batch_size=1000,
        )
    return jobs


def hold_half(rng: Random, owners: list[User]) -> int:
    """Running jobs on about half the schedulable GPUs, in aligned blocks of 1, 2, 4 or 8 per
    node (like bench/placement.py), allocated through ``services.allocate`` and started as an
    agent reports it; some are past their estimated end. The number of GPUs held."""
    from django.utils import timezone

    from inventory.models import Gpu
    from scheduling import services

    blocks = []
    gpus = list(
        Gpu.objects.schedulable()
        .filter(mig_enabled=False)  # whole-GPU jobs only
        .select_related("node")
        .order_by("node_id", "index")
    )
    by_node: dict[int, list] = {}
    for gpu in gpus:
        by_node.setdefault(gpu.node_id, []).append(gpu)
    for node_gpus in by_node.values():
        index = 0
        while index < len(node_gpus):
            size = min(rng.choice((1, 2, 4, 8)), len(node_gpus) - index)
            if rng.random() < 0.5:
                blocks.append(node_gpus[index : index + size])
            index += size
    jobs = job_rows(rng, len(blocks), owners, [])
    for job, block in zip(jobs, blocks, strict=True):  # the shape of the GPUs they hold
        job.gpu_count, job.node_count, job.topology = len(block), 1, "any"
    now = timezone.now()
    for job, block in zip(enqueue(rng, jobs), blocks, strict=True):
        services.allocate(job, [gpu.pk for gpu in block], actor_name=services.LOOP_ACTOR)
        started_at = now - timedelta(seconds=rng.uniform(0, 3600))
        services.job_started(job.pk, job.attempt, 1000 + job.pk, started_at)
    return sum(len(block) for block in blocks)


def requeue(job_ids: list[int]) -> None:
    """Put placed jobs back in the queue (audited; their GPUs are released)."""
    from django.db import transaction

    from scheduling import services
    from scheduling.models import JobState

    with transaction.atomic():
        for job_id in job_ids:
            services.transition(
                job_id,
                JobState.QUEUED,
                actor_name=BENCH_ACTOR,
                expect=[JobState.SCHEDULED],
                message="put back by bench/loop.py",
            )


def check_invariants(when: str) -> None:
    """``gpuadmin check``: exit when the set-up (or the passes) broke an invariant."""
    from scheduling.checks import run_checks

    broken = {name: found for name, found in run_checks().items() if found}
    if broken:
        sys.exit(f"invariants broken {when}: {broken}")
    print(f"gpuadmin check {when}: all invariants hold")


def median_phases(summaries: list[PassSummary]) -> dict[str, float]:
    """Median milliseconds per phase and for the whole pass."""
    medians = {
        phase: statistics.median(s.phase_ms.get(phase, 0.0) for s in summaries) for phase in PHASES
    }
    medians["pass"] = statistics.median(s.duration_ms for s in summaries)
    return medians


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=1250)
    parser.add_argument("--jobs", type=int, default=10_000)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--policy", choices=("priority", "fcfs"), default="priority")
    args = parser.parse_args()

    os.environ["GPUADMIN_CENTRAL_QUEUE"] = QUEUE  # read when Django is set up
    os.environ.setdefault("LOG_LEVEL", "warning")
    with throwaway_database("gpuadmin_bench_loop"):
        from django.contrib.auth import get_user_model

        from inventory.models import Gpu
        from scheduling import loop
        from scheduling.models import Job, JobState, SchedulerSettings

        rng = Random(args.seed)
        started = time.perf_counter()
        hostnames = load_sim_fleet(args.nodes, publish_samples=True)
        try:
            SchedulerSettings.objects.update_or_create(pk=1, defaults={"policy": args.policy})
            user_model = get_user_model()
            owners = user_model.objects.bulk_create(
                user_model(username=f"user{number}") for number in range(OWNERS)
            )
            held = hold_half(rng, owners)
            models = sorted(set(Gpu.objects.values_list("name", flat=True)))
            enqueue(rng, job_rows(rng, args.jobs, owners, models))
            setup_s = time.perf_counter() - started
            mig = Gpu.objects.filter(mig_enabled=True).count()
            print(
                f"{args.nodes} nodes, {Gpu.objects.count()} GPUs ({mig} in MIG mode, {held} "
                f"held by running jobs), {args.jobs} waiting jobs, policy "
                f"{args.policy}, {args.runs} runs; set up in {setup_s:.0f} s; "
                f"{os.cpu_count()} cores (load average {os.getloadavg()[0]:.1f})"
            )
            check_invariants("after set-up")

            first = loop.run_pass()
            blocked = [loop.run_pass() for _ in range(args.runs)]
            placing: list[PassSummary] = []
            for _ in range(args.runs):
                requeue(placing[-1].dispatched if placing else first.dispatched)
                placing.append(loop.run_pass())
            check_invariants("after the passes")
            reasons = Counter(
                Job.objects.filter(state=JobState.QUEUED).values_list("pending_code", flat=True)
            )
        finally:
            delete_redis_keys({QUEUE, *hostnames})

    passes = {"first pass": [first], "blocked": blocked, "placing": placing}
    columns = {name: median_phases(summaries) for name, summaries in passes.items()}
    print(f"\n{'ms (medians over runs)':26}" + "".join(f"{name:>14}" for name in columns))
    for row in (*PHASES, "pass"):
        print(f"{row:26}" + "".join(f"{values[row]:>14.0f}" for values in columns.values()))
    for label, attribute in (
        ("jobs placed", "placed"),
        ("placements refused", "refused"),
        ("jobs waiting", "waiting"),
        ("pending rows written", "pending_saved"),
    ):
        print(
            f"{label:26}"
            + "".join(
                f"{statistics.median(getattr(s, attribute) for s in runs):>14.0f}"
                for runs in passes.values()
            )
        )
    print(f"waiting jobs by reason: {dict(reasons.most_common())}")
    placed = statistics.median(s.placed for s in placing)
    commit_per_job = columns["placing"]["commit"] / placed if placed else 0.0
    print(f"\nload average now {os.getloadavg()[0]:.1f}\n")
    for name, values in (("blocked", columns["blocked"]), ("placing", columns["placing"])):
        print(f"loop_pass_{name}_ms: {values['pass']:.0f} ms")
        for phase in PHASES:
            print(f"loop_pass_{name}_{phase}_ms: {values[phase]:.0f} ms")
    print(f"loop_commit_per_placement_ms: {commit_per_job:.2f} ms")
    print(f"loop_first_pass_ms: {columns['first pass']['pass']:.0f} ms")


if __name__ == "__main__":
    main()
