"""Slurm-style job dependencies (``afterok``, ``afterany``, ``afternotok``) and array caps,
as the placement loop needs them.

A job may depend only on jobs that exist when it is submitted (and that its submitter sees),
so dependencies never form a cycle. ``resolve`` tells the loop which queued jobs must still
wait, and cancels those whose dependency can never be satisfied (like Slurm's
``kill_invalid_depend``); the loop is woken on every job's end (``transitions.transition``), so a
dependent job is looked at again as soon as what it waits for ends.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from django.contrib.auth.models import User
from django.db.models import Exists, OuterRef

from scheduling.jobs import control, limits, queries, slurm, transitions
from scheduling.models import (
    TERMINAL_STATES,
    DependencyKind,
    Job,
    JobArray,
    JobDependency,
    JobState,
)
from scheduling.placement.text import listing

# By the state the job depended on ended in: whether each kind of dependency holds. A job
# that has not ended satisfies none yet; one that ended otherwise never will.
SATISFIED_BY: dict[str, frozenset[str]] = {
    DependencyKind.AFTEROK: frozenset({JobState.COMPLETED}),
    DependencyKind.AFTERNOTOK: frozenset({JobState.FAILED, JobState.CANCELED}),
    DependencyKind.AFTERANY: frozenset(TERMINAL_STATES),
}


def outcome(kind: str, state: str) -> bool | None:
    """Whether a ``kind`` dependency on a job in ``state`` holds: ``None`` while that job has
    not ended, ``False`` when it ended in a way that can never satisfy it."""
    if state not in TERMINAL_STATES:
        return None
    return state in SATISFIED_BY[kind]


def text(pairs: Iterable[tuple[str, int]]) -> str:
    """``afterok:12:13,afterany:14``: (kind, job id) pairs as Slurm writes them."""
    by_kind: dict[str, list[str]] = {}
    for kind, job_id in pairs:
        by_kind.setdefault(kind, []).append(str(job_id))
    return ",".join(f"{kind}:{':'.join(ids)}" for kind, ids in by_kind.items())


def check(owner: User, dependency: str | Sequence[tuple[str, int]]) -> list[tuple[str, Job]]:
    """The (kind, job) pairs of a submission's ``dependency`` (Slurm's text or pairs):
    ``limits.JobRejected`` naming ``dependency`` for a bad kind, a job named twice or
    unknown to ``owner`` (``queries.visible_jobs``), one that already ended in a way that can
    never satisfy it, or more than ``SUBMISSION_LIMITS["dependencies"]`` jobs."""
    if isinstance(dependency, str):
        limits.check_text("dependency", dependency)
        if len(dependency) > limits.MAX_DEPENDENCY_CHARS:
            most = limits.MAX_DEPENDENCY_CHARS
            raise limits.JobRejected("dependency", f"at most {most} characters")
        try:
            pairs = slurm.parse_dependency(dependency)
        except slurm.SpecError as exc:
            raise limits.JobRejected("dependency", str(exc)) from None
    else:
        pairs = list(dependency)
    most = limits.SUBMISSION_LIMITS["dependencies"][1]
    if len(pairs) > most:
        raise limits.JobRejected("dependency", f"at most {most} jobs")
    named: set[int] = set()
    for kind, job_id in pairs:
        if kind not in DependencyKind.values:
            kinds = ", ".join(DependencyKind.values)
            raise limits.JobRejected("dependency", f"{kind!r} is not one of {kinds}")
        if job_id in named:
            raise limits.JobRejected("dependency", f"job {job_id} is named twice")
        named.add(job_id)
    found = {
        job.pk: job for job in queries.visible_jobs(owner).filter(pk__in=named).only("pk", "state")
    }
    for kind, job_id in pairs:
        job = found.get(job_id)
        if job is None:
            no_job = queries.no_job_text(owner, job_id)
            raise limits.JobRejected("dependency", f"{kind}:{job_id}: {no_job}")
        if outcome(kind, job.state) is False:
            raise limits.JobRejected(
                "dependency", f"{kind}:{job_id}: job {job_id} {job.state}, so it can never hold"
            )
    return [(kind, found[job_id]) for kind, job_id in pairs]


# Rows per INSERT: PostgreSQL takes at most 65,535 parameters in a statement (3 per row).
STORE_BATCH = 20_000


def store(job_ids: Sequence[int], needs: Sequence[tuple[str, Job]]) -> list[JobDependency]:
    """Each of ``job_ids`` depends on each of ``needs`` (in the caller's transaction; one
    multi-row INSERT per ``STORE_BATCH`` rows)."""
    if not needs:
        return []
    return JobDependency.objects.bulk_create(
        (
            JobDependency(job_id=job_id, on=on, kind=kind)
            for job_id in job_ids
            for kind, on in needs
        ),
        batch_size=STORE_BATCH,
    )


def resolve() -> dict[int, list[tuple[str, int]]]:
    """The QUEUED jobs whose dependencies do not all hold yet, each with those that do not
    (kind, job id; by the jobs' states; one query); those with one that can never hold are
    canceled (``control.cancel_waiting``, audited, with a message such as ``dependency never
    satisfied: afterok:123 failed``) and are not in the answer."""
    rows = JobDependency.objects.filter(job__state=JobState.QUEUED).values_list(
        "job_id", "kind", "on_id", "on__state"
    )
    waiting: dict[int, list[tuple[str, int]]] = {}
    never: dict[int, str] = {}
    for job_id, kind, on_id, state in rows:
        held = outcome(kind, state)
        if held is None:
            waiting.setdefault(job_id, []).append((kind, on_id))
        elif held is False and job_id not in never:
            never[job_id] = f"dependency never satisfied: {kind}:{on_id} {state}"
    if never:
        control.cancel_waiting(never, actor_name=transitions.LOOP_ACTOR)
    return {job_id: unmet for job_id, unmet in waiting.items() if job_id not in never}


# What each kind of dependency waits for the job it names to do.
AWAITED: dict[str, str] = {
    DependencyKind.AFTEROK: "complete",
    DependencyKind.AFTERNOTOK: "fail or be canceled",
    DependencyKind.AFTERANY: "end",
}


def waiting_text(unmet: Iterable[tuple[str, int]]) -> str:
    """Why a job waits on its dependencies, as Slurm's ``(Dependency)`` reason but in words:
    ``waiting for job 12 to complete (afterok)``, ``waiting for jobs 12 and 13 to complete
    (afterok) and job 14 to end (afterany)``; ``unmet``: (kind, job id) pairs not held yet."""
    by_kind: dict[str, list[int]] = {}
    for kind, job_id in unmet:
        by_kind.setdefault(kind, []).append(job_id)
    clauses = [
        f"{'job' if len(ids) == 1 else 'jobs'} {listing([str(i) for i in sorted(ids)])} "
        f"to {AWAITED[kind]} ({kind})"
        for kind, ids in sorted(by_kind.items())
    ]
    return f"waiting for {listing(clauses, limit=len(clauses))}"


def array_limits() -> dict[int, int]:
    """Array id -> its %N cap, for the capped arrays with unfinished tasks (one query)."""
    unfinished = Job.objects.filter(array=OuterRef("pk")).exclude(state__in=TERMINAL_STATES)
    capped = JobArray.objects.filter(max_running__isnull=False).filter(Exists(unfinished))
    return {pk: cap for pk, cap in capped.values_list("pk", "max_running") if cap is not None}
