"""Release to start: how soon GPUs freed by a job go to the job waiting for them.

    .venv/bin/python bench/release.py [--releases 60] [--sample-interval 2]

The processes it starts and what ``release_to_start_ms`` measures:
docs/development/design-notes.md, "Release to start: bench/release.py".
"""

from __future__ import annotations

import argparse
import os
import pwd
import shutil
import statistics
import tempfile
from pathlib import Path

from common import (
    delete_redis_keys,
    process_env,
    start_worker_and_agent,
    stop,
    throwaway_database,
    wait_for,
)

QUEUE = f"bench-release-{os.getpid()}"
HOSTNAME = f"bench-{os.getpid()}-0000"
MODEL = "dgx-a100-80gb"
TARGET_MEDIAN_MS = 1000


def percentile(values: list[float], pct: int) -> float:
    return statistics.quantiles(values, n=100, method="inclusive")[pct - 1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--releases", type=int, default=60)
    parser.add_argument(
        "--sample-interval", type=int, default=2, help="the agent's GPUADMIN_SAMPLE_INTERVAL_S"
    )
    args = parser.parse_args()
    if args.releases < 2:
        parser.error("--releases must be at least 2")

    os.environ["GPUADMIN_CENTRAL_QUEUE"] = QUEUE  # read when Django is set up
    os.environ.setdefault("LOG_LEVEL", "warning")
    scratch = Path(tempfile.mkdtemp(prefix="gpuadmin-bench-release-"))
    with throwaway_database("gpuadmin_bench_release") as database_url:
        from django.contrib.auth import get_user_model

        from gpuadmin.access.models import UnixAccount
        from inventory import live
        from scheduling.jobs import control, submission
        from scheduling.models import Job, JobState

        env = process_env(
            database_url,
            scratch,
            GPUADMIN_SAMPLE_INTERVAL_S=str(args.sample_interval),
            GPUADMIN_JOB_KILL_GRACE_S="2",
        )
        processes = start_worker_and_agent(env, scratch, HOSTNAME, MODEL)
        try:
            owner = get_user_model().objects.create_user("bench")
            # Its jobs run as this account (an agent running as root starts each job as its
            # owner's, and no Unix account "bench" exists).
            UnixAccount.objects.create(
                user=owner, username=pwd.getpwuid(os.geteuid()).pw_name, allow_root=True
            )

            def submit(number: int) -> Job:
                flag = scratch / f"done-{number}"
                return submission.submit_job(
                    owner,
                    command=f"while [ ! -e {flag} ]; do sleep 0.02; done",
                    use_shell=True,
                    gpu_count=8,
                    name=f"release-{number}",
                )

            def state(job: Job) -> str:
                return Job.objects.values_list("state", flat=True).get(pk=job.pk)

            def sample_shows_the_running_job() -> bool:
                samples = live.latest([HOSTNAME])[HOSTNAME].values()
                return len(samples) == 8 and all(sample.get("processes") for sample in samples)

            print(
                f"1 simulated {MODEL} agent, samples every {args.sample_interval} s, "
                f"{args.releases} releases; {os.cpu_count()} cores "
                f"(load average {os.getloadavg()[0]:.1f})"
            )
            running = submit(0)
            wait_for(lambda: state(running) == JobState.RUNNING, 60, "the first job to run")
            delays: dict[str, list[float]] = {"finish": [], "cancel": []}
            for number in range(1, args.releases + 1):
                waiting = submit(number)
                wait_for(
                    lambda: Job.objects.get(pk=waiting.pk).pending_code != "",  # noqa: B023
                    30,
                    "a pass to find the waiting job no room",
                )
                wait_for(sample_shows_the_running_job, 30, "a sample showing the running job")
                kind = "finish" if number % 2 else "cancel"
                if kind == "finish":
                    (scratch / f"done-{number - 1}").touch()
                else:
                    control.cancel_job(running, actor=owner)
                wait_for(
                    lambda: state(waiting) != JobState.QUEUED,  # noqa: B023
                    60,
                    f"job {number} to be placed",
                )
                running.refresh_from_db()
                waiting.refresh_from_db()
                assert waiting.scheduled_at is not None and running.finished_at is not None
                delay = waiting.scheduled_at - running.finished_at
                delays[kind].append(delay.total_seconds() * 1000)
                wait_for(lambda: state(waiting) == JobState.RUNNING, 60, f"job {number} to run")  # noqa: B023
                running = waiting
            control.cancel_job(running, actor=owner)
            wait_for(lambda: state(running) == JobState.CANCELED, 30, "the last job to end")
        finally:
            stop(processes)
            delete_redis_keys({QUEUE, HOSTNAME})
            shutil.rmtree(scratch, ignore_errors=True)

    every = delays["finish"] + delays["cancel"]
    for kind, values in delays.items():
        print(f"{kind:8} x{len(values):<4} median {statistics.median(values):7.0f} ms")
    median, p95 = statistics.median(every), percentile(every, 95)
    print(
        f"all      x{len(every):<4} median {median:7.0f} ms, p95 {p95:.0f} ms, "
        f"max {max(every):.0f} ms (target: median under {TARGET_MEDIAN_MS} ms)"
    )
    print(f"\nload average now {os.getloadavg()[0]:.1f}\n")
    print(f"release_to_start_ms_median: {median:.0f} ms")
    print(f"release_to_start_ms_p95: {p95:.0f} ms")


if __name__ == "__main__":
    main()
