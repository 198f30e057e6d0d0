"""The append-only audit log every app writes to (see ``gpuadmin.audit.services.record``)."""

from __future__ import annotations

from django.conf import settings
from django.db import models
from django.utils import timezone


class AuditEvent(models.Model):
    """One state change: who, what, when, and the before/after values.

    Rows are never updated or deleted: a PostgreSQL trigger (migration 0002) refuses both. For
    that reason ``actor`` has no database foreign-key constraint and no ``SET_NULL`` cascade
    (which would be an UPDATE): ``actor_name`` keeps who acted even after the user is gone, and
    ``object_repr`` keeps what was changed after the object is gone.
    """

    time = models.DateTimeField(default=timezone.now, db_index=True)
    event_type = models.CharField(
        max_length=64, db_index=True, help_text="Dotted name such as gpu.state_changed."
    )
    actor = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        null=True,
        blank=True,
        on_delete=models.DO_NOTHING,
        db_constraint=False,
        related_name="+",
    )
    actor_name = models.CharField(
        max_length=150, help_text="Username, or the background process, e.g. placement-loop."
    )
    target_type = models.CharField(max_length=64, blank=True, help_text="app_label.model")
    target_id = models.CharField(max_length=128, blank=True)
    object_repr = models.CharField(max_length=200, blank=True)
    before = models.JSONField(null=True, blank=True)
    after = models.JSONField(null=True, blank=True)
    message = models.TextField(blank=True)
    request_id = models.UUIDField(null=True, blank=True, db_index=True)
    channel = models.CharField(
        max_length=40,
        blank=True,
        default="",
        help_text="Through what the change came: web, api, or the CLI verb (cli drain); "
        "empty for the background processes.",
    )

    class Meta:
        ordering = ["-time", "-id"]
        indexes = [models.Index(fields=["target_type", "target_id", "-time"])]

    def __str__(self) -> str:
        return (
            f"{self.time:%Y-%m-%d %H:%M:%S} {self.actor_name} {self.event_type} {self.object_repr}"
        )
