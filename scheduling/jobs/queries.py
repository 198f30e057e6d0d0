"""What the scheduler looks like from outside, for the API, the pages and the CLI: which jobs a
person sees, the queue and its statistics, every GPU's allocation, the orchestrator's state
and a job's log (read through its node's agent). Nothing here changes state."""

from __future__ import annotations

from collections.abc import Collection, Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.conf import settings
from django.contrib.auth.models import AnonymousUser, User
from django.contrib.postgres.aggregates import ArrayAgg
from django.db.models import (
    Avg,
    Count,
    DurationField,
    ExpressionWrapper,
    F,
    Max,
    Min,
    Prefetch,
    Q,
)
from django.db.models.query import QuerySet
from django.utils import timezone
from django.utils.dateparse import parse_datetime
from kombu.exceptions import OperationalError
from redis.exceptions import RedisError

from gpuadmin.access.models import ApiToken
from gpuadmin.access.services import sees_only_own, visible_to
from gpuadmin.audit.models import AuditEvent
from inventory import live
from inventory.models import Gpu, Node
from inventory.services import AgentTimedOut, run_on_node
from inventory.usability import Unusable
from scheduling.jobs import slurm
from scheduling.jobs.limits import SUBMISSION_LIMITS
from scheduling.jobs.slurm import array_label, compact_indexes
from scheduling.jobs.transitions import STOPPING
from scheduling.models import (
    HOLDING_STATES,
    TERMINAL_STATES,
    Allocation,
    Job,
    JobArray,
    JobDependency,
    JobState,
    PoolPolicy,
    SchedulerSettings,
)
from scheduling.policies import quotas

WAITING_STATES = (JobState.PENDING, JobState.QUEUED)
LOG_TIMEOUT_S = 5
# Wait-time histogram of /queue/statistics: (label, upper bound; None = no bound).
WAIT_BUCKETS: tuple[tuple[str, timedelta | None], ...] = (
    ("<1m", timedelta(minutes=1)),
    ("1-10m", timedelta(minutes=10)),
    ("10-60m", timedelta(hours=1)),
    ("1-6h", timedelta(hours=6)),
    (">6h", None),
)
STATISTICS_WINDOW = timedelta(hours=24)
THROUGHPUT_WINDOW = timedelta(hours=1)


# --------------------------------------------------------------------------- who sees what


def visible_jobs(user: User | AnonymousUser) -> QuerySet[Job]:
    """Users see their own jobs; viewers, operators and admins see everyone's."""
    return visible_to(user, Job.objects.all())


def no_job_text(user: User | AnonymousUser, job_id: int | str) -> str:
    """What ``user`` is told of a job ``visible_jobs`` does not give them: ``no job 12``, and
    to a user ``no job 12 of yours (a user sees only their own jobs)``, whether it is
    another's or none at all (the API's 404, a dependency's refusal)."""
    if sees_only_own(user):
        return f"no job {job_id} of yours (a user sees only their own jobs)"
    return f"no job {job_id}"


def visible_arrays(user: User | AnonymousUser) -> QuerySet[JobArray]:
    """The job arrays ``user`` sees: by the rule of ``visible_jobs``."""
    return visible_to(user, JobArray.objects.all())


def task_count_name(state: str) -> str:
    """The annotation of ``with_task_counts`` for the tasks in ``state``."""
    return f"tasks_{state}"


def with_task_counts(arrays: QuerySet[JobArray]) -> QuerySet[JobArray]:
    """Arrays with their owner and how many of their tasks made jobs are in each state (one
    query); ``task_counts`` adds those not made jobs yet."""
    return arrays.select_related("owner").annotate(
        **{
            task_count_name(state): Count("tasks", filter=Q(tasks__state=state))
            for state in JobState
        }
    )


def task_counts(array: JobArray) -> dict[str, int]:
    """State -> how many of the tasks of ``array`` (of ``with_task_counts``) are in it: its
    jobs', its tasks canceled before they were made jobs (``canceled_tasks``), and its tasks
    not made jobs yet in theirs (``JobArray.unsplit_state``). States with none are left
    out."""
    counts: dict[str, int] = {state: getattr(array, task_count_name(state)) for state in JobState}
    counts[JobState.CANCELED] += len(array.canceled_tasks)
    counts[array.unsplit_state] += array.unsplit
    return {state: count for state, count in counts.items() if count}


def array_indexes(array: JobArray) -> tuple[int, ...]:
    """The indexes of the tasks of ``array``, ascending (its spec's)."""
    return slurm.parse_array(
        array.spec, max_tasks=array.size, max_index=SUBMISSION_LIMITS["array_index"][1]
    ).indexes


def unsplit_indexes(array: JobArray) -> tuple[int, ...]:
    """The indexes of the tasks of ``array`` not made jobs (yet), in order: its spec's last,
    those canceled before they were made (``canceled_tasks``) left out."""
    canceled = set(array.canceled_tasks)
    return tuple(index for index in array_indexes(array) if index not in canceled)[array.split :]


def standing_for(array: JobArray, states: Collection[str], indexes: list[int]) -> list[int]:
    """The indexes a collapsed row of the tasks of ``array`` in ``states`` stands for: those
    of its jobs (``indexes``, ascending), its tasks not made jobs yet when their state is one
    of ``states`` (Slurm's pending array record: ``12_[50-1999%50]``), and its tasks canceled
    before they were made when ``states`` has canceled."""
    every = list(indexes)
    if array.unsplit and array.unsplit_state in states:
        every += unsplit_indexes(array)  # made in the spec's order: all after
    if array.canceled_tasks and JobState.CANCELED in states:
        return sorted([*every, *array.canceled_tasks])
    return every


def visible_allocations(user: User | AnonymousUser) -> QuerySet[Allocation]:
    """The allocations of the jobs ``user`` sees."""
    return visible_to(user, Allocation.objects.all(), owner="job__owner_id")


def own_tokens(user: User | AnonymousUser) -> QuerySet[ApiToken]:
    if isinstance(user, AnonymousUser):
        return ApiToken.objects.none()
    return ApiToken.objects.filter(user=user)


def with_details(jobs: QuerySet[Job]) -> QuerySet[Job]:
    """Jobs with what the job serializer shows (owner, pool, allocations with GPU and node,
    dependencies with the state of each job depended on) in three queries, however many
    jobs."""
    return jobs.select_related("owner", "pool").prefetch_related(
        Prefetch("allocations", queryset=Allocation.objects.select_related("gpu", "node")),
        Prefetch(
            "dependencies",
            queryset=JobDependency.objects.select_related("on").only(
                "job_id", "kind", "on_id", "on__state"
            ),
        ),
    )


@dataclass(frozen=True)
class ArrayTasks:
    """The tasks of one job array in one state that one row of ``collapsed_arrays`` stands
    for: ``12_[3-999%50]``, as ``squeue`` lists them."""

    label: str
    indexes: str  # compacted: 3-999
    count: int


def collapsed_arrays(jobs: QuerySet[Job]) -> QuerySet[Job]:
    """Of ``jobs``, one row per job array and state, as ``squeue`` lists an array: the jobs
    in no array, each task holding GPUs (each runs somewhere else), and of each array's other
    tasks in each state the first; ``array_tasks_of`` tells a page of rows what they stand
    for."""
    first = (
        jobs.filter(array__isnull=False)
        .exclude(state__in=HOLDING_STATES)
        .order_by("array_id", "state", "pk")
        .distinct("array_id", "state")
        .values("pk")
    )
    return jobs.filter(Q(array__isnull=True) | Q(state__in=HOLDING_STATES) | Q(pk__in=first))


def array_tasks_of(jobs: QuerySet[Job], rows: Iterable[Job]) -> dict[int, ArrayTasks]:
    """The tasks of ``jobs`` that each of ``rows`` (of ``collapsed_arrays(jobs)``) stands
    for, by row id: only the rows that stand for tasks of an array, with its tasks not made
    jobs yet in the row of their state (``standing_for``; two queries)."""
    standing = {
        (row.array_id, row.state): row.pk
        for row in rows
        if row.array_id is not None and row.state not in HOLDING_STATES
    }
    if not standing:
        return {}
    tasks = (
        jobs.prefetch_related(None)
        .filter(array_id__in={array_id for array_id, _ in standing})
        .exclude(state__in=HOLDING_STATES)
        .order_by()
        .values("array_id", "state")
        .annotate(indexes=ArrayAgg("array_index", order_by="array_index"))
    )
    arrays = JobArray.objects.in_bulk({array_id for array_id, _ in standing})
    found: dict[int, ArrayTasks] = {}
    for group in tasks:
        row_id = standing.get((group["array_id"], group["state"]))
        if row_id is not None:
            array = arrays[group["array_id"]]
            every = standing_for(array, [group["state"]], group["indexes"])
            indexes = compact_indexes(every)
            label = array_label(array.pk, indexes, array.max_running)
            found[row_id] = ArrayTasks(label, indexes, len(every))
    return found


# --------------------------------------------------------------------------- attempts


@dataclass
class Attempt:
    """One run of a job, from its placement to its end: where, when, and how it ended."""

    number: int
    gpus: list[Allocation]  # its allocations, by node and GPU index
    placed_at: datetime | None = None
    started_at: datetime | None = None
    ended_at: datetime | None = None
    ended: str = ""  # the state it left the job in (queued: requeued); empty while it holds GPUs
    exit_code: int | None = None
    reason: str = ""  # why it ended (the end's message, or the preemption or cancel asked for)
    current: bool = False  # the run the job's state is about (it runs, or it ended the job)

    @property
    def how_it_ended(self) -> str:
        """``requeued: retry 1/2 after attempt 1 failed: exit code 3``; empty while it runs."""
        ended = "requeued" if self.ended == JobState.QUEUED else self.ended
        return ": ".join(filter(None, (ended, self.reason))) if ended else ""

    @property
    def nodes(self) -> dict[str, list[int]]:
        """``{"dgx-01": [0, 1]}``: its GPUs' indexes by node."""
        nodes: dict[str, list[int]] = {}
        for allocation in self.gpus:
            nodes.setdefault(allocation.node.hostname, []).append(allocation.gpu.index)
        return nodes


# Audit rows that say why a run is about to end, before its end is reported.
STOP_REQUESTS = ("job.preempt_requested", "job.cancel_requested", STOPPING)


def job_attempts(job: Job, allocations: Iterable[Allocation]) -> list[Attempt]:
    """The job's runs, oldest first, from its ``allocations`` (every attempt's, with GPU and
    node) and its audit rows (one query): ``job.scheduled`` places attempt N, ``job.running``
    starts it, the first move out of scheduled or running ends it (its state, exit code and
    message); a preemption's or a cancel's request, or a stop that waits for its parts
    (``job.stopping``), gives the reason an end without one."""
    attempts: dict[int, Attempt] = {}
    for allocation in sorted(allocations, key=lambda a: (a.node.hostname, a.gpu.index)):
        attempt = attempts.setdefault(allocation.attempt, Attempt(allocation.attempt, []))
        attempt.gpus.append(allocation)
        attempt.placed_at = attempt.placed_at or allocation.allocated_at
        attempt.ended_at = allocation.released_at  # a gang's GPUs are released together
    events = AuditEvent.objects.filter(
        target_type=Job._meta.label_lower, target_id=str(job.pk)
    ).order_by("pk")
    running: Attempt | None = None
    asked = ""
    for event in events.only("event_type", "time", "before", "after", "message"):
        before, after = event.before or {}, event.after or {}
        if event.event_type == f"job.{JobState.SCHEDULED}" and "attempt" in after:
            number = after["attempt"]
            running = attempts.setdefault(number, Attempt(number, []))
            running.placed_at, asked = event.time, ""
        elif running is None:
            continue
        elif event.event_type == f"job.{JobState.RUNNING}":
            started = after.get("started_at")
            running.started_at = parse_datetime(started) if started else event.time
        elif event.event_type in STOP_REQUESTS:
            asked = event.message
        elif before.get("state") in HOLDING_STATES and after.get("state") not in HOLDING_STATES:
            running.ended, running.ended_at = after["state"], event.time
            running.exit_code = after.get("exit_code")
            running.reason = event.message or asked
            running = None
    found = sorted(attempts.values(), key=lambda attempt: attempt.number)
    if found and (
        job.state in HOLDING_STATES
        or (job.state in TERMINAL_STATES and found[-1].ended == job.state)
    ):
        found[-1].current = True
    return found


# Queue order: the placement loop's position, then submission.
QUEUE_ORDER = (F("queue_position").asc(nulls_last=True), "submitted_at", "pk")


def waiting(jobs: QuerySet[Job]) -> QuerySet[Job]:
    """Held and queued jobs in queue order."""
    return jobs.filter(state__in=WAITING_STATES).order_by(*QUEUE_ORDER)


def holding(jobs: QuerySet[Job]) -> QuerySet[Job]:
    """Scheduled and running jobs, oldest placement first."""
    return jobs.filter(state__in=HOLDING_STATES).order_by("scheduled_at", "pk")


# --------------------------------------------------------------------------- statistics


@dataclass(frozen=True)
class WaitBucket:
    label: str
    count: int


@dataclass(frozen=True)
class QueueStatistics:
    total_queued: int
    by_state: dict[str, int]
    # Over the jobs started in the last 24 h: started_at - submitted_at.
    started_last_24h: int
    average_wait_s: float | None
    wait_distribution: list[WaitBucket]
    # Jobs that completed or failed in the last hour.
    throughput_jobs_per_hour: int
    oldest_queued_submitted_at: datetime | None


def queue_statistics(now: datetime | None = None) -> QueueStatistics:
    """The queue in numbers, in four aggregate queries."""
    now = now or timezone.now()
    by_state = dict.fromkeys(JobState.values, 0)
    by_state.update(Job.objects.order_by().values_list("state").annotate(n=Count("pk")))
    wait = ExpressionWrapper(F("started_at") - F("submitted_at"), output_field=DurationField())
    buckets: dict[str, Count] = {}
    lower = timedelta(0)
    for label, upper in WAIT_BUCKETS:
        condition = Q(wait__gte=lower) if upper is None else Q(wait__gte=lower, wait__lt=upper)
        buckets[label] = Count("pk", filter=condition)
        lower = upper or lower
    started = (
        Job.objects.filter(started_at__gte=now - STATISTICS_WINDOW)
        .annotate(wait=wait)
        .aggregate(started=Count("pk"), average=Avg("wait"), **buckets)
    )
    finished = Job.objects.filter(
        state__in=(JobState.COMPLETED, JobState.FAILED),
        finished_at__gte=now - THROUGHPUT_WINDOW,
    ).count()
    oldest = Job.objects.filter(state=JobState.QUEUED).aggregate(oldest=Min("submitted_at"))
    average = started["average"]
    return QueueStatistics(
        total_queued=by_state[JobState.QUEUED],
        by_state=by_state,
        started_last_24h=started["started"],
        average_wait_s=None if average is None else round(average.total_seconds(), 3),
        wait_distribution=[WaitBucket(label, started[label]) for label, _ in WAIT_BUCKETS],
        throughput_jobs_per_hour=finished,
        oldest_queued_submitted_at=oldest["oldest"],
    )


# --------------------------------------------------------------------------- GPUs


@dataclass(frozen=True)
class GpuStatus:
    """A present GPU, why the one rule refuses it now (``None``: it may be given), and its
    active allocations (a whole GPU has one; MPS shares and MIG devices one each), oldest
    first."""

    gpu: Gpu
    unusable: Unusable | None
    allocations: tuple[Allocation, ...] = ()

    @property
    def allocation(self) -> Allocation | None:
        """The first of them (the API's ``job_id``, from before shares were listed)."""
        return self.allocations[0] if self.allocations else None

    @property
    def in_use(self) -> bool:
        """Whether a job holds it, or a part of it (counted once however many)."""
        return bool(self.allocations)

    @property
    def schedulable(self) -> bool:
        return self.unusable is None

    @property
    def free(self) -> bool:
        return self.schedulable and not self.in_use


def gpu_status(hostname: str | None = None) -> list[GpuStatus]:
    """Every present GPU (of one node when ``hostname`` is given), in two queries and one
    read of the live samples."""
    gpus = Gpu.objects.present().select_related("node").order_by("node__hostname", "index")
    if hostname is not None:
        gpus = gpus.on_node(hostname)
    allocations: dict[int, list[Allocation]] = {}
    active = Allocation.objects.active().select_related("job__owner")
    for allocation in active.order_by("allocated_at", "pk"):
        allocations.setdefault(allocation.gpu_id, []).append(allocation)
    now = timezone.now()
    rows = list(gpus)
    samples = live.latest({gpu.node.hostname for gpu in rows})
    return [
        GpuStatus(
            gpu,
            gpu.unusable(
                samples[gpu.node.hostname].get(gpu.uuid),
                allocated=gpu.pk in allocations,
                now=now,
            ),
            tuple(allocations.get(gpu.pk, ())),
        )
        for gpu in rows
    ]


# --------------------------------------------------------------------------- orchestrator


@dataclass(frozen=True)
class OrchestratorStatus:
    config: SchedulerSettings
    default_policy: PoolPolicy  # of the GPUs in no pool
    jobs: dict[str, int]  # pending, queued, scheduled, running
    gpus_present: int
    gpus_allocated: int  # in use: held whole or in part, each GPU once
    gpus_free: int  # usable now (the one rule, live samples included) and not allocated
    last_scheduled_at: datetime | None


def orchestrator_status() -> OrchestratorStatus:
    """The switch and policy, and what the loop has to work with (a few counting queries)."""
    active_states = (*WAITING_STATES, *HOLDING_STATES)
    jobs: dict[str, int] = dict.fromkeys(active_states, 0)
    jobs.update(
        Job.objects.filter(state__in=active_states)
        .order_by()
        .values_list("state")
        .annotate(n=Count("pk"))
    )
    allocated = Allocation.objects.active().gpu_ids()
    return OrchestratorStatus(
        config=SchedulerSettings.load(),
        default_policy=quotas.policy_of(None),  # a status read writes no row
        jobs=jobs,
        gpus_present=Gpu.objects.present().count(),
        gpus_allocated=allocated.count(),
        gpus_free=Gpu.objects.free(held=allocated).count(),
        last_scheduled_at=Job.objects.aggregate(last=Max("scheduled_at"))["last"],
    )


# --------------------------------------------------------------------------- logs


class NoLog(LookupError):
    """The job (or this attempt of it on that node) never ran: there is no log to read."""


class LogUnavailable(RuntimeError):
    """The node's agent cannot be asked now (unreachable node, silent agent, no broker)."""


@dataclass(frozen=True)
class JobLog:
    text: str
    exists: bool  # False: the agent has no log for this attempt (yet)
    node: str
    nodes: list[str]  # every node of the attempt (a multi-node job has a log on each)
    attempt: int


def job_log(job: Job, *, lines: int, hostname: str | None = None) -> JobLog:
    """The last ``lines`` lines of the job's latest attempt on ``hostname`` (default: its first
    node), read through that node's agent. Raises ``NoLog`` or ``LogUnavailable``."""
    nodes = list(
        Node.objects.filter(allocations__job=job, allocations__attempt=job.attempt)
        .distinct()
        .order_by("hostname")
    )
    if job.attempt == 0 or not nodes:
        raise NoLog(f"job {job.pk} has not run yet (it is {job.state})")
    names = [node.hostname for node in nodes]
    node = (
        nodes[0] if hostname is None else next((n for n in nodes if n.hostname == hostname), None)
    )
    if node is None:
        raise NoLog(
            f"attempt {job.attempt} of job {job.pk} ran on {', '.join(names)}, not {hostname}"
        )
    if not node.is_reachable():
        raise LogUnavailable(
            f"node {node.hostname} is unreachable: no heartbeat in the last "
            f"{settings.GPUADMIN_HEARTBEAT_GRACE_S} s"
        )
    try:
        answer = run_on_node(
            node.hostname,
            "scheduling.tail_log",
            job.pk,
            job.attempt,
            lines,
            timeout=LOG_TIMEOUT_S,
            unanswered="try again later",
        )
    except AgentTimedOut as exc:
        raise LogUnavailable(str(exc)) from None
    except (OperationalError, RedisError) as exc:
        raise LogUnavailable(f"the task broker cannot be reached: {exc}") from None
    return JobLog(answer["text"], answer["exists"], node.hostname, names, job.attempt)
