"""Allocations: one GPU (whole, a MIG device or an MPS share) given to one job; the database
refuses a second active allocation of a GPU (a partial unique index). And the GPU-hours each
day accounts.
"""

from __future__ import annotations

from django.conf import settings
from django.db import models
from django.db.models import Q
from django.db.models.functions import Now

from inventory.models import Gpu, MigInstance, Node, Pool


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

    job = models.ForeignKey("scheduling.Job", on_delete=models.PROTECT, related_name="allocations")
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
    # allocations never overlap in time, whichever host wrote them (see
    # allocation_services.allocate).
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
