"""The alerts page (firing first, filters, the polled partial, acknowledging), the fleet
page's panel, the idle-held table, and ``/api/v1/alerts/`` (filters, ack) with its roles."""

from __future__ import annotations

import re
import uuid
from typing import Any

import pytest
from django.test import Client
from django.utils import timezone
from rest_framework.test import APIClient

from gpuadmin.access.models import Membership, Role
from gpuadmin.celery import app
from health import alerts
from health.models import Alert, IdleHeldUsage
from inventory.models import Node
from tests.scheduling.conftest import add_sim_node

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def no_broker(monkeypatch) -> None:
    monkeypatch.setattr(app, "send_task", lambda *args, **kwargs: None)


@pytest.fixture
def fleet() -> dict[str, Any]:
    one, two = (add_sim_node(f"pg-{uuid.uuid4().hex[:6]}") for _ in range(2))
    old = alerts.open_alert(
        fingerprint="p:old", severity="critical", summary="old trouble", node=one
    )
    alerts.resolve_alert("p:old")
    hot = alerts.open_alert(
        fingerprint="p:hot", severity="warning", summary="GPU 1 hot", gpu=one.gpus.get(index=1)
    )
    lost = alerts.open_alert(fingerprint="p:lost", severity="critical", summary="lost", node=two)
    return {"one": one, "two": two, "old": old, "hot": hot, "lost": lost}


def person(django_user_model, role: str | None) -> Any:
    user = django_user_model.objects.create_user(f"{role or 'user'}-{uuid.uuid4().hex[:4]}")
    if role:
        Membership.objects.create(user=user, role=role)
    return user


def page_client(user: Any) -> Client:
    client = Client()
    client.force_login(user)
    return client


def row_ids(html: str) -> list[int]:
    return [int(pk) for pk in re.findall(r'<tr id="alert-(\d+)"', html)]


def test_the_page_lists_firing_first_then_history_and_filters(fleet, django_user_model):
    client = page_client(person(django_user_model, Role.VIEWER))
    html = client.get("/alerts/").content.decode()
    ids = row_ids(html)
    assert ids.index(fleet["old"].pk) == 2  # the resolved one after both firing
    assert ">Acknowledge</button>" not in html  # a viewer reads only

    assert row_ids(client.get("/alerts/?state=resolved").content.decode()) == [fleet["old"].pk]
    assert row_ids(client.get("/alerts/?severity=warning").content.decode()) == [fleet["hot"].pk]
    only_two = client.get(f"/alerts/?node={fleet['two'].hostname}").content.decode()
    assert row_ids(only_two) == [fleet["lost"].pk]
    bad = client.get("/alerts/?state=sideways")
    assert bad.status_code == 200 and "Select a valid choice" in bad.content.decode()


def test_the_polled_partial_is_the_list_alone(fleet, django_user_model):
    client = page_client(person(django_user_model, Role.VIEWER))
    html = client.get("/alerts/", HTTP_HX_REQUEST="true").content.decode()
    assert html.lstrip().startswith('<div id="alerts-live"')
    assert "<html" not in html and len(row_ids(html)) == 3


def test_an_operator_acknowledges_with_a_comment_from_the_page(fleet, django_user_model):
    ops = person(django_user_model, Role.OPERATOR)
    client = page_client(ops)
    assert ">Acknowledge</button>" in client.get("/alerts/").content.decode()
    response = client.post(f"/alerts/{fleet['hot'].pk}/ack/", {"comment": "fan replaced"})
    assert response.status_code == 302
    hot = Alert.objects.get(pk=fleet["hot"].pk)
    assert (hot.acknowledged_by, hot.ack_comment) == (ops, "fan replaced")
    page = client.get("/alerts/").content.decode()
    assert "fan replaced" in page

    client.post(f"/alerts/{fleet['old'].pk}/ack/", {"comment": "late"})  # resolved: refused
    assert Alert.objects.get(pk=fleet["old"].pk).acknowledged_at is None
    assert "only a firing one" in client.get("/alerts/").content.decode()


@pytest.mark.parametrize(
    ("next_url", "location"),
    [
        ("/alerts/?severity=critical", "/alerts/?severity=critical"),
        ("https://evil.example/", "/alerts/"),
        ("//evil.example/", "/alerts/"),
        ("javascript:alert(1)", "/alerts/"),
        ("health:nope", "/alerts/"),
        ("", "/alerts/"),
    ],
)
def test_acknowledging_goes_back_only_to_a_page_of_this_site(
    fleet, django_user_model, next_url, location
):
    client = page_client(person(django_user_model, Role.OPERATOR))
    response = client.post(f"/alerts/{fleet['hot'].pk}/ack/", {"comment": "ok", "next": next_url})
    assert (response.status_code, response["Location"]) == (302, location)
    assert Alert.objects.get(pk=fleet["hot"].pk).ack_comment == "ok"


def test_the_fleet_page_shows_the_panel_to_signed_in_people(fleet, django_user_model):
    viewer = page_client(person(django_user_model, Role.VIEWER))
    html = viewer.get("/fleet/").content.decode()
    assert 'id="alerts-panel"' in html
    assert html.index(f"panel-alert-{fleet['lost'].pk}") < html.index(
        f"panel-alert-{fleet['hot'].pk}"
    )
    assert f"panel-alert-{fleet['old'].pk}" not in html  # resolved
    assert "2 firing" in html
    assert 'id="alerts-panel"' not in Client().get("/fleet/").content.decode()  # anonymous

    panel = viewer.get("/alerts/panel/").content.decode()
    assert 'id="alerts-panel"' in panel and "<html" not in panel


def test_idle_held_hours_show_on_the_pages_and_the_api(django_user_model):
    alice = django_user_model.objects.create_user("alice")
    IdleHeldUsage.objects.create(user=alice, day=timezone.localdate(), gpu_seconds=5400)
    viewer = person(django_user_model, Role.VIEWER)
    html = page_client(viewer).get("/alerts/idle/").content.decode()
    assert 'data-user="alice"' in html and "1.50" in html
    assert 'data-user="alice"' in page_client(viewer).get("/alerts/").content.decode()

    api = APIClient()
    api.force_authenticate(viewer)
    [row] = api.get("/api/v1/idle-held/?user=alice").json()["results"]
    assert row == {
        "user": "alice",
        "day": str(timezone.localdate()),
        "gpu_seconds": 5400.0,
        "gpu_hours": 1.5,
    }


def test_the_api_lists_filters_retrieves_and_acknowledges(fleet, django_user_model):
    api = APIClient()
    api.force_authenticate(person(django_user_model, Role.VIEWER))
    listed = api.get("/api/v1/alerts/").json()
    assert [a["id"] for a in listed["results"]][-1] == fleet["old"].pk
    firing = api.get("/api/v1/alerts/?state=firing&severity=critical").json()["results"]
    assert [a["id"] for a in firing] == [fleet["lost"].pk]
    hot = api.get(f"/api/v1/alerts/{fleet['hot'].pk}/").json()
    assert (hot["gpu_index"], hot["node"], hot["state"]) == (1, fleet["one"].hostname, "firing")
    assert api.post(f"/api/v1/alerts/{fleet['hot'].pk}/ack/", {}).status_code == 403  # viewer

    ops = person(django_user_model, Role.OPERATOR)
    api.force_authenticate(ops)
    acked = api.post(f"/api/v1/alerts/{fleet['hot'].pk}/ack/", {"comment": "on it"}, format="json")
    assert acked.status_code == 200
    assert (acked.json()["acknowledged_by"], acked.json()["ack_comment"]) == (ops.username, "on it")
    assert acked.json()["acknowledged_at"]
    too_long = api.post(
        f"/api/v1/alerts/{fleet['lost'].pk}/ack/", {"comment": "x" * 3000}, format="json"
    )
    assert too_long.status_code == 400 and "comment" in too_long.json()
    resolved = api.post(f"/api/v1/alerts/{fleet['old'].pk}/ack/", {}, format="json")
    assert resolved.status_code == 409
    unacked = api.get("/api/v1/alerts/?state=firing&acknowledged=false").json()["results"]
    assert [a["id"] for a in unacked] == [fleet["lost"].pk]
    assert api.get("/api/v1/alerts/?node=nowhere").json()["results"] == []
    assert Node.objects.count() >= 2


def test_the_acknowledged_filter_offers_any_yes_and_no(fleet, django_user_model):
    client = page_client(person(django_user_model, Role.VIEWER))
    html = client.get("/alerts/").content.decode()
    select = re.search(r'<select name="acknowledged".*?</select>', html, re.S)
    assert select is not None
    assert re.findall(r"<option[^>]*>([^<]*)</option>", select.group()) == ["Any", "Yes", "No"]
    acked = alerts.acknowledge(fleet["hot"], person(django_user_model, Role.OPERATOR))
    assert row_ids(client.get("/alerts/?acknowledged=true").content.decode()) == [acked.pk]
    assert acked.pk not in row_ids(client.get("/alerts/?acknowledged=false").content.decode())
    assert len(row_ids(client.get("/alerts/?acknowledged=").content.decode())) == 3
