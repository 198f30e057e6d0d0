"""People acting on quarantines and the circuit breaker: the API (``/api/v1/quarantines/``,
``/api/v1/breaker/``) and the admin's actions, each with a reason and audited."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone
from rest_framework.test import APIClient

from gpuadmin.access.models import Membership, Role
from gpuadmin.audit.models import AuditEvent
from health import quarantine
from health.choices import QuarantineState
from health.models import BreakerTrip, Quarantine
from inventory.choices import GpuState
from tests.health import test_quarantine as quarantine_tests

pytestmark = pytest.mark.django_db
boxes = quarantine_tests.boxes  # simulated nodes of 4 GPUs
box = quarantine_tests.box
policy = quarantine_tests.policy
fence = quarantine_tests.fence


def api_as(django_user_model, name: str, role: str | None) -> APIClient:
    user = django_user_model.objects.create_user(name)
    if role:
        Membership.objects.create(user=user, role=role)
    client = APIClient()
    client.force_authenticate(user)
    return client


@pytest.fixture
def tripped(box, policy) -> BreakerTrip:
    for index in range(4):  # 4 GPUs: the fourth trips it
        fence(box.gpu(index), policy)
    trip = quarantine.breaker_open()
    assert trip is not None
    return trip


def test_everyone_signed_in_reads_the_breaker_and_quarantines(django_user_model, tripped):
    viewer = api_as(django_user_model, "viewer", Role.VIEWER)
    body = viewer.get("/api/v1/breaker/").json()
    assert (body["open"], body["limit"], body["window_s"]) == (True, 3.0, 300)
    assert (body["trip"]["falling"], body["trip"]["fleet"]) == (4, 4)
    listed = viewer.get("/api/v1/quarantines/?state=fenced").json()
    assert listed["count"] == 3
    assert {row["gpu_state"] for row in listed["results"]} == {"degraded"}
    assert viewer.get("/api/v1/quarantines/?state=released").json()["count"] == 0
    assert APIClient().get("/api/v1/breaker/").status_code == 401


def test_a_quarantines_gpu_state_is_the_gpus_state_now(django_user_model, box, policy):
    """A quarantine whose GPU went back to service says ``available`` (``fenced_to`` keeps
    where health put it); an open one says what it waits for."""
    returned, fenced = box.gpu(0), box.gpu(1)
    fence(returned, policy)
    now = timezone.now()
    quarantine.review(now)
    quarantine.review(now + timedelta(seconds=61))
    fence(fenced, policy)
    viewer = api_as(django_user_model, "viewer", Role.VIEWER)
    rows = {row["gpu_index"]: row for row in viewer.get("/api/v1/quarantines/").json()["results"]}
    picked = {
        index: (row["state"], row["gpu_state"], row["fenced_to"], row["waiting_for"])
        for index, row in rows.items()
    }
    assert picked == {
        0: ("returned", "available", "degraded", ""),
        1: ("fenced", "degraded", "degraded", "waits for the fault to clear"),
    }


def test_an_admin_resets_the_breaker_with_a_reason(django_user_model, tripped):
    url = "/api/v1/breaker/reset/"
    operator = api_as(django_user_model, "ops", Role.OPERATOR)
    assert operator.post(url, {"reason": "x"}, format="json").status_code == 403
    admin = api_as(django_user_model, "root", Role.ADMIN)
    missing = admin.post(url, {}, format="json")
    assert (missing.status_code, set(missing.json())) == (400, {"reason"})
    done = admin.post(url, {"reason": "PDU replaced"}, format="json")
    assert done.status_code == 200 and done.json()["open"] is False
    assert BreakerTrip.objects.get(pk=tripped.pk).reset_by.username == "root"
    row = AuditEvent.objects.get(event_type="health.breaker_reset")
    assert (row.actor_name, row.message) == ("root", "automatic fencing back on: PDU replaced")
    again = admin.post(url, {"reason": "again"}, format="json")
    assert again.status_code == 409
    assert again.json() == {"detail": "The circuit breaker is not open."}


def test_an_operator_releases_a_quarantine_and_the_gpu_returns(
    django_user_model,
    box,
    policy,
):
    fence(box.gpu(2), policy)
    held = Quarantine.objects.get()
    url = f"/api/v1/quarantines/{held.pk}/release/"
    viewer = api_as(django_user_model, "viewer", Role.VIEWER)
    assert viewer.post(url, {"reason": "x"}, format="json").status_code == 403
    operator = api_as(django_user_model, "ops", Role.OPERATOR)
    assert set(operator.post(url, {}, format="json").json()) == {"reason"}
    released = operator.post(url, {"reason": "reseated"}, format="json")
    assert released.status_code == 200
    assert released.json()["state"] == QuarantineState.RELEASED
    assert box.gpu(2).state == GpuState.AVAILABLE
    back = AuditEvent.objects.filter(event_type="gpu.state_changed").latest("pk")
    assert (back.actor_name, back.message) == ("ops", "reseated")
    again = operator.post(url, {"reason": "again"}, format="json")
    assert again.status_code == 409
    assert again.json() == {"detail": f"Quarantine {held.pk} is released: closed already."}


def test_the_admin_releases_quarantines_after_asking_why(admin_client, box, policy):
    fence(box.gpu(0), policy)
    held = Quarantine.objects.get()
    chosen = {"action": "release_quarantines", "_selected_action": [held.pk]}
    asked = admin_client.post("/admin/health/quarantine/", chosen)
    assert asked.status_code == 200 and b"Reason" in asked.content
    assert Quarantine.objects.get().state == QuarantineState.FENCED
    done = admin_client.post(
        "/admin/health/quarantine/", {**chosen, "apply": "1", "reason": "ok now"}, follow=True
    )
    assert "1 done." in done.content.decode()
    assert Quarantine.objects.get().state == QuarantineState.RELEASED
    assert box.gpu(0).state == GpuState.AVAILABLE
    again = admin_client.post(
        "/admin/health/quarantine/", {**chosen, "apply": "1", "reason": "ok"}, follow=True
    )
    assert ": already closed" in again.content.decode()


def test_the_admin_resets_the_breaker_after_asking_why(admin_client, tripped):
    admin_client.post(
        "/admin/health/breakertrip/",
        {"action": "reset_breaker", "_selected_action": [tripped.pk]}
        | {"apply": "1", "reason": "fixed"},
    )
    assert quarantine.breaker_open() is None
    row = AuditEvent.objects.get(event_type="health.breaker_reset")
    assert (row.actor_name, row.message) == ("admin", "automatic fencing back on: fixed")


def test_quarantines_and_trips_cannot_be_edited_by_hand(admin_client, tripped):
    held = Quarantine.objects.first()
    assert admin_client.get("/admin/health/quarantine/add/").status_code == 403
    page = admin_client.get(f"/admin/health/quarantine/{held.pk}/change/")
    assert page.status_code == 200 and page.context["adminform"].form.fields == {}
    assert admin_client.post(f"/admin/health/breakertrip/{tripped.pk}/delete/").status_code == 403
