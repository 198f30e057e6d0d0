"""The health app's tables: telemetry history, health events and recovery, alerts."""

from health.models.alerts import Alert, AlertRule, IdleHeldUsage, Webhook, WebhookDelivery
from health.models.events import (
    BreakerTrip,
    HealthEvent,
    Quarantine,
    RecoveryPolicy,
)
from health.models.telemetry import FleetRollup, GpuRollup, GpuSample

__all__ = [
    "Alert",
    "AlertRule",
    "BreakerTrip",
    "FleetRollup",
    "GpuRollup",
    "GpuSample",
    "HealthEvent",
    "IdleHeldUsage",
    "Quarantine",
    "RecoveryPolicy",
    "Webhook",
    "WebhookDelivery",
]
