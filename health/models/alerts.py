"""Alert rules, the alerts they open, and the webhooks that carry them out."""

from __future__ import annotations

from django.conf import settings
from django.db import models
from django.db.models import Q
from django.utils import timezone

from health.choices import AlertState, DeliveryState, RuleKind, Severity, WebhookKind
from health.models.events import HealthEvent
from inventory.models import Gpu, Node


class AlertRule(models.Model):
    """When to open an alert. ``metric`` names a live sample field (``temperature_c``...)."""

    name = models.CharField(max_length=100, unique=True)
    kind = models.CharField(max_length=20, choices=RuleKind.choices)
    metric = models.CharField(max_length=40, blank=True)
    operator = models.CharField(
        max_length=2, choices=[(">", ">"), (">=", ">="), ("<", "<"), ("<=", "<=")], default=">"
    )
    threshold = models.FloatField(null=True, blank=True)
    duration_s = models.PositiveIntegerField(
        default=0, help_text="How long the condition must hold before the alert opens."
    )
    severity = models.CharField(max_length=10, choices=Severity.choices, default=Severity.WARNING)
    enabled = models.BooleanField(default=True)
    description = models.TextField(blank=True)

    class Meta:
        ordering = ("name",)

    def __str__(self) -> str:
        return self.name


class Alert(models.Model):
    """One condition on one thing (``fingerprint``: rule + GPU/node/event), open until it
    clears. At most one firing alert per fingerprint: a repeat updates ``last_seen_at``."""

    rule = models.ForeignKey(
        AlertRule, null=True, blank=True, on_delete=models.SET_NULL, related_name="alerts"
    )
    fingerprint = models.CharField(max_length=200)
    state = models.CharField(max_length=10, choices=AlertState.choices, default=AlertState.FIRING)
    severity = models.CharField(max_length=10, choices=Severity.choices)
    summary = models.CharField(max_length=500)
    node = models.ForeignKey(
        Node, null=True, blank=True, on_delete=models.CASCADE, related_name="alerts"
    )
    gpu = models.ForeignKey(
        Gpu, null=True, blank=True, on_delete=models.CASCADE, related_name="alerts"
    )
    event = models.ForeignKey(
        HealthEvent, null=True, blank=True, on_delete=models.SET_NULL, related_name="alerts"
    )
    labels = models.JSONField(default=dict, blank=True)
    opened_at = models.DateTimeField(default=timezone.now)
    last_seen_at = models.DateTimeField(default=timezone.now)
    resolved_at = models.DateTimeField(null=True, blank=True)
    acknowledged_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    acknowledged_at = models.DateTimeField(null=True, blank=True)
    ack_comment = models.TextField(blank=True)

    class Meta:
        ordering = ("-opened_at", "-pk")
        constraints = [
            models.UniqueConstraint(
                fields=["fingerprint"],
                condition=Q(state=AlertState.FIRING),
                name="health_one_firing_alert",
            ),
        ]
        indexes = [models.Index(fields=["state", "-opened_at"], name="health_alert_state_time")]

    def __str__(self) -> str:
        return self.summary


class Webhook(models.Model):
    """Where alerts go: a generic JSON receiver, a Slack-compatible one, or Alertmanager."""

    name = models.CharField(max_length=100, unique=True)
    url = models.URLField(max_length=500)
    kind = models.CharField(max_length=16, choices=WebhookKind.choices, default=WebhookKind.GENERIC)
    min_severity = models.CharField(
        max_length=10, choices=Severity.choices, default=Severity.WARNING
    )
    enabled = models.BooleanField(default=True)

    class Meta:
        ordering = ("name",)

    def __str__(self) -> str:
        return self.name


class WebhookDelivery(models.Model):
    """One alert change (opened, resolved, acknowledged) sent to one webhook, with retries."""

    webhook = models.ForeignKey(Webhook, on_delete=models.CASCADE, related_name="deliveries")
    alert = models.ForeignKey(Alert, on_delete=models.CASCADE, related_name="deliveries")
    change = models.CharField(max_length=16)
    state = models.CharField(
        max_length=10, choices=DeliveryState.choices, default=DeliveryState.PENDING
    )
    attempts = models.PositiveSmallIntegerField(default=0)
    last_error = models.TextField(blank=True)
    created_at = models.DateTimeField(default=timezone.now)
    delivered_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ("-created_at",)
        verbose_name_plural = "webhook deliveries"

    def __str__(self) -> str:
        return f"{self.alert} -> {self.webhook} ({self.change})"


class IdleHeldUsage(models.Model):
    """GPU-seconds a user held allocated but idle, per day (the idle-held rule counts them)."""

    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="+")
    day = models.DateField()
    gpu_seconds = models.FloatField(default=0)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["user", "day"], name="health_idle_user_day")]

    def __str__(self) -> str:
        return f"{self.user} {self.day}: {self.gpu_seconds / 3600:.1f} idle GPU-hours"
