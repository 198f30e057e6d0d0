"""An external Ray cluster as an admin registered it, with what gpuadmin last read of it, and
the jobs users submitted to it through gpuadmin.

A job's ``submission_id`` is chosen and stored by gpuadmin before Ray is asked to run it; Ray
refuses a second job of the same id, so a retried submission never starts two jobs."""

from __future__ import annotations

from django.conf import settings
from django.core.validators import MinValueValidator
from django.db import models
from django.db.models import Q

from inventory.models import Pool


class ClusterState(models.TextChoices):
    """How the last read of the cluster went."""

    NEW = "new", "Not read yet"
    OK = "ok", "OK"
    UNREACHABLE = "unreachable", "Unreachable"  # no answer: refused connection, timeout, DNS
    REFUSED = "refused", "Refused"  # an answer that says no: 401/403, not a Ray dashboard


class RayCluster(models.Model):
    """A Ray cluster, by its dashboard (the Jobs API's address). ``token`` is kept as given,
    since gpuadmin must send it; it is write-only in the admin and never in the API, the pages
    or the audit log. The node and resource fields are the last successful read's."""

    name = models.SlugField(max_length=64, unique=True)
    address = models.URLField(
        "dashboard address", help_text="http(s)://host:8265 of its dashboard (the Jobs API)."
    )
    token = models.TextField(
        blank=True, help_text="Sent as a bearer token, if set. Write-only: never shown again."
    )
    pool = models.ForeignKey(
        Pool,
        null=True,
        blank=True,
        on_delete=models.PROTECT,
        related_name="+",
        help_text="The pool whose quotas and fair share its jobs count in.",
    )
    state = models.CharField(max_length=12, choices=ClusterState.choices, default=ClusterState.NEW)
    last_error = models.TextField(blank=True)
    ray_version = models.CharField(max_length=32, blank=True)
    nodes = models.JSONField(
        default=list, blank=True, help_text="The nodes of the last read (jobs_api.RayNode)."
    )
    gpus = models.FloatField(default=0)
    gpus_in_use = models.FloatField(default=0)
    last_read_at = models.DateTimeField(null=True, blank=True)
    last_ok_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["name"]
        verbose_name = "Ray cluster"

    def __str__(self) -> str:
        return self.name

    @property
    def state_colour(self) -> str:
        colours: dict[str, str] = {ClusterState.OK: "green", ClusterState.NEW: "grey"}
        return colours.get(self.state, "red")


class RayJobState(models.TextChoices):
    """gpuadmin's job words (``scheduling.jobs.models.JobState``) for what Ray reports."""

    PENDING = "pending", "Pending"  # stored by gpuadmin; Ray has not acknowledged it yet
    QUEUED = "queued", "Queued"  # Ray's PENDING: waiting (``message`` says why)
    RUNNING = "running", "Running"
    COMPLETED = "completed", "Completed"  # SUCCEEDED
    FAILED = "failed", "Failed"
    CANCELED = "canceled", "Canceled"  # STOPPED


RAY_STATES = {
    "PENDING": RayJobState.QUEUED,
    "RUNNING": RayJobState.RUNNING,
    "SUCCEEDED": RayJobState.COMPLETED,
    "FAILED": RayJobState.FAILED,
    "STOPPED": RayJobState.CANCELED,
}
ACTIVE_STATES = frozenset({RayJobState.PENDING, RayJobState.QUEUED, RayJobState.RUNNING})


class RayJob(models.Model):
    """A job submitted to a Ray cluster through gpuadmin: what was asked and what Ray last
    said of it (``state``; ``message``: Ray's, for a queued job why it waits)."""

    owner = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="ray_jobs"
    )
    cluster = models.ForeignKey(RayCluster, on_delete=models.PROTECT, related_name="jobs")
    entrypoint = models.TextField(help_text="The shell command Ray runs (its entrypoint).")
    runtime_env = models.JSONField(
        default=dict, blank=True, help_text="Ray's runtime_env (env_vars, pip, working_dir...)."
    )
    gpus = models.FloatField(default=0, validators=[MinValueValidator(0)])
    cpus = models.FloatField(default=0, validators=[MinValueValidator(0)])
    submission_id = models.CharField(max_length=64, unique=True)
    state = models.CharField(
        max_length=10, choices=RayJobState.choices, default=RayJobState.PENDING
    )
    message = models.TextField(blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    started_at = models.DateTimeField(null=True, blank=True)
    ended_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-id"]
        verbose_name = "Ray job"
        constraints = [
            models.CheckConstraint(
                condition=Q(gpus__gte=0) & Q(cpus__gte=0), name="ray_job_resources_not_negative"
            ),
        ]

    def __str__(self) -> str:
        return f"Ray job {self.pk} on {self.cluster_id}"

    @property
    def active(self) -> bool:
        return self.state in ACTIVE_STATES
