"""/api/v1 resources: nodes, gpus, mig-instances; filters, pagination, audited catalog PATCH."""

import json
import re

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from gpuadmin.audit.models import AuditEvent
from inventory import live
from inventory.choices import GpuState
from inventory.models import Gpu, Node, Pool
from inventory.nvml.scanner import scan
from inventory.nvml.sim import SimulatedNvml, faults
from inventory.services import apply_discovery

pytestmark = pytest.mark.django_db


@pytest.fixture
def fleet(sim_scan) -> None:
    apply_discovery("dgx-01", sim_scan("dgx-a100-40gb", "dgx-01"))
    apply_discovery("box-01", sim_scan("pcie-l40s-4x", "box-01"))
    Node.objects.filter(hostname="dgx-01").update(last_heartbeat_at=timezone.now())


@pytest.fixture
def viewer(client, django_user_model):
    client.force_login(django_user_model.objects.create_user("viewer"))
    return client


def test_node_list_and_detail(viewer, fleet):
    body = viewer.get("/api/v1/nodes/").json()
    assert body["count"] == 2
    assert [n["hostname"] for n in body["results"]] == ["box-01", "dgx-01"]
    dgx = viewer.get("/api/v1/nodes/dgx-01/").json()
    assert dgx["reachable"] is True
    assert (dgx["gpu_count"], dgx["missing_gpu_count"]) == (8, 0)
    assert (dgx["driver_version"], dgx["pool"], dgx["owner"], dgx["tags"]) == (
        "535.129.03",
        None,
        None,
        [],
    )
    assert viewer.get("/api/v1/nodes/box-01/").json()["reachable"] is False
    assert viewer.get("/api/v1/nodes/nope/").status_code == 404


def test_the_schema_admits_a_node_no_agent_has_described(viewer, fleet):
    assert viewer.get("/api/v1/nodes/dgx-01/").json()["nvml_backend"] == ""
    components = viewer.get("/api/schema/?format=json").json()["components"]["schemas"]
    field = components["Node"]["properties"]["nvml_backend"]
    enums = re.findall(r'"#/components/schemas/(\w+)"', json.dumps(field))
    assert "" in {value for enum in enums for value in components[enum]["enum"]}


def test_gpu_list_filters(viewer, fleet):
    assert viewer.get("/api/v1/gpus/").json()["count"] == 12
    assert viewer.get("/api/v1/gpus/?node=box-01").json()["count"] == 4
    mig = viewer.get("/api/v1/gpus/?mig_enabled=true").json()
    assert [(g["node"], g["index"]) for g in mig["results"]] == [("dgx-01", 0), ("dgx-01", 1)]
    assert mig["results"][0]["mig_instance_count"] == 3
    assert viewer.get("/api/v1/gpus/?model=A100").json()["count"] == 8
    Gpu.objects.filter(node__hostname="box-01", index=3).update(missing_since=timezone.now())
    missing = viewer.get("/api/v1/gpus/?missing=true").json()
    assert [(g["node"], g["index"], g["missing"]) for g in missing["results"]] == [
        ("box-01", 3, True)
    ]
    assert viewer.get("/api/v1/gpus/?missing=false").json()["count"] == 11
    Gpu.objects.filter(node__hostname="dgx-01", index=4).update(
        pool=Pool.objects.create(name="vision")
    )
    assert viewer.get("/api/v1/gpus/?pool=vision").json()["results"][0]["index"] == 4
    bad = viewer.get("/api/v1/gpus/?state=broken")
    assert bad.status_code == 400
    assert set(bad.json()) == {"state"}


def test_gpu_detail_by_uuid(viewer, fleet):
    gpu = Gpu.objects.get(node__hostname="dgx-01", index=0)
    body = viewer.get(f"/api/v1/gpus/{gpu.uuid}/").json()
    assert (body["uuid"], body["node"], body["memory_total_mib"]) == (gpu.uuid, "dgx-01", 40960)
    assert (body["mig_enabled"], body["numa_node"], body["missing"]) == (True, 3, False)


def test_pagination(viewer, fleet):
    page = viewer.get("/api/v1/gpus/?limit=5&offset=10").json()
    assert page["count"] == 12
    assert len(page["results"]) == 2
    assert page["previous"] is not None and page["next"] is None
    assert len(viewer.get("/api/v1/gpus/?limit=5000").json()["results"]) == 12


def test_mig_instances_list_and_filters(viewer, fleet):
    body = viewer.get("/api/v1/mig-instances/").json()
    assert body["count"] == 10
    gpu1 = Gpu.objects.get(node__hostname="dgx-01", index=1)
    by_gpu = viewer.get(f"/api/v1/mig-instances/?gpu={gpu1.uuid}").json()
    assert by_gpu["count"] == 7
    assert {(row["gpu_uuid"], row["gpu_index"], row["node"]) for row in by_gpu["results"]} == {
        (gpu1.uuid, 1, "dgx-01")
    }
    assert viewer.get("/api/v1/mig-instances/?node=box-01").json()["count"] == 0


def test_reads_need_a_login(client, fleet):
    response = client.get("/api/v1/gpus/")
    assert response.status_code == 401
    assert response["WWW-Authenticate"] == "Bearer"
    assert response.json() == {"detail": "Authentication credentials were not provided."}


def test_patch_is_for_staff_only(viewer, fleet):
    gpu = Gpu.objects.get(node__hostname="dgx-01", index=0)
    response = viewer.patch(
        f"/api/v1/gpus/{gpu.uuid}/", {"label": "x"}, content_type="application/json"
    )
    assert response.status_code == 403
    assert response.json() == {"detail": "You do not have permission to perform this action."}
    assert not AuditEvent.objects.filter(event_type="gpu.catalog_changed").exists()


def test_patch_catalog_fields_is_audited(admin_client, admin_user, fleet, django_user_model):
    gpu = Gpu.objects.get(node__hostname="dgx-01", index=0)
    Pool.objects.create(name="vision")
    django_user_model.objects.create_user("alice")
    response = admin_client.patch(
        f"/api/v1/gpus/{gpu.uuid}/",
        {
            "label": "rack 4 top",
            "pool": "vision",
            "owner": "alice",
            "tags": ["nvlink", "a100"],
            "notes": "",
        },
        content_type="application/json",
    )
    assert response.status_code == 200, response.json()
    body = response.json()
    assert (body["label"], body["pool"], body["owner"], body["tags"]) == (
        "rack 4 top",
        "vision",
        "alice",
        ["nvlink", "a100"],
    )
    gpu.refresh_from_db()
    assert (gpu.label, gpu.pool.name, gpu.owner.username) == ("rack 4 top", "vision", "alice")
    event = AuditEvent.objects.get(event_type="gpu.catalog_changed")
    assert event.actor == admin_user
    assert str(event.target_id) == gpu.uuid
    assert event.before == {"label": "", "pool": None, "owner": None, "tags": []}
    assert event.after == {
        "label": "rack 4 top",
        "pool": "vision",
        "owner": "alice",
        "tags": ["nvlink", "a100"],
    }

    # Same values again: nothing changes, nothing is audited.
    admin_client.patch(
        f"/api/v1/gpus/{gpu.uuid}/", {"label": "rack 4 top"}, content_type="application/json"
    )
    assert AuditEvent.objects.filter(event_type="gpu.catalog_changed").count() == 1


def test_patch_node_catalog_is_audited(admin_client, fleet):
    response = admin_client.patch(
        "/api/v1/nodes/dgx-01/", {"notes": "in hall B"}, content_type="application/json"
    )
    assert response.status_code == 200
    event = AuditEvent.objects.get(event_type="node.catalog_changed")
    assert (event.before, event.after) == ({"notes": ""}, {"notes": "in hall B"})


def test_discovered_fields_are_read_only(admin_client, fleet):
    gpu = Gpu.objects.get(node__hostname="dgx-01", index=0)
    response = admin_client.patch(
        f"/api/v1/gpus/{gpu.uuid}/",
        {"name": "fake", "memory_total_mib": 1, "index": 9},
        content_type="application/json",
    )
    assert response.status_code == 200
    gpu.refresh_from_db()
    assert (gpu.name, gpu.memory_total_mib, gpu.index) == ("NVIDIA A100-SXM4-40GB", 40960, 0)
    assert not AuditEvent.objects.filter(event_type="gpu.catalog_changed").exists()


def test_bad_catalog_input_is_400_naming_the_field(admin_client, fleet):
    gpu = Gpu.objects.get(node__hostname="dgx-01", index=0)
    url = f"/api/v1/gpus/{gpu.uuid}/"
    response = admin_client.patch(url, {"pool": "nope"}, content_type="application/json")
    assert response.status_code == 400
    assert response.json() == {"pool": ["Object with name=nope does not exist."]}
    response = admin_client.patch(url, {"owner": "ghost"}, content_type="application/json")
    assert response.json() == {"owner": ["Object with username=ghost does not exist."]}
    response = admin_client.patch(url, {"tags": "not-a-list"}, content_type="application/json")
    assert set(response.json()) == {"tags"}
    assert admin_client.put(url, {}, content_type="application/json").status_code == 405
    assert not AuditEvent.objects.filter(event_type="gpu.catalog_changed").exists()


def count_queries(client, url: str) -> int:
    with CaptureQueriesContext(connection) as ctx:
        assert client.get(url).status_code == 200
    return len(ctx.captured_queries)


@pytest.mark.parametrize(
    ("url", "most"),
    # The GPU list names the job on each GPU (``live``): one query for all of them.
    # /api/v1/gpus/: who holds them is one query per answer (scheduling's jobs, Slurm's).
    [("/api/v1/nodes/", 4), ("/api/v1/gpus/", 6), ("/api/v1/mig-instances/", 4)],
)
def test_list_queries_do_not_grow_with_rows(
    viewer, sim_scan, url, most, django_assert_max_num_queries
):
    apply_discovery("dgx-00", sim_scan("dgx-a100-40gb", "dgx-00"))
    one = count_queries(viewer, url)
    for i in range(1, 5):
        apply_discovery(f"dgx-{i:02}", sim_scan("dgx-a100-40gb", f"dgx-{i:02}"))
    with django_assert_max_num_queries(most):
        assert viewer.get(url).status_code == 200
    assert count_queries(viewer, url) == one


def test_busy_and_free_filters_follow_live_samples_and_state(viewer, fleet):
    nvml = SimulatedNvml.from_model("dgx-a100-40gb", node_name="dgx-01")
    faults.start_process(nvml, None, 3, 4242, used_mib=30_000, util=97)
    live.publish("dgx-01", scan(nvml, include=("facts", "metrics")))
    try:
        Gpu.objects.filter(node__hostname="dgx-01", index=5).update(state=GpuState.DRAINING)

        def indexes(query: str) -> list[tuple[str, int]]:
            rows = viewer.get(f"/api/v1/gpus/?{query}").json()["results"]
            return [(row["node"], row["index"]) for row in rows]

        assert indexes("busy=true") == [("dgx-01", 3)]
        assert len(indexes("busy=false")) == 11
        # box-01 never heartbeats: its GPUs are not free; on dgx-01, GPUs 0 and 1 are in MIG
        # mode, 3 is busy, 5 draining.
        assert indexes("free=true") == [("dgx-01", i) for i in (2, 4, 6, 7)]
        assert len(indexes("free=false")) == 8
        assert indexes("free=true&model=L40S") == []
    finally:
        live.client().delete(live.KEY_PREFIX + "dgx-01")
