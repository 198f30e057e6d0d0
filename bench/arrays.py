"""Job arrays: how long one ``--array`` submission of N tasks takes to be accepted, by gpuadmin
and by Slurm 22.05's ``sbatch --array`` in the same run, and how long gpuadmin's placement loop
then takes to make the first of its tasks jobs.

    .venv/bin/python bench/arrays.py [--tasks 2000] [--runs 15] [--cap 50] [--no-slurm]

Creates a throwaway database on the configured PostgreSQL server (DATABASE_URL, or the
embedded one), a simulated fleet of two DGX nodes and a user, and starts a private Slurm
(bench/slurm.py; installed from Debian when missing). Then ``--runs`` times, in turn:

- gpuadmin: one array ``0-<tasks-1>%<cap>`` submitted through the job service
  (``submission.submit_array``, what ``POST /api/v1/jobs/`` with ``"array"`` calls after
  parsing the body): the checks, the ``JobArray`` row and its ``array.submitted`` audit row in
  one statement, timed from the call to its commit (PostgreSQL's work included; the loop's
  wake-up is sent on commit, Redis must be reachable). Its tasks are not jobs yet: as Slurm
  keeps a pending array as one record, gpuadmin makes them jobs when the loop reaches them;
- Slurm: ``sbatch --hold --array=<the same spec> --gres=gpu:1 --wrap ...``, timed from the
  start of the ``sbatch`` process to its exit (its start, the munge credential, the RPC to
  slurmctld, which stores the array as one job record, and the reply). Held, as gpuadmin's
  tasks wait for a placement loop that does not run here;
- gpuadmin's split, a second figure apart from the comparison: ``arrays.split_due()``, what
  each placement pass does first, timed from the call to its commit, right after the
  submission: it makes jobs of the first tasks the array may use (its cap and one more: 51
  for ``%50``; 500 without a cap), with their ``job.submitted`` audit rows, and looks at the
  earlier runs' arrays too (each locked, none with room: their tasks wait).

Neither side's tasks are deleted between runs. Prints each run, then the medians, and ends
with the headline lines ``array_<tasks>_ms``, ``slurm_array_<tasks>_ms``,
``array_<tasks>_vs_slurm`` (the median of the runs' ratios) and
``array_<tasks>_split_first_<n>_ms`` (the loop's split of its first n tasks). Target
(issue 30): submission at most 2x Slurm's time.
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

        from scheduling.jobs import arrays, submission

        hostnames = load_sim_fleet(2)
        owner = get_user_model().objects.create_user("bench")
        ours_ms: list[float] = []
        theirs_ms: list[float] = []
        split_ms: list[float] = []
        made: set[int] = set()
        try:
            with SlurmCluster(tuned=True) if args.slurm else nullcontext() as slurm:
                sbatch = ["--hold", f"--array={spec}", "--gres=gpu:1", "--wrap", " ".join(COMMAND)]
                for run in range(args.runs):
                    started = time.perf_counter()
                    submitted = submission.submit_array(owner, spec, command=COMMAND, gpu_count=1)
                    ours_ms.append((time.perf_counter() - started) * 1000)
                    assert submitted.array.size == args.tasks
                    line = f"run {run + 1}: gpuadmin {ours_ms[-1]:.1f} ms"
                    if slurm is not None:
                        client = slurm.client()
                        started = time.perf_counter()
                        client.sbatch(sbatch)
                        theirs_ms.append((time.perf_counter() - started) * 1000)
                        line += f", Slurm {theirs_ms[-1]:.1f} ms"
                        line += f" ({ours_ms[-1] / theirs_ms[-1]:.1f}x)"
                    started = time.perf_counter()
                    made.add(arrays.split_due())
                    split_ms.append((time.perf_counter() - started) * 1000)
                    line += f"; its first tasks made jobs in {split_ms[-1]:.1f} ms"
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
    [first] = made  # the same number each run
    split_median = statistics.median(split_ms)
    print(
        f"the loop's split of its first {first} tasks (arrays.split_due, right after the "
        f"submission): median {split_median:.1f} ms, min {min(split_ms):.1f} ms"
    )
    print(f"array_{args.tasks}_ms: {median:.1f} ms")
    if theirs_ms:
        print(f"slurm_array_{args.tasks}_ms: {slurm_median:.1f} ms")
        print(f"array_{args.tasks}_vs_slurm: {ratio:.2f} x")
    print(f"array_{args.tasks}_split_first_{first}_ms: {split_median:.1f} ms")


if __name__ == "__main__":
    main()
