"""Alerts: one firing per fingerprint (also under concurrent opens), resolving keeps the
history, acknowledging is kept and audited, each change goes to the matching webhooks in their
formats (posted to a real HTTP receiver), with retries."""

from __future__ import annotations

import threading
import uuid
from datetime import timedelta
from typing import Any

import pytest
from django.db import connection
from django.utils import timezone

from gpuadmin.audit.models import AuditEvent
from gpuadmin.celery import app
from health import alerts, webhooks
from health.choices import AlertState, DeliveryState, WebhookKind
from health.models import Alert, Webhook, WebhookDelivery
from inventory.models import Gpu
from tests.health.receiver import receiver
from tests.scheduling.conftest import RecordingBroker, add_sim_node

pytestmark = pytest.mark.django_db


@pytest.fixture
def gpu() -> Gpu:
    node = add_sim_node(f"al-{uuid.uuid4().hex[:6]}")
    return node.gpus.get(index=3)


@pytest.fixture
def broker(monkeypatch) -> RecordingBroker:
    """Records what is sent (``Task.apply_async`` passes args and kwargs by position)."""
    recorder = RecordingBroker()

    def send_task(name: str, args: tuple = (), kwargs: object = None, **options: Any) -> None:
        recorder.send_task(name, args, options.get("queue"))

    monkeypatch.setattr(app, "send_task", send_task)
    return recorder


def test_it_opens_once_per_fingerprint_and_bumps_last_seen(gpu):
    first = alerts.open_alert(fingerprint="t:hot", severity="warning", summary="hot", gpu=gpu)
    Alert.objects.filter(pk=first.pk).update(last_seen_at=timezone.now() - timedelta(minutes=5))
    again = alerts.open_alert(fingerprint="t:hot", severity="critical", summary="hotter", gpu=gpu)

    assert again.pk == first.pk
    stored = Alert.objects.get(pk=first.pk)
    assert stored.last_seen_at > timezone.now() - timedelta(seconds=5)
    assert (stored.severity, stored.summary) == ("critical", "hotter")  # worse: raised
    assert stored.node_id == gpu.node_id  # taken from the GPU
    assert AuditEvent.objects.filter(event_type="alert.opened").count() == 1


def test_resolving_keeps_the_history_and_a_new_firing_alert_is_a_new_row(gpu):
    first = alerts.open_alert(fingerprint="t:x", severity="warning", summary="x", gpu=gpu)
    assert alerts.resolve_alert("t:x") is True
    assert alerts.resolve_alert("t:x") is False  # nothing firing any more
    second = alerts.open_alert(fingerprint="t:x", severity="warning", summary="x again", gpu=gpu)

    assert second.pk != first.pk
    assert list(Alert.objects.filter(fingerprint="t:x").values_list("state", flat=True)) == [
        AlertState.FIRING,
        AlertState.RESOLVED,
    ]
    assert Alert.objects.get(pk=first.pk).resolved_at is not None
    assert AuditEvent.objects.filter(event_type="alert.resolved", target_id=str(first.pk)).exists()


def test_acknowledging_keeps_who_when_and_the_comment_audited(gpu, django_user_model):
    ops = django_user_model.objects.create_user("ops")
    alert = alerts.open_alert(fingerprint="t:ack", severity="warning", summary="x", gpu=gpu)
    alerts.acknowledge(alert, ops, "swapping the fan")

    stored = Alert.objects.get(pk=alert.pk)
    assert (stored.acknowledged_by, stored.ack_comment) == (ops, "swapping the fan")
    assert stored.acknowledged_at is not None
    row = AuditEvent.objects.get(event_type="alert.acknowledged")
    assert (row.actor, row.message, row.after["acknowledged_by"]) == (
        ops,
        "swapping the fan",
        "ops",
    )

    alerts.resolve_alert("t:ack")
    with pytest.raises(alerts.AlertNotFiring):
        alerts.acknowledge(alert, ops, "late")


@pytest.mark.django_db(transaction=True)
def test_concurrent_opens_of_one_fingerprint_leave_one_firing_alert(gpu):
    """Eight workers open the same alert at once: the partial unique index and the savepoint
    retry leave one row, and every caller gets it."""
    barrier = threading.Barrier(8)
    got: list[int] = []

    def worker() -> None:
        try:
            barrier.wait()
            got.append(alerts.open_alert(fingerprint="t:race", severity="warning", summary="r").pk)
        finally:
            connection.close()

    threads = [threading.Thread(target=worker) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    assert len(got) == 8 and len(set(got)) == 1
    assert Alert.objects.filter(fingerprint="t:race").count() == 1
    assert AuditEvent.objects.filter(event_type="alert.opened").count() == 1


def test_changes_are_queued_for_webhooks_of_matching_severity_on_commit(
    gpu, broker, django_capture_on_commit_callbacks, settings
):
    Webhook.objects.create(name="all", url="http://127.0.0.1:9/", min_severity="info")
    Webhook.objects.create(name="pager", url="http://127.0.0.1:9/", min_severity="critical")
    Webhook.objects.create(
        name="off", url="http://127.0.0.1:9/", min_severity="info", enabled=False
    )

    with django_capture_on_commit_callbacks(execute=False) as callbacks:
        alert = alerts.open_alert(fingerprint="t:w", severity="warning", summary="w", gpu=gpu)
        assert broker.named("health.deliver_webhook") == []  # nothing before the commit
    for callback in callbacks:
        callback()

    [delivery] = WebhookDelivery.objects.all()
    assert (delivery.webhook.name, delivery.alert, delivery.change) == ("all", alert, "opened")
    assert broker.named("health.deliver_webhook") == [
        ((delivery.pk,), settings.GPUADMIN_CENTRAL_QUEUE)
    ]

    with django_capture_on_commit_callbacks(execute=True):
        alerts.open_alert(fingerprint="t:c", severity="critical", summary="c", gpu=gpu)
        alerts.resolve_alert("t:c")
    changes = sorted(
        WebhookDelivery.objects.filter(alert__fingerprint="t:c").values_list(
            "webhook__name", "change"
        )
    )
    assert changes == [
        ("all", "opened"),
        ("all", "resolved"),
        ("pager", "opened"),
        ("pager", "resolved"),
    ]


def deliver_one(alert: Alert, kind: str, url: str, change: str = "opened") -> WebhookDelivery:
    hook = Webhook.objects.create(name=f"{kind}-{uuid.uuid4().hex[:4]}", url=url, kind=kind)
    delivery = WebhookDelivery.objects.create(webhook=hook, alert=alert, change=change)
    webhooks.deliver(delivery.pk, final=False)
    delivery.refresh_from_db()
    return delivery


def test_generic_json_carries_the_alert_the_change_and_links(gpu, broker):
    alert = alerts.open_alert(fingerprint="t:g", severity="warning", summary="GPU hot", gpu=gpu)
    with receiver() as got:
        delivery = deliver_one(alert, WebhookKind.GENERIC, got.url + "/hook")
    [request] = got.requests
    assert (delivery.state, delivery.attempts) == (DeliveryState.DELIVERED, 1)
    assert request.path == "/hook" and request.content_type == "application/json"
    assert request.body["change"] == "opened"
    assert request.body["alert"]["summary"] == "GPU hot"
    assert request.body["alert"]["gpu_uuid"] == gpu.uuid
    assert request.body["alert"]["node"] == gpu.node.hostname
    assert request.body["urls"]["api"].endswith(f"/api/v1/alerts/{alert.pk}/")


def test_slack_body_has_text_and_blocks(gpu, broker, django_user_model):
    alert = alerts.open_alert(fingerprint="t:s", severity="critical", summary="XID 79", gpu=gpu)
    alerts.acknowledge(alert, django_user_model.objects.create_user("ops"), "on it")
    with receiver() as got:
        deliver_one(Alert.objects.get(pk=alert.pk), WebhookKind.SLACK, got.url, "acknowledged")
    body = got.requests[0].body
    assert body["text"] == "[ACKNOWLEDGED] critical: XID 79"
    assert body["blocks"][0]["type"] == "section"
    assert "acknowledged by ops: on it" in body["blocks"][0]["text"]["text"]


def test_alertmanager_gets_v2_alerts_with_labels_and_ends_at_on_resolve(gpu, broker):
    alert = alerts.open_alert(
        fingerprint="t:am",
        severity="critical",
        summary="GPU lost",
        gpu=gpu,
        labels={"kind": "gpu_lost"},
    )
    with receiver() as got:
        deliver_one(alert, WebhookKind.ALERTMANAGER, got.url)
        alerts.resolve_alert("t:am")
        deliver_one(
            Alert.objects.get(pk=alert.pk), WebhookKind.ALERTMANAGER, got.url + "/", "resolved"
        )
    opened, resolved = got.requests
    assert opened.path == resolved.path == "/api/v2/alerts"
    [posted] = opened.body
    assert posted["labels"] == {
        "alertname": "t",
        "kind": "gpu_lost",
        "severity": "critical",
        "fingerprint": "t:am",
        "source": "gpuadmin",
        "instance": gpu.node.hostname,
        "Hostname": gpu.node.hostname,
        "gpu": "3",
        "UUID": gpu.uuid,
        "modelName": gpu.name,
    }
    assert posted["annotations"]["summary"] == "GPU lost"
    assert "endsAt" not in posted and posted["startsAt"]
    assert posted["generatorURL"].startswith("http")
    assert resolved.body[0]["endsAt"] and resolved.body[0]["labels"] == posted["labels"]


def test_a_failed_attempt_raises_for_a_retry_and_the_last_one_gives_up(gpu, broker):
    alert = alerts.open_alert(fingerprint="t:f", severity="warning", summary="f", gpu=gpu)
    with receiver(fail_first=2) as got:
        hook = Webhook.objects.create(name="flaky", url=got.url)
        delivery = WebhookDelivery.objects.create(webhook=hook, alert=alert, change="opened")
        with pytest.raises(webhooks.DeliveryFailed, match="HTTP 500"):
            webhooks.deliver(delivery.pk, final=False)
        assert webhooks.deliver(delivery.pk, final=True) == DeliveryState.FAILED
        assert webhooks.deliver(delivery.pk, final=True) == DeliveryState.FAILED  # left alone
    delivery.refresh_from_db()
    assert (delivery.attempts, len(got.requests)) == (2, 2)
    assert "HTTP 500" in delivery.last_error


def test_an_unreachable_receiver_is_a_failed_attempt(gpu, broker, free_port):
    alert = alerts.open_alert(fingerprint="t:u", severity="warning", summary="u", gpu=gpu)
    hook = Webhook.objects.create(name="nobody", url=f"http://127.0.0.1:{free_port}/")
    delivery = WebhookDelivery.objects.create(webhook=hook, alert=alert, change="opened")
    with pytest.raises(webhooks.DeliveryFailed, match="ConnectionRefused|URLError"):
        webhooks.deliver(delivery.pk, final=False)


def test_firing_alerts_are_sent_again_to_alertmanager_so_it_keeps_them(gpu, broker):
    """Alertmanager resolves what it has not heard of for resolve_timeout: the firing ones
    of the webhook's severity go again, in one request; resolved ones do not."""
    alerts.open_alert(fingerprint="t:r1", severity="critical", summary="one", gpu=gpu)
    alerts.open_alert(fingerprint="t:r2", severity="info", summary="two", gpu=gpu)
    alerts.open_alert(fingerprint="t:r3", severity="critical", summary="three", gpu=gpu)
    alerts.resolve_alert("t:r3")
    with receiver() as got:
        Webhook.objects.create(
            name="am", url=got.url, kind=WebhookKind.ALERTMANAGER, min_severity="warning"
        )
        Webhook.objects.create(name="generic", url=got.url)  # not Alertmanager: nothing
        assert webhooks.resend_firing_to_alertmanager() == 1
    [request] = got.requests
    assert request.path == "/api/v2/alerts"
    assert [alert["labels"]["fingerprint"] for alert in request.body] == ["t:r1"]
