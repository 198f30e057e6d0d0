"""Opening, resolving and acknowledging alerts: the one place an alert changes.

At most one alert is firing per fingerprint (a partial unique index): opening it again only
moves its ``last_seen_at``, so the rule evaluation and the recovery policies can call
``open_alert`` on every pass without counting. Resolved alerts stay as the history. Each
change is audited and handed to the webhooks once it commits.
"""

from __future__ import annotations

from typing import Any

from django.contrib.auth.models import User
from django.db import IntegrityError, transaction
from django.utils import timezone

from gpuadmin.audit.services import record
from health import webhooks, xids
from health.choices import CONDITION_RULE_KINDS, SEVERITY_RANK, AlertState, EventKind, Severity
from health.models import Alert, AlertRule, HealthEvent
from inventory.models import Gpu, Node

ACTOR = "health"


class AlertNotFiring(ValueError):
    """Only a firing alert can be acknowledged."""


def _audit_fields(alert: Alert) -> dict[str, Any]:
    return {
        "fingerprint": alert.fingerprint,
        "state": alert.state,
        "severity": alert.severity,
        "acknowledged_by": alert.acknowledged_by.get_username() if alert.acknowledged_by else None,
    }


# The event kinds one fault of a GPU reports together: an uncorrectable memory error raises
# the ECC counters and remaps a row; the XIDs of these parts join them (``XidInfo.subject``).
FAULT_OF_KIND: dict[str, str] = {
    EventKind.GPU_LOST: "gpu_lost",
    EventKind.ECC_CORRECTED: "memory",
    EventKind.ECC_UNCORRECTED: "memory",
    EventKind.RETIRED_PAGES: "memory",
    EventKind.REMAP_PENDING: "memory",
    EventKind.REMAP_FAILURE: "memory",
    EventKind.NVLINK: "nvlink",
}


def unreachable_fingerprint(hostname: str) -> str:
    """The node's "unreachable" alert: the node-unreachable rule's and its heartbeat-lost
    events' (one silent agent, one alert)."""
    return f"node:{hostname}:unreachable"


def event_fingerprint(event: HealthEvent) -> str:
    """One firing alert per fault and GPU (or node): the health-event rule and a policy's
    "alert" action use it, and a fault reported several ways (XID 79 and the GPU lost to
    NVML; XID 48, the ECC counter and a remapped row) is one fault."""
    if event.kind == EventKind.HEARTBEAT_LOST:
        return unreachable_fingerprint(event.node.hostname)
    info = xids.lookup(event.xid) if event.xid is not None else None
    if info is not None and info.subject:
        what = info.subject
    elif event.xid is not None:
        what = f"{event.kind}:{event.xid}"
    else:
        what = FAULT_OF_KIND.get(event.kind, event.kind)
    where = event.gpu.uuid if event.gpu_id and event.gpu else event.node.hostname
    return f"event:{what}:{where}"


def _names_it_better(event: HealthEvent | None, found: Alert) -> bool:
    """An XID names a fault by NVIDIA's catalog: it words the alert that a counter or a lost
    GPU opened for the same fault first (``event_fingerprint``)."""
    if event is None or event.xid is None or found.event_id is None:
        return False
    return HealthEvent.objects.filter(pk=found.event_id, xid=None).exists()


def open_alert(
    *,
    fingerprint: str,
    severity: str,
    summary: str,
    node: Node | None = None,
    gpu: Gpu | None = None,
    event: HealthEvent | None = None,
    rule: AlertRule | None = None,
    labels: dict[str, Any] | None = None,
) -> Alert:
    """The firing alert of ``fingerprint``: a new one (audited, sent to the webhooks on
    commit), or the one already firing with ``last_seen_at`` moved to now (its severity
    raised when this one is worse, its words an XID's; a condition rule adopting the alert a
    policy opened for the same thing, so that it resolves when the condition clears). Safe
    when two workers open the same one at once."""
    if node is None and gpu is not None:
        node = gpu.node
    with transaction.atomic():
        for _attempt in range(3):
            found = (
                Alert.objects.select_for_update()
                .filter(fingerprint=fingerprint, state=AlertState.FIRING)
                .first()
            )
            if found is not None:
                found.last_seen_at = timezone.now()
                fields = ["last_seen_at"]
                if SEVERITY_RANK[Severity(severity)] > SEVERITY_RANK[Severity(found.severity)]:
                    found.severity, found.summary = severity, summary[:500]
                    fields += ["severity", "summary"]
                elif _names_it_better(event, found):
                    found.summary, found.event = summary[:500], event
                    fields += ["summary", "event"]
                if rule is not None and found.rule_id is None and rule.kind in CONDITION_RULE_KINDS:
                    found.rule = rule
                    fields.append("rule")
                found.save(update_fields=fields)
                return found
            try:
                with transaction.atomic():  # a savepoint: losing the race leaves us usable
                    alert = Alert.objects.create(
                        fingerprint=fingerprint,
                        severity=severity,
                        summary=summary[:500],
                        node=node,
                        gpu=gpu,
                        event=event,
                        rule=rule,
                        labels=labels or {},
                    )
            except IntegrityError:
                continue  # another worker opened it first: bump theirs
            record(
                "alert.opened",
                actor_name=ACTOR,
                target=alert,
                after=_audit_fields(alert),
                message=alert.summary,
            )
            webhooks.enqueue(alert, webhooks.Change.OPENED)
            return alert
    raise RuntimeError(f"could not open alert {fingerprint!r}")  # pragma: no cover


def resolve_alert(fingerprint: str) -> bool:
    """Resolve the firing alert of ``fingerprint``; False when none was firing."""
    with transaction.atomic():
        alert = (
            Alert.objects.select_for_update()
            .filter(fingerprint=fingerprint, state=AlertState.FIRING)
            .first()
        )
        if alert is None:
            return False
        before = _audit_fields(alert)
        alert.state = AlertState.RESOLVED
        alert.resolved_at = timezone.now()
        alert.save(update_fields=["state", "resolved_at"])
        record(
            "alert.resolved",
            actor_name=ACTOR,
            target=alert,
            before=before,
            after=_audit_fields(alert),
            message=f"resolved: {alert.summary}",
        )
        webhooks.enqueue(alert, webhooks.Change.RESOLVED)
    return True


def acknowledge(alert: Alert, user: User, comment: str = "") -> Alert:
    """``user`` has seen the firing ``alert`` (and says so in ``comment``): by whom and when
    are kept on it, audited, and sent to the webhooks. Acknowledging again replaces them."""
    with transaction.atomic():
        locked = Alert.objects.select_for_update().get(pk=alert.pk)
        if locked.state != AlertState.FIRING:
            raise AlertNotFiring(
                f"alert {locked.pk} is {locked.state}: only a firing one can be acknowledged"
            )
        before = _audit_fields(locked)
        locked.acknowledged_by = user
        locked.acknowledged_at = timezone.now()
        locked.ack_comment = comment
        locked.save(update_fields=["acknowledged_by", "acknowledged_at", "ack_comment"])
        record(
            "alert.acknowledged",
            actor=user,
            target=locked,
            before=before,
            after=_audit_fields(locked),
            message=comment or f"acknowledged: {locked.summary}",
        )
        webhooks.enqueue(locked, webhooks.Change.ACKNOWLEDGED)
    return locked
