"""Jobs, their GPU allocations and the scheduler's settings (roles and API tokens live in
``gpuadmin.access``).

A job's ``state`` changes only through ``scheduling.services`` (one audited transition each).
An allocation gives one GPU to one job; the database refuses a second active allocation of a
GPU (a partial unique index), whatever the Python code above it does.
"""

from __future__ import annotations

from collections.abc import Collection
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.contrib.postgres.constraints import ExclusionConstraint
from django.contrib.postgres.fields import ArrayField, DateTimeRangeField, RangeOperators
from django.core.validators import MaxValueValidator, MinValueValidator
from django.db import models
from django.db.models import F, Func, Q, Value
from django.db.models.functions import Now

from inventory.models import Gpu, MigInstance, Node, Pool
from scheduling.placement.snapshot import DEFAULT_POLICY
from scheduling.placement.text import plural


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
# QUEUED job carries any of it (``services.transition`` clears it, a constraint checks it).
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
        "self", null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    preempt_requested_at = models.DateTimeField(null=True, blank=True)
    # Set when its owner (or an operator) asked its agents to stop it: its end is a cancel
    # whatever its processes made of the signal, and no pass picks it as a victim meanwhile.
    cancel_requested_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-pk"]
        indexes = [
            models.Index(fields=["state", "submitted_at"], name="job_state_submitted"),
            models.Index(fields=["owner", "state"], name="job_owner_state"),
            models.Index(fields=["array", "state"], name="job_array_state"),
            models.Index(fields=["project"], name="job_project"),
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
            models.UniqueConstraint(fields=["array", "array_index"], name="job_array_index_unique"),
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


class AllocationQuerySet(models.QuerySet):
    def active(self) -> AllocationQuerySet:
        return self.filter(released_at__isnull=True)

    def gpu_ids(self) -> models.QuerySet:
        """The GPUs these allocations hold, each once: the one count of GPUs in use (an MPS
        GPU with two shares, or a MIG GPU with three devices given, is one GPU)."""
        return self.order_by().values("gpu_id").distinct()


class AllocationKind(models.TextChoices):
    GPU = "gpu", "Whole GPU"
    MIG = "mig", "MIG device"
    MPS = "mps", "MPS share"


class Allocation(models.Model):
    """One GPU (or one MIG device of it, or an MPS share of it) given to one job, from
    placement until the job lets go of it.

    The database guards every kind (migration 0006's trigger, with the GPU row locked): a
    whole GPU shares with nothing; MIG devices share a GPU only with other MIG devices, each
    device once; MPS shares share a GPU only with MPS shares, at most 100 % of its SMs."""

    job = models.ForeignKey(Job, on_delete=models.PROTECT, related_name="allocations")
    gpu = models.ForeignKey(Gpu, on_delete=models.PROTECT, related_name="allocations")
    node = models.ForeignKey(Node, on_delete=models.PROTECT, related_name="allocations")
    kind = models.CharField(max_length=3, choices=AllocationKind.choices, default="gpu")
    # The MIG device given (kept as a UUID too: discovery may delete the instance row later).
    mig_instance = models.ForeignKey(
        MigInstance, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    device_uuid = models.CharField(
        max_length=64, blank=True, help_text="What CUDA_VISIBLE_DEVICES names: GPU-... or MIG-..."
    )
    mps_percent = models.PositiveSmallIntegerField(null=True, blank=True)
    mps_memory_mib = models.PositiveIntegerField(null=True, blank=True)
    attempt = models.PositiveSmallIntegerField(default=0)
    manual = models.BooleanField(default=False, help_text="Made by hand (gpu-allocate).")
    borrowed = models.BooleanField(
        default=False,
        db_default=False,  # a row written without it (raw SQL) is not borrowed
        help_text="Its attempt ran over quota on idle GPUs: counted against no quota.",
    )
    # The database's clock (the INSERT's and the release UPDATE's statement time), so one GPU's
    # allocations never overlap in time, whichever host wrote them (see services.allocate).
    allocated_at = models.DateTimeField(db_default=Now())
    released_at = models.DateTimeField(null=True, blank=True)

    objects = AllocationQuerySet.as_manager()

    class Meta:
        ordering = ["pk"]
        constraints = [
            # The integrity rule: a GPU is never given twice (other kinds: the trigger).
            models.UniqueConstraint(
                fields=["gpu"],
                condition=Q(released_at__isnull=True, kind="gpu"),
                name="allocation_one_active_per_gpu",
            ),
            models.UniqueConstraint(
                fields=["mig_instance"],
                condition=Q(released_at__isnull=True, kind="mig"),
                name="allocation_one_active_per_mig_device",
            ),
            models.CheckConstraint(
                condition=Q(kind="mps", mps_percent__gte=1, mps_percent__lte=100)
                | (~Q(kind="mps") & Q(mps_percent__isnull=True, mps_memory_mib__isnull=True)),
                name="allocation_mps_share_only_for_mps",
            ),
        ]
        indexes = [
            models.Index(fields=["job", "released_at"], name="allocation_job_active"),
            models.Index(
                fields=["gpu"], condition=Q(released_at__isnull=True), name="allocation_gpu_active"
            ),
            models.Index(fields=["released_at"], name="allocation_released"),
        ]

    def __str__(self) -> str:
        return f"{self.gpu_id} -> job {self.job_id}"

    @property
    def is_active(self) -> bool:
        return self.released_at is None


class SchedulerSettings(models.Model):
    """The placement loop's switch (one row; changes are audited). Queue policies are per
    pool: ``PoolPolicy``."""

    enabled = models.BooleanField(default=True, help_text="Off: nothing new is placed.")
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        verbose_name = verbose_name_plural = "scheduler settings"

    def __str__(self) -> str:
        return f"scheduler ({'on' if self.enabled else 'off'})"

    @classmethod
    def load(cls) -> SchedulerSettings:
        return cls.objects.get_or_create(pk=1)[0]


class PolicyName(models.TextChoices):
    FCFS = "fcfs", "First come, first served"
    PRIORITY = "priority", "Priority with aging"
    SJF = "sjf", "Shortest job first (the user's estimate)"
    FAIRSHARE = "fairshare", "Weighted fair share"
    LAS = "las", "Least attained service (Tiresias)"
    QSSF = "qssf", "Shortest predicted service first (QSSF: runtimes from history)"


class PoolPolicy(models.Model):
    """How one pool shares its GPUs; ``pool`` empty: the GPUs in no pool (one row each,
    audited)."""

    pool = models.OneToOneField(
        Pool,
        null=True,
        blank=True,
        on_delete=models.CASCADE,
        related_name="policy",
        help_text="The pool whose GPUs this policy shares; empty: the GPUs in no pool.",
    )
    policy = models.CharField(
        "queue policy",
        max_length=16,
        choices=PolicyName.choices,
        default=DEFAULT_POLICY,
        help_text="The order in which the pool's waiting jobs are considered.",
    )
    backfill = models.BooleanField(
        "EASY backfill",
        default=True,
        help_text="EASY backfill: a later job may start first if it does not delay the first "
        "waiting job's start (by estimates, else maximum runtimes).",
    )
    aging_interval_s = models.PositiveIntegerField(
        "aging interval (seconds)",
        default=60,
        validators=[MinValueValidator(1)],
        help_text="A waiting job gains one priority point per interval (1,000 points per level).",
    )
    fairshare_half_life_s = models.PositiveIntegerField(
        "fair-share half-life (seconds)",
        default=7 * 24 * 3600,
        validators=[MinValueValidator(60)],
        help_text="Past usage counts half after this long (Slurm's PriorityDecayHalfLife).",
    )
    fairshare_weight = models.PositiveIntegerField(
        "fair-share weight (priority points)",
        default=10_000,
        help_text="Priority points a fully under-served user gains over a fully over-served one.",
    )
    las_thresholds_gpu_s = ArrayField(
        models.PositiveIntegerField(),
        verbose_name="LAS queue thresholds (GPU-seconds)",
        default=list,
        blank=True,
        help_text="Least attained service: GPU-seconds at which a job drops to the next queue "
        "(comma-separated; empty: 3,600 and 36,000).",
    )
    allow_borrowing = models.BooleanField(
        "borrow idle GPUs over quota",
        default=True,
        help_text="Over-quota work may run on idle GPUs as preemptible, reclaimed first.",
    )
    preemption = models.BooleanField(
        "allow preemption",
        default=True,
        help_text="Higher-priority or under-share jobs may preempt preemptible work.",
    )
    preempt_exempt_s = models.PositiveIntegerField(
        "preemption exemption (seconds)",
        default=0,
        help_text="A job is not preempted for another's priority, share or attained service "
        "before it has run this long (Slurm's PreemptExemptTime); borrowed GPUs are reclaimed "
        "at once.",
    )
    qssf_points_per_halving = models.PositiveIntegerField(
        "QSSF points per halving",
        default=250,
        validators=[MinValueValidator(1), MaxValueValidator(100_000)],
        help_text="qssf: priority points a job gains for each halving of the GPU-seconds it is "
        "likely to use (a point is one aging interval of waiting). More favours short jobs "
        "harder and lets large jobs wait longer behind them.",
    )
    prediction_trust_intervals = models.PositiveIntegerField(
        "trust predicted runtimes for (aging intervals)",
        default=360,
        validators=[MaxValueValidator(1_000_000)],
        help_text="Backfill: a job whose runtime is only predicted (no estimate) may use the "
        "queue head's GPUs while the head has waited fewer than this many aging intervals.",
    )
    preempt_signal = models.CharField(
        "preemption signal",
        max_length=10,
        default="SIGTERM",
        help_text="Sent to a preempted job first; SIGKILL follows after the grace.",
    )
    preempt_grace_s = models.PositiveIntegerField(
        "preemption grace (seconds)",
        default=30,
        validators=[MaxValueValidator(3600)],
        help_text="Time a preempted job has to checkpoint before SIGKILL.",
    )
    dynamic_mig = models.BooleanField(
        "create MIG instances on demand",
        default=False,
        help_text="The scheduler may create MIG instances on idle MIG-mode GPUs for MIG jobs.",
    )
    reservation_auto_approve = models.BooleanField(
        "approve reservations within quota",
        default=True,
        help_text="Reservations within the requester's quota need no admin.",
    )
    reservation_release_after_s = models.PositiveIntegerField(
        "release unused reservations after (seconds)",
        default=900,
        help_text="A reservation with no job running this long after its start is released.",
    )
    updated_at = models.DateTimeField("updated", auto_now=True)

    class Meta:
        verbose_name = "pool policy"
        verbose_name_plural = "pool policies"
        constraints = [
            models.UniqueConstraint(
                fields=["pool"], nulls_distinct=False, name="pool_policy_one_per_pool"
            )
        ]

    def __str__(self) -> str:
        return f"{self.pool or 'no pool'}: {self.get_policy_display()}"

    @classmethod
    def default(cls) -> PoolPolicy:
        """The policy of the GPUs in no pool (the row exists from the first look)."""
        return cls.objects.get_or_create(pool=None)[0]


class QuotaPeriod(models.TextChoices):
    DAY = "day", "Day"
    WEEK = "week", "Week"
    MONTH = "month", "Month"


class Quota(models.Model):
    """What one user or one project may use of one pool (empty pool: the GPUs in no pool):
    GPUs at once, GPU-hours per period, and its fair-share weight."""

    pool = models.ForeignKey(Pool, null=True, blank=True, on_delete=models.PROTECT)
    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.CASCADE
    )
    project = models.CharField(max_length=100, blank=True)
    max_gpus = models.PositiveIntegerField(
        "GPUs at once", null=True, blank=True, help_text="Empty: no limit."
    )
    gpu_hours = models.PositiveIntegerField(
        "GPU-hours per period", null=True, blank=True, help_text="Empty: no limit."
    )
    period = models.CharField(max_length=5, choices=QuotaPeriod.choices, default="month")
    fairshare_weight = models.PositiveIntegerField(
        default=1, validators=[MinValueValidator(1)], help_text="Shares (Slurm's fairshare)."
    )
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["pool__name", "project", "user__username"]
        constraints = [
            models.CheckConstraint(
                condition=(Q(user__isnull=True) & ~Q(project=""))
                | (Q(user__isnull=False) & Q(project="")),
                name="quota_user_or_project",
            ),
            models.UniqueConstraint(
                fields=["pool", "user", "project"],
                nulls_distinct=False,
                name="quota_one_per_holder_and_pool",
            ),
        ]

    def __str__(self) -> str:
        holder = f"project {self.project}" if self.project else f"user {self.user}"
        return f"{holder} in {self.pool or 'no pool'}"

    def validate_constraints(self, exclude: Collection[str] | None = None) -> None:
        """The holder's constraints (a user or a project; one quota each per pool) are
        ``quotas.quota_problems``' to say, on the holder's field; the table still enforces
        them. Forms leave them out here, where Django would say them with no field."""
        super().validate_constraints(exclude={*(exclude or ()), "project"})


class JobArray(models.Model):
    """One ``--array`` submission: its tasks are Jobs with an ``array_index``."""

    owner = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="+")
    spec = models.CharField(max_length=200, help_text="As submitted, e.g. 0-999%50.")
    size = models.PositiveIntegerField()
    max_running = models.PositiveIntegerField(
        null=True, blank=True, help_text="Tasks running at once (the %N); empty: no cap."
    )
    submitted_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-pk"]

    def __str__(self) -> str:
        return f"array {self.pk} [{self.spec}]"


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


class ReservationState(models.TextChoices):
    REQUESTED = "requested", "Requested"  # waiting for an admin
    APPROVED = "approved", "Approved"  # holds its GPUs for its window
    REJECTED = "rejected", "Rejected"
    CANCELED = "canceled", "Canceled"
    RELEASED = "released", "Released"  # given back early (unused past the grace, or by hand)
    ENDED = "ended", "Ended"


class Reservation(models.Model):
    """N GPUs (optionally a model, a node or named GPUs) booked for [start, end)."""

    owner = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="+")
    project = models.CharField(max_length=100, blank=True)
    pool = models.ForeignKey(Pool, null=True, blank=True, on_delete=models.PROTECT)
    gpu_count = models.PositiveSmallIntegerField(validators=[MinValueValidator(1)])
    gpu_model = models.CharField(max_length=100, blank=True)
    node = models.ForeignKey(Node, null=True, blank=True, on_delete=models.PROTECT)
    requested_gpus = models.ManyToManyField(Gpu, blank=True, related_name="+")
    start = models.DateTimeField()
    end = models.DateTimeField()
    state = models.CharField(
        max_length=10, choices=ReservationState.choices, default=ReservationState.REQUESTED
    )
    note = models.TextField(blank=True, max_length=2000)
    message = models.TextField(blank=True, help_text="Why it was rejected or released.")
    decided_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    created_at = models.DateTimeField(auto_now_add=True)
    first_used_at = models.DateTimeField(null=True, blank=True)
    released_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["start", "pk"]
        indexes = [models.Index(fields=["state", "end"], name="reservation_state_end")]
        constraints = [
            models.CheckConstraint(
                condition=Q(end__gt=F("start")), name="reservation_ends_after_start"
            )
        ]

    def __str__(self) -> str:
        return f"reservation {self.pk} ({plural(self.gpu_count, 'GPU')})"


def _single_gpu_range() -> Func:
    """``int8range(gpu_id, gpu_id, '[]')``: GPU equality as range overlap, so the exclusion
    constraint needs only the built-in GiST range support (no btree_gist extension)."""
    return Func(F("gpu"), F("gpu"), Value("[]"), function="int8range")


class ReservationGpu(models.Model):
    """One GPU held by an approved reservation for ``during``; the database refuses two
    overlapping holds of one GPU. A release shortens ``during`` to end at the release."""

    reservation = models.ForeignKey(Reservation, on_delete=models.CASCADE, related_name="holds")
    gpu = models.ForeignKey(Gpu, on_delete=models.PROTECT, related_name="reservation_holds")
    during = DateTimeRangeField()

    class Meta:
        constraints = [
            ExclusionConstraint(
                name="reservation_gpu_no_overlap",
                expressions=[
                    (_single_gpu_range(), RangeOperators.OVERLAPS),
                    ("during", RangeOperators.OVERLAPS),
                ],
            ),
            models.UniqueConstraint(fields=["reservation", "gpu"], name="reservation_gpu_once"),
        ]

    def __str__(self) -> str:
        return f"{self.gpu_id} for reservation {self.reservation_id}"


class RelayoutState(models.TextChoices):
    DRAINING = "draining", "Waiting for its jobs"  # the GPU takes no new work
    APPLYING = "applying", "Applying the layout"  # the agent destroys and creates instances
    VERIFYING = "verifying", "Verifying by a re-scan"
    DONE = "done", "Done"
    FAILED = "failed", "Failed (rolled back)"
    CANCELED = "canceled", "Canceled"


RELAYOUT_OPEN_STATES = (RelayoutState.DRAINING, RelayoutState.APPLYING, RelayoutState.VERIFYING)


class MigRelayout(models.Model):
    """An admin's request to give one GPU a new MIG layout, step by step (each step a state
    with a deadline; a failure rolls back to ``previous_layout``). One open per node."""

    gpu = models.ForeignKey(Gpu, on_delete=models.PROTECT, related_name="+")
    node = models.ForeignKey(Node, on_delete=models.PROTECT, related_name="+")
    layout_name = models.CharField(max_length=64, help_text="all-1g.10gb, balanced or custom.")
    layout = models.JSONField(help_text="GPU instance profile names with placement starts.")
    previous_layout = models.JSONField(default=list, blank=True)
    preempt = models.BooleanField(
        default=False, help_text="Preempt its jobs (else wait for them to end)."
    )
    state = models.CharField(
        max_length=10, choices=RelayoutState.choices, default=RelayoutState.DRAINING
    )
    step_deadline = models.DateTimeField(null=True, blank=True)
    message = models.TextField(blank=True)
    requested_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, on_delete=models.SET_NULL, related_name="+"
    )
    created_at = models.DateTimeField(auto_now_add=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        verbose_name = "MIG re-layout"
        ordering = ["-pk"]
        constraints = [
            models.UniqueConstraint(
                fields=["node"],
                condition=Q(state__in=RELAYOUT_OPEN_STATES),
                name="mig_relayout_one_open_per_node",
            )
        ]

    def __str__(self) -> str:
        return f"MIG re-layout of GPU {self.gpu_id} to {self.layout_name} ({self.state})"


# What a re-layout shows, in order: the admin's read-only form and the API's body.
RELAYOUT_FIELDS = (
    "gpu",
    "node",
    "layout_name",
    "layout",
    "previous_layout",
    "preempt",
    "state",
    "step_deadline",
    "message",
    "requested_by",
    "created_at",
    "finished_at",
)


class UsageDay(models.Model):
    """Accounting: one day of one (pool, user, project)'s GPU use, rolled up from allocations
    and telemetry (GPU-seconds; energy in joules)."""

    day = models.DateField()
    pool = models.ForeignKey(Pool, null=True, blank=True, on_delete=models.PROTECT)
    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="+")
    project = models.CharField(max_length=100, blank=True)
    allocated_gpu_s = models.FloatField(default=0)
    used_gpu_s = models.FloatField(default=0, help_text="Utilization-weighted.")
    idle_held_gpu_s = models.FloatField(default=0)
    mig_slice_s = models.FloatField(default=0, help_text="MIG compute slices x seconds.")
    mps_gpu_s = models.FloatField(default=0, help_text="MPS shares as fractions of a GPU.")
    energy_j = models.FloatField(default=0)
    cpu_s = models.FloatField(
        "CPU seconds", default=0, help_text="CPU time of the jobs that finished that day."
    )

    class Meta:
        ordering = ["-day"]
        constraints = [
            models.UniqueConstraint(
                fields=["day", "pool", "user", "project"],
                nulls_distinct=False,
                name="usage_day_once",
            )
        ]

    def __str__(self) -> str:
        hours = self.allocated_gpu_s / 3600
        pool = f" in pool {self.pool}" if self.pool_id else ""
        project = f", project {self.project}" if self.project else ""
        return f"{self.user.get_username()} on {self.day}{pool}{project}: {hours:.1f} GPU-h"
