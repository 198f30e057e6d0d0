"""Job arrays: how long one ``--array`` submission of N tasks takes to be accepted, by gpuadmin
and by Slurm 22.05's ``sbatch --array`` in the same run.

    .venv/bin/python bench/arrays.py [--tasks 2000] [--runs 15] [--cap 50] [--no-slurm]

Creates a throwaway database on the configured PostgreSQL server (DATABASE_URL, or the
embedded one), a simulated fleet of two DGX nodes and a user, and starts a private Slurm
(bench/slurm.py; installed from Debian when missing). Then ``--runs`` times, in turn:

- gpuadmin: one array ``0-<tasks-1>%<cap>`` submitted through the job service
  (``submission.submit_array``, what ``POST /api/v1/jobs/`` with ``"array"`` calls after
  parsing the body): the checks, the ``JobArray`` row, every task's job, every audit row, one
  transaction, timed from the call to its commit (PostgreSQL's work included; the loop's
  wake-up is sent on commit, Redis must be reachable);
- Slurm: ``sbatch --hold --array=<the same spec> --gres=gpu:1 --wrap ...``, timed from the
  start of the ``sbatch`` process to its exit (its start, the munge credential, the RPC to
  slurmctld, which stores the array as one job record, and the reply). Held, as gpuadmin's
  tasks wait for a placement loop that does not run here.

Neither side's tasks are deleted between runs. Prints each run, then the medians, and ends
with the headline lines ``array_<tasks>_ms``, ``slurm_array_<tasks>_ms`` and
``array_<tasks>_vs_slurm`` (the median of the runs' ratios). Target (issue 30): at most 2x
Slurm's time.
"""

from __future__ import annotations

import argparse
import statistics
import time
from contextlib import nullcontext

from common import delete_redis_keys, load_sim_fleet, throwaway_database
from slurm import SlurmCluster

TARGET_RATIO = 2.0
COMMAND = ["python", "train.py", "--seed", "1"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=2000)
    parser.add_argument("--runs", type=int, default=15)
    parser.add_argument("--cap", type=int, default=50, help="the %%N cap (0: none)")
    parser.add_argument(
        "--slurm",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="also time Slurm's sbatch --array in the same run",
    )
    args = parser.parse_args()
    spec = f"0-{args.tasks - 1}" + (f"%{args.cap}" if args.cap else "")

    with throwaway_database("gpuadmin_bench_array"):
        from django.contrib.auth import get_user_model

        from scheduling.jobs import submission

        hostnames = load_sim_fleet(2)
        owner = get_user_model().objects.create_user("bench")
        ours_ms: list[float] = []
        theirs_ms: list[float] = []
        try:
            with SlurmCluster(tuned=True) if args.slurm else nullcontext() as slurm:
                sbatch = ["--hold", f"--array={spec}", "--gres=gpu:1", "--wrap", " ".join(COMMAND)]
                for run in range(args.runs):
                    started = time.perf_counter()
                    submitted = submission.submit_array(owner, spec, command=COMMAND, gpu_count=1)
                    ours_ms.append((time.perf_counter() - started) * 1000)
                    assert len(submitted.task_ids) == args.tasks
                    line = f"run {run + 1}: gpuadmin {ours_ms[-1]:.1f} ms"
                    if slurm is not None:
                        client = slurm.client()
                        started = time.perf_counter()
                        client.sbatch(sbatch)
                        theirs_ms.append((time.perf_counter() - started) * 1000)
                        line += f", Slurm {theirs_ms[-1]:.1f} ms"
                        line += f" ({ours_ms[-1] / theirs_ms[-1]:.1f}x)"
                    print(line, flush=True)
        finally:
            delete_redis_keys(set(hostnames))
    median = statistics.median(ours_ms)
    print(
        f"{args.tasks}-task array ({spec}): gpuadmin median {median:.1f} ms over {args.runs} "
        f"runs, min {min(ours_ms):.1f} ms"
    )
    if theirs_ms:
        slurm_median = statistics.median(theirs_ms)
        ratio = statistics.median(o / t for o, t in zip(ours_ms, theirs_ms, strict=True))
        print(
            f"Slurm's sbatch --array={spec}: median {slurm_median:.1f} ms, min "
            f"{min(theirs_ms):.1f} ms; gpuadmin/Slurm, median of the runs' ratios: {ratio:.2f}x "
            f"(target: at most {TARGET_RATIO:g}x)"
        )
    print(f"array_{args.tasks}_ms: {median:.1f} ms")
    if theirs_ms:
        print(f"slurm_array_{args.tasks}_ms: {slurm_median:.1f} ms")
        print(f"array_{args.tasks}_vs_slurm: {ratio:.2f} x")


if __name__ == "__main__":
    main()
