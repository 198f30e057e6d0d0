"""GET /gpu/discover: the node's agent scans now, the catalog is synced, the seed's shape."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from gpuadmin.access.models import Membership, Role
from gpuadmin.audit.models import AuditEvent
from inventory.models import Gpu, Node
from inventory.nvml.sim import faults
from tests.inventory.conftest import SimNode

pytestmark = pytest.mark.django_db


@pytest.fixture
def staff(client, django_user_model):
    client.force_login(django_user_model.objects.create_user("ops", is_staff=True))
    return client


def test_discover_scans_through_the_agent_and_answers_the_seed_shape(staff, node: SimNode):
    faults.start_process(node.state_dir, node.hostname, 2, 4242, used_mib=20_000, util=88)
    response = staff.get(f"/gpu/discover?node={node.hostname}")
    assert response.status_code == 200, response.content
    body = response.json()
    assert body["meta"] == {"code": 200, "message": "GPU discovery successful"}
    assert node.broker.sent[-1]["name"] == "inventory.scan_node"
    assert node.broker.sent[-1]["queue"] == f"node.{node.hostname}"
    data = body["data"]
    assert [gpu["index"] for gpu in data] == list(range(8))
    gpu2 = data[2]
    assert set(gpu2) == {
        "index",
        "uuid",
        "name",
        "driverVersion",
        "vbiosVersion",
        "memoryTotalMB",
        "memoryUsedMB",
        "utilizationPercent",
        "temperatureC",
        "smClockMHz",
        "computeMode",
    }
    assert gpu2["uuid"] == Gpu.objects.get(node__hostname=node.hostname, index=2).uuid
    assert (gpu2["name"], gpu2["driverVersion"]) == ("NVIDIA A100-SXM4-40GB", "535.129.03")
    assert (gpu2["memoryTotalMB"], gpu2["utilizationPercent"]) == (40960, 88)
    assert gpu2["memoryUsedMB"] >= 20_000
    assert gpu2["smClockMHz"] > 0 and isinstance(gpu2["temperatureC"], int)
    assert gpu2["computeMode"] == "Default"
    assert data[0]["utilizationPercent"] is None  # MIG enabled: NVML gives no utilization


def test_discover_syncs_what_changed_on_the_node(staff, node: SimNode):
    faults.fall_off_bus(node.state_dir, node.hostname, 6)
    body = staff.get(f"/gpu/discover?node={node.hostname}").json()
    assert body["meta"]["code"] == 200
    assert Gpu.objects.get(node__hostname=node.hostname, index=6).error_message
    assert AuditEvent.objects.filter(event_type="gpu.error").count() == 1


def test_discover_is_audited_under_the_admin_and_the_request(staff, node: SimNode):
    faults.fall_off_bus(node.state_dir, node.hostname, 6)
    response = staff.get(f"/gpu/discover?node={node.hostname}")
    row = AuditEvent.objects.get(event_type="gpu.error")
    assert (row.actor_name, str(row.request_id)) == ("ops", response["X-Request-ID"])


def test_a_silent_agent_is_a_503_with_the_seed_meta(staff, node: SimNode):
    node.broker.answer = False
    response = staff.get(f"/gpu/discover?node={node.hostname}")
    assert response.status_code == 503
    assert response.json() == {
        "data": [],
        "meta": {
            "code": 503,
            "message": f"GPU discovery failed: node {node.hostname} did not answer within "
            "15 s; the catalog was left as it was",
        },
    }
    assert node.broker.revoked == 1


def test_an_unreachable_node_fails_fast_without_sending(staff, node: SimNode):
    Node.objects.filter(hostname=node.hostname).update(
        last_heartbeat_at=timezone.now() - timedelta(minutes=5)
    )
    response = staff.get(f"/gpu/discover?node={node.hostname}")
    assert response.status_code == 503
    assert "is unreachable: no heartbeat in the last 30 s" in response.json()["meta"]["message"]
    assert node.broker.sent == []


def test_bad_input_is_4xx(staff, node: SimNode):
    assert staff.get("/gpu/discover?node=nope-99").status_code == 404
    assert node.broker.sent == []


def test_the_admin_role_discovers_without_being_staff(client, node: SimNode, django_user_model):
    admin = django_user_model.objects.create_user("ada")
    Membership.objects.create(user=admin, role=Role.ADMIN)
    client.force_login(admin)
    response = client.get(f"/gpu/discover?node={node.hostname}")
    assert response.status_code == 200, response.content
    assert node.broker.sent[-1]["name"] == "inventory.scan_node"


@pytest.mark.parametrize("role", [Role.OPERATOR, Role.USER, Role.VIEWER, None])
def test_other_roles_cannot_discover(client, node: SimNode, django_user_model, role):
    person = django_user_model.objects.create_user("someone")
    if role is not None:
        Membership.objects.create(user=person, role=role)
    client.force_login(person)
    assert client.get(f"/gpu/discover?node={node.hostname}").status_code == 403
    assert node.broker.sent == []
