"""Time the placement loop's real passes: database snapshot, engine, commits, pending reasons.

    .venv/bin/python bench/loop.py [--nodes 1250] [--jobs 10000] [--runs 5] [--seed 1]
                                   [--policy priority|qssf|...]

The fleet and queue it loads, the passes it times and its headline figures:
docs/development/design-notes.md, "The placement loop: bench/loop.py".
"""

from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import statistics
import sys
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta
from random import Random
from typing import TYPE_CHECKING

from common import delete_redis_keys, load_sim_fleet, throwaway_database
from placement import random_job_shape

from scheduling.placement.policies import POLICIES

if TYPE_CHECKING:  # Django is set up inside main()
    from django.contrib.auth.models import User

    from scheduling.loop.passes import PassSummary
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
    audit row ``submission.submit_job`` writes: the same rows, in bulk."""
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
    node (like bench/placement.py), allocated through ``allocation_services.allocate`` and started
    as an agent reports it; some are past their estimated end. The number of GPUs held."""
    from django.utils import timezone

    from inventory.models import Gpu
    from scheduling.allocations import services as allocation_services
    from scheduling.jobs import reports, transitions

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
    grants = [
        allocation_services.Grant(job.pk, tuple(gpu.pk for gpu in block))
        for job, block in zip(enqueue(rng, jobs), blocks, strict=True)
    ]
    outcome = allocation_services.allocate_many(grants, actor_name=transitions.LOOP_ACTOR)
    assert not outcome.refused, outcome.refused
    for job, _ in outcome.granted:
        started_at = now - timedelta(seconds=rng.uniform(0, 3600))
        reports.job_started(job.pk, job.attempt, 1000 + job.pk, started_at)
    return sum(len(block) for block in blocks)


def requeue(job_ids: list[int]) -> None:
    """Put placed jobs back in the queue (audited; their GPUs are released)."""
    from django.db import transaction

    from scheduling.jobs import transitions
    from scheduling.models import JobState

    with transaction.atomic():
        for job_id in job_ids:
            transitions.transition(
                job_id,
                JobState.QUEUED,
                actor_name=BENCH_ACTOR,
                expect=[JobState.SCHEDULED],
                message="put back by bench/loop.py",
            )


def check_invariants(when: str) -> None:
    """``gpuadmin check``, and that every allocation and every placement was audited: exit
    when the set-up (or the passes) broke one."""
    from django.db.models import Sum

    from gpuadmin.audit.models import AuditEvent
    from scheduling.checks import run_checks
    from scheduling.models import Allocation, Job

    broken = {name: found for name, found in run_checks().items() if found}
    if broken:
        sys.exit(f"invariants broken {when}: {broken}")
    allocations = Allocation.objects.count()
    placements = Job.objects.aggregate(total=Sum("attempt"))["total"] or 0
    audited = Counter(
        AuditEvent.objects.filter(
            event_type__in=("allocation.created", "job.scheduled")
        ).values_list("event_type", flat=True)
    )
    if (audited["allocation.created"], audited["job.scheduled"]) != (allocations, placements):
        sys.exit(
            f"unaudited writes {when}: {allocations} allocations, {placements} placements, "
            f"audited {dict(audited)}"
        )
    print(
        f"gpuadmin check {when}: all invariants hold; {allocations} allocations and "
        f"{placements} placements, each audited"
    )


@contextmanager
def counting_queries(counts: list[int]) -> Iterator[None]:
    """Append the number of statements run inside to ``counts``."""
    from django.db import connection

    seen = [0]

    def count(execute, sql, params, many, context):  # noqa: ANN001, ANN202 - Django's hook
        seen[0] += 1
        return execute(sql, params, many, context)

    with connection.execute_wrapper(count):
        yield
    counts.append(seen[0])


def backend_cpu_s(pid: int) -> float | None:
    """CPU seconds (user + system) the PostgreSQL backend ``pid`` used so far (Linux /proc;
    None where it cannot be read)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat_file:
            fields = stat_file.read().rsplit(b")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@contextmanager
def measuring_cpu(spent: list[float]) -> Iterator[None]:
    """Append the CPU milliseconds used inside by this process and its database backend (the
    process alone when the backend's cannot be read) to ``spent``."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        [(pid,)] = cursor.fetchall()
    backend_from, started = backend_cpu_s(pid), time.process_time()
    yield
    used = time.process_time() - started
    backend_to = backend_cpu_s(pid)
    if backend_from is not None and backend_to is not None:
        used += backend_to - backend_from
    spent.append(used * 1000)


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
    parser.add_argument("--policy", choices=tuple(POLICIES), default="priority")
    parser.add_argument(
        "--profile", action="store_true", help="cProfile one more blocked pass (CPU time)"
    )
    args = parser.parse_args()

    os.environ["GPUADMIN_CENTRAL_QUEUE"] = QUEUE  # read when Django is set up
    os.environ.setdefault("LOG_LEVEL", "warning")
    with throwaway_database("gpuadmin_bench_loop"):
        from django.contrib.auth import get_user_model
        from django.db import connection

        from inventory.models import Gpu
        from scheduling.loop import passes as loop
        from scheduling.models import Job, JobState, PoolPolicy

        rng = Random(args.seed)
        started = time.perf_counter()
        hostnames = load_sim_fleet(args.nodes, publish_samples=True)
        queries: dict[str, list[int]] = {"first pass": [], "blocked": [], "placing": []}
        try:
            PoolPolicy.objects.update_or_create(pool=None, defaults={"policy": args.policy})
            user_model = get_user_model()
            owners = user_model.objects.bulk_create(
                user_model(username=f"user{number}") for number in range(OWNERS)
            )
            held = hold_half(rng, owners)
            models = sorted(set(Gpu.objects.values_list("name", flat=True)))
            enqueue(rng, job_rows(rng, args.jobs, owners, models))
            # The planner's statistics of the loaded tables, as autovacuum keeps them on a
            # fleet that has run a while: left to it, they came a minute into the passes or
            # not at all, and a pass's plans changed with them (10,000 GPUs read by 10,000
            # index lookups, twice the time, while the tables looked empty).
            with connection.cursor() as cursor:
                cursor.execute("ANALYZE")
            setup_s = time.perf_counter() - started
            mig = Gpu.objects.filter(mig_enabled=True).count()
            print(
                f"{args.nodes} nodes, {Gpu.objects.count()} GPUs ({mig} in MIG mode, {held} "
                f"held by running jobs), {args.jobs} waiting jobs, policy "
                f"{args.policy}, {args.runs} runs; set up in {setup_s:.0f} s; "
                f"{os.cpu_count()} cores (load average {os.getloadavg()[0]:.1f})"
            )
            check_invariants("after set-up")

            with counting_queries(queries["first pass"]):
                first = loop.run_pass()
            blocked = []
            blocked_cpu_ms: list[float] = []
            for _ in range(args.runs):
                with measuring_cpu(blocked_cpu_ms), counting_queries(queries["blocked"]):
                    blocked.append(loop.run_pass())
            if args.profile:
                profiler = cProfile.Profile(time.process_time)
                profiler.runcall(loop.run_pass)
                pstats.Stats(profiler).sort_stats("cumulative").print_stats(40)
                pstats.Stats(profiler).sort_stats("tottime").print_stats(30)
            placing: list[PassSummary] = []
            for _ in range(args.runs):
                requeue(placing[-1].dispatched if placing else first.dispatched)
                with counting_queries(queries["placing"]):
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
    print(
        f"{'queries':26}"
        + "".join(f"{statistics.median(counts):>14.0f}" for counts in queries.values())
    )
    print(f"waiting jobs by reason: {dict(reasons.most_common())}")
    placed = statistics.median(s.placed for s in placing)
    commit_s = columns["placing"]["commit"] / 1000
    print(f"\nload average now {os.getloadavg()[0]:.1f}\n")
    for name, values in (("blocked", columns["blocked"]), ("placing", columns["placing"])):
        print(f"loop_pass_{name}_ms: {values['pass']:.0f} ms")
        for phase in PHASES:
            print(f"loop_pass_{name}_{phase}_ms: {values[phase]:.0f} ms")
    print(f"loop_first_pass_ms: {columns['first pass']['pass']:.0f} ms")
    print(f"loop_commit_per_placement_ms: {commit_s * 1000 / placed if placed else 0:.2f} ms")
    print(f"loop_queries_per_placement: {statistics.median(queries['placing']) / placed:.3f}")
    print(f"placing_pass_per_s: {placed / (columns['placing']['pass'] / 1000):.0f} placements/s")
    print(f"placements_per_s: {placed / commit_s if commit_s else 0:.0f} placements/s")
    print(f"loop_nodes: {args.nodes} nodes")
    print(f"loop_waiting_jobs: {args.jobs} jobs")
    print(f"blocked_pass_ms: {columns['blocked']['pass']:.0f} ms")
    print(f"blocked_pass_cpu_ms: {statistics.median(blocked_cpu_ms):.0f} ms")
    print(f"unchanged_rows_written: {sum(s.pending_saved for s in blocked)} rows")


if __name__ == "__main__":
    main()
