"""Invariants the scheduler promises, checked against the database (``gpuadmin check``).

Each check is one query and returns human sentences; an empty list means the invariant holds.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from typing import TextIO

from django.conf import settings
from django.contrib.postgres.fields import ArrayField
from django.db import connection
from django.db.models import Count, F, Func, IntegerField, Q
from django.utils import timezone

from inventory.choices import GpuState, NodeState
from scheduling.jobs.reports import overdue_stops, stop_began, stop_grace_s, unconfirmed_jobs
from scheduling.jobs.transitions import STOPPING
from scheduling.models import HOLDING_STATES, Allocation, Job, JobArray
from scheduling.placement.text import plural

Check = Callable[[], list[str]]


def gpus_allocated_twice() -> list[str]:
    rows = (
        Allocation.objects.active()
        .values("gpu__uuid")
        .annotate(jobs=Count("job", distinct=True), n=Count("pk"))
        .filter(n__gt=1)
    )
    return [f"GPU {row['gpu__uuid']} has {row['n']} active allocations" for row in rows]


def holding_jobs_with_wrong_allocations() -> list[str]:
    """A scheduled or running job holds exactly gpu_count x node_count GPUs."""
    jobs = (
        Job.objects.filter(state__in=HOLDING_STATES)
        .annotate(held=Count("allocations", filter=Q(allocations__released_at__isnull=True)))
        .exclude(held=F("gpu_count") * F("node_count"))
    )
    return [
        f"job {job.pk} is {job.state} with {plural(job.held, 'GPU')} allocated, "
        f"needs {job.total_gpus}"
        for job in jobs
    ]


INDEXES: ArrayField[list[int], list[int]] = ArrayField(IntegerField())


def arrays_with_wrong_tasks() -> list[str]:
    """A job array has exactly as many jobs as it says it made of its tasks (``split``): the
    placement loop makes each of its indexes a job once; and none of its tasks canceled
    before they were made (``canceled_tasks``) is a job: it is never made."""
    arrays = JobArray.objects.annotate(made=Count("tasks")).exclude(made=F("split"))
    made_canceled = (
        Job.objects.filter(
            array__isnull=False,
            array__canceled_tasks__contains=Func(
                F("array_index"), template="ARRAY[%(expressions)s]", output_field=INDEXES
            ),
        )
        .order_by("array_id", "array_index")
        .values_list("array_id", "array_index", "pk")
    )
    return [
        f"array {array.pk} has {plural(array.made, 'job')} of its tasks, says it made {array.split}"
        for array in arrays
    ] + [
        f"array {array_id}'s task {index} was canceled before it was made, yet is job {job_id}"
        for array_id, index, job_id in made_canceled
    ]


def allocations_of_jobs_that_let_go() -> list[str]:
    rows = (
        Allocation.objects.active()
        .exclude(job__state__in=HOLDING_STATES)
        .values_list("pk", "job_id", "job__state")
    )
    return [f"allocation {pk} is active but job {job} is {state}" for pk, job, state in rows]


def allocations_on_offline_hardware() -> list[str]:
    rows = (
        Allocation.objects.active()
        .filter(
            Q(gpu__state=GpuState.OFFLINE)
            | Q(node__state=NodeState.OFFLINE)
            | Q(gpu__missing_since__isnull=False)
        )
        .values_list("job_id", "gpu__uuid", "gpu__state", "node__hostname", "node__state")
    )
    return [
        f"job {job} holds GPU {uuid} ({gpu_state}) on node {host} ({node_state})"
        for job, uuid, gpu_state, host, node_state in rows
    ]


def jobs_scheduled_too_long() -> list[str]:
    """No job stays SCHEDULED longer than ``GPUADMIN_SCHEDULED_CONFIRM_S`` (beat re-queues
    it: a job found here waits for that, or nothing re-queues it)."""
    bound = settings.GPUADMIN_SCHEDULED_CONFIRM_S
    now = timezone.now()
    rows = unconfirmed_jobs(now).order_by("pk").values_list("pk", "scheduled_at")
    return [
        f"job {pk} is scheduled for {(now - at).total_seconds():.0f} s, longer than "
        f"GPUADMIN_SCHEDULED_CONFIRM_S ({bound} s), and no agent has started it"
        for pk, at in rows
        if at is not None  # always (the filter): for the type checker
    ]


def jobs_stopping_too_long() -> list[str]:
    """No job's stop stays under way past the time it is overdue (``reports.stop_overdue_at``:
    the stop's grace and ``GPUADMIN_UNKILLABLE_TIMEOUT_S`` after it began) and a beat period
    more (``GPUADMIN_REQUEUE_INTERVAL_S``): by then beat has drained the nodes that never
    reported its processes gone and ended it (``reports.end_unkillable_stops``), or stopped
    waiting for its silent nodes. A job found here holds its GPUs with nothing acting on it
    (beat is not running, or its nodes are silent and its cancel waits for their agents)."""
    unkillable = settings.GPUADMIN_UNKILLABLE_TIMEOUT_S
    beat = settings.GPUADMIN_REQUEUE_INTERVAL_S
    now = timezone.now()
    found = []
    for job in overdue_stops(now, slack=timedelta(seconds=beat)):
        began = stop_began(job, now)
        assert began is not None  # overdue: its stop is under way
        waited = (now - began).total_seconds()
        waiting_for = f" (waiting for {', '.join(job.ending['nodes'])})" if job.ending else ""
        found.append(
            f"job {job.pk} has been stopping for {waited:.0f} s{waiting_for}, longer than "
            f"its grace ({stop_grace_s(job)} s) + GPUADMIN_UNKILLABLE_TIMEOUT_S "
            f"({unkillable} s) + a beat period ({beat:g} s), and holds its GPUs: its nodes "
            "should have been drained and the job ended"
        )
    return found


def audit_gaps() -> list[str]:
    """Every job's latest state event names its current state; every allocation is audited.
    A ``job.stopping`` row names the state decided, not taken yet (the job keeps its own until
    its agents report its processes gone): not a state event."""
    with connection.cursor() as cursor:
        cursor.execute(
            """
            SELECT j.id, j.state, e.after ->> 'state'
            FROM scheduling_job j
            LEFT JOIN LATERAL (
                SELECT after FROM audit_auditevent
                WHERE target_type = 'scheduling.job' AND target_id = j.id::text
                  AND (event_type LIKE 'job.%%' AND after ? 'state')
                  AND event_type <> %s
                ORDER BY id DESC LIMIT 1
            ) e ON true
            WHERE e.after IS NULL OR e.after ->> 'state' <> j.state
            """,
            [STOPPING],
        )
        jobs = [
            f"job {pk} is {state} but its audit log says {logged or 'nothing'}"
            for pk, state, logged in cursor.fetchall()
        ]
        cursor.execute(
            """
            SELECT a.id FROM scheduling_allocation a
            WHERE NOT EXISTS (
                SELECT 1 FROM audit_auditevent e
                WHERE e.event_type = 'allocation.created'
                  AND e.target_type = 'scheduling.allocation' AND e.target_id = a.id::text
            )
            """
        )
        allocations = [f"allocation {pk} has no audit row" for (pk,) in cursor.fetchall()]
    return jobs + allocations


CHECKS: dict[str, Check] = {
    "a GPU is never allocated twice": gpus_allocated_twice,
    "a scheduled or running job holds exactly its GPUs": holding_jobs_with_wrong_allocations,
    "a job that ended holds no GPU": allocations_of_jobs_that_let_go,
    "no allocation on offline or missing hardware": allocations_on_offline_hardware,
    "no job stays scheduled without its agent starting it": jobs_scheduled_too_long,
    "no stopped job holds its GPUs past the kill grace and the unkillable timeout": (
        jobs_stopping_too_long
    ),
    "every job and allocation change is audited": audit_gaps,
    "each job array's tasks are made jobs once": arrays_with_wrong_tasks,
}


def run_checks() -> dict[str, list[str]]:
    """Violations per invariant (empty lists when all hold)."""
    return {name: check() for name, check in CHECKS.items()}


def report(out: TextIO) -> int:
    """Print each invariant with its violations; the number of violations."""
    failed = 0
    for invariant, violations in run_checks().items():
        print(f"{'FAIL' if violations else 'ok  '} {invariant}", file=out)
        for violation in violations:
            print(f"     - {violation}", file=out)
        failed += len(violations)
    print(f"{failed} violation(s)" if failed else "all invariants hold", file=out)
    return failed
