"""Maintenance of GPUs and nodes (drain, offline, online) with a reason, from the API, the
admin and the GPU and node pages: operators and admins only, audited, and a change the GPU
state machine refuses answered clearly (409, a message naming the states)."""

from __future__ import annotations

import pytest
from django.test import Client
from rest_framework.test import APIClient

from gpuadmin.access.models import Membership, Role
from gpuadmin.audit.models import AuditEvent
from inventory.choices import GpuState
from inventory.models import Gpu, Node
from inventory.services import apply_discovery, record_heartbeat, set_gpu_state
from inventory.signals import gpus_went_offline

pytestmark = pytest.mark.django_db


@pytest.fixture
def node(sim_scan) -> Node:
    apply_discovery("box-01", sim_scan("pcie-l40s-4x", "box-01"))
    record_heartbeat("box-01")
    return Node.objects.get(hostname="box-01")


@pytest.fixture
def gpu(node) -> Gpu:
    return node.gpus.get(index=1)


def person(django_user_model, name: str, role: str | None) -> object:
    user = django_user_model.objects.create_user(name)
    if role:
        Membership.objects.create(user=user, role=role)
    return user


@pytest.fixture
def ops(django_user_model):
    return person(django_user_model, "ops", Role.OPERATOR)


@pytest.fixture
def api(ops) -> APIClient:
    client = APIClient()
    client.force_authenticate(ops)
    return client


@pytest.fixture
def offline_signals():
    sent: list[list[int]] = []

    def receiver(sender, *, gpu_ids, **kwargs):
        sent.append(list(gpu_ids))

    gpus_went_offline.connect(receiver, dispatch_uid="test-maintenance")
    yield sent
    gpus_went_offline.disconnect(dispatch_uid="test-maintenance")


def state_rows() -> list[tuple[str, str, str, str]]:
    return [
        (row.actor_name, row.before["state"], row.after["state"], row.message)
        for row in AuditEvent.objects.filter(event_type__endswith=".state_changed").order_by("pk")
    ]


# --------------------------------------------------------------------------- API


def test_an_operator_drains_and_brings_back_a_gpu_through_the_api(api, gpu):
    url = f"/api/v1/gpus/{gpu.uuid}/state/"
    drained = api.post(url, {"state": "draining", "reason": "BIOS update"}, format="json")
    assert drained.status_code == 200, drained.content
    body = drained.json()
    assert (body["uuid"], body["state"], body["state_reason"]) == (
        gpu.uuid,
        "draining",
        "BIOS update",
    )
    assert body["state_changed_at"] is not None
    back = api.post(url, {"state": "available", "reason": "done"}, format="json")
    assert back.json()["state"] == "available"
    assert state_rows() == [
        ("ops", "available", "draining", "BIOS update"),
        ("ops", "draining", "available", "done"),
    ]


def test_taking_a_gpu_offline_requeues_its_work_through_the_signal(
    api, gpu, offline_signals, django_capture_on_commit_callbacks
):
    with django_capture_on_commit_callbacks(execute=True):
        response = api.post(
            f"/api/v1/gpus/{gpu.uuid}/state/", {"state": "offline", "reason": "RMA"}, format="json"
        )
    assert response.status_code == 200
    assert offline_signals == [[gpu.pk]]


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"state": "draining"}, "reason"),
        ({"state": "draining", "reason": ""}, "reason"),
        ({"state": "draining", "reason": "x" * 501}, "reason"),
        ({"reason": "why"}, "state"),
        ({"state": "broken", "reason": "why"}, "state"),
        ({"state": "degraded", "reason": "why"}, "state"),  # the health policies' state
        ({"state": "resetting", "reason": "why"}, "state"),
    ],
)
def test_bad_input_is_a_400_naming_the_field(api, gpu, body, field):
    response = api.post(f"/api/v1/gpus/{gpu.uuid}/state/", body, format="json")
    assert response.status_code == 400
    assert set(response.json()) == {field}
    assert Gpu.objects.get(pk=gpu.pk).state == GpuState.AVAILABLE


def test_a_change_the_state_machine_refuses_is_a_409_naming_the_states(api, gpu):
    set_gpu_state(gpu, GpuState.RESETTING, actor_name="health", reason="XID 48")
    response = api.post(
        f"/api/v1/gpus/{gpu.uuid}/state/", {"state": "draining", "reason": "x"}, format="json"
    )
    assert response.status_code == 409
    assert response.json() == {
        "detail": "GPU 1 of box-01 is resetting: it can go to available, degraded, offline, "
        "not draining"
    }
    assert Gpu.objects.get(pk=gpu.pk).state == GpuState.RESETTING


@pytest.mark.parametrize(("role", "status"), [(None, 403), (Role.VIEWER, 403), (Role.ADMIN, 200)])
def test_only_operators_and_admins_change_states(django_user_model, gpu, node, role, status):
    client = APIClient()
    client.force_authenticate(person(django_user_model, "someone", role))
    body = {"state": "draining", "reason": "why"}
    assert client.post(f"/api/v1/gpus/{gpu.uuid}/state/", body, format="json").status_code == status
    assert client.post(
        f"/api/v1/nodes/{node.hostname}/state/", body, format="json"
    ).status_code == (status)
    assert APIClient().post(f"/api/v1/gpus/{gpu.uuid}/state/", body).status_code == 401


def test_a_node_goes_offline_and_online_through_the_api(
    api, node, offline_signals, django_capture_on_commit_callbacks
):
    url = f"/api/v1/nodes/{node.hostname}/state/"
    with django_capture_on_commit_callbacks(execute=True):
        offline = api.post(url, {"state": "offline", "reason": "rack power"}, format="json")
    assert offline.status_code == 200
    assert (offline.json()["state"], offline.json()["state_reason"]) == ("offline", "rack power")
    assert offline_signals == [sorted(node.gpus.values_list("pk", flat=True))]
    assert api.post(url, {"state": "online", "reason": "back"}, format="json").status_code == 200
    assert api.post(url, {"state": "available", "reason": "x"}, format="json").status_code == 400
    assert state_rows() == [
        ("ops", "online", "offline", "rack power"),
        ("ops", "offline", "online", "back"),
    ]


# --------------------------------------------------------------------------- admin


def test_an_admin_action_asks_for_a_reason_first(admin_client, node):
    pks = list(node.gpus.order_by("index").values_list("pk", flat=True))
    chosen = {"action": "set_draining", "_selected_action": pks[:2]}
    asked = admin_client.post("/admin/inventory/gpu/", chosen)
    assert asked.status_code == 200
    assert asked.templates[0].name == "admin/action_reason.html"
    assert Gpu.objects.filter(state="draining").count() == 0
    blank = admin_client.post("/admin/inventory/gpu/", {**chosen, "apply": "1", "reason": " "})
    assert blank.status_code == 200 and "This field is required." in blank.content.decode()
    done = admin_client.post(
        "/admin/inventory/gpu/", {**chosen, "apply": "1", "reason": "firmware"}, follow=True
    )
    assert "Drain selected GPUs: 2 done." in done.content.decode()
    assert sorted(Gpu.objects.filter(state="draining").values_list("pk", flat=True)) == pks[:2]
    assert state_rows() == [("admin", "available", "draining", "firmware")] * 2


def test_an_admin_action_names_each_refused_gpu(admin_client, node):
    zero, one = node.gpus.order_by("index")[:2]
    set_gpu_state(one, GpuState.RESETTING, actor_name="health")
    done = admin_client.post(
        "/admin/inventory/gpu/",
        {"action": "set_draining", "_selected_action": [zero.pk, one.pk]}
        | {"apply": "1", "reason": "firmware"},
        follow=True,
    )
    html = done.content.decode()
    assert "Drain selected GPUs: 1 done." in html
    assert (
        "GPU 1 of box-01 is resetting: it can go to available, degraded, offline, not draining"
        in html
    )
    assert Gpu.objects.get(pk=one.pk).state == GpuState.RESETTING


def test_node_actions_take_a_reason(admin_client, node):
    admin_client.post(
        "/admin/inventory/node/",
        {"action": "set_offline", "_selected_action": [node.pk], "apply": "1", "reason": "move"},
    )
    assert Node.objects.get(pk=node.pk).state == "offline"
    assert state_rows() == [("admin", "online", "offline", "move")]


# --------------------------------------------------------------------------- pages


def signed_in(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


def test_the_gpu_and_node_pages_offer_maintenance_to_operators_only(django_user_model, ops, gpu):
    page = signed_in(ops).get(f"/gpus/{gpu.uuid}/").content.decode()
    assert f'action="/gpus/{gpu.uuid}/state/"' in page
    assert '<option value="draining">Drain</option>' in page
    assert '<option value="available">' not in page  # it is available: not offered
    node_page = signed_in(ops).get("/nodes/box-01/").content.decode()
    assert 'action="/nodes/box-01/state/"' in node_page
    viewer = person(django_user_model, "viewer", Role.VIEWER)
    assert "/state/" not in signed_in(viewer).get(f"/gpus/{gpu.uuid}/").content.decode()
    assert "/state/" not in Client().get(f"/gpus/{gpu.uuid}/").content.decode()


def test_a_reset_gpu_page_offers_only_what_the_state_machine_allows(ops, gpu):
    set_gpu_state(gpu, GpuState.RESETTING, actor_name="health")
    page = signed_in(ops).get(f"/gpus/{gpu.uuid}/").content.decode()
    assert '<option value="draining">' not in page
    assert '<option value="offline">Take offline</option>' in page


def test_the_page_form_changes_the_state_with_a_reason(ops, gpu):
    client = signed_in(ops)
    response = client.post(
        f"/gpus/{gpu.uuid}/state/", {"state": "offline", "reason": "fan"}, follow=True
    )
    assert response.redirect_chain == [(f"/gpus/{gpu.uuid}/", 302)]
    assert "GPU 1 of box-01 is now offline." in response.content.decode()
    assert state_rows() == [("ops", "available", "offline", "fan")]


def test_the_page_form_says_why_nothing_changed(ops, gpu):
    client = signed_in(ops)
    set_gpu_state(gpu, GpuState.RESETTING, actor_name="health")
    refused = client.post(
        f"/gpus/{gpu.uuid}/state/", {"state": "draining", "reason": "x"}, follow=True
    ).content.decode()
    assert "Not changed: GPU 1 of box-01 is resetting: it can go to" in refused
    no_reason = client.post(f"/gpus/{gpu.uuid}/state/", {"state": "offline"}, follow=True)
    assert "GPU 1 of box-01 not changed: * reason" in no_reason.content.decode()
    assert Gpu.objects.get(pk=gpu.pk).state == GpuState.RESETTING


def test_the_node_page_form_drains_the_node(ops, node):
    response = signed_in(ops).post(
        "/nodes/box-01/state/", {"state": "draining", "reason": "kernel"}, follow=True
    )
    assert response.redirect_chain == [("/nodes/box-01/", 302)]
    assert Node.objects.get(pk=node.pk).state == "draining"
    assert state_rows() == [("ops", "online", "draining", "kernel")]


def test_viewers_cannot_post_the_page_form(django_user_model, gpu):
    viewer = person(django_user_model, "viewer", Role.VIEWER)
    response = signed_in(viewer).post(
        f"/gpus/{gpu.uuid}/state/", {"state": "offline", "reason": "x"}
    )
    assert response.status_code == 403
    assert Gpu.objects.get(pk=gpu.pk).state == GpuState.AVAILABLE
