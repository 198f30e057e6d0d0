"""Jobs, their GPU allocations and the scheduler's settings (roles and API tokens live in
``gpuadmin.access``).

A job's ``state`` changes only through ``scheduling.services`` (one audited transition each).
An allocation gives one GPU to one job; the database refuses a second active allocation of a
GPU (a partial unique index), whatever the Python code above it does.
"""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.contrib.postgres.fields import ArrayField
from django.core.validators import MaxValueValidator, MinValueValidator
from django.db import models
from django.db.models import Q
from django.db.models.functions import Now

from inventory.models import Gpu, Node


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
    owner = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="+")
    project = models.CharField(max_length=100, blank=True, db_index=True)
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

    # Where it stands
    state = models.CharField(max_length=10, choices=JobState.choices, default=JobState.PENDING)
    attempt = models.PositiveSmallIntegerField(default=0, help_text="Runs started so far.")
    submitted_at = models.DateTimeField(auto_now_add=True, db_index=True)
    scheduled_at = models.DateTimeField(null=True, blank=True)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    exit_code = models.IntegerField(null=True, blank=True)
    pid = models.IntegerField(null=True, blank=True)
    message = models.TextField(blank=True, help_text="Why it failed or was canceled.")

    # The placement loop's latest word on a waiting job (not state changes: not audited)
    pending_code = models.CharField(max_length=32, blank=True)
    pending_reason = models.TextField(blank=True)
    queue_position = models.PositiveIntegerField(null=True, blank=True)
    estimated_start_at = models.DateTimeField(null=True, blank=True)
    what_if = models.TextField(blank=True)
    # Why the GPUs it runs on were chosen (topology class, NUMA nodes, score, sentence)
    placement = models.JSONField(null=True, blank=True)

    class Meta:
        ordering = ["-pk"]
        indexes = [
            models.Index(fields=["state", "submitted_at"], name="job_state_submitted"),
            models.Index(fields=["owner", "state"], name="job_owner_state"),
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
        ]

    def __str__(self) -> str:
        return f"job {self.pk} {self.name}".strip()

    @property
    def total_gpus(self) -> int:
        return self.gpu_count * self.node_count

    @property
    def is_terminal(self) -> bool:
        return self.state in TERMINAL_STATES


class AllocationQuerySet(models.QuerySet):
    def active(self) -> AllocationQuerySet:
        return self.filter(released_at__isnull=True)


class Allocation(models.Model):
    """One GPU given to one job, from placement until the job lets go of it."""

    job = models.ForeignKey(Job, on_delete=models.PROTECT, related_name="allocations")
    gpu = models.ForeignKey(Gpu, on_delete=models.PROTECT, related_name="allocations")
    node = models.ForeignKey(Node, on_delete=models.PROTECT, related_name="allocations")
    attempt = models.PositiveSmallIntegerField(default=0)
    manual = models.BooleanField(default=False, help_text="Made by hand (gpu-allocate).")
    # The database's clock (the INSERT's and the release UPDATE's statement time), so one GPU's
    # allocations never overlap in time, whichever host wrote them (see services.allocate).
    allocated_at = models.DateTimeField(db_default=Now())
    released_at = models.DateTimeField(null=True, blank=True)

    objects = AllocationQuerySet.as_manager()

    class Meta:
        ordering = ["pk"]
        constraints = [
            # The integrity rule: a GPU is never given twice.
            models.UniqueConstraint(
                fields=["gpu"],
                condition=Q(released_at__isnull=True),
                name="allocation_one_active_per_gpu",
            ),
        ]
        indexes = [models.Index(fields=["job", "released_at"], name="allocation_job_active")]

    def __str__(self) -> str:
        return f"{self.gpu_id} -> job {self.job_id}"

    @property
    def is_active(self) -> bool:
        return self.released_at is None


class SchedulerSettings(models.Model):
    """The placement loop's switch and policy (one row; changes are audited)."""

    POLICY_CHOICES = [("fcfs", "First come, first served"), ("priority", "Priority with aging")]

    enabled = models.BooleanField(default=True, help_text="Off: nothing new is placed.")
    policy = models.CharField(max_length=16, choices=POLICY_CHOICES, default="priority")
    aging_interval_s = models.PositiveIntegerField(
        default=60,
        validators=[MinValueValidator(1)],
        help_text="A waiting job gains one priority point per interval (1,000 points per level).",
    )
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        verbose_name = verbose_name_plural = "scheduler settings"

    def __str__(self) -> str:
        return f"scheduler ({'on' if self.enabled else 'off'}, {self.policy})"

    @classmethod
    def load(cls) -> SchedulerSettings:
        return cls.objects.get_or_create(pk=1)[0]
