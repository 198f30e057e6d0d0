"""What hardware exists: pools, nodes, GPUs, MIG instances and the links between GPUs and to NICs.

Two kinds of fields live side by side. *Discovered* fields are written only by discovery
(``inventory.services.apply_discovery``) from NVML scans and are read-only in the admin.
*Catalog* fields (label, owner, pool, notes, tags) belong to people and discovery never touches
them.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.contrib.postgres.fields import ArrayField
from django.core.validators import RegexValidator
from django.db import models
from django.db.models import Q
from django.utils import timezone

from inventory.choices import ISOLATION_NONE, JOBS_RUN_AS_OWNER, GpuState, NodeState, NvmlBackend
from inventory.discovery import GPU_FIELDS, HOST_FIELDS
from inventory.querysets import GpuQuerySet, NodeQuerySet
from inventory.usability import Unusable, refuses_unconfined_jobs, why_unusable


class Pool(models.Model):
    """A named group of GPUs (a team's share, a partition) that admins assign GPUs to."""

    name = models.SlugField(max_length=64, unique=True)
    description = models.TextField(blank=True)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name


CATALOG_FIELDS = ("label", "owner", "pool", "notes", "tags")
# A GPU's catalog adds how it is shared (``Gpu.mps_shared``).
GPU_CATALOG_FIELDS = (*CATALOG_FIELDS, "mps_shared")
# A node's adds whether it may run jobs it cannot confine (``Node.allow_unconfined``) and where
# other nodes reach it (``Node.address``).
NODE_CATALOG_FIELDS = (*CATALOG_FIELDS, "allow_unconfined", "address")
# Sizes of the free-form catalog fields; the admin and the API refuse more (a 400 naming it).
MAX_NOTES_CHARS = 10_000
# What confines a node's jobs, in one line (``Node.isolation``).
ISOLATION_CHARS = 200
# Why a node or GPU is in its state (an admin's reason, a health policy's finding).
STATE_REASON_CHARS = 500
HELD_OUTSIDE_CHARS = 200  # Gpu.held_outside: "Slurm job 1234 on hpc"


class StateFields(models.Model):
    """The service state's why and since, written only by ``inventory.services``' state
    changes (never a form: the admin's actions ask for a reason)."""

    state_reason = models.CharField(max_length=STATE_REASON_CHARS, blank=True, editable=False)
    state_changed_at = models.DateTimeField(null=True, blank=True, editable=False)

    class Meta:
        abstract = True


MAX_TAGS = 32


class CatalogFields(models.Model):
    """Fields people own on a node or GPU (the seed's editable labels, ``CATALOG_FIELDS``);
    discovery never writes them."""

    label = models.CharField(max_length=100, blank=True)
    owner = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="+",
    )
    # PROTECT: a pool is deleted once nothing is in it (moving a node or GPU out is audited).
    pool = models.ForeignKey(
        Pool, null=True, blank=True, on_delete=models.PROTECT, related_name="+"
    )
    notes = models.TextField(blank=True, max_length=MAX_NOTES_CHARS)
    tags = ArrayField(models.CharField(max_length=50), size=MAX_TAGS, default=list, blank=True)

    class Meta:
        abstract = True


class Node(CatalogFields, StateFields):
    """A GPU host, identified by its hostname; its agent registers and heartbeats."""

    # What agents report (read-only for people), in display order.
    DISCOVERED_FIELDS = (
        "hostname",
        "model",
        "nvml_backend",
        "job_account",
        "isolation",
        "isolation_reason",
        "driver_version",
        "cuda_driver_version",
        "nvml_version",
        "agent_version",
        *HOST_FIELDS,
        "scan_error",
        "registered_at",
        "last_scan_at",
        "last_heartbeat_at",
    )

    hostname = models.CharField(max_length=253, unique=True)
    state = models.CharField(max_length=16, choices=NodeState.choices, default=NodeState.ONLINE)
    # Discovered (agent registration and scans)
    model = models.CharField(max_length=100, blank=True, help_text="Machine model, e.g. dgx-h100.")
    nvml_backend = models.CharField(
        "NVML backend",
        max_length=8,
        choices=NvmlBackend.choices,
        blank=True,
        help_text="What the node's agent queries: the NVIDIA driver, or the NVML simulator "
        "running the node's machine model. Empty until an agent says.",
    )
    job_account = models.CharField(
        max_length=32,
        blank=True,
        help_text="Whose Unix account the node's jobs run as: 'per owner' (each job's owner's, "
        "its agent running as root) or the account its agent runs as. Empty until an agent says.",
    )
    isolation = models.CharField(
        max_length=ISOLATION_CHARS,
        blank=True,
        help_text="What confines the node's jobs, e.g. 'cgroup v2 (devices, kill, cpu_time) + "
        "cgroup v1 (cpuset, memory, pids)', or 'none'. Empty until an agent says.",
    )
    isolation_reason = models.TextField(
        blank=True, help_text="Why something is not confined, as its agent says."
    )
    # Catalog (people's)
    allow_unconfined = models.BooleanField(
        "Allow unconfined jobs",
        default=False,
        help_text="Real-NVML agents refuse jobs on a node whose isolation is 'none' unless "
        "this is on.",
    )
    address = models.CharField(
        max_length=253,
        blank=True,
        validators=[
            RegexValidator(r"^[A-Za-z0-9_.:\[\]-]+$", "a host name or an IP address"),
            RegexValidator(r"^-", "a host name or an IP address", inverse_match=True),
        ],
        help_text="Where other nodes reach this one: a host name or IP address (Slurm's "
        "NodeAddr). Empty: its hostname. A Ray application's workers join its head here.",
    )
    driver_version = models.CharField(max_length=32, blank=True)
    cuda_driver_version = models.CharField("CUDA driver version", max_length=16, blank=True)
    nvml_version = models.CharField("NVML version", max_length=32, blank=True)
    agent_version = models.CharField(max_length=32, blank=True)
    cpu_count = models.PositiveIntegerField(
        "CPUs", null=True, blank=True, help_text="Logical CPUs its agent reports."
    )
    memory_total_mib = models.PositiveIntegerField(
        "host memory (MiB)", null=True, blank=True, help_text="Host RAM its agent reports."
    )
    # Kept back from jobs (Slurm's CoreSpecCount and MemSpecLimit, Kubernetes' system-reserved).
    cpus_reserved = models.PositiveIntegerField(
        "CPUs reserved", default=0, help_text="CPUs no job is given (the OS, the agent)."
    )
    memory_reserved_mib = models.PositiveIntegerField(
        "host memory reserved (MiB)", default=0, help_text="Host RAM no job is given."
    )
    scan_error = models.TextField(blank=True)
    registered_at = models.DateTimeField(default=timezone.now)
    last_scan_at = models.DateTimeField(null=True, blank=True)
    last_heartbeat_at = models.DateTimeField(null=True, blank=True)

    objects = NodeQuerySet.as_manager()

    class Meta:
        ordering = ["hostname"]

    def __str__(self) -> str:
        return self.hostname

    def job_account_label(self) -> str:
        """Whose account the node's jobs run as, in words ("" until its agent says)."""
        if self.job_account == JOBS_RUN_AS_OWNER:
            return "their owners' accounts"
        return f"the agent's account, {self.job_account}" if self.job_account else ""

    @property
    def unconfined(self) -> bool:
        """Its agent said it confines none of a job's resources (``ISOLATION_NONE``)."""
        return self.isolation == ISOLATION_NONE

    @property
    def refuses_unconfined(self) -> bool:
        """Its agent refuses every job: the one rule's ``refuses_unconfined_jobs``."""
        return refuses_unconfined_jobs(
            nvml_backend=self.nvml_backend,
            isolation=self.isolation,
            allow_unconfined=self.allow_unconfined,
        )

    @property
    def reached_at(self) -> str:
        """Where other nodes reach it: its ``address``, else its hostname."""
        return self.address or self.hostname

    def is_reachable(self, now: datetime | None = None) -> bool:
        """Heard from within the heartbeat grace (``GPUADMIN_HEARTBEAT_GRACE_S``)."""
        if self.last_heartbeat_at is None:
            return False
        grace = timedelta(seconds=settings.GPUADMIN_HEARTBEAT_GRACE_S)
        return self.last_heartbeat_at >= (now or timezone.now()) - grace


class Gpu(CatalogFields, StateFields):
    """A physical GPU, identified by its NVML UUID for life: it keeps its row when it goes
    missing from scans, comes back, or moves to another node."""

    # What agents report (read-only for people), in display order.
    DISCOVERED_FIELDS = (
        "uuid",
        "node",
        *GPU_FIELDS,
        "first_seen_at",
        "last_seen_at",
        "missing_since",
    )

    uuid = models.CharField("UUID", max_length=64, unique=True)
    node = models.ForeignKey(Node, on_delete=models.PROTECT, related_name="gpus")
    state = models.CharField(max_length=16, choices=GpuState.choices, default=GpuState.AVAILABLE)
    # Discovered
    index = models.PositiveSmallIntegerField()
    minor_number = models.PositiveSmallIntegerField(
        null=True, blank=True, help_text="Device minor number: /dev/nvidia<N>."
    )
    name = models.CharField(max_length=100)
    serial = models.CharField(max_length=32, blank=True)
    pci_bus_id = models.CharField("PCI bus ID", max_length=16)
    pci_device_id = models.CharField("PCI device ID", max_length=10, blank=True)
    board_part_number = models.CharField(max_length=32, blank=True)
    vbios_version = models.CharField("VBIOS version", max_length=32, blank=True)
    architecture = models.CharField(max_length=16, blank=True)
    compute_capability = models.CharField(max_length=8, blank=True)
    memory_total_mib = models.PositiveIntegerField("memory (MiB)", default=0)
    power_limit_default_w = models.FloatField("default power limit (W)", null=True, blank=True)
    numa_node = models.SmallIntegerField("NUMA node", null=True, blank=True)
    gpu_numa_node = models.SmallIntegerField(
        "GPU NUMA node",
        null=True,
        blank=True,
        help_text="The GPU's own memory as a NUMA node (Grace Hopper; topo -m's GPU NUMA ID).",
    )
    socket = models.SmallIntegerField(
        null=True, blank=True, help_text="CPU socket, named by its lowest NUMA node."
    )
    cpu_affinity = models.CharField("CPU affinity", max_length=200, blank=True)
    nvlink_count = models.PositiveSmallIntegerField("NVLinks", default=0)
    mig_capable = models.BooleanField("MIG capable", default=False)
    mig_enabled = models.BooleanField("MIG enabled", default=False)
    mig_pending_enabled = models.BooleanField("MIG enabled after reset", default=False)
    error_message = models.TextField(blank=True)
    # Catalog (people's): shared by MPS, so only MPS shares of it are given, never the whole.
    mps_shared = models.BooleanField(
        "MPS shared", default=False, help_text="Jobs get MPS shares of it, never the whole GPU."
    )
    first_seen_at = models.DateTimeField(default=timezone.now)
    last_seen_at = models.DateTimeField(default=timezone.now)
    missing_since = models.DateTimeField(null=True, blank=True)
    # Set by an integration (``inventory.services.set_held_outside``), never by people.
    held_outside = models.CharField(
        "held outside gpuadmin",
        max_length=HELD_OUTSIDE_CHARS,
        blank=True,
        editable=False,
        help_text="The work outside gpuadmin holding it (a Slurm job); gpuadmin gives it to "
        "no job meanwhile.",
    )

    objects = GpuQuerySet.as_manager()

    class Meta:
        verbose_name = "GPU"
        verbose_name_plural = "GPUs"
        ordering = ["node__hostname", "index"]
        constraints = [
            models.UniqueConstraint(
                fields=["node", "index"],
                condition=Q(missing_since__isnull=True),
                name="inventory_gpu_one_present_gpu_per_node_index",
            )
        ]

    # All that ``__str__``, ``pool_in_force_id`` and ``unusable`` read of a GPU and its node:
    # a query that locks hundreds of GPUs to check them loads these alone
    # (``.select_related("node").only(*Gpu.RULE_FIELDS)``, not all 60 columns).
    RULE_FIELDS = (
        "uuid",
        "index",
        "pool",
        "state",
        "missing_since",
        "error_message",
        "mig_enabled",
        "mps_shared",
        "held_outside",
        "node__hostname",
        "node__pool",
        "node__state",
        "node__last_heartbeat_at",
        "node__nvml_backend",
        "node__isolation",
        "node__allow_unconfined",
    )

    def __str__(self) -> str:
        return f"{self.node.hostname}/GPU{self.index} ({self.uuid})"

    @property
    def pool_in_force_id(self) -> int | None:
        """The pool it belongs to: its own, else its node's (``querysets.pool_is``' rule; its
        node loaded)."""
        return self.pool_id if self.pool_id is not None else self.node.pool_id

    @property
    def is_missing(self) -> bool:
        return self.missing_since is not None

    def unusable(
        self,
        sample: Mapping[str, Any] | None = None,
        *,
        allocated: bool = False,
        now: datetime | None = None,
    ) -> Unusable | None:
        """Why it cannot take a whole-GPU job now (``inventory.usability``, its node loaded),
        given its latest live sample and whether an active allocation holds it."""
        return why_unusable(
            node_state=self.node.state,
            reachable=self.node.is_reachable(now),
            gpu_state=self.state,
            missing=self.is_missing,
            error_message=self.error_message,
            mig_enabled=self.mig_enabled,
            mps_shared=self.mps_shared,
            held_outside=self.held_outside,
            refuses_unconfined=self.node.refuses_unconfined,
            sample=sample,
            allocated=allocated,
        )


class MigInstance(models.Model):
    """A MIG compute instance inside a GPU instance: what a MIG device UUID names."""

    # Everything discovery sets (all but the GPU it belongs to).
    DISCOVERED_FIELDS = (
        "uuid",
        "gi_id",
        "ci_id",
        "profile_name",
        "profile_id",
        "ci_profile_name",
        "placement_start",
        "placement_size",
        "memory_mib",
        "sm_count",
    )

    gpu = models.ForeignKey(
        Gpu, verbose_name="GPU", on_delete=models.CASCADE, related_name="mig_instances"
    )
    uuid = models.CharField("UUID", max_length=64, unique=True, null=True, blank=True)
    gi_id = models.PositiveSmallIntegerField("GPU instance ID")
    ci_id = models.PositiveSmallIntegerField("compute instance ID")
    profile_name = models.CharField(
        "profile", max_length=32, help_text="GPU instance profile, e.g. 3g.20gb"
    )
    profile_id = models.PositiveSmallIntegerField("profile ID")
    ci_profile_name = models.CharField("compute instance profile", max_length=32)
    placement_start = models.PositiveSmallIntegerField()
    placement_size = models.PositiveSmallIntegerField()
    memory_mib = models.PositiveIntegerField("memory (MiB)")
    sm_count = models.PositiveSmallIntegerField("SMs")

    class Meta:
        verbose_name = "MIG instance"
        verbose_name_plural = "MIG instances"
        ordering = ["gpu", "gi_id", "ci_id"]
        constraints = [
            models.UniqueConstraint(
                fields=["gpu", "gi_id", "ci_id"], name="inventory_mig_unique_gi_ci"
            )
        ]

    def __str__(self) -> str:
        return f"{self.gpu.uuid} GI{self.gi_id}/CI{self.ci_id} {self.ci_profile_name}"


class GpuLink(models.Model):
    """How two GPUs of a node reach each other, as ``nvidia-smi topo -m`` names it."""

    node = models.ForeignKey(Node, on_delete=models.CASCADE, related_name="links")
    gpu_a = models.ForeignKey(Gpu, verbose_name="GPU A", on_delete=models.CASCADE, related_name="+")
    gpu_b = models.ForeignKey(Gpu, verbose_name="GPU B", on_delete=models.CASCADE, related_name="+")
    link_type = models.CharField(max_length=8, help_text="NV#, PIX, PXB, PHB, NODE or SYS")
    nvlink_count = models.PositiveSmallIntegerField("NVLinks", default=0)

    class Meta:
        verbose_name = "GPU link"
        verbose_name_plural = "GPU links"
        ordering = ["node", "gpu_a__index", "gpu_b__index"]
        constraints = [
            models.UniqueConstraint(fields=["gpu_a", "gpu_b"], name="inventory_link_unique_pair"),
            models.CheckConstraint(
                condition=Q(gpu_a__lt=models.F("gpu_b")), name="inventory_link_ordered_pair"
            ),
        ]

    def __str__(self) -> str:
        return f"{self.gpu_a_id}-{self.gpu_b_id} {self.link_type}"


class GpuNicLink(models.Model):
    """How a GPU reaches a network adapter of its node (a NIC column of ``topo -m``): the path
    a multi-node job's traffic takes, so GPU-NIC affinity matters for placement and debugging."""

    node = models.ForeignKey(Node, on_delete=models.CASCADE, related_name="nic_links")
    gpu = models.ForeignKey(
        Gpu, verbose_name="GPU", on_delete=models.CASCADE, related_name="nic_links"
    )
    nic = models.CharField("NIC", max_length=64, help_text="Adapter name, e.g. mlx5_0.")
    link_type = models.CharField(max_length=8, help_text="PIX, PXB, PHB, NODE or SYS")

    class Meta:
        verbose_name = "GPU-NIC link"
        verbose_name_plural = "GPU-NIC links"
        ordering = ["node", "gpu__index", "nic"]
        constraints = [
            models.UniqueConstraint(fields=["gpu", "nic"], name="inventory_nic_link_unique_pair")
        ]

    def __str__(self) -> str:
        return f"{self.gpu_id}-{self.nic} {self.link_type}"
