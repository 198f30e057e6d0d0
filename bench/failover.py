"""Failover of the central side: two central workers (`gpuadmin worker`) and two beats
(`gpuadmin beat`) as real processes on one throwaway database and the configured Redis, a queue
kept loaded (jobs submitted all along, the simulated nodes' agents played by this script: each
placed job is reported started and, a moment later, completed, which frees its GPUs and wakes
the loop). Each round SIGKILLs, at once, the worker whose pass holds the placement loop's lease
(caught in the middle of a pass: the lease is taken; with its pool processes, as a lost
machine) and the beat that holds the beat lease, then measures the time from the kill to the
next placement committed (the first ``allocation.created`` audit row after it) and to the
next task beat sends (the survivor's first claimed period). A new worker and beat replace the
killed ones before the next round.

    python bench/failover.py [--rounds 3] [--nodes 8]

Ends with the medians: ``failover_placement_s`` and ``failover_beat_s`` (target: under 60 s
each, with the default lease of 15 s and backstop pass every 30 s).
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import statistics
import subprocess
import tempfile
import threading
import time
from datetime import datetime
from pathlib import Path

import psutil
from common import (
    delete_redis_keys,
    load_sim_fleet,
    process_env,
    start_gpuadmin,
    throwaway_database,
    wait_for,
)

QUEUE = f"bench-failover-{os.getpid()}"
SUBMIT_EVERY_S = 0.2
RUN_S = 1.0  # how long the played agents take to finish a job they started
SETTLE_S = 10.0  # between a round's replacements and its kill


def wait_ready(log: Path, line: str) -> None:
    """Until the process logging to ``log`` wrote ``line`` (a worker ready, a beat standing by):
    starting takes tens of seconds on a loaded host, and a kill before is no failover."""
    wait_for(lambda: line in log.read_text(errors="replace"), 180, f"{log.name}: {line!r}")


def kill_hard(process: subprocess.Popen[bytes]) -> None:
    """SIGKILL a process and its children (a worker's pool), as losing its machine does."""
    children = psutil.Process(process.pid).children(recursive=True)
    for child in children:
        child.send_signal(signal.SIGKILL)
    process.send_signal(signal.SIGKILL)
    process.wait(timeout=30)


def holder_pid(name: str) -> int | None:
    """The process id in the holder of lease ``name`` while it is held, else ``None``."""
    from django.utils import timezone

    from gpuadmin.leases.models import Lease

    lease = Lease.objects.filter(name=name, expires_at__gt=timezone.now()).first()
    return None if lease is None else int(lease.holder.split(":")[1])


def owner_of(pid: int, processes: list[subprocess.Popen[bytes]]) -> subprocess.Popen[bytes]:
    for process in processes:
        family = {process.pid, *(c.pid for c in psutil.Process(process.pid).children(True))}
        if pid in family:
            return process
    raise LookupError(pid)


class Load:
    """Jobs submitted every ``SUBMIT_EVERY_S``; placed jobs reported started, then completed
    ``RUN_S`` later (the agents of the simulated nodes)."""

    def __init__(self) -> None:
        self.stopping = threading.Event()
        self.threads = [
            threading.Thread(target=self._guard, args=(f,))
            for f in (self._submit, self._play_agents)
        ]

    def __enter__(self) -> Load:
        for thread in self.threads:
            thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self.stopping.set()
        for thread in self.threads:
            thread.join()

    def _guard(self, loop) -> None:  # noqa: ANN001
        from django.db import connection

        try:
            loop()
        finally:
            connection.close()

    def _submit(self) -> None:
        from django.contrib.auth.models import User

        from scheduling.jobs import submission

        owner, _ = User.objects.get_or_create(username="bench-failover")
        while not self.stopping.wait(SUBMIT_EVERY_S):
            submission.submit_job(
                owner, command=["sleep", "1"], gpu_count=2, estimated_duration_s=60
            )

    def _play_agents(self) -> None:
        from django.utils import timezone

        from scheduling.jobs import reports
        from scheduling.models import Job, JobState

        started: dict[tuple[int, int], float] = {}
        while not self.stopping.wait(0.2):
            for pk, attempt in Job.objects.filter(state=JobState.SCHEDULED).values_list(
                "pk", "attempt"
            ):
                if reports.job_started(pk, attempt, 1, timezone.now()):
                    started[(pk, attempt)] = time.monotonic()
            for (pk, attempt), at in list(started.items()):
                if time.monotonic() - at >= RUN_S:
                    reports.job_finished(pk, attempt, "completed", 0, "", timezone.now())
                    del started[(pk, attempt)]


def first_placement_after(killed_at: datetime, timeout: float = 300) -> float:
    """Seconds from ``killed_at`` to the first placement committed after it (its audit row's
    time, written in the placement's transaction)."""
    from django.db.models import Min

    from gpuadmin.audit.models import AuditEvent

    after = AuditEvent.objects.filter(event_type="allocation.created", time__gt=killed_at)
    deadline = time.monotonic() + timeout
    while (at := after.aggregate(at=Min("time"))["at"]) is None:
        if time.monotonic() > deadline:
            raise RuntimeError(f"no placement {timeout:.0f} s after the kill")
        time.sleep(0.1)
    return (at - killed_at).total_seconds()


def first_beat_send_after(killed_at: datetime, old: set[str], timeout: float = 300) -> float:
    """Seconds from ``killed_at`` until a beat other than the ``old`` senders claims a period
    (it sends that task right after), polled every 0.1 s."""
    from django.utils import timezone

    from gpuadmin.leases.models import BeatPeriod

    wait_for(
        lambda: BeatPeriod.objects.exclude(sent_by__in=old).exists(),
        timeout,
        "the standby beat to send",
        poll_s=0.1,
    )
    return (timezone.now() - killed_at).total_seconds()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3, help="kills in the middle of a pass")
    parser.add_argument("--nodes", type=int, default=8)
    args = parser.parse_args()
    os.environ["GPUADMIN_CENTRAL_QUEUE"] = QUEUE
    scratch = Path(tempfile.mkdtemp(prefix="bench-failover-"))
    with throwaway_database("bench_failover") as database_url:
        from django.utils import timezone

        from gpuadmin.audit.models import AuditEvent
        from gpuadmin.leases.beat import LEASE_NAME as BEAT_LEASE
        from gpuadmin.leases.models import BeatPeriod
        from scheduling.loop import passes

        logging.getLogger("gpuadmin").setLevel(logging.WARNING)  # each job's moves
        hostnames = load_sim_fleet(args.nodes, publish_samples=True)
        env = process_env(database_url, scratch, GPUADMIN_CENTRAL_QUEUE=QUEUE)
        started = 0

        def start(verb: str) -> subprocess.Popen[bytes]:
            nonlocal started
            started += 1
            own = {**env, "GPUADMIN_DATA_DIR": str(scratch / f"data-{started}")}
            argv = [verb, "--concurrency", "1"] if verb == "worker" else [verb]
            return start_gpuadmin(argv, own, scratch / f"{verb}-{started}.log")

        def replace(verb: str, processes: list[subprocess.Popen[bytes]], ready: str) -> None:
            processes.append(start(verb))
            wait_ready(scratch / f"{verb}-{started}.log", ready)

        workers = [start("worker"), start("worker")]
        beats = [start("beat"), start("beat")]
        for number, (verb, ready) in enumerate(
            [("worker", " ready."), ("worker", " ready."), ("beat", "beat: ")], 1
        ):
            wait_ready(scratch / f"{verb}-{number}.log", ready)
        wait_ready(scratch / "beat-4.log", "beat: ")  # a leader, and one standing by
        placement_s: list[float] = []
        beat_s: list[float] = []
        try:
            with Load():
                wait_for(lambda: holder_pid(BEAT_LEASE) is not None, 120, "a beat leader")
                wait_for(
                    lambda: AuditEvent.objects.filter(event_type="allocation.created").exists(),
                    120,
                    "a first placement",
                )
                while len(placement_s) < args.rounds:
                    time.sleep(SETTLE_S)
                    wait_for(lambda: holder_pid(passes.lease_name()) is not None, 120,
                             "a pass in progress", poll_s=0.005)  # fmt: skip
                    pass_pid, beat_pid = holder_pid(passes.lease_name()), holder_pid(BEAT_LEASE)
                    if pass_pid is None or beat_pid is None:
                        continue  # the pass ended meanwhile
                    worker, beat = owner_of(pass_pid, workers), owner_of(beat_pid, beats)
                    kill_hard(worker)
                    kill_hard(beat)
                    killed_at = timezone.now()
                    # Killed in the middle of its pass: the lease was not given back.
                    mid_pass = holder_pid(passes.lease_name()) == pass_pid
                    old_holders = set(BeatPeriod.objects.values_list("sent_by", flat=True))
                    placement = first_placement_after(killed_at)
                    beat_s.append(first_beat_send_after(killed_at, old_holders))
                    if mid_pass:
                        placement_s.append(placement)
                    print(f"kill at {killed_at:%H:%M:%S}: placement after {placement:.1f} s"
                          f"{'' if mid_pass else ' (the pass had ended: not counted)'}, "
                          f"beat after {beat_s[-1]:.1f} s", flush=True)  # fmt: skip
                    workers.remove(worker)
                    beats.remove(beat)
                    replace("worker", workers, " ready.")
                    replace("beat", beats, "beat: standing by")
        finally:
            for process in [*workers, *beats]:
                process.terminate()
            for process in [*workers, *beats]:
                try:
                    process.wait(timeout=60)
                except subprocess.TimeoutExpired:
                    kill_hard(process)
            delete_redis_keys({QUEUE, *hostnames})
    print(f"kills: {len(beat_s)} ({len(placement_s)} in the middle of a pass), {args.nodes} "
          "nodes, lease TTL 15 s, backstop pass every 30 s")  # fmt: skip
    print(f"failover_placement_s: {statistics.median(placement_s):.1f} s")
    print(f"failover_beat_s: {statistics.median(beat_s):.1f} s")


if __name__ == "__main__":
    main()
