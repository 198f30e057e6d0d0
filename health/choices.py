"""Stable lowercase values of the health app's kinds, severities, actions and states."""

from django.db import models


class Severity(models.TextChoices):
    INFO = "info", "Info"
    WARNING = "warning", "Warning"
    CRITICAL = "critical", "Critical"


SEVERITY_RANK = {Severity.INFO: 0, Severity.WARNING: 1, Severity.CRITICAL: 2}


class EventKind(models.TextChoices):
    """What a health event is about (``HealthEvent.kind``); agents detect the first ones, the
    central side the last: a node's heartbeats stop, or a Slurm cluster that runs the node
    drains it or marks it down (``integrations.slurm``)."""

    XID = "xid", "XID error"
    ECC_CORRECTED = "ecc_corrected", "Correctable ECC errors"
    ECC_UNCORRECTED = "ecc_uncorrected", "Uncorrectable ECC errors"
    RETIRED_PAGES = "retired_pages", "Retired pages"
    REMAP_PENDING = "remap_pending", "Row remap pending"
    REMAP_FAILURE = "remap_failure", "Row remap failure"
    THERMAL = "thermal", "Thermal"  # a thermal clock event, or a temperature over the threshold
    POWER = "power", "Power brake"  # the hardware power brake slowed the clocks
    NVLINK = "nvlink", "NVLink errors"
    GPU_LOST = "gpu_lost", "GPU lost"  # NVML_ERROR_GPU_IS_LOST: fallen off the bus
    QUERY_FAILING = "query_failing", "Queries failing"  # NVML keeps failing on the GPU
    HEARTBEAT_LOST = "heartbeat_lost", "Heartbeat lost"
    SLURM_DRAIN = "slurm_drain", "Drained in Slurm"
    SLURM_DOWN = "slurm_down", "Down in Slurm"


class Action(models.TextChoices):
    """What a recovery policy may do (``RecoveryPolicy.actions``), applied in this order."""

    ALERT = "alert", "Open an alert"
    FAIL_JOB = "fail_job", "Fail the GPU's jobs"
    REQUEUE_JOB = "requeue_job", "Requeue the GPU's jobs"
    DEGRADE_GPU = "degrade_gpu", "Fence the GPU (degraded)"
    DRAIN_GPU = "drain_gpu", "Drain the GPU"
    DRAIN_NODE = "drain_node", "Drain the node"
    RESET_GPU = "reset_gpu", "Reset the GPU"
    OFFLINE_GPU = "offline_gpu", "Take the GPU offline"


class QuarantineState(models.TextChoices):
    FENCED = "fenced", "Fenced"  # the fault has not cleared yet
    PROBATION = "probation", "Probation"  # the fault cleared; a clean period is running
    HELD = "held", "Held back"  # flapping or escalated: a human decides
    RETURNED = "returned", "Returned"  # back in service
    RELEASED = "released", "Released by an admin"


class AlertState(models.TextChoices):
    FIRING = "firing", "Firing"
    RESOLVED = "resolved", "Resolved"


class RuleKind(models.TextChoices):
    METRIC = "metric", "A metric over a threshold for a duration"
    IDLE_HELD = "idle_held", "An allocated GPU left idle"
    HEALTH_EVENT = "health_event", "Health events of a severity"
    NODE_UNREACHABLE = "node_unreachable", "A node's agent unreachable"
    FOREIGN_PROCESS = "foreign_process", "A process outside any allocation"


# Rules whose alerts resolve when the evaluation no longer finds their condition.
CONDITION_RULE_KINDS = (
    RuleKind.METRIC,
    RuleKind.IDLE_HELD,
    RuleKind.FOREIGN_PROCESS,
    RuleKind.NODE_UNREACHABLE,
)


class WebhookKind(models.TextChoices):
    GENERIC = "generic", "Generic JSON"
    SLACK = "slack", "Slack-compatible"
    ALERTMANAGER = "alertmanager", "Alertmanager API (v2)"


class DeliveryState(models.TextChoices):
    PENDING = "pending", "Pending"
    DELIVERED = "delivered", "Delivered"
    FAILED = "failed", "Failed"  # gave up after the last retry
