"""Seed-compatible endpoints: /api/gpu/devices, /api/gpu/driver, /gpu/mig/*, /gpu/topology."""

import base64
from collections.abc import Iterator

import pytest
from django.utils import timezone

from inventory import live
from inventory.choices import GpuState
from inventory.models import Gpu, Node
from inventory.nvml.scanner import scan
from inventory.nvml.sim import SimulatedNvml, faults
from inventory.services import apply_discovery

pytestmark = pytest.mark.django_db

HOST = "api-dgx-01"


@pytest.fixture(autouse=True)
def no_default_node(settings):
    settings.GPUADMIN_NODE_NAME = "not-a-registered-node"


@pytest.fixture
def clear_live() -> Iterator[None]:
    live.client().delete(live.KEY_PREFIX + HOST)
    yield
    live.client().delete(live.KEY_PREFIX + HOST)


@pytest.fixture
def dgx(sim_scan, clear_live) -> Node:
    apply_discovery(HOST, sim_scan("dgx-a100-40gb", HOST))
    Node.objects.filter(hostname=HOST).update(last_heartbeat_at=timezone.now())
    return Node.objects.get(hostname=HOST)


def publish(hostname: str = HOST, *, busy_gpu: int | None = None) -> None:
    nvml = SimulatedNvml.from_model("dgx-a100-40gb", node_name=hostname)
    if busy_gpu is not None:
        faults.start_process(nvml, None, busy_gpu, 4242, used_mib=30_000, util=97)
    live.publish(hostname, scan(nvml, include=("facts", "metrics")))


def test_devices_without_samples_have_catalog_totals_and_no_live_values(client, admin_user, dgx):
    client.force_login(admin_user)
    body = client.get("/api/gpu/devices").json()
    assert body["count"] == 8
    assert [d["index"] for d in body["devices"]] == list(range(8))
    assert body["devices"][2] == {
        "index": 2,
        "name": "NVIDIA A100-SXM4-40GB",
        "total_memory_mb": 40960,
        "free_memory_mb": None,
        "used_memory_mb": None,
        "utilization_percent": None,
        "temperature_c": None,
        "is_available": False,  # NVML has not answered for it: no sample yet
        "error_message": "no live sample: its node's agent has not reported lately",
    }


def test_devices_show_published_live_values(client, admin_user, dgx):
    publish(busy_gpu=3)
    Gpu.objects.filter(node=dgx, index=5).update(state=GpuState.DRAINING)
    client.force_login(admin_user)
    devices = client.get(f"/api/gpu/devices?node={HOST}").json()["devices"]
    busy, idle = devices[3], devices[2]
    assert busy["total_memory_mb"] == 40960
    assert busy["used_memory_mb"] >= 30_000
    assert busy["free_memory_mb"] == 40960 - busy["used_memory_mb"]
    assert busy["utilization_percent"] == 97
    assert busy["is_available"] is True  # NVML answers for it; being busy is not an error
    assert isinstance(idle["temperature_c"], int | float)
    assert idle["used_memory_mb"] < 30_000
    assert idle["is_available"] is True
    assert devices[5]["is_available"] is True  # draining is the admin's word, not NVML's
    assert devices[0]["utilization_percent"] is None  # MIG: N/A
    assert [d["error_message"] for d in devices] == [None] * 8
    assert {d["is_available"] for d in devices} == {True}


def test_devices_are_unavailable_when_the_agent_is_silent(client, admin_user, dgx):
    publish()
    Node.objects.filter(pk=dgx.pk).update(last_heartbeat_at=None)
    client.force_login(admin_user)
    devices = client.get("/api/gpu/devices").json()["devices"]
    assert {d["is_available"] for d in devices} == {False}
    assert all(d["error_message"].startswith("no live sample") for d in devices)


def test_node_without_gpus_lists_no_devices(client, admin_user):
    Node.objects.create(hostname="empty-01")
    client.force_login(admin_user)
    response = client.get("/api/gpu/devices")
    assert response.status_code == 200
    assert response.json() == {"devices": [], "count": 0}


def test_driver_versions(client, admin_user, dgx):
    client.force_login(admin_user)
    assert client.get("/api/gpu/driver").json() == {
        "driver_version": "535.129.03",
        "cuda_driver_version": "12.2",
        "nvml_version": "12.535.129.03",
    }


def test_unknown_node_is_404_naming_the_parameter(client, admin_user, dgx):
    client.force_login(admin_user)
    for url in ("/api/gpu/devices", "/api/gpu/driver", "/gpu/mig/summary", "/gpu/topology"):
        response = client.get(f"{url}?node=nope-99")
        assert response.status_code == 404
        assert response.json() == {
            "detail": "No node with hostname 'nope-99'.",
            "node": ["No such node."],
        }


def test_several_nodes_without_a_choice_is_400_naming_node(client, admin_user, dgx, settings):
    Node.objects.create(hostname="other-01")
    client.force_login(admin_user)
    response = client.get("/api/gpu/devices")
    assert response.status_code == 400
    assert response.json() == {
        "detail": "Several nodes are registered; choose one with ?node=<hostname>.",
        "node": ["This parameter is required when several nodes are registered."],
    }
    settings.GPUADMIN_NODE_NAME = HOST
    assert client.get("/api/gpu/devices").json()["count"] == 8


def test_no_node_at_all_is_404(client, admin_user):
    client.force_login(admin_user)
    response = client.get("/api/gpu/driver")
    assert response.status_code == 404
    assert response.json()["node"] == ["No node is registered."]


def test_anonymous_users_are_refused(client, dgx):
    response = client.get("/api/gpu/devices")
    assert response.status_code == 401
    assert response["WWW-Authenticate"] == "Bearer"
    assert response.json() == {"detail": "Authentication credentials were not provided."}


def test_basic_auth_is_accepted(client, django_user_model, dgx):
    django_user_model.objects.create_user("viewer", password="pw-123-secret")
    token = base64.b64encode(b"viewer:pw-123-secret").decode()
    response = client.get("/api/gpu/driver", HTTP_AUTHORIZATION=f"Basic {token}")
    assert response.status_code == 200


def test_mig_summary_and_instances(client, admin_user, dgx):
    client.force_login(admin_user)
    summary = client.get("/gpu/mig/summary").json()
    assert len(summary) == 8
    gpu0 = Gpu.objects.get(node=dgx, index=0)
    assert summary[0] == {
        "index": 0,
        "uuid": gpu0.uuid,
        "mig_enabled": True,
        "mig_pending_enabled": True,
        "gpu_instance_count": 3,
        "compute_instance_count": 3,
    }
    assert (summary[1]["gpu_instance_count"], summary[1]["compute_instance_count"]) == (7, 7)
    assert [row["mig_enabled"] for row in summary] == [True, True] + [False] * 6
    assert [row["compute_instance_count"] for row in summary[2:]] == [0] * 6

    rows = client.get("/gpu/mig/instances").json()
    assert len(rows) == 10
    assert [row["gpu_index"] for row in rows] == [0] * 3 + [1] * 7
    first = rows[0]
    assert set(first) == {
        "gpu_index",
        "gpu_uuid",
        "gi_id",
        "ci_id",
        "profile_name",
        "profile_id",
        "ci_profile_name",
        "placement_start",
        "placement_size",
        "memory_mib",
        "sm_count",
        "uuid",
    }
    assert first["gpu_uuid"] == gpu0.uuid
    assert first["uuid"].startswith("MIG-")
    assert {row["profile_name"] for row in rows[3:]} == {"1g.5gb"}


def test_topology_matrix(client, admin_user, dgx):
    client.force_login(admin_user)
    body = client.get(f"/gpu/topology?node={HOST}").json()
    assert body["node"] == HOST
    assert body["gpus"] == list(range(8))
    assert body["numa_nodes"] == [3, 3, 1, 1, 7, 7, 5, 5]
    assert len(body["cpu_affinity"]) == 8
    for i, row in enumerate(body["matrix"]):
        assert row == ["X" if i == j else "NV12" for j in range(8)]
    assert body["nvlink_counts"][0] == [0] + [12] * 7
    assert (body["nics"], body["nic_links"]) == ([], [[]] * 8)  # the DGX A100 model has none


def test_topology_lists_gpu_nic_links(client, admin_user, sim_scan):
    client.force_login(admin_user)
    apply_discovery("dgx1-api", sim_scan("dgx-1-v100", "dgx1-api"))
    body = client.get("/api/v1/nodes/dgx1-api/topology/").json()
    assert body["nics"] == ["mlx5_0", "mlx5_1", "mlx5_2", "mlx5_3"]
    assert body["nic_links"][0] == ["PIX", "PHB", "SYS", "SYS"]
    assert body["matrix"][0][:5] == ["X", "NV1", "NV1", "NV2", "NV2"]


def test_v1_node_topology_is_the_same_matrix(client, admin_user, dgx):
    client.force_login(admin_user)
    seed = client.get(f"/gpu/topology?node={HOST}").json()
    assert client.get(f"/api/v1/nodes/{HOST}/topology/").json() == seed
    assert client.get("/api/v1/nodes/nope-99/topology/").status_code == 404


def test_seed_endpoints_query_counts(
    client, admin_user, dgx, sim_scan, django_assert_max_num_queries
):
    client.force_login(admin_user)
    publish()
    urls = (
        "/api/gpu/devices",
        "/gpu/mig/summary",
        "/gpu/mig/instances",
        "/gpu/topology",
        f"/api/v1/nodes/{HOST}/topology/",
    )
    # At most 6: the topology reads the node's GPU-NIC links too; the count never grows.
    for url in urls:
        with django_assert_max_num_queries(6):
            assert client.get(f"{url}?node={HOST}").status_code == 200
    for i in range(4):
        apply_discovery(f"api-more-{i}", sim_scan("dgx-a100-40gb", f"api-more-{i}"))
    for url in urls:
        with django_assert_max_num_queries(6):
            assert client.get(f"{url}?node={HOST}").status_code == 200
