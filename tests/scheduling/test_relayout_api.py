"""MIG re-layouts in the API (``/api/v1/mig-relayouts/``), through
``scheduling.sharing.relayout``: an admin asks for a named or custom layout and cancels one
still draining; everyone signed in reads them; refusals name the field."""

from __future__ import annotations

import pytest
from rest_framework.test import APIClient

from gpuadmin.audit.models import AuditEvent
from inventory.choices import GpuState
from scheduling.models import MigRelayout, RelayoutState
from scheduling.sharing import relayout
from tests.inventory.conftest import node  # noqa: F401 - the simulated node fixture

pytestmark = pytest.mark.django_db


@pytest.fixture
def admin_api(django_user_model) -> APIClient:
    client = APIClient()
    client.force_authenticate(django_user_model.objects.create_user("mig-admin", is_staff=True))
    return client


@pytest.fixture
def user_api(django_user_model) -> APIClient:
    client = APIClient()
    client.force_authenticate(django_user_model.objects.create_user("ursula"))
    return client


def test_an_admin_starts_one_and_everyone_reads_its_steps(node, admin_api, user_api):  # noqa: F811
    gpu = node.gpu(0)
    response = admin_api.post(
        "/api/v1/mig-relayouts/",
        {"gpu": gpu.uuid, "layout_name": "custom", "layout": "4g.20gb, 2g.10gb@4, 1g.5gb@6"},
        format="json",
    )

    assert response.status_code == 201, response.json()
    body = response.json()
    item = MigRelayout.objects.get()
    assert body["id"] == item.pk
    assert (body["gpu"], body["gpu_index"], body["node"]) == (gpu.uuid, 0, gpu.node.hostname)
    assert (body["layout_name"], body["state"], body["preempt"]) == ("custom", "draining", False)
    assert body["layout"] == [
        {"profile": "4g.20gb", "start": 0},
        {"profile": "2g.10gb", "start": 4},
        {"profile": "1g.5gb", "start": 6},
    ]
    assert {(i["profile"], i["start"]) for i in body["previous_layout"]} == {
        ("2g.10gb", 0),
        ("2g.10gb", 2),
        ("3g.20gb", 4),
    }
    assert body["requested_by"] == "mig-admin" and body["step_deadline"]
    gpu.refresh_from_db()
    assert gpu.state == GpuState.DRAINING
    assert AuditEvent.objects.filter(event_type="mig_relayout.draining").count() == 1

    for _ in range(3):  # drain, apply, verify
        relayout.advance(item.pk)
    done = user_api.get(f"/api/v1/mig-relayouts/{item.pk}/").json()
    assert done["state"] == "done" and done["finished_at"]
    listed = user_api.get("/api/v1/mig-relayouts/", {"gpu": gpu.uuid, "state": "done"}).json()
    assert [row["id"] for row in listed["results"]] == [item.pk]
    assert user_api.get("/api/v1/mig-relayouts/", {"state": "draining"}).json()["results"] == []
    assert user_api.get("/api/v1/mig-relayouts/", {"node": "elsewhere"}).json()["count"] == 0


def test_a_named_layout_with_preemption(node, admin_api):  # noqa: F811
    gpu = node.gpu(1)
    body = admin_api.post(
        "/api/v1/mig-relayouts/",
        {"gpu": gpu.uuid, "layout_name": "all-1g.5gb", "preempt": True},
        format="json",
    ).json()
    assert (body["layout_name"], body["preempt"]) == ("all-1g.5gb", True)
    assert [item["start"] for item in body["layout"]] == list(range(7))


@pytest.mark.parametrize(
    ("gpu_index", "request_body", "field"),
    [
        (2, {"layout_name": "balanced"}, "gpu"),  # not in MIG mode
        (0, {"layout_name": "all-9g"}, "layout_name"),
        (0, {"layout_name": "custom", "layout": "3g.20gb@2"}, "layout"),
        (0, {"layout_name": "custom", "layout": "3g.20gb@x"}, "layout"),
        (0, {"layout_name": "custom", "layout": "3g.20gb@\u00b2"}, "layout"),  # not to int()
        (0, {"layout_name": "custom", "layout": "3g.20gb@\u0664"}, "layout"),  # an Arabic 4
        (0, {"layout_name": "custom"}, "layout"),
        (0, {"layout_name": "balanced", "preempt": "sometimes"}, "preempt"),
        (None, {"layout_name": "balanced"}, "gpu"),  # no such GPU
        (0, {}, "layout_name"),
    ],
)
def test_refusals_are_a_400_naming_the_field(node, admin_api, gpu_index, request_body, field):  # noqa: F811
    gpu = "GPU-nonesuch" if gpu_index is None else node.gpu(gpu_index).uuid
    response = admin_api.post("/api/v1/mig-relayouts/", {"gpu": gpu, **request_body}, format="json")
    assert response.status_code == 400
    assert field in response.json()
    assert not MigRelayout.objects.exists()


def test_one_gpu_of_a_node_at_a_time_and_cancel_while_draining(node, admin_api):  # noqa: F811
    first = admin_api.post(
        "/api/v1/mig-relayouts/", {"gpu": node.gpu(0).uuid, "layout_name": "balanced"}
    ).json()
    second = admin_api.post(
        "/api/v1/mig-relayouts/", {"gpu": node.gpu(1).uuid, "layout_name": "balanced"}
    )
    assert second.status_code == 400
    assert "has a MIG re-layout under way (GPU 0)" in second.json()["gpu"][0]

    canceled = admin_api.post(f"/api/v1/mig-relayouts/{first['id']}/cancel/")
    assert canceled.status_code == 200
    assert canceled.json()["state"] == RelayoutState.CANCELED
    assert node.gpu(0).state == GpuState.AVAILABLE
    again = admin_api.post(f"/api/v1/mig-relayouts/{first['id']}/cancel/")
    assert again.status_code == 409
    assert "only a re-layout still draining" in again.json()["detail"]


def test_only_admins_write(node, user_api, admin_api):  # noqa: F811
    gpu = node.gpu(0)
    refused = user_api.post("/api/v1/mig-relayouts/", {"gpu": gpu.uuid, "layout_name": "balanced"})
    assert refused.status_code == 403
    assert not MigRelayout.objects.exists()
    item = admin_api.post(
        "/api/v1/mig-relayouts/", {"gpu": gpu.uuid, "layout_name": "balanced"}
    ).json()
    assert user_api.post(f"/api/v1/mig-relayouts/{item['id']}/cancel/").status_code == 403
    assert APIClient().get("/api/v1/mig-relayouts/").status_code in (401, 403)
