"""The central side in twos, losing one of each under load (issue 31): two web servers
(`gpuadmin serve`), two central workers and two beats, all real processes on this session's
database; 500 submissions through the REST API, spread over both web servers, while the
worker whose placement pass is running and a beat are SIGKILLed.

The nodes are simulated DGX A100s in the catalog, their agents not run (their heartbeats taken
as fresh): what is tested is the central side, and on a 2-core host every process counts.

Afterwards `gpuadmin check` is clean, every submission answered 2xx is a job (and no other
job exists), every job is placed, running or finished, or waits with the loop's reason, no GPU
was ever held by two jobs at once, and placements resumed within the failover bound.
"""

from __future__ import annotations

import socket
import subprocess
import sys
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from datetime import datetime, timedelta

import pytest
from django.contrib.auth import get_user_model
from django.db import connection
from django.db.models import Min
from django.utils import timezone

from gpuadmin.access.services import create_token
from gpuadmin.audit.models import AuditEvent
from inventory.models import Node
from scheduling.loop import passes as loop
from scheduling.models import Job, JobState
from tests.conftest import REPO_DIR
from tests.integration.stack import (
    kill_hard,
    overlapping_allocations,
    running,
    stack_env,
    submit_over_http,
    wait_until_ready,
    wait_until_serving,
)
from tests.scheduling.conftest import add_sim_node
from tests.waiting import wait_for

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]

NODES = 24  # 8 GPUs each: the first 192 one-GPU jobs are placed, the others wait
SUBMISSIONS = 500
IN_FLIGHT = 50  # submissions sent at once (threads)
KILL_AFTER = 60  # submissions answered before the kill: GPUs are still free after it
FAILOVER_BOUND_S = 60
STARTING_S = 180  # a process's start, on a loaded host
SETTINGS = {
    "GPUADMIN_SUBMIT_RATE": "off",  # the per-user throttle is tested apart
    "GPUADMIN_PLACEMENT_INTERVAL_S": "2",  # beat's backstop pass
    "GPUADMIN_SCHEDULED_CONFIRM_S": "86400",  # no agents: placed jobs stay scheduled
}


def pass_holder() -> str | None:
    """The process (its PGAPPNAME) whose placement pass holds the loop's lock now."""
    key = loop.PASS_LOCK_ID
    with connection.cursor() as cursor:
        cursor.execute(
            """
            SELECT a.application_name FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid
            WHERE l.locktype = 'advisory' AND l.granted AND l.database = a.datid
              AND a.datname = current_database() AND l.classid = %s::oid AND l.objid = %s::oid
            """,
            [key >> 32, key & 0xFFFFFFFF],
        )
        row = cursor.fetchone()
    return None if row is None else row[0]


def first_placement_after(moment: datetime) -> float:
    """Seconds from ``moment`` to the first placement committed after it (its audit row)."""
    after = AuditEvent.objects.filter(event_type="allocation.created", time__gt=moment)
    wait_for(after.exists, FAILOVER_BOUND_S, "a placement after the kill")
    return (after.aggregate(at=Min("time"))["at"] - moment).total_seconds()


def free_ports(count: int) -> list[int]:
    """``count`` distinct free loopback ports (held open together while chosen)."""
    with ExitStack() as stack:
        sockets = [stack.enter_context(socket.socket()) for _ in range(count)]
        for sock in sockets:
            sock.bind(("127.0.0.1", 0))
        return [sock.getsockname()[1] for sock in sockets]


def test_two_of_everything_lose_a_worker_and_a_beat_under_load(
    gpuadmin_env, tmp_path, report_figure
):
    began = time.monotonic()
    env = stack_env(gpuadmin_env, **SETTINGS)
    owners = [get_user_model().objects.create_user(f"failover-{n}") for n in range(4)]
    keys = [create_token(owner, "failover", actor_name="tests")[1] for owner in owners]
    for n in range(NODES):
        add_sim_node(f"failover-{n:02}")
    Node.objects.update(last_heartbeat_at=timezone.now() + timedelta(hours=1))
    bases = [f"http://127.0.0.1:{port}" for port in free_ports(2)]
    # Each process names itself to PostgreSQL (PGAPPNAME): the pass lock's holder is found by it.
    commands = {
        **{
            f"web-{n}": (
                ("serve", "--bind", base.removeprefix("http://"), "--workers", "1"),
                {**env, "PGAPPNAME": f"web-{n}"},
            )
            for n, base in enumerate(bases)
        },
        **{
            f"worker-{n}": (("worker", "--concurrency", "2"), {**env, "PGAPPNAME": f"worker-{n}"})
            for n in range(2)
        },
        # Each beat keeps its schedule in a data directory of its own.
        **{
            f"beat-{n}": (
                ("beat",),
                {**env, "PGAPPNAME": f"beat-{n}", "GPUADMIN_DATA_DIR": str(tmp_path / f"beat-{n}")},
            )
            for n in range(2)
        },
    }
    answers: Counter[str] = Counter()
    accepted: list[int] = []
    counting = threading.Lock()
    killed: dict[str, object] = {}
    with running(commands, tmp_path) as processes:
        workers = [processes["worker-0"], processes["worker-1"]]
        logs = [tmp_path / "worker-0.log", tmp_path / "worker-1.log"]
        wait_until_ready(workers, logs, STARTING_S)
        for n, base in enumerate(bases):
            wait_until_serving(base, processes[f"web-{n}"], STARTING_S)
        started_s = time.monotonic() - began

        def submit(index: int) -> None:
            body = {"command": ["true"], "gpu_count": 1}
            status, job_id = submit_over_http(bases[index % 2], keys[index % len(keys)], body)
            with counting:
                answers[status] += 1
                if job_id is not None:
                    accepted.append(job_id)

        def kill_in_a_pass() -> None:
            """Once ``KILL_AFTER`` submissions are answered, SIGKILL the worker whose pass
            holds the loop's lock (caught in it), and a beat."""
            try:
                wait_for(lambda: answers.total() >= KILL_AFTER, 120, "the first submissions")
                holder = None
                deadline = time.monotonic() + 60
                while holder is None and time.monotonic() < deadline:
                    holder = pass_holder()
                    time.sleep(0.005)
                assert holder is not None, "no placement pass ran under load"
                kill_hard(processes[holder])
                kill_hard(processes["beat-0"])
                killed.update(worker=holder, beat="beat-0", at=timezone.now())
                killed["placed_after_s"] = first_placement_after(killed["at"])
            except AssertionError as exc:  # this thread's failure, the test's
                killed["error"] = str(exc)
            finally:
                connection.close()

        killer = threading.Thread(target=kill_in_a_pass)
        killer.start()
        submitting = time.monotonic()
        with ThreadPoolExecutor(IN_FLIGHT) as pool:
            list(pool.map(submit, range(SUBMISSIONS)))
        submit_s = time.monotonic() - submitting
        killer.join()
        assert "error" not in killed, killed["error"]

        # The loop has seen every job: what fits is placed, each waiting job carries its reason.
        wait_for(
            lambda: (
                Job.objects.filter(state=JobState.SCHEDULED).count() == NODES * 8
                and not Job.objects.filter(state=JobState.QUEUED, pending_code="").exists()
            ),
            STARTING_S,
            "every job to be placed or to get its reason",
        )
        survivors = [name for name, process in processes.items() if process.poll() is None]
        check = subprocess.run(
            [sys.executable, "-m", "gpuadmin", "check"],
            env=env,
            cwd=REPO_DIR,
            capture_output=True,
            text=True,
            timeout=120,
        )
        jobs = dict(Job.objects.values_list("pk", "state"))
        queued = Job.objects.filter(state=JobState.QUEUED)
        waiting_without_reason = list(queued.filter(pending_reason="").values_list("pk", flat=True))

    states = Counter(jobs.values())
    report_figure(
        f"{SUBMISSIONS} submissions over 2 web servers ({IN_FLIGHT} at once) in {submit_s:.1f} s: "
        f"answers {dict(answers)}; killed {killed['worker']} in a pass and {killed['beat']}, "
        f"a placement {killed['placed_after_s']:.1f} s later; jobs {dict(states)}; "
        f"stack up in {started_s:.1f} s, test {time.monotonic() - began:.1f} s"
    )
    assert answers == {"201": SUBMISSIONS}, answers
    assert sorted(jobs) == sorted(accepted)  # every 2xx is a job, and no other job exists
    assert set(states) == {JobState.SCHEDULED, JobState.QUEUED}, states
    assert not waiting_without_reason
    assert check.returncode == 0, check.stdout + check.stderr
    assert "all invariants hold" in check.stdout
    assert overlapping_allocations() == []
    assert killed["placed_after_s"] < FAILOVER_BOUND_S
    assert sorted(survivors) == sorted(set(processes) - {killed["worker"], killed["beat"]})
