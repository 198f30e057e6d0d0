"""Health events, the recovery policies that act on them, and the GPUs they fenced."""

from __future__ import annotations

from django.conf import settings
from django.contrib.postgres.fields import ArrayField
from django.db import models
from django.db.models import Q
from django.utils import timezone

from health import xids
from health.choices import Action, EventKind, QuarantineState, Severity
from inventory.choices import GpuState
from inventory.models import Gpu, Node


class HealthEvent(models.Model):
    """Something a GPU or node reported (or the central side noticed), with its raw data.

    ``dedupe_key`` is unique: an agent that resends an event, or two workers that receive it
    twice, store and act on it once (``handled_at`` is set under the row's lock)."""

    node = models.ForeignKey(Node, on_delete=models.CASCADE, related_name="health_events")
    gpu = models.ForeignKey(
        Gpu, null=True, blank=True, on_delete=models.CASCADE, related_name="health_events"
    )
    kind = models.CharField(max_length=24, choices=EventKind.choices)
    xid = models.PositiveIntegerField("XID", null=True, blank=True)
    gpu_instance_id = models.PositiveSmallIntegerField(
        "GPU instance ID",
        null=True,
        blank=True,
        help_text="The MIG GPU instance the driver attributed the XID to (NVML's gpuInstanceId, "
        "the kernel line's GPU-I); empty: the whole GPU.",
    )
    severity = models.CharField(max_length=10, choices=Severity.choices)
    message = models.TextField(blank=True)
    data = models.JSONField(default=dict, blank=True)  # the raw report: counters, XID text...
    occurred_at = models.DateTimeField()
    received_at = models.DateTimeField(default=timezone.now)
    dedupe_key = models.CharField(max_length=200, unique=True)
    policy = models.ForeignKey(
        "RecoveryPolicy", null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    handled_at = models.DateTimeField(null=True, blank=True)
    outcome = models.JSONField(default=list, blank=True)  # what the policy did, step by step

    class Meta:
        ordering = ("-occurred_at", "-pk")
        indexes = [
            models.Index(fields=["gpu", "-occurred_at"], name="health_event_gpu_time"),
            models.Index(fields=["node", "-occurred_at"], name="health_event_node_time"),
            models.Index(fields=["-occurred_at"], name="health_event_time"),
        ]

    def __str__(self) -> str:
        what = f"XID {self.xid}" if self.xid is not None else self.get_kind_display()
        return f"{what} on {self.gpu or self.node}"

    @property
    def title(self) -> str:
        """What happened, named once: an XID by NVIDIA's catalog (``XID 79 (GPU has fallen
        off the bus)``), any other event by its kind ("Uncorrectable ECC errors"). ``message``
        holds only what the reporter said beyond it."""
        if self.kind == EventKind.XID and self.xid is not None:
            info = xids.lookup(self.xid)
            return info.title if info else f"XID {self.xid} (not in NVIDIA's XID catalog)"
        return self.get_kind_display()

    def describe(self, gpu: Gpu | None = None) -> str:
        """``XID 79 (GPU has fallen off the bus) on GPU 3 of dgx-01``, ``XID 94 (...) on GPU
        instance 5 of GPU 1 of dgx-01`` for one the driver attributed to a MIG instance;
        ``gpu``: another GPU the event's policy acts on (a node-wide policy)."""
        gpu = gpu or self.gpu
        where = f"GPU {gpu.index} of {gpu.node.hostname}" if gpu else f"node {self.node.hostname}"
        if gpu is not None and gpu == self.gpu and self.gpu_instance_id is not None:
            where = f"GPU instance {self.gpu_instance_id} of {where}"
        return f"{self.title} on {where}"

    def summary(self, gpu: Gpu | None = None) -> str:
        """:meth:`describe` and the reporter's details: what alerts and GPU reasons say."""
        text = self.describe(gpu)
        return f"{text}: {self.message}" if self.message else text


class RecoveryPolicy(models.Model):
    """What to do about events of a kind (and for XIDs, of one XID or one resolution bucket
    of NVIDIA's catalog). The most specific enabled policy wins: an XID's own, then its
    bucket's, then the kind's."""

    name = models.CharField(max_length=100, unique=True)
    kind = models.CharField(max_length=24, choices=EventKind.choices)
    xid = models.PositiveIntegerField("XID", null=True, blank=True)
    resolution = models.CharField(
        max_length=40,
        blank=True,
        help_text="An NVIDIA resolution bucket (RESET_GPU, RESTART_APP, ...) for XID events.",
    )
    severity = models.CharField(max_length=10, choices=Severity.choices, default=Severity.WARNING)
    actions = ArrayField(
        models.CharField(max_length=16, choices=Action.choices), default=list, blank=True
    )
    node_wide = models.BooleanField(
        default=False, help_text="The fault affects the whole node: fence every GPU on it."
    )
    threshold = models.FloatField(
        null=True,
        blank=True,
        help_text="Act only above this value: correctable ECC errors per hour, degrees C...",
    )
    escalate_after = models.PositiveSmallIntegerField(
        null=True, blank=True, help_text="After this many firings on one GPU in the window..."
    )
    escalate_window_s = models.PositiveIntegerField(default=86_400)
    escalate_to = models.CharField(
        max_length=16, choices=Action.choices, default=Action.OFFLINE_GPU, blank=True
    )
    probation_s = models.PositiveIntegerField(
        default=300, help_text="Clean seconds after the fault clears before the GPU returns."
    )
    reset_before_probation = models.BooleanField(
        default=False,
        help_text="Probation starts only after a successful GPU reset through the node's agent "
        "(or a person returns the GPU): faults NVIDIA clears by a reset or a node reboot "
        "(XID 79, uncorrectable ECC: row remapping and page retirement take effect at reset).",
    )
    enabled = models.BooleanField(default=True)
    description = models.TextField(blank=True)

    class Meta:
        verbose_name_plural = "recovery policies"
        ordering = ("kind", "xid", "resolution", "name")
        constraints = [
            models.UniqueConstraint(
                fields=["kind", "xid"],
                condition=Q(xid__isnull=False, enabled=True),
                name="health_policy_one_per_xid",
            ),
        ]

    def __str__(self) -> str:
        return self.name


class Quarantine(models.Model):
    """A GPU a health policy fenced, from the fault to its return (or a human's decision).
    At most one is open per GPU."""

    gpu = models.ForeignKey(Gpu, on_delete=models.CASCADE, related_name="quarantines")
    state = models.CharField(
        max_length=12, choices=QuarantineState.choices, default=QuarantineState.FENCED
    )
    gpu_state = models.CharField(
        max_length=12,
        choices=GpuState.choices,
        default=GpuState.DEGRADED,
        help_text="The state health put the GPU in: probation returns it only from there "
        "(an admin's own change releases the quarantine).",
    )
    cause = models.ForeignKey(HealthEvent, on_delete=models.PROTECT, related_name="quarantines")
    policy = models.ForeignKey(
        RecoveryPolicy, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    opened_at = models.DateTimeField(default=timezone.now)
    fault_cleared_at = models.DateTimeField(null=True, blank=True)
    probation_until = models.DateTimeField(null=True, blank=True)
    reset_required = models.BooleanField(
        default=False,
        help_text="Its policy asked for a GPU reset before probation (kept here: the policy "
        "may change or go).",
    )
    reset_at = models.DateTimeField(
        null=True, blank=True, help_text="When a reset of the GPU succeeded while it was fenced."
    )
    closed_at = models.DateTimeField(null=True, blank=True)
    note = models.TextField(blank=True)

    class Meta:
        ordering = ("-opened_at",)
        constraints = [
            models.UniqueConstraint(
                fields=["gpu"],
                condition=Q(closed_at__isnull=True),
                name="health_one_open_quarantine",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.gpu} ({self.get_state_display()})"


class BreakerTrip(models.Model):
    """The circuit breaker tripped: too many GPUs fell at once, automatic fencing stopped
    until an admin resets it (``reset_at``)."""

    tripped_at = models.DateTimeField(default=timezone.now)
    falling = models.PositiveIntegerField(help_text="GPUs fenced or asking to be in the window.")
    fleet = models.PositiveIntegerField(help_text="GPUs in the fleet then.")
    reset_at = models.DateTimeField(null=True, blank=True)
    reset_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )

    class Meta:
        ordering = ("-tripped_at",)
        constraints = [
            models.UniqueConstraint(
                fields=["reset_at"], condition=Q(reset_at__isnull=True), name="health_one_open_trip"
            ),
        ]

    def __str__(self) -> str:
        return f"circuit breaker tripped at {self.tripped_at:%Y-%m-%d %H:%M}"
