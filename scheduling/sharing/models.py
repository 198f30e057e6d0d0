"""MIG re-layouts: an admin's request to give one GPU a new MIG layout, and its steps."""

from __future__ import annotations

from django.conf import settings
from django.db import models
from django.db.models import Q

from inventory.models import Gpu, Node


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
