"""Sustained concurrent churn: client processes submit, cancel, start, finish and grab GPUs by
hand while two central workers run the placement loop. Afterwards no invariant is broken, no
GPU was ever held by two jobs at once, and every job rests in a state its audit log names."""

from __future__ import annotations

import subprocess
import sys
from datetime import timedelta
from pathlib import Path

import pytest
from django.utils import timezone

from inventory.models import Node
from scheduling.checks import run_checks
from scheduling.jobs import reports
from scheduling.loop import passes as loop
from scheduling.models import HOLDING_STATES, Allocation, Job, JobState, SchedulerSettings
from tests.conftest import REPO_DIR, session_database_url
from tests.integration.stack import overlapping_allocations, stop_warmly, wait_until_ready
from tests.scheduling.conftest import add_sim_node

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]

CLIENTS = 3
CHURN_S = 20


def test_concurrent_churn_breaks_no_invariant(gpuadmin_env, tmp_path):
    for i in range(4):
        add_sim_node(f"churn-{i:02}")
    # The nodes' agents are not run here: their heartbeats are taken as fresh for the test.
    Node.objects.update(last_heartbeat_at=timezone.now() + timedelta(hours=1))
    env = {**gpuadmin_env, "DATABASE_URL": session_database_url()}

    def start(*args: str, log: Path) -> subprocess.Popen:
        # Output goes to a file, never an unread pipe: a client blocked writing its log while
        # it holds GPU row locks would stall the placement pass and every other client.
        return subprocess.Popen(
            [sys.executable, "-X", "faulthandler", *args],  # SIGABRT dumps every thread's stack
            env=env,
            cwd=REPO_DIR,
            stdout=log.open("w"),
            stderr=subprocess.STDOUT,
            text=True,
        )

    logs = [tmp_path / f"worker-{n}.log" for n in range(2)]
    workers = [start("-m", "gpuadmin", "worker", "--concurrency", "2", log=log) for log in logs]
    try:
        wait_until_ready(workers, logs, timeout=60)
        client_logs = [tmp_path / f"churn-{n}.log" for n in range(CLIENTS)]
        clients = [
            start("-m", "tests.integration.churn", "--seconds", str(CHURN_S), "--seed", str(n),
                  "--owner", f"churn-{n}", log=log)
            for n, log in enumerate(client_logs)
        ]  # fmt: skip
        for client in clients:
            client.wait(timeout=CHURN_S + 120)
        # A failed client's output (its traceback) lands in the assertion, the others' not.
        failed = {
            f"client {n} (exit {client.returncode})": log.read_text()[-4000:]
            for n, (client, log) in enumerate(zip(clients, client_logs, strict=True))
            if client.returncode
        }
        assert not failed, failed
        # Stop placing, wait out a pass in flight, then play the agents: what holds GPUs ends.
        SchedulerSettings.objects.update_or_create(pk=1, defaults={"enabled": False})
        with loop.pass_lock():
            pass
        for job in Job.objects.filter(state__in=HOLDING_STATES):
            reports.job_started(job.pk, job.attempt, 1, timezone.now())
            reports.job_finished(job.pk, job.attempt, "completed", 0, "", timezone.now())
    finally:
        aborted = stop_warmly(workers)
        assert not aborted, "\n".join(
            f"--- {log.name}\n{log.read_text()[-12000:]}"
            for worker, log in zip(workers, logs, strict=True)
            if worker in aborted
        )

    assert Job.objects.count() > 100, [log.read_text()[-4000:] for log in client_logs]
    assert Allocation.objects.count() > 50
    assert {name: found for name, found in run_checks().items() if found} == {}
    assert overlapping_allocations() == []
    states = set(Job.objects.values_list("state", flat=True))
    assert states <= {JobState.QUEUED, JobState.COMPLETED, JobState.FAILED, JobState.CANCELED}
    assert JobState.COMPLETED in states
