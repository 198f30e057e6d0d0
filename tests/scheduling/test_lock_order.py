"""Writers that lock both jobs and GPUs lock the jobs first (``scheduling.jobs.transitions``' lock
order), so a placement and a job's end that want the same job and GPU never deadlock.

The race, caught by the concurrency test under churn: the loop decided a batch while job A
was still queued (A onto one GPU, B onto the GPU a client then gave A by hand). A's end is
reported while the batch commits: the report locks A, then A's GPU to release it. Had the
batch locked its GPUs before its jobs, it would hold that GPU while waiting for A: each waits
for the other and PostgreSQL aborts one (a churn client died with ``deadlock detected``).

Beat's drain of a node whose agent never reports a stopped job gone locks the job first too,
and a report that ended it meanwhile wins."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from datetime import timedelta

import pytest
from django.db import connection, transaction
from django.utils import timezone

from inventory.choices import NodeState
from inventory.models import Gpu, Node
from scheduling.agent.wire import FinalState, JobFinished, executor_id
from scheduling.allocations import services as allocation_services
from scheduling.jobs import reports as job_reports
from scheduling.models import Allocation, Job, JobState
from tests.scheduling.conftest import add_sim_node

pytestmark = pytest.mark.django_db(transaction=True)


def backends_waiting_for_a_lock() -> int:
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_stat_clear_snapshot()")  # inside a transaction too
        cursor.execute(
            "SELECT count(*) FROM pg_stat_activity"
            " WHERE datname = current_database() AND wait_event_type = 'Lock'"
        )
        return cursor.fetchone()[0]


def wait_for_waiters(count: int) -> None:
    """Until `count` backends wait for a row lock (or 10 s)."""
    deadline = time.monotonic() + 10
    while backends_waiting_for_a_lock() < count and time.monotonic() < deadline:
        time.sleep(0.01)


def run(outcome: dict[str, object], name: str, call: Callable[[], object]) -> threading.Thread:
    """`call` in a thread of its own (its own connection); its result or exception (the
    deadlock's victim) lands in `outcome[name]`."""

    def target() -> None:
        try:
            outcome[name] = call()
        except Exception as exc:
            outcome[name] = exc
        finally:
            connection.close()

    thread = threading.Thread(target=target)
    thread.start()
    return thread


def test_a_jobs_end_and_a_placement_of_the_same_job_do_not_deadlock(django_user_model, broker):
    add_sim_node("dgx-01")
    first, second = Gpu.objects.filter(node__hostname="dgx-01").order_by("pk")[:2]
    owner = django_user_model.objects.create_user("alice")
    a, b = (Job.objects.create(owner=owner, command=["x"], state=JobState.QUEUED) for _ in "ab")
    stale_batch = [
        allocation_services.Grant(a.pk, (first.pk,)),
        allocation_services.Grant(b.pk, (second.pk,)),
    ]
    allocation_services.allocate(
        a, [second.pk], actor=owner, manual=True
    )  # by hand, after the decision
    outcome: dict[str, object] = {}

    with transaction.atomic():
        Job.objects.select_for_update().get(pk=a.pk)  # A's end is being reported ...
        batch = run(
            outcome,
            "batch",
            lambda: allocation_services.allocate_many(stale_batch, actor_name="loop"),
        )
        wait_for_waiters(1)  # the batch waits for A
        # ... and the report locks A's GPU to release it
        job_reports.job_finished(a.pk, a.attempt, "canceled", None, "", timezone.now())
    batch.join(timeout=30)

    committed = outcome["batch"]
    assert isinstance(committed, allocation_services.Allocated), outcome
    assert a.pk in committed.refused and "canceled" in committed.refused[a.pk]
    assert [job.pk for job, _ in committed.granted] == [b.pk]
    a.refresh_from_db()
    assert a.state == JobState.CANCELED
    active = Allocation.objects.active().values_list("job_id", "gpu_id")
    assert list(active) == [(b.pk, second.pk)]  # A's GPU released, then given to B


def test_ends_reported_together_with_a_preempted_jobs_do_not_deadlock_with_a_placement(
    django_user_model, broker
):
    """An agent reports A's end and B's end after B was preempted: B's GPU is released by a
    statement of its own, after A's. A placement that decided while both GPUs looked free
    locks them in id order: had the report locked A's GPU and then waited for B's (which the
    placement got first), each would wait for the other."""
    add_sim_node("dgx-01")
    low, high = Gpu.objects.filter(node__hostname="dgx-01").order_by("pk")[:2]
    owner = django_user_model.objects.create_user("alice")
    a, b, waiting, preemptor = (
        Job.objects.create(owner=owner, command=["x"], state=JobState.QUEUED) for _ in "abcd"
    )
    allocation_services.allocate(a, [high.pk], actor=owner)
    allocation_services.allocate(b, [low.pk], actor=owner)
    for job in (a, b):
        job_reports.job_started(job.pk, job.attempt, 1000 + job.pk, timezone.now())
    Job.objects.filter(pk=b.pk).update(preempted_by=preemptor, preempt_requested_at=timezone.now())
    reports = [
        JobFinished(executor_id(a.pk, 1), FinalState("completed"), 0, timezone.now()),
        JobFinished(executor_id(b.pk, 1), FinalState("failed"), -15, timezone.now()),
    ]
    outcome: dict[str, object] = {}

    # The placement reaches the lower GPU first: a lock held elsewhere queues it there.
    with transaction.atomic():
        Gpu.objects.select_for_update().get(pk=low.pk)
        grant = allocation_services.Grant(waiting.pk, (low.pk, high.pk))
        placement = run(
            outcome,
            "placement",
            lambda: allocation_services.allocate_many([grant], actor_name="loop"),
        )
        wait_for_waiters(1)
        report = run(outcome, "report", lambda: job_reports.job_events(reports))
        wait_for_waiters(2)
    placement.join(timeout=30)
    report.join(timeout=30)

    assert isinstance(outcome["report"], job_reports.Recorded), outcome
    assert outcome["report"].reached == {a.pk: JobState.COMPLETED, b.pk: JobState.QUEUED}
    assert isinstance(outcome["placement"], allocation_services.Allocated), outcome
    assert not Allocation.objects.active().exists()


def test_a_report_that_ends_a_job_while_beat_waits_for_it_wins_over_the_unkillable_drain(
    django_user_model, broker, settings
):
    """Beat found job A's cancel overdue (``end_unkillable_stops``) while A's agent was
    reporting its processes gone at last, A's row locked by the report: beat waits for it,
    then finds A canceled by the report and drains nothing."""
    add_sim_node("dgx-01")
    owner = django_user_model.objects.create_user("alice")
    a = Job.objects.create(owner=owner, command=["x"], state=JobState.QUEUED)
    gpu = Gpu.objects.filter(node__hostname="dgx-01").order_by("pk").first()
    assert gpu is not None
    allocation_services.allocate(a, [gpu.pk], actor=owner)
    job_reports.job_started(a.pk, a.attempt, 1000, timezone.now())
    overdue = settings.GPUADMIN_JOB_KILL_GRACE_S + settings.GPUADMIN_UNKILLABLE_TIMEOUT_S + 5
    Job.objects.filter(pk=a.pk).update(
        cancel_requested_at=timezone.now() - timedelta(seconds=overdue)
    )
    outcome: dict[str, object] = {}

    with transaction.atomic():
        Job.objects.select_for_update().get(pk=a.pk)  # A's end is being reported ...
        beat = run(outcome, "beat", job_reports.end_unkillable_stops)
        wait_for_waiters(1)  # beat found A overdue and waits for its row
        gone = JobFinished(executor_id(a.pk, 1), FinalState.CANCELED, -9, timezone.now())
        job_reports.job_events([gone], sender="dgx-01")
    beat.join(timeout=30)

    assert outcome["beat"] == [], outcome
    a.refresh_from_db()
    assert (a.state, a.exit_code) == (JobState.CANCELED, -9)
    assert Node.objects.get(hostname="dgx-01").state == NodeState.ONLINE
