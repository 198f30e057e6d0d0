"""Each pool's policy and the quotas of users, projects and pools."""

from __future__ import annotations

from collections.abc import Collection

from django.conf import settings
from django.contrib.postgres.fields import ArrayField
from django.core.validators import MaxValueValidator, MinValueValidator
from django.db import models
from django.db.models import Q

from inventory.models import Pool
from scheduling.placement.snapshot import DEFAULT_POLICY


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
    las_min_run_s = models.PositiveIntegerField(
        "attained-service exemption (seconds)",
        default=600,
        help_text="las, and qssf for preemptible work: a job is not preempted for another's "
        "less attained service before it has run this long since its latest start (so that "
        "work resumed a moment ago is not stopped again at once); 0: at once.",
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
