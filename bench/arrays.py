"""Job arrays: how long one ``--array`` submission of N tasks takes to be accepted.

    .venv/bin/python bench/arrays.py [--tasks 2000] [--runs 15] [--cap 50]

Creates a throwaway database on the configured PostgreSQL server (DATABASE_URL, or the
embedded one), a simulated fleet of two DGX nodes and a user; then ``--runs`` times submits
one array ``0-<tasks-1>%<cap>`` through the job service (``submission.submit_array``: the checks,
the ``JobArray`` row, every task's job in one multi-row INSERT and every audit row in another,
one transaction), as ``POST /api/v1/jobs/`` does after parsing the body. Each run is timed from
the call to its commit (the loop's wake-up is sent on commit; Redis must be reachable), and the
tasks are deleted before the next. Prints each run, then the median, and ends with the
headline line ``array_<tasks>_ms: value ms``. Target (issue 12): a 2,000-task array under
100 ms; printed beside Slurm 22.05's ``sbatch --array=0-1999`` (``SLURM_MS``, the issue's).
"""

from __future__ import annotations

import argparse
import statistics
import time

from common import delete_redis_keys, load_sim_fleet, throwaway_database

TARGET_MS = 100
SLURM_MS = 5.8  # the figure for one sbatch --array=0-1999


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=2000)
    parser.add_argument("--runs", type=int, default=15)
    parser.add_argument("--cap", type=int, default=50, help="the %%N cap (0: none)")
    args = parser.parse_args()

    with throwaway_database("gpuadmin_bench_array"):
        from django.contrib.auth import get_user_model

        from scheduling.jobs import submission

        hostnames = load_sim_fleet(2)
        owner = get_user_model().objects.create_user("bench")
        spec = f"0-{args.tasks - 1}" + (f"%{args.cap}" if args.cap else "")
        times_ms = []
        try:
            for run in range(args.runs):
                started = time.perf_counter()
                submitted = submission.submit_array(
                    owner, spec, command=["python", "train.py", "--seed", "1"], gpu_count=1
                )
                times_ms.append((time.perf_counter() - started) * 1000)
                assert len(submitted.task_ids) == args.tasks
                print(f"run {run + 1}: {times_ms[-1]:.1f} ms")
        finally:
            delete_redis_keys(set(hostnames))
    median = statistics.median(times_ms)
    print(
        f"{args.tasks}-task array ({spec}): median {median:.1f} ms over {args.runs} runs, "
        f"min {min(times_ms):.1f} ms (target: under {TARGET_MS} ms; Slurm's sbatch "
        f"--array=0-1999: {SLURM_MS} ms, {median / SLURM_MS:.1f}x that)"
    )
    print(f"array_{args.tasks}_ms: {median:.1f} ms")


if __name__ == "__main__":
    main()
