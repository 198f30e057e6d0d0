"""Carrying alert changes to webhooks: a delivery row per change and receiver, sent by the
``health.deliver_webhook`` task once the change commits (never in the caller's request), with
retries and exponential backoff.

Three body formats: generic JSON, Slack-compatible (``text`` + ``blocks``), and
Alertmanager's API v2 (``POST /api/v2/alerts``, a list of alerts with labels, annotations,
``startsAt``/``endsAt``) so an existing Alertmanager routes them like Prometheus's.
"""

from __future__ import annotations

import json
import logging
import re
import urllib.error
import urllib.request
from datetime import datetime
from enum import StrEnum
from typing import Any

from celery import current_app
from django.conf import settings
from django.db import transaction
from django.urls import reverse
from django.utils import timezone

from health.choices import SEVERITY_RANK, AlertState, DeliveryState, Severity, WebhookKind
from health.models import Alert, Webhook, WebhookDelivery

logger = logging.getLogger("gpuadmin.health.webhooks")

# The task that sends one delivery (``health.tasks.deliver_webhook``, which calls ``deliver``).
DELIVER_TASK = "health.deliver_webhook"


class Change(StrEnum):
    OPENED = "opened"
    RESOLVED = "resolved"
    ACKNOWLEDGED = "acknowledged"


class DeliveryFailed(RuntimeError):
    """The receiver could not be reached or answered other than 2xx: try again later."""


def enqueue(alert: Alert, change: Change) -> list[WebhookDelivery]:
    """A pending delivery of ``change`` to every enabled webhook whose ``min_severity`` the
    alert reaches, sent once the caller's transaction commits."""
    rank = SEVERITY_RANK[Severity(alert.severity)]
    hooks = [
        hook
        for hook in Webhook.objects.filter(enabled=True)
        if SEVERITY_RANK[Severity(hook.min_severity)] <= rank
    ]
    if not hooks:
        return []
    deliveries = WebhookDelivery.objects.bulk_create(
        WebhookDelivery(webhook=hook, alert=alert, change=change) for hook in hooks
    )
    ids = [delivery.pk for delivery in deliveries]

    def send() -> None:
        for delivery_id in ids:
            current_app.send_task(
                DELIVER_TASK, args=(delivery_id,), queue=settings.GPUADMIN_CENTRAL_QUEUE
            )

    transaction.on_commit(send)
    return deliveries


def deliver(delivery_id: int, *, final: bool) -> str:
    """Send one delivery; its state after. A failure raises ``DeliveryFailed`` (the task
    retries) unless ``final``, when the delivery is marked failed."""
    delivery = (
        WebhookDelivery.objects.select_related(
            "webhook", "alert__node", "alert__gpu", "alert__rule", "alert__acknowledged_by"
        )
        .filter(pk=delivery_id)
        .first()
    )
    if delivery is None or delivery.state != DeliveryState.PENDING:
        return delivery.state if delivery else "gone"
    hook = delivery.webhook
    url, body = request_for(hook, delivery.alert, Change(delivery.change))
    error = post_json(url, body)
    delivery.attempts += 1
    if error is None:
        delivery.state = DeliveryState.DELIVERED
        delivery.delivered_at = timezone.now()
        delivery.last_error = ""
    else:
        delivery.last_error = error[:2000]
        if final:
            delivery.state = DeliveryState.FAILED
    delivery.save(update_fields=["attempts", "state", "delivered_at", "last_error"])
    if error is not None and not final:
        raise DeliveryFailed(f"webhook {hook.name}: {error}")
    return delivery.state


def post_json(url: str, body: Any) -> str | None:
    """POST ``body`` as JSON; ``None`` on a 2xx answer, else what went wrong."""
    request = urllib.request.Request(
        url,
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json", "User-Agent": "gpuadmin-alerts"},
        method="POST",
    )
    try:
        with urllib.request.urlopen(request, timeout=settings.GPUADMIN_WEBHOOK_TIMEOUT_S):
            return None
    except urllib.error.HTTPError as exc:
        return f"HTTP {exc.code} from {url}"
    except (OSError, ValueError) as exc:
        return f"{type(exc).__name__} posting to {url}: {exc}"


def absolute(path: str) -> str:
    return settings.GPUADMIN_PUBLIC_URL.rstrip("/") + path


def request_for(hook: Webhook, alert: Alert, change: Change) -> tuple[str, Any]:
    """The URL to POST to and the body, in the webhook's format."""
    if hook.kind == WebhookKind.ALERTMANAGER:
        url = hook.url.rstrip("/")
        if not url.endswith("/api/v2/alerts"):
            url += "/api/v2/alerts"
        return url, [alertmanager_alert(alert)]
    if hook.kind == WebhookKind.SLACK:
        return hook.url, slack_body(alert, change)
    return hook.url, generic_body(alert, change)


def _iso(moment: datetime | None) -> str | None:
    return moment.isoformat() if moment else None


def alert_fields(alert: Alert) -> dict[str, Any]:
    """The alert as the generic format and the API describe it."""
    return {
        "id": alert.pk,
        "fingerprint": alert.fingerprint,
        "state": alert.state,
        "severity": alert.severity,
        "summary": alert.summary,
        "rule": alert.rule.name if alert.rule else None,
        "node": alert.node.hostname if alert.node else None,
        "gpu_index": alert.gpu.index if alert.gpu else None,
        "gpu_uuid": alert.gpu.uuid if alert.gpu else None,
        "event_id": alert.event_id,
        "labels": alert.labels,
        "opened_at": _iso(alert.opened_at),
        "last_seen_at": _iso(alert.last_seen_at),
        "resolved_at": _iso(alert.resolved_at),
        "acknowledged_by": alert.acknowledged_by.get_username() if alert.acknowledged_by else None,
        "acknowledged_at": _iso(alert.acknowledged_at),
        "ack_comment": alert.ack_comment,
    }


def generic_body(alert: Alert, change: Change) -> dict[str, Any]:
    return {
        "change": change.value,
        "alert": alert_fields(alert),
        "urls": {
            "alert": absolute(reverse("health:alerts") + f"?id={alert.pk}"),
            "alerts": absolute(reverse("health:alerts")),
            "api": absolute(reverse("health-api-v1:alert-detail", args=[alert.pk])),
        },
    }


def slack_body(alert: Alert, change: Change) -> dict[str, Any]:
    where = " ".join(
        part
        for part in (
            f"node {alert.node.hostname}" if alert.node else "",
            f"GPU {alert.gpu.index} ({alert.gpu.uuid})" if alert.gpu else "",
        )
        if part
    )
    headline = f"[{change.value.upper()}] {alert.severity}: {alert.summary}"
    detail = headline + (f"\n{where}" if where else "")
    if change == Change.ACKNOWLEDGED and alert.acknowledged_by:
        detail += f"\nacknowledged by {alert.acknowledged_by.get_username()}"
        if alert.ack_comment:
            detail += f": {alert.ack_comment}"
    link = absolute(reverse("health:alerts") + f"?id={alert.pk}")
    return {
        "text": headline,
        "blocks": [
            {"type": "section", "text": {"type": "mrkdwn", "text": detail}},
            {
                "type": "context",
                "elements": [{"type": "mrkdwn", "text": f"<{link}|open in gpuadmin>"}],
            },
        ],
    }


def _label_name(text: str) -> str:
    """An Alertmanager label name / alertname: letters, digits and underscores."""
    return re.sub(r"[^A-Za-z0-9_]", "_", text) or "gpuadmin"


def alertmanager_alert(alert: Alert) -> dict[str, Any]:
    """One alert of Alertmanager's ``postableAlerts``: a resolved one carries ``endsAt``."""
    labels = {_label_name(name): str(value) for name, value in alert.labels.items()}
    labels["alertname"] = _label_name(
        alert.rule.name
        if alert.rule
        else labels.get("alertname") or alert.fingerprint.split(":")[0]
    )
    labels.update(severity=alert.severity, fingerprint=alert.fingerprint, source="gpuadmin")
    if alert.node:
        labels.update(instance=alert.node.hostname, Hostname=alert.node.hostname)
    if alert.gpu:
        labels.update(gpu=str(alert.gpu.index), UUID=alert.gpu.uuid, modelName=alert.gpu.name)
    annotations = {"summary": alert.summary, "description": alert.summary}
    if alert.acknowledged_by:
        annotations["acknowledged_by"] = alert.acknowledged_by.get_username()
        annotations["ack_comment"] = alert.ack_comment
    body: dict[str, Any] = {
        "labels": labels,
        "annotations": annotations,
        "startsAt": _iso(alert.opened_at),
        "generatorURL": absolute(reverse("health:alerts") + f"?id={alert.pk}"),
    }
    if alert.resolved_at:
        body["endsAt"] = _iso(alert.resolved_at)
    return body


def resend_firing_to_alertmanager() -> int:
    """Post every firing alert again to each enabled Alertmanager webhook (one request each),
    as Prometheus re-sends its firing alerts: Alertmanager resolves an alert it has not heard
    of within its ``resolve_timeout`` (5 minutes by default). A failure is logged; the next
    pass (beat, every ``GPUADMIN_ALERTMANAGER_RESEND_S``) tries again. Returns the requests
    that were answered."""
    hooks = list(Webhook.objects.filter(enabled=True, kind=WebhookKind.ALERTMANAGER))
    if not hooks:
        return 0
    firing = list(
        Alert.objects.filter(state=AlertState.FIRING).select_related(
            "node", "gpu", "rule", "acknowledged_by"
        )
    )
    answered = 0
    for hook in hooks:
        rank = SEVERITY_RANK[Severity(hook.min_severity)]
        body = [
            alertmanager_alert(alert)
            for alert in firing
            if SEVERITY_RANK[Severity(alert.severity)] >= rank
        ]
        if not body:
            continue
        url, _ = request_for(hook, firing[0], Change.OPENED)
        error = post_json(url, body)
        if error is None:
            answered += 1
        else:
            logger.warning("re-sending %d firing alerts to %s failed: %s", len(body), hook, error)
    return answered
