"""Throughput of trivial jobs through one 8-GPU node, submit to completion, next to Slurm.

    .venv/bin/python bench/throughput.py [--jobs 400] [--runs 3] [--no-slurm]

What a run times, the Slurm side and ``--profile``'s hops: docs/development/design-notes.md,
"Throughput: bench/throughput.py".
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING

from common import (
    delete_redis_keys,
    process_env,
    start_worker_and_agent,
    stop,
    throwaway_database,
    wait_for,
)
from slurm import SlurmCluster

if TYPE_CHECKING:
    from django.contrib.auth.models import User

QUEUE = f"bench-throughput-{os.getpid()}"
HOSTNAME = f"bench-{os.getpid()}-throughput"
MODEL = "dgx-a100-80gb"
SLURM_TUNED_JOBS_PER_S = 9.3  # the measurement on this machine
TARGET_RATIO = 3.0


def gpuadmin_run(jobs: int, owner: User) -> tuple[float, list[int]]:
    """Seconds from the first submission of ``jobs`` one-GPU ``true`` jobs to the last end
    recorded centrally (the time on the last job's ``job.completed`` audit row: precise
    whatever the bench's polling interval, which stays slow so as not to compete with what
    it measures), and the jobs' ids."""
    from django.db.models import Max
    from django.utils import timezone

    from gpuadmin.audit.models import AuditEvent
    from scheduling.jobs import submission
    from scheduling.models import Job, JobState

    started = timezone.now()
    ids = [
        submission.submit_job(owner, command=["true"], gpu_count=1, name="bench").pk
        for _ in range(jobs)
    ]
    batch = Job.objects.filter(pk__in=ids)
    wait_for(
        lambda: not batch.exclude(state__in=[JobState.COMPLETED, JobState.FAILED]).exists(),
        600,
        f"{jobs} jobs to end",
        poll_s=0.25,
    )
    ended = AuditEvent.objects.filter(
        target_type=Job._meta.label_lower,
        target_id__in=[str(pk) for pk in ids],
        event_type__in=["job.completed", "job.failed"],
    ).aggregate(last=Max("time"))["last"]
    elapsed = (ended - started).total_seconds()
    failed = list(batch.filter(state=JobState.FAILED).values_list("message", flat=True))
    if failed:
        sys.exit(f"{len(failed)} of the bench's jobs failed, e.g.: {failed[0]}")
    return elapsed, ids


# The agent's debug line per run_job received, and the worker's info line per pass.
RECEIVED_LINE = re.compile(r"^(\S+ \S+) DEBUG gpuadmin\.agent: job (\S+): run_job received")
SENT_LINE = re.compile(r"^(\S+ \S+) DEBUG gpuadmin\.agent: job events sent: (.*)$")
PASS_LINE = re.compile(
    r"^(\S+ \S+) INFO gpuadmin\.placement: placement pass: (\d+) placed.* in (\d+) ms"
)


def log_lines(log: Path, offset: int) -> list[str]:
    with log.open() as file:
        file.seek(offset)
        return file.read().splitlines()


def logged_at(stamp: str) -> datetime:
    """A log line's time (logging's asctime, local time) as an aware datetime."""
    return datetime.strptime(stamp, "%Y-%m-%d %H:%M:%S,%f").astimezone()


def cpu_ticks(pids: list[int]) -> dict[int, int]:
    """CPU time (user and system, in clock ticks) used so far by each of ``pids`` that runs."""
    used = {}
    for pid in pids:
        try:
            stat = Path(f"/proc/{pid}/stat").read_bytes()
        except FileNotFoundError:
            continue
        fields = stat[stat.rindex(b")") + 2 :].split()
        used[pid] = int(fields[11]) + int(fields[12])
    return used


def cpu_used_ms(before: dict[int, int], after: dict[int, int]) -> float:
    """Milliseconds of CPU used between two ``cpu_ticks`` by the processes in both."""
    ticks = sum(after[pid] - before[pid] for pid in before.keys() & after.keys())
    return ticks * 1000 / os.sysconf("SC_CLK_TCK")


def process_groups(worker: int, agent: int) -> dict[str, list[int]]:
    """The bench's processes: the central worker (with its pool's processes), the agent, this
    process (it submits), and the database's server processes for this database."""
    from django.db import connection

    children = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                stat = Path(f"/proc/{name}/stat").read_bytes()
            except FileNotFoundError:
                continue
            if int(stat[stat.rindex(b")") + 2 :].split()[1]) == worker:
                children.append(int(name))
    with connection.cursor() as cursor:
        cursor.execute("SELECT pid FROM pg_stat_activity WHERE datname = current_database()")
        backends = [pid for (pid,) in cursor.fetchall()]
    return {
        "worker": [worker, *children],
        "agent": [agent],
        "bench (submits)": [os.getpid()],
        "postgres": backends,
    }


def hop_table(ids: list[int], agent_lines: list[str], worker_lines: list[str]) -> list[str]:
    """Where the jobs' cycles went: each hop's median and 90th percentile in milliseconds."""
    from gpuadmin.audit.models import AuditEvent
    from scheduling.agent.wire import parse_executor_id
    from scheduling.models import Allocation, Job

    jobs = {job.pk: job for job in Job.objects.filter(pk__in=ids)}
    audited = AuditEvent.objects.filter(
        target_type=Job._meta.label_lower,
        target_id__in=[str(pk) for pk in ids],
        event_type__in=["job.running", "job.completed"],
    ).values_list("target_id", "event_type", "time")
    recorded = {(int(target), kind): at for target, kind, at in audited}
    received = {}
    sent: dict[tuple[int, str], datetime] = {}
    batches: list[int] = []
    for line in agent_lines:
        if match := RECEIVED_LINE.match(line):
            received[parse_executor_id(match[2])[0]] = logged_at(match[1])
        elif match := SENT_LINE.match(line):
            names = match[2].split()
            batches.append(len(names))
            for name in names:
                executor_name, kind = name.split(":")
                sent[parse_executor_id(executor_name)[0], kind] = logged_at(match[1])
    by_gpu: dict[int, list[tuple[datetime, Job]]] = defaultdict(list)
    for gpu_id, job_id in Allocation.objects.filter(job_id__in=ids).values_list("gpu_id", "job_id"):
        placed = jobs[job_id].scheduled_at
        if placed is not None:
            by_gpu[gpu_id].append((placed, jobs[job_id]))
    hops: dict[str, list[float]] = defaultdict(list)

    def hop(name: str, start: datetime | None, end: datetime | None) -> None:
        if start is not None and end is not None:
            hops[name].append((end - start).total_seconds() * 1000)

    for job in jobs.values():
        hop("submitted -> placed (queue wait)", job.submitted_at, job.scheduled_at)
        hop("placed -> run_job received by the agent", job.scheduled_at, received.get(job.pk))
        hop("received -> process started", received.get(job.pk), job.started_at)
        hop("process started -> its end seen by the executor", job.started_at, job.finished_at)
        hop(
            "end seen -> recorded centrally (GPU released)",
            job.finished_at,
            recorded.get((job.pk, "job.completed")),
        )
        hop("  end seen -> sent by the agent", job.finished_at, sent.get((job.pk, "finished")))
        hop(
            "  sent -> recorded centrally",
            sent.get((job.pk, "finished")),
            recorded.get((job.pk, "job.completed")),
        )
        hop(
            "(started -> recorded RUNNING centrally)",
            job.started_at,
            recorded.get((job.pk, "job.running")),
        )
    for gpu_jobs in by_gpu.values():
        gpu_jobs.sort(key=lambda placed_job: placed_job[0])
        for (placed, job), (next_placed, _) in zip(gpu_jobs, gpu_jobs[1:], strict=False):
            completed = recorded.get((job.pk, "job.completed"))
            hop("GPU released -> its next job placed", completed, next_placed)
            hop("= the GPU's cycle (placed -> next placed)", placed, next_placed)
    passes = [match for line in worker_lines if (match := PASS_LINE.match(line))]
    lines = [f"  {'hop':<52} {'median':>8} {'p90':>8} {'n':>5}"]
    for name, values in hops.items():
        values.sort()
        p90 = values[min(len(values) - 1, int(len(values) * 0.9))]
        lines.append(
            f"  {name:<52} {statistics.median(values):>6.1f}ms {p90:>6.1f}ms {len(values):>5}"
        )
    if batches:
        lines.append(
            f"  {len(batches)} messages of job events from the agent: median "
            f"{statistics.median(batches):g} events, most {max(batches)}"
        )
    if passes:
        counts = [int(match[2]) for match in passes]
        durations = [float(match[3]) for match in passes]
        lines.append(
            f"  {len(passes)} passes that placed or changed something: median "
            f"{statistics.median(counts):g} placed, {statistics.median(durations):.0f} ms each"
        )
    return lines


def slurm_run(slurm: SlurmCluster, jobs: int) -> float:
    client = slurm.client()
    started = time.monotonic()
    for _ in range(jobs):
        client.sbatch(["--gres=gpu:1", "--wrap", "true"])
    wait_for(lambda: slurm.queued() == 0, 600, f"{jobs} Slurm jobs to end")
    return time.monotonic() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=400)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--slurm", action=argparse.BooleanOptionalAction, default=True)
    parser.add_argument(
        "--profile", action="store_true", help="print where each job's cycle goes, per run"
    )
    args = parser.parse_args()

    os.environ["GPUADMIN_CENTRAL_QUEUE"] = QUEUE  # read when Django is set up
    os.environ.setdefault("LOG_LEVEL", "info" if args.profile else "warning")
    os.environ["GPUADMIN_SUBMIT_RATE"] = "off"
    scratch = Path(tempfile.mkdtemp(prefix="gpuadmin-bench-throughput-"))
    ours: list[float] = []
    finished = False
    with throwaway_database("gpuadmin_bench_throughput") as database_url:
        from django.contrib.auth import get_user_model

        env = process_env(database_url, scratch)
        processes = start_worker_and_agent(
            env,
            scratch,
            HOSTNAME,
            MODEL,
            agent_args=("--jobs-as-agent",),
            agent_env={"LOG_LEVEL": "debug"} if args.profile else None,
        )
        owner = get_user_model().objects.create_user("bench")
        try:
            print(
                f"1 simulated {MODEL} agent (8 GPUs), {args.jobs} one-GPU `true` jobs per run, "
                f"{args.runs} runs; {os.cpu_count()} cores "
                f"(load average {os.getloadavg()[0]:.1f})"
            )
            gpuadmin_run(16, owner)  # warm-up: imports, connections, the executor's first fork
            for run in range(args.runs):
                offsets = [(scratch / name).stat().st_size for name in ("agent.log", "worker.log")]
                groups = process_groups(processes[0].pid, processes[1].pid)
                cpu_before = {name: cpu_ticks(pids) for name, pids in groups.items()}
                elapsed, ids = gpuadmin_run(args.jobs, owner)
                cpu_after = {name: cpu_ticks(pids) for name, pids in groups.items()}
                ours.append(args.jobs / elapsed)
                print(
                    f"gpuadmin run {run + 1}: {elapsed:.2f} s, {ours[-1]:.1f} jobs/s "
                    f"(load average {os.getloadavg()[0]:.1f})",
                    flush=True,
                )
                if args.profile:
                    agent_lines = log_lines(scratch / "agent.log", offsets[0])
                    worker_lines = log_lines(scratch / "worker.log", offsets[1])
                    print("\n".join(hop_table(ids, agent_lines, worker_lines)), flush=True)
                    per_job = {
                        name: cpu_used_ms(cpu_before[name], cpu_after[name]) / args.jobs
                        for name in groups
                    }
                    print(
                        "  CPU per job: "
                        + ", ".join(f"{name} {ms:.1f} ms" for name, ms in per_job.items()),
                        flush=True,
                    )
            finished = True
        finally:
            stop(processes)
            delete_redis_keys({QUEUE, HOSTNAME, f"node.{HOSTNAME}"})
            if finished:
                shutil.rmtree(scratch, ignore_errors=True)
            else:
                print(f"the processes' logs are kept in {scratch}", file=sys.stderr)

    theirs: list[float] = []
    if args.slurm:
        # Ports of its own: bench/submit.py's cluster (16817) may run at the same time.
        with SlurmCluster(tuned=True, port=16837) as slurm:
            for run in range(args.runs):
                elapsed = slurm_run(slurm, args.jobs)
                theirs.append(args.jobs / elapsed)
                print(f"slurm run {run + 1}: {elapsed:.2f} s, {theirs[-1]:.1f} jobs/s", flush=True)

    ours_median = statistics.median(ours)
    target = TARGET_RATIO * SLURM_TUNED_JOBS_PER_S
    print(
        f"\ngpuadmin {ours_median:.1f} jobs/s (median of {args.runs}); target at least "
        f"{TARGET_RATIO:g}x Slurm's tuned {SLURM_TUNED_JOBS_PER_S} = {target:.1f} jobs/s"
    )
    print(f"\nthroughput_jobs_per_s: {ours_median:.1f} jobs/s")
    if theirs:
        slurm_median = statistics.median(theirs)
        print(f"slurm_throughput_jobs_per_s: {slurm_median:.1f} jobs/s")
        print(f"throughput_vs_slurm: {ours_median / slurm_median:.2f} x")


if __name__ == "__main__":
    main()
