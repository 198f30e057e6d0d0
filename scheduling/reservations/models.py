"""Reservations: GPUs booked for a window of time, and the GPUs an approval holds (the database
refuses a GPU held twice in overlapping windows).
"""

from __future__ import annotations

from django.conf import settings
from django.contrib.postgres.constraints import ExclusionConstraint
from django.contrib.postgres.fields import DateTimeRangeField, RangeOperators
from django.core.validators import MinValueValidator
from django.db import models
from django.db.models import F, Func, Q, Value

from inventory.models import Gpu, Node, Pool
from scheduling.placement.text import plural


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
