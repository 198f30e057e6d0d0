"""One client of the scheduling concurrency test: for ``--seconds`` it submits, cancels, starts
and finishes jobs (standing in for users and node agents) and grabs GPUs by hand, at random,
through the services; the central workers place jobs meanwhile.

    python -m tests.integration.churn --seconds 20 --seed 1 --owner churn-1
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import time
from collections import Counter


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=float, required=True)
    parser.add_argument("--seed", type=int, required=True)
    parser.add_argument("--owner", required=True)
    args = parser.parse_args()
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "gpuadmin.settings")
    import django

    django.setup()
    from django.contrib.auth import get_user_model
    from django.utils import timezone

    from inventory.models import Gpu
    from scheduling.allocations import services as allocation_services
    from scheduling.jobs import control, limits, reports, submission, transitions
    from scheduling.models import Job, JobState

    rng = random.Random(args.seed)
    owner, _ = get_user_model().objects.get_or_create(username=args.owner)
    done: Counter[str] = Counter()

    def pick(state: str) -> Job | None:
        ids = list(Job.objects.filter(state=state).values_list("pk", flat=True)[:50])
        return Job.objects.get(pk=rng.choice(ids)) if ids else None

    def submit() -> None:
        gpus = rng.choice([1, 1, 1, 2, 2, 4, 8])
        nodes = 2 if gpus == 8 and rng.random() < 0.2 else 1
        topology = rng.choice(["any", "any", "numa", "nvlink"])
        submission.submit_job(
            owner, command=["true"], gpu_count=gpus, node_count=nodes, topology=topology,
            estimated_duration_s=rng.choice([None, 60, 600]),
        )  # fmt: skip

    def cancel() -> None:
        job = pick(rng.choice([JobState.QUEUED, JobState.RUNNING, JobState.SCHEDULED]))
        if job is not None:
            control.cancel_job(job, actor=owner)

    def start() -> None:
        job = pick(JobState.SCHEDULED)
        if job is not None:
            reports.job_started(job.pk, job.attempt, 1000 + job.pk, timezone.now())

    def finish() -> None:
        job = pick(JobState.RUNNING)
        if job is not None:
            outcome = rng.choice(["completed", "completed", "failed", "lost", "canceled"])
            reports.job_finished(job.pk, job.attempt, outcome, 0, "", timezone.now())

    def grab() -> None:
        """A manual allocation racing the placement loop for the same GPUs."""
        job = pick(JobState.QUEUED)
        if job is None or job.node_count != 1:
            return
        free = list(
            Gpu.objects.schedulable()
            .exclude(allocations__released_at__isnull=True)
            .values_list("pk", flat=True)[: job.gpu_count * 3]
        )
        chosen = rng.sample(free, min(job.gpu_count, len(free)))
        if len(chosen) == job.gpu_count:
            allocation_services.allocate(job, chosen, actor=owner)

    actions = [(submit, 0.4), (cancel, 0.1), (start, 0.2), (finish, 0.2), (grab, 0.1)]
    deadline = time.monotonic() + args.seconds
    while time.monotonic() < deadline:
        action = rng.choices([a for a, _ in actions], weights=[w for _, w in actions])[0]
        try:
            action()
            done[action.__name__] += 1
        # Refusals are answers: a shape the fleet could never run (8 GPUs in one NUMA node),
        # a job that moved on, GPUs taken meanwhile.
        except (
            limits.JobRejected,
            transitions.IllegalTransition,
            allocation_services.AllocationRefused,
        ):
            done[f"{action.__name__}-refused"] += 1
    sys.stdout.write(" ".join(f"{name}={count}" for name, count in sorted(done.items())) + "\n")


if __name__ == "__main__":
    main()
