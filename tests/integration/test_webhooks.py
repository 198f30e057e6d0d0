"""Webhooks through a real central Celery worker on the real Redis, to real HTTP receivers:
an alert's opening reaches a generic, a Slack-compatible and an Alertmanager receiver; one that
answers 500 twice gets it on the third attempt (the task's backoff); resolving sends endsAt."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator

import pytest
from django.test import override_settings

from health import alerts
from health.choices import DeliveryState, WebhookKind
from health.models import Webhook, WebhookDelivery
from tests.conftest import REPO_DIR, session_database_url
from tests.health.receiver import Receiver, receiver
from tests.scheduling.conftest import add_sim_node
from tests.waiting import wait_for

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]


@pytest.fixture
def central_worker(gpuadmin_env, tmp_path, settings) -> Iterator[str]:
    """A central worker on a queue of this test's own (sessions share Redis), retrying
    webhooks after 1 s, 2 s, ..."""
    queue = f"hooks-{uuid.uuid4().hex[:6]}"
    settings.GPUADMIN_CENTRAL_QUEUE = queue
    env = {
        **gpuadmin_env,
        "DATABASE_URL": session_database_url(),
        "GPUADMIN_CENTRAL_QUEUE": queue,
        "GPUADMIN_WEBHOOK_BACKOFF_S": "1",
        "GPUADMIN_WEBHOOK_MAX_ATTEMPTS": "4",
    }
    log = tmp_path / "worker.log"
    worker = subprocess.Popen(
        [sys.executable, "-m", "gpuadmin", "worker", "--concurrency", "2"],
        env=env,
        cwd=REPO_DIR,
        stdout=log.open("w"),
        stderr=subprocess.STDOUT,
    )
    try:
        yield queue
    finally:
        worker.terminate()
        try:
            worker.wait(timeout=30)
        except subprocess.TimeoutExpired:
            worker.kill()
        print(log.read_text()[-3000:])  # noqa: T201 (shown when a test fails)


def hook(name: str, got: Receiver, kind: str = WebhookKind.GENERIC) -> Webhook:
    return Webhook.objects.create(name=name, url=got.url + "/in", kind=kind, min_severity="info")


def states(alert_id: int) -> dict[str, tuple[str, int]]:
    return {
        name: (state, attempts)
        for name, state, attempts in WebhookDelivery.objects.filter(alert_id=alert_id).values_list(
            "webhook__name", "state", "attempts"
        )
    }


def test_a_worker_delivers_every_format_and_retries_a_failing_receiver(central_worker):
    gpu = add_sim_node(f"wh-{uuid.uuid4().hex[:6]}").gpus.get(index=0)
    with (
        receiver() as generic,
        receiver() as slack,
        receiver() as alertmanager,
        receiver(fail_first=2) as flaky,
    ):
        hook("generic", generic)
        hook("slack", slack, WebhookKind.SLACK)
        hook("am", alertmanager, WebhookKind.ALERTMANAGER)
        hook("flaky", flaky)
        started = time.monotonic()
        alert = alerts.open_alert(
            fingerprint="it:hot", severity="critical", summary="GPU 0 at 97 C", gpu=gpu
        )
        opened = {"generic", "slack", "am", "flaky"}
        wait_for(
            lambda: {n for n, (s, _) in states(alert.pk).items() if s == "delivered"} == opened,
            60,
            "every receiver to get the alert",
        )
        took = time.monotonic() - started

        assert states(alert.pk)["flaky"] == (DeliveryState.DELIVERED, 3)
        assert [r.status for r in flaky.requests] == [500, 500, 200]
        assert took >= 1 + 2  # the backoff: 1 s, then 2 s
        assert generic.requests[0].body["alert"]["summary"] == "GPU 0 at 97 C"
        assert slack.requests[0].body["text"] == "[OPENED] critical: GPU 0 at 97 C"
        [posted] = alertmanager.requests[0].body
        assert alertmanager.requests[0].path == "/in/api/v2/alerts"
        assert posted["labels"]["UUID"] == gpu.uuid and "endsAt" not in posted

        alerts.resolve_alert("it:hot")
        alertmanager.wait_for(2)
        assert alertmanager.requests[1].body[0]["endsAt"]
        generic.wait_for(2)
        assert generic.requests[1].body["change"] == "resolved"


def test_a_receiver_that_never_answers_is_given_up_after_the_last_attempt(central_worker):
    with receiver(fail_first=100) as down:
        hook("down", down)
        alert = alerts.open_alert(fingerprint="it:down", severity="warning", summary="x")
        wait_for(
            lambda: states(alert.pk).get("down", ("", 0))[0] == DeliveryState.FAILED,
            60,
            "the delivery to be given up",
        )
    assert states(alert.pk)["down"] == (DeliveryState.FAILED, 4)
    assert len(down.requests) == 4


def test_up_links_webhook_bodies_to_the_address_it_serves(gpuadmin_env, tmp_path, free_port):
    """Without GPUADMIN_PUBLIC_URL, `gpuadmin up --bind` tells its worker (which sends the
    webhooks) the address it serves, not http://localhost:8000."""
    queue = f"hooks-{uuid.uuid4().hex[:6]}"
    env = {
        **gpuadmin_env,
        "DATABASE_URL": session_database_url(),
        "GPUADMIN_CENTRAL_QUEUE": queue,
    }
    for name in ("GPUADMIN_PUBLIC_URL", "GPUADMIN_BIND"):
        env.pop(name, None)
    log, bind = tmp_path / "up.log", f"127.0.0.1:{free_port}"
    with log.open("w") as out:
        up = subprocess.Popen(
            [sys.executable, "-m", "gpuadmin", "up", "--no-agents", "--no-grpc", "--bind", bind],
            env=env,
            cwd=REPO_DIR,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        wait_for(lambda: "gpuadmin is up" in log.read_text(), 120, "the stack to start")
        with receiver() as got, override_settings(GPUADMIN_CENTRAL_QUEUE=queue):
            hook("generic", got)
            alerts.open_alert(fingerprint="it:url", severity="warning", summary="x")
            [delivered] = got.wait_for(1, timeout=60)
        urls = delivered.body["urls"]
        assert urls["alerts"] == f"http://127.0.0.1:{free_port}/alerts/"
        assert all(url.startswith(f"http://127.0.0.1:{free_port}/") for url in urls.values())
    finally:
        up.send_signal(signal.SIGINT)
        up.wait(timeout=90)
        print(log.read_text()[-3000:])  # noqa: T201 (shown when a test fails)
