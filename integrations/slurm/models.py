"""A Slurm cluster as gpuadmin mirrors it: the cluster an admin registered (its slurmrestd and
how to sign in) and what the last poll read of it: nodes, partitions and jobs, each job's GPUs
mapped onto the catalogued GPUs by their minor numbers (``integrations.slurm.services.sync``).

The mirror is read-only: only ``services.sync`` writes nodes, partitions and jobs.
"""

from __future__ import annotations

from django.contrib.postgres.fields import ArrayField
from django.core.validators import MinValueValidator
from django.db import models
from django.db.models import Q

from integrations.slurm.rest.model import HOLDING_FLAG, HOLDING_STATES, holds_gpus
from inventory.models import Gpu, Node

# States of a Slurm node that take it out of service (Slurm's base state DOWN, its DRAIN flag):
# each new one is a health event on the catalogued node.
OUT_OF_SERVICE = ("DRAIN", "DOWN")


# The jobs that hold their GPUs now (``rest.model.HOLDING_STATES``), as a filter of SlurmJob.
HOLDING = Q(state__in=HOLDING_STATES) | Q(state_flags__contains=[HOLDING_FLAG])

# A job's base state as its badge shows it (the others grey).
JOB_STATE_COLOURS = {
    "RUNNING": "green",
    "PENDING": "blue",
    "SUSPENDED": "amber",
    "COMPLETING": "amber",
    "FAILED": "red",
    "NODE_FAIL": "red",
    "OUT_OF_MEMORY": "red",
    "TIMEOUT": "red",
    "BOOT_FAIL": "red",
}


class AuthKind(models.TextChoices):
    JWT = "jwt", "JWT (auth/jwt: a user name and a token)"
    LOCAL = "local", "Local (auth/local: the Unix socket's peer, no token)"


class PollState(models.TextChoices):
    """How the last poll went."""

    NEW = "new", "Not polled yet"
    OK = "ok", "OK"
    UNREACHABLE = "unreachable", "Unreachable"  # no answer: refused connection, timeout, DNS
    REFUSED = "refused", "Refused"  # an answer that says no: 401/403, an unsupported API


class SlurmCluster(models.Model):
    """A Slurm cluster an admin registered, by its slurmrestd: a URL, or a Unix socket on
    gpuadmin's host. ``token`` is kept as given (gpuadmin must send it back, so it cannot keep
    a digest as it does of its own API tokens); it is write-only in the admin and never in the
    API, the pages or the audit log."""

    name = models.SlugField(max_length=64, unique=True)
    url = models.CharField(
        "slurmrestd URL",
        max_length=500,
        blank=True,
        help_text="http(s)://host:6820 of its slurmrestd; leave empty to use a Unix socket.",
    )
    unix_socket = models.CharField(
        max_length=500,
        blank=True,
        help_text="Path of slurmrestd's Unix socket on gpuadmin's host (instead of a URL).",
    )
    auth = models.CharField(
        "authentication", max_length=8, choices=AuthKind.choices, default=AuthKind.JWT
    )
    user_name = models.CharField(
        max_length=64, blank=True, help_text="The Slurm user gpuadmin reads as (JWT)."
    )
    token = models.TextField(
        blank=True, help_text="Its JWT (scontrol token). Write-only: never shown again."
    )
    poll_interval_s = models.PositiveIntegerField(
        "poll interval (s)", default=30, validators=[MinValueValidator(5)]
    )
    drain_fenced = models.BooleanField(
        default=False,
        help_text="Ask Slurm to drain a node one of whose GPUs gpuadmin's health fenced.",
    )
    state = models.CharField(max_length=12, choices=PollState.choices, default=PollState.NEW)
    last_error = models.TextField(blank=True)
    api_version = models.CharField(
        "API version", max_length=16, blank=True, help_text="Of slurmrestd's last answer."
    )
    last_polled_at = models.DateTimeField(null=True, blank=True)
    last_ok_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["name"]
        verbose_name = "Slurm cluster"
        constraints = [
            models.CheckConstraint(
                condition=(Q(url="") & ~Q(unix_socket="")) | (~Q(url="") & Q(unix_socket="")),
                name="slurm_cluster_url_or_socket",
            ),
        ]

    def __str__(self) -> str:
        return self.name

    @property
    def address(self) -> str:
        return self.url or f"unix:{self.unix_socket}"

    @property
    def state_colour(self) -> str:
        colours: dict[str, str] = {PollState.OK: "green", PollState.NEW: "grey"}
        return colours.get(self.state, "red")


class SlurmNode(models.Model):
    """A node as Slurm's last answer described it; ``node``: the catalogued node of that
    hostname (None when the catalog has none)."""

    cluster = models.ForeignKey(SlurmCluster, on_delete=models.CASCADE, related_name="nodes")
    name = models.CharField(max_length=253)
    node = models.ForeignKey(
        Node, null=True, blank=True, on_delete=models.SET_NULL, related_name="slurm_nodes"
    )
    states = ArrayField(models.CharField(max_length=32), default=list, blank=True)
    reason = models.TextField(blank=True)
    reason_set_by = models.CharField(max_length=64, blank=True)
    reason_changed_at = models.DateTimeField(null=True, blank=True)
    state_changed_at = models.DateTimeField(
        null=True, blank=True, help_text="When gpuadmin saw its states change."
    )
    partitions = ArrayField(models.CharField(max_length=64), default=list, blank=True)
    cpus = models.PositiveIntegerField(default=0)
    alloc_cpus = models.PositiveIntegerField(default=0)
    real_memory_mib = models.PositiveBigIntegerField(default=0)
    alloc_memory_mib = models.PositiveBigIntegerField(default=0)
    gpus = models.PositiveIntegerField(default=0)
    gpus_used = ArrayField(models.PositiveSmallIntegerField(), default=list, blank=True)
    last_seen_at = models.DateTimeField()

    class Meta:
        ordering = ["cluster", "name"]
        verbose_name = "Slurm node"
        constraints = [
            models.UniqueConstraint(fields=["cluster", "name"], name="slurm_node_per_cluster")
        ]

    def __str__(self) -> str:
        return f"{self.cluster.name}/{self.name}"

    @property
    def state_text(self) -> str:
        """``mixed+drain``, as ``sinfo`` writes it."""
        return "+".join(state.lower() for state in self.states) or "unknown"

    @property
    def state_colour(self) -> str:
        if self.out_of_service:
            return "red"
        return "green" if {"IDLE", "MIXED", "ALLOCATED"} & set(self.states) else "grey"

    @property
    def out_of_service(self) -> str | None:
        """``DRAIN`` or ``DOWN`` (the first), or None."""
        return next((state for state in OUT_OF_SERVICE if state in self.states), None)


class SlurmPartition(models.Model):
    cluster = models.ForeignKey(SlurmCluster, on_delete=models.CASCADE, related_name="partitions")
    name = models.CharField(max_length=64)
    state = models.CharField(max_length=16, default="UP")
    nodes = ArrayField(models.CharField(max_length=253), default=list, blank=True)
    total_cpus = models.PositiveIntegerField(default=0)
    total_nodes = models.PositiveIntegerField(default=0)

    class Meta:
        ordering = ["cluster", "name"]
        verbose_name = "Slurm partition"
        constraints = [
            models.UniqueConstraint(fields=["cluster", "name"], name="slurm_partition_per_cluster")
        ]

    def __str__(self) -> str:
        return f"{self.cluster.name}/{self.name}"


class SlurmJob(models.Model):
    """A job in Slurm's last answer (those that left it are deleted: Slurm's accounting keeps
    its history, gpuadmin mirrors the queue)."""

    cluster = models.ForeignKey(SlurmCluster, on_delete=models.CASCADE, related_name="jobs")
    job_id = models.PositiveBigIntegerField("job ID")
    name = models.CharField(max_length=200, blank=True)
    user = models.CharField(max_length=64, blank=True)
    account = models.CharField(max_length=64, blank=True)
    state = models.CharField(max_length=24)
    state_flags = ArrayField(models.CharField(max_length=32), default=list, blank=True)
    reason = models.CharField(max_length=200, blank=True)
    partition = models.CharField(max_length=200, blank=True)
    nodes = ArrayField(models.CharField(max_length=253), default=list, blank=True)
    gpus_requested = models.PositiveIntegerField("GPUs requested", default=0)
    cpus = models.PositiveIntegerField("CPUs", default=0)
    array_job_id = models.PositiveBigIntegerField(null=True, blank=True)
    array_task_id = models.PositiveIntegerField(null=True, blank=True)
    submit_time = models.DateTimeField(null=True, blank=True)
    start_time = models.DateTimeField(null=True, blank=True)
    end_time = models.DateTimeField(null=True, blank=True)
    time_limit_min = models.PositiveIntegerField(
        "time limit (min)", null=True, blank=True, help_text="Empty: unlimited."
    )
    last_seen_at = models.DateTimeField()

    class Meta:
        ordering = ["cluster", "job_id"]
        verbose_name = "Slurm job"
        constraints = [
            models.UniqueConstraint(fields=["cluster", "job_id"], name="slurm_job_per_cluster")
        ]
        indexes = [models.Index(fields=["state"], name="slurm_job_state")]

    def __str__(self) -> str:
        return f"{self.cluster.name}/{self.job_id}"

    @property
    def state_colour(self) -> str:
        return JOB_STATE_COLOURS.get(self.state, "grey")

    @property
    def holds_gpus(self) -> bool:
        """It holds its GPUs now (``HOLDING``)."""
        return holds_gpus(self.state, self.state_flags)

    @property
    def display_id(self) -> str:
        """``1234``, or ``1230_4`` for a task of array 1230 (as ``squeue`` shows it)."""
        if self.array_job_id is not None and self.array_task_id is not None:
            return f"{self.array_job_id}_{self.array_task_id}"
        return str(self.job_id)


class SlurmJobGpu(models.Model):
    """One GPU a Slurm job holds: Slurm's index on the node (the device's minor number) and the
    catalogued GPU with that minor number on that node, None when the catalog has no such GPU
    (kept, so the page still says what Slurm said)."""

    job = models.ForeignKey(SlurmJob, on_delete=models.CASCADE, related_name="gpus")
    node_name = models.CharField(max_length=253)
    minor_number = models.PositiveSmallIntegerField()
    gpu = models.ForeignKey(
        Gpu, null=True, blank=True, on_delete=models.SET_NULL, related_name="slurm_jobs"
    )

    class Meta:
        ordering = ["job", "node_name", "minor_number"]
        verbose_name = "Slurm job's GPU"
        constraints = [
            models.UniqueConstraint(
                fields=["job", "node_name", "minor_number"], name="slurm_job_gpu_once"
            )
        ]

    def __str__(self) -> str:
        return f"{self.job}: {self.node_name} GPU minor {self.minor_number}"
