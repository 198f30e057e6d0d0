"""Jobs, arrays and dependencies. A job's state changes only through
``scheduling.jobs.transitions`` (one audited transition each).
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.contrib.postgres.fields import ArrayField
from django.core.serializers.json import DjangoJSONEncoder
from django.core.validators import MaxValueValidator, MinValueValidator
from django.db import models
from django.db.models import F, Func, Q

from inventory.models import Pool
from scheduling.allocations.models import AllocationKind


class JobState(models.TextChoices):
    PENDING = "pending", "Pending"  # accepted, not yet admitted to the queue
    QUEUED = "queued", "Queued"  # waiting for GPUs
    SCHEDULED = "scheduled", "Scheduled"  # GPUs allocated, sent to the node agent
    RUNNING = "running", "Running"
    COMPLETED = "completed", "Completed"
    FAILED = "failed", "Failed"
    CANCELED = "canceled", "Canceled"
    PREEMPTED = "preempted", "Preempted"  # stopped to make room; re-queued


TERMINAL_STATES = frozenset({JobState.COMPLETED, JobState.FAILED, JobState.CANCELED})
# States in which a job holds its allocations.
HOLDING_STATES = frozenset({JobState.SCHEDULED, JobState.RUNNING})
# The placement loop's word on a waiting job, as it reads on a job that is not waiting: only a
# QUEUED job carries any of it (``transitions.transition`` clears it, a constraint checks it).
NOT_WAITING: dict[str, Any] = {
    "pending_code": "",
    "pending_reason": "",
    "queue_position": None,
    "estimated_start_at": None,
    "what_if": "",
}


class Priority(models.TextChoices):
    LOW = "low", "Low"
    NORMAL = "normal", "Normal"
    HIGH = "high", "High"
    CRITICAL = "critical", "Critical"


class Topology(models.TextChoices):
    ANY = "any", "Any GPUs of one node"
    NUMA = "numa", "One NUMA node"
    NVLINK = "nvlink", "One NVLink/NVSwitch domain"
    NODE = "node", "One node"


class Job(models.Model):
    # job_owner_state leads with the owner: no index of its own (one less to write per job).
    owner = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="+", db_index=False
    )
    project = models.CharField(max_length=100, blank=True)
    name = models.CharField(max_length=200, blank=True)

    # What to run
    command = ArrayField(models.TextField(), help_text="argv; a shell only when use_shell.")
    use_shell = models.BooleanField(default=False)
    env = models.JSONField(default=dict, blank=True)
    working_dir = models.CharField(max_length=1024, blank=True)
    container_image = models.CharField(max_length=500, blank=True)
    # The client's key for this submission: a resend with the same key (per owner) returns this
    # job instead of storing another (``submission.submit_job``).
    idempotency_key = models.CharField(max_length=100, blank=True, default="")

    # What it needs
    gpu_count = models.PositiveSmallIntegerField(
        default=1, validators=[MinValueValidator(1)], help_text="GPUs per node."
    )
    node_count = models.PositiveSmallIntegerField(
        default=1, validators=[MinValueValidator(1)], help_text="Nodes of a multi-node gang."
    )
    min_gpu_memory_mib = models.PositiveIntegerField(default=0)
    gpu_model = models.CharField(max_length=100, blank=True, help_text="Exact GPU product name.")
    topology = models.CharField(max_length=8, choices=Topology.choices, default=Topology.ANY)
    priority = models.CharField(max_length=8, choices=Priority.choices, default=Priority.NORMAL)
    preemptible = models.BooleanField(default=False)
    estimated_duration_s = models.PositiveIntegerField(null=True, blank=True)
    max_runtime_s = models.PositiveIntegerField(null=True, blank=True)
    max_retries = models.PositiveSmallIntegerField(default=0, validators=[MaxValueValidator(20)])
    pool = models.ForeignKey(
        Pool,
        null=True,
        blank=True,
        on_delete=models.PROTECT,
        related_name="+",
        db_index=False,  # job_pool: its jobs only
        help_text="The pool whose GPUs it runs on; none: the GPUs in no pool.",
    )
    # Sharing: a MIG device of this profile, or an MPS share of one GPU (then gpu_count is 1).
    mig_profile = models.CharField(
        "MIG profile", max_length=32, blank=True, help_text="e.g. 1g.10gb: one MIG device."
    )
    mps_percent = models.PositiveSmallIntegerField(
        "MPS share (% of SMs)",
        null=True,
        blank=True,
        validators=[MinValueValidator(1), MaxValueValidator(100)],
    )
    mps_memory_mib = models.PositiveIntegerField("MPS memory limit (MiB)", null=True, blank=True)
    # A Ray application (scheduling.jobs.ray): its nodes run a Ray cluster of their own, the
    # head on the first, and its command is the entrypoint, run on the head.
    ray = models.BooleanField(
        "Ray application",
        default=False,
        help_text="Run the command as a Ray application on a Ray cluster of the job's nodes.",
    )
    ray_port = models.PositiveIntegerField(
        null=True,
        blank=True,
        editable=False,
        help_text="Its head's GCS port in its current attempt (its dashboard's is the next).",
    )
    # Host resources on each of its nodes (Slurm's --cpus-per-task x tasks and --mem; a
    # Kubernetes pod's requests): placement gives a node part only where they are free.
    cpus = models.PositiveIntegerField(
        "CPUs per node", default=0, help_text="Logical CPUs on each node (0: none asked)."
    )
    host_memory_mib = models.PositiveIntegerField(
        "host memory per node (MiB)", default=0, help_text="Host RAM on each node (0: none asked)."
    )
    # Slurm-style arrays and dependencies
    array = models.ForeignKey(
        "JobArray",
        null=True,
        blank=True,
        on_delete=models.PROTECT,
        related_name="tasks",
        db_index=False,  # job_array_state leads with it
    )
    array_index = models.PositiveIntegerField(null=True, blank=True)
    reservation = models.ForeignKey(
        "Reservation",
        null=True,
        blank=True,
        on_delete=models.PROTECT,
        related_name="jobs",
        db_index=False,  # job_reservation: its jobs only
        help_text="Runs on this reservation's GPUs, inside its window.",
    )

    # Where it stands
    state = models.CharField(max_length=10, choices=JobState.choices, default=JobState.PENDING)
    attempt = models.PositiveSmallIntegerField(default=0, help_text="Runs started so far.")
    preemptions = models.PositiveSmallIntegerField(
        default=0, help_text="Times it was stopped for another job and re-queued."
    )
    failures = models.PositiveSmallIntegerField(
        default=0,
        help_text="Runs that failed, timed out or were lost: what max_retries counts (a "
        "preemption, a re-layout's or a fault's re-queue does not).",
    )
    submitted_at = models.DateTimeField(auto_now_add=True, db_index=True)
    scheduled_at = models.DateTimeField(null=True, blank=True)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    exit_code = models.IntegerField(null=True, blank=True)
    pid = models.IntegerField(null=True, blank=True)
    message = models.TextField(blank=True, help_text="Why it failed or was canceled.")
    # Read from its cgroup at its end (sacct's TotalCPU and MaxRSS); a gang's summed / largest.
    cpu_seconds = models.FloatField(
        "CPU time (s)", null=True, blank=True, help_text="User and system CPU time of all its runs."
    )
    max_memory_bytes = models.PositiveBigIntegerField(
        "peak memory (bytes)",
        null=True,
        blank=True,
        help_text="Largest host memory of any of its runs on any one node.",
    )

    # The placement loop's latest word on a waiting job (not state changes: not audited)
    pending_code = models.CharField(max_length=32, blank=True)
    pending_reason = models.TextField(blank=True)
    queue_position = models.PositiveIntegerField(null=True, blank=True)
    estimated_start_at = models.DateTimeField(null=True, blank=True)
    what_if = models.TextField(blank=True)
    # Why the GPUs it runs on were chosen (topology class, NUMA nodes, score, sentence)
    placement = models.JSONField(null=True, blank=True)
    # Placed over its quota on idle GPUs (borrowing): preemptible, and reclaimed first.
    borrowed = models.BooleanField(default=False)
    # Set when the loop asked its agents to stop it for another job (signal, then the grace);
    # its end is then a preemption: it is re-queued, not canceled.
    preempted_by = models.ForeignKey(
        "self",
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="+",
        db_index=False,  # job_preempted_by: its jobs only
    )
    preempt_requested_at = models.DateTimeField(null=True, blank=True)
    # Set when its owner (or an operator) asked its agents to stop it: its end is a cancel
    # whatever its processes made of the signal, and no pass picks it as a victim meanwhile.
    cancel_requested_at = models.DateTimeField(null=True, blank=True)
    # Set when its attempt's end was decided while its processes may still run on some of its
    # nodes (a gang's part ended, or it was stopped for its hardware): the end to take once the
    # agents of ``nodes`` have reported their parts gone; it keeps its GPUs until then
    # (``scheduling.jobs.transitions.stop_parts``). {"state", "message", "fields", "nodes",
    # "since"}.
    ending = models.JSONField(null=True, blank=True, encoder=DjangoJSONEncoder)

    class Meta:
        ordering = ["-pk"]
        indexes = [
            models.Index(fields=["state", "submitted_at"], name="job_state_submitted"),
            models.Index(fields=["owner", "state"], name="job_owner_state"),
            models.Index(fields=["project"], name="job_project"),
            # Partial: most jobs are in no array, pool or reservation and preempted by none,
            # and each index a row is in costs its INSERT (a job array's thousands of tasks,
            # every submission's server time); a lookup by one of them (= or IN, never IS NULL)
            # implies it is set, so PostgreSQL uses the index all the same.
            *(
                models.Index(
                    fields=fields, name=name, condition=Q(**{f"{fields[0]}__isnull": False})
                )
                for fields, name in (
                    (["array", "state"], "job_array_state"),
                    (["pool"], "job_pool"),
                    (["reservation"], "job_reservation"),
                    (["preempted_by"], "job_preempted_by"),
                )
            ),
        ]
        constraints = [
            models.CheckConstraint(condition=Q(gpu_count__gte=1), name="job_gpu_count_positive"),
            models.CheckConstraint(condition=Q(node_count__gte=1), name="job_node_count_positive"),
            models.CheckConstraint(
                condition=Q(state=JobState.QUEUED)
                | Q(
                    pending_code="",
                    pending_reason="",
                    queue_position__isnull=True,
                    estimated_start_at__isnull=True,
                    what_if="",
                ),
                name="job_waiting_fields_only_while_queued",
            ),
            models.CheckConstraint(
                condition=Q(mig_profile="") | Q(mps_percent__isnull=True),
                name="job_mig_or_mps_not_both",
            ),
            models.CheckConstraint(
                condition=(Q(mig_profile="") & Q(mps_percent__isnull=True))
                | Q(gpu_count=1, node_count=1),
                name="job_shares_are_single_gpu",
            ),
            models.CheckConstraint(
                condition=Q(mps_percent__isnull=True) | Q(mps_percent__gte=1, mps_percent__lte=100),
                name="job_mps_percent_range",
            ),
            models.UniqueConstraint(
                fields=["array", "array_index"],
                condition=Q(array__isnull=False),
                name="job_array_index_unique",
            ),
            models.UniqueConstraint(
                fields=["owner", "idempotency_key"],
                condition=~Q(idempotency_key=""),
                name="job_owner_idempotency_key_unique",
            ),
        ]

    def __str__(self) -> str:
        return f"job {self.pk} {self.name}".strip()

    @property
    def total_gpus(self) -> int:
        return self.gpu_count * self.node_count

    @property
    def is_terminal(self) -> bool:
        return self.state in TERMINAL_STATES

    @property
    def allocation_kind(self) -> AllocationKind:
        """What its allocation gives: a MIG device, an MPS share, else whole GPUs."""
        if self.mig_profile:
            return AllocationKind.MIG
        return AllocationKind.GPU if self.mps_percent is None else AllocationKind.MPS


def expected_end(
    start: datetime | None, estimated_duration_s: int | None, max_runtime_s: int | None
) -> datetime | None:
    """When a job that started at ``start`` should let go of its GPUs: its estimate, else its
    maximum runtime, after the start (None when either is unknown). The placement loop's and
    the calendar's one rule."""
    runtime = estimated_duration_s or max_runtime_s
    if start is None or runtime is None:
        return None
    return start + timedelta(seconds=runtime)


# How many of an array's tasks were canceled before they were made jobs, in SQL.
CANCELED_TASKS = Func(
    F("canceled_tasks"), function="CARDINALITY", output_field=models.IntegerField()
)


class JobArray(models.Model):
    """One ``--array`` submission, stored as one row as Slurm stores a pending array: its
    tasks become Jobs with an ``array_index`` only when the placement loop reaches them
    (``scheduling.jobs.arrays``), the first ``split`` of its indexes in the spec's order,
    skipping those canceled before they were made (``canceled_tasks``)."""

    owner = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="+")
    spec = models.CharField(max_length=200, help_text="As submitted, e.g. 0-999%50.")
    size = models.PositiveIntegerField()
    max_running = models.PositiveIntegerField(
        null=True, blank=True, help_text="Tasks running at once (the %N); empty: no cap."
    )
    submitted_at = models.DateTimeField(auto_now_add=True)
    held = models.BooleanField(default=False, help_text="Submitted held: its tasks are pending.")
    # What its tasks name, as a job's own keys: kept while it may still make tasks of them.
    pool = models.ForeignKey(
        Pool, null=True, blank=True, on_delete=models.PROTECT, related_name="+", db_index=False
    )
    reservation = models.ForeignKey(
        "Reservation",
        null=True,
        blank=True,
        on_delete=models.PROTECT,
        related_name="+",
        db_index=False,
    )
    template = models.JSONField(
        default=dict,
        blank=True,
        help_text="The other checked Job fields each of its tasks is made with.",
    )
    dependency = models.TextField(
        blank=True, help_text="What each task depends on, as Slurm writes it: afterok:12:13."
    )
    split = models.PositiveIntegerField(
        default=0,
        help_text="Its tasks made jobs so far: the first of its indexes not canceled, in order.",
    )
    canceled_at = models.DateTimeField(
        null=True, blank=True, help_text="Canceled: its tasks not made jobs yet never will be."
    )
    canceled_tasks = ArrayField(
        models.PositiveIntegerField(),
        default=list,
        blank=True,
        help_text="Indexes of its tasks canceled before they were made jobs (ascending): "
        "never made; the others are made in order around them.",
    )

    class Meta:
        ordering = ["-pk"]
        indexes = [
            # The arrays a placement pass splits: few of all ever submitted.
            models.Index(
                fields=["id"],
                name="jobarray_unsplit",
                condition=Q(split__lt=F("size") - CANCELED_TASKS, canceled_at__isnull=True),
            )
        ]
        constraints = [
            models.CheckConstraint(
                condition=Q(split__lte=F("size") - CANCELED_TASKS), name="jobarray_split_le_size"
            )
        ]

    def __str__(self) -> str:
        return f"array {self.pk} [{self.spec}]"

    @property
    def unsplit(self) -> int:
        """Its tasks not made jobs (yet, or ever when it was canceled), those canceled one by
        one (``canceled_tasks``) left out."""
        return self.size - self.split - len(self.canceled_tasks)

    @property
    def unsplit_state(self) -> str:
        """The state its tasks not made jobs are in, as Slurm shows a pending array's:
        canceled with the array, else held (pending) or queued as it was submitted."""
        if self.canceled_at is not None:
            return JobState.CANCELED
        return JobState.PENDING if self.held else JobState.QUEUED


class DependencyKind(models.TextChoices):
    AFTEROK = "afterok", "After it completes"
    AFTERANY = "afterany", "After it ends"
    AFTERNOTOK = "afternotok", "After it fails"


class JobDependency(models.Model):
    """``job`` may start only after ``on`` ended the way ``kind`` says."""

    job = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="dependencies")
    on = models.ForeignKey(Job, on_delete=models.PROTECT, related_name="dependents")
    kind = models.CharField(max_length=10, choices=DependencyKind.choices)

    class Meta:
        verbose_name_plural = "job dependencies"
        constraints = [
            models.UniqueConstraint(fields=["job", "on"], name="job_dependency_once"),
            models.CheckConstraint(condition=~Q(job=F("on")), name="job_dependency_not_self"),
        ]

    def __str__(self) -> str:
        return f"job {self.job_id} {self.kind}:{self.on_id}"
