"""Celery tasks of the health app: thin wrappers around its services.

Agents send ``health.report`` (signed, believed only from the node it is about); beat runs
the periodic ones on the central worker.
"""

from __future__ import annotations

from typing import Any

from celery import Task, shared_task
from django.conf import settings

from gpuadmin.access.node_orders import NodeOrder
from gpuadmin.access.node_signing import send_as_node
from gpuadmin.access.nodes import speaks_for
from gpuadmin.celery import DATABASE_AWAY
from health import quarantine, resets, rules, services, telemetry, webhooks
from health.wire import HealthReport


@shared_task(name="health.evaluate_alerts")
def evaluate_alerts() -> None:
    rules.evaluate()


@shared_task(name="health.resend_to_alertmanager")
def resend_to_alertmanager() -> None:
    webhooks.resend_firing_to_alertmanager()


@shared_task(
    name=webhooks.DELIVER_TASK,
    bind=True,
    autoretry_for=(webhooks.DeliveryFailed, *DATABASE_AWAY),
    retry_backoff=settings.GPUADMIN_WEBHOOK_BACKOFF_S,
    retry_backoff_max=settings.GPUADMIN_WEBHOOK_BACKOFF_MAX_S,
    retry_jitter=False,
    max_retries=settings.GPUADMIN_WEBHOOK_MAX_ATTEMPTS - 1,
)
def deliver_webhook(self: Task, delivery_id: int) -> None:
    last = self.request.retries >= settings.GPUADMIN_WEBHOOK_MAX_ATTEMPTS - 1
    webhooks.deliver(delivery_id, final=last)


@shared_task(name="health.ingest_samples")
def ingest_samples() -> None:
    telemetry.ingest()


@shared_task(name="health.maintain_telemetry")
def maintain_telemetry() -> None:
    telemetry.maintain()


@shared_task(name="health.review_quarantines")
def review_quarantines() -> None:
    quarantine.review()


@shared_task(name="health.report", bind=True)
def report(self: Task, hostname: str, reports: list[dict[str, Any]]) -> None:
    """What a node's agent saw on its GPUs (``health.wire.HealthReport`` dicts): stored once
    and acted on by the recovery policies, believed only from that node."""
    if speaks_for(self, hostname):
        services.receive_reports(hostname, [HealthReport.from_dict(item) for item in reports])


@shared_task(name="health.watch_heartbeats")
def watch_heartbeats() -> None:
    services.watch_heartbeats()


@shared_task(name="health.reset_gpu", base=NodeOrder)
def reset_gpu(gpu_index: int, gpu_uuid: str, event_id: int | None = None) -> None:
    """Reset one of this node's GPUs for a recovery policy (runs on the node's agent) and
    report how it went."""
    error = resets.reset_on_this_node(gpu_index)
    send_as_node(
        "health.reset_finished", args=(settings.GPUADMIN_NODE_NAME, gpu_uuid, error, event_id)
    )


@shared_task(name="health.reset_finished", bind=True)
def reset_finished(
    self: Task, hostname: str, gpu_uuid: str, error: str | None, event_id: int | None = None
) -> None:
    if speaks_for(self, hostname):
        resets.finish_reset(hostname, gpu_uuid, error, event_id)
