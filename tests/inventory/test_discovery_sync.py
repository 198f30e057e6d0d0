"""apply_discovery: scans of simulated nodes synced into the catalog, audited."""

import pytest
from django.contrib.auth import get_user_model

from gpuadmin.audit.models import AuditEvent
from inventory.admin import GpuAdmin
from inventory.api.serializers import GpuSerializer
from inventory.discovery import GPU_FIELDS, gpu_fields
from inventory.models import Gpu, GpuLink, GpuNicLink, MigInstance, Node, Pool
from inventory.nvml.scanner import scan
from inventory.nvml.sim import SimulatedNvml, faults
from inventory.services import apply_discovery
from tests.inventory.conftest import model_with_uuids

pytestmark = pytest.mark.django_db


def audit_kinds() -> list[str]:
    return sorted(AuditEvent.objects.values_list("event_type", flat=True))


def snapshot_rows() -> list[tuple]:
    gpus = list(Gpu.objects.order_by("pk").values_list())
    return (
        gpus
        + list(MigInstance.objects.order_by("pk").values_list())
        + list(GpuLink.objects.order_by("pk").values_list())
        + list(GpuNicLink.objects.order_by("pk").values_list())
    )


def test_first_scan_creates_the_node_gpus_mig_instances_and_links(sim_scan):
    apply_discovery("dgx-01", sim_scan("dgx-a100-40gb", "dgx-01"))

    node = Node.objects.get(hostname="dgx-01")
    assert (node.driver_version, node.cuda_driver_version) == ("535.129.03", "12.2")
    gpus = list(node.gpus.all())
    assert [gpu.index for gpu in gpus] == list(range(8))
    assert [gpu.numa_node for gpu in gpus] == [3, 3, 1, 1, 7, 7, 5, 5]
    assert {gpu.name for gpu in gpus} == {"NVIDIA A100-SXM4-40GB"}
    assert [gpu.mig_enabled for gpu in gpus] == [True, True] + [False] * 6
    assert all(gpu.mig_capable for gpu in gpus)
    assert MigInstance.objects.filter(gpu=gpus[0]).count() == 3
    assert MigInstance.objects.filter(gpu=gpus[1]).count() == 7
    assert {i.profile_name for i in gpus[1].mig_instances.all()} == {"1g.5gb"}
    assert GpuLink.objects.filter(node=node).count() == 28
    assert set(GpuLink.objects.values_list("link_type", "nvlink_count")) == {("NV12", 12)}
    assert audit_kinds() == ["gpu.appeared"] * 8 + ["node.topology_changed"]
    appeared = AuditEvent.objects.filter(event_type="gpu.appeared").first()
    assert appeared.actor_name == "discovery"
    assert appeared.target_type == "inventory.gpu"
    assert appeared.target_id.startswith("GPU-")


def test_dgx1_nvlink_mesh_and_nic_affinity_are_stored(sim_scan):
    apply_discovery("dgx1-01", sim_scan("dgx-1-v100", "dgx1-01"))

    node = Node.objects.get(hostname="dgx1-01")
    nv = GpuLink.objects.filter(node=node, link_type__startswith="NV")
    assert nv.count() == 16  # the cube's 12 edges and 4 face diagonals, no NVSwitch
    assert sorted(nv.values_list("nvlink_count", flat=True)) == [1] * 8 + [2] * 8
    rows = GpuNicLink.objects.filter(node=node).values_list("gpu__index", "nic", "link_type")
    assert len(rows) == 32
    assert sorted(row[1:] for row in rows if row[0] == 0) == [
        ("mlx5_0", "PIX"), ("mlx5_1", "PHB"), ("mlx5_2", "SYS"), ("mlx5_3", "SYS"),
    ]  # fmt: skip
    events = snapshot_rows(), AuditEvent.objects.count()
    assert apply_discovery("dgx1-01", sim_scan("dgx-1-v100", "dgx1-01")).is_empty
    assert (snapshot_rows(), AuditEvent.objects.count()) == events


def test_an_identical_scan_writes_nothing(sim_scan):
    apply_discovery("dgx-01", sim_scan("dgx-h100", "dgx-01"))
    rows, events = snapshot_rows(), AuditEvent.objects.count()

    plan = apply_discovery("dgx-01", sim_scan("dgx-h100", "dgx-01"))

    assert plan.is_empty
    assert snapshot_rows() == rows
    assert AuditEvent.objects.count() == events


def test_catalog_fields_survive_discovery(sim_scan):
    apply_discovery("dgx-01", sim_scan("dgx-a100-80gb", "dgx-01"))
    owner = get_user_model().objects.create_user("alice")
    pool = Pool.objects.create(name="vision")
    Gpu.objects.filter(index=2).update(
        label="the fast one", owner=owner, pool=pool, notes="fan noisy", tags=["a", "b"]
    )
    changed = model_with_uuids("dgx-a100-80gb", "dgx-01")
    changed["gpu_types"]["A100-SXM4-80GB"]["vbios_version"] = "92.00.99.00.01"

    apply_discovery("dgx-01", sim_scan(changed, "dgx-01"))

    gpu = Gpu.objects.get(index=2)
    assert gpu.vbios_version == "92.00.99.00.01"
    assert (gpu.label, gpu.owner, gpu.pool, gpu.notes, gpu.tags) == (
        "the fast one",
        owner,
        pool,
        "fan noisy",
        ["a", "b"],
    )
    event = AuditEvent.objects.filter(event_type="gpu.facts_changed", target_id=gpu.uuid).get()
    assert event.after == {"vbios_version": "92.00.99.00.01"}
    assert event.before == {"vbios_version": "92.00.36.00.02"}


def test_a_gpu_that_disappears_is_marked_missing_and_comes_back_as_the_same_row(sim_scan):
    full = model_with_uuids("dgx-h100", "dgx-01")
    apply_discovery("dgx-01", sim_scan(full, "dgx-01"))
    gpu = Gpu.objects.get(index=5)
    without_gpu5 = {**full, "gpus": [g for i, g in enumerate(full["gpus"]) if i != 5]}
    # Remaining GPUs keep their UUIDs but NVML renumbers them: 6 and 7 become 5 and 6.

    apply_discovery("dgx-01", sim_scan(without_gpu5, "dgx-01"))

    gpu.refresh_from_db()
    assert gpu.is_missing
    assert Gpu.objects.present().count() == 7
    assert Gpu.objects.get(uuid=full["gpus"][6]["uuid"]).index == 5
    assert "gpu.missing" in audit_kinds()

    apply_discovery("dgx-01", sim_scan(full, "dgx-01"))

    gpu.refresh_from_db()
    assert not gpu.is_missing and gpu.index == 5
    assert Gpu.objects.count() == 8
    assert AuditEvent.objects.filter(event_type="gpu.returned", target_id=gpu.uuid).count() == 1


def test_swapped_gpus_keep_their_rows(sim_scan):
    model = model_with_uuids("pcie-l40s-4x", "box")
    apply_discovery("box", sim_scan(model, "box"))
    first, second = (Gpu.objects.get(index=i).pk for i in (0, 1))
    model["gpus"][0]["uuid"], model["gpus"][1]["uuid"] = (
        model["gpus"][1]["uuid"],
        model["gpus"][0]["uuid"],
    )

    apply_discovery("box", sim_scan(model, "box"))

    assert Gpu.objects.get(pk=first).index == 1
    assert Gpu.objects.get(pk=second).index == 0


def test_a_gpu_moved_to_another_node_is_recorded(sim_scan):
    model = model_with_uuids("rtx-4080-super", "desk-a")
    apply_discovery("desk-a", sim_scan(model, "desk-a"))
    gpu = Gpu.objects.get()

    apply_discovery("desk-b", sim_scan(model, "desk-b"))
    apply_discovery("desk-a", sim_scan({**model, "gpus": []}, "desk-a"))

    gpu.refresh_from_db()
    assert gpu.node.hostname == "desk-b" and not gpu.is_missing
    moved = AuditEvent.objects.get(event_type="gpu.moved")
    assert (moved.before, moved.after) == ({"node": "desk-a"}, {"node": "desk-b"})
    assert "gpu.missing" not in audit_kinds()  # desk-a no longer holds it


def test_mig_layout_changes_are_synced_and_audited(sim_scan):
    apply_discovery("dgx-01", sim_scan("dgx-a100-40gb", "dgx-01"))
    nvml = SimulatedNvml.from_fleet_spec(
        {"nodes": [{"name": "dgx-01", "model": "dgx-a100-40gb", "mig": {"0": ["7g.40gb"]}}]},
        "dgx-01",
    )

    apply_discovery("dgx-01", scan(nvml))

    gpu0 = Gpu.objects.get(index=0)
    assert [
        (i.profile_name, i.placement_start, i.placement_size) for i in gpu0.mig_instances.all()
    ] == [("7g.40gb", 0, 8)]
    event = AuditEvent.objects.get(event_type="gpu.mig_changed")
    assert event.target_id == gpu0.uuid
    assert len(event.before["instances"]) == 3
    assert event.after["instances"] == ["GI0/CI0 7g.40gb@0"]


def test_a_failing_gpu_keeps_its_facts_and_gets_its_error(sim_scan):
    nvml = SimulatedNvml.from_model("dgx-h100", node_name="dgx-01")
    apply_discovery("dgx-01", scan(nvml))
    before = Gpu.objects.get(index=4)
    faults.fall_off_bus(nvml, None, 4)

    apply_discovery("dgx-01", scan(nvml))

    gpu = Gpu.objects.get(pk=before.pk)
    assert "NVML_ERROR_GPU_IS_LOST" in gpu.error_message
    assert not gpu.is_missing
    assert (gpu.uuid, gpu.pci_bus_id, gpu.memory_total_mib) == (
        before.uuid,
        before.pci_bus_id,
        before.memory_total_mib,
    )
    assert AuditEvent.objects.filter(event_type="gpu.error", target_id=gpu.uuid).count() == 1
    assert not Gpu.objects.schedulable().filter(pk=gpu.pk).exists()

    faults.clear(nvml, None, 4)
    apply_discovery("dgx-01", scan(nvml))
    assert Gpu.objects.get(pk=before.pk).error_message == ""


def test_a_driver_upgrade_is_audited(sim_scan):
    apply_discovery("dgx-01", sim_scan("dgx-h100", "dgx-01"))
    upgraded = model_with_uuids("dgx-h100", "dgx-01")
    upgraded["system"]["driver_version"] = "580.126.09"

    apply_discovery("dgx-01", sim_scan(upgraded, "dgx-01"))

    event = AuditEvent.objects.get(event_type="node.driver_changed")
    assert event.before == {"driver_version": "580.105.08"}
    assert event.after == {"driver_version": "580.126.09"}
    assert Node.objects.get().driver_version == "580.126.09"


def test_one_list_of_discovered_gpu_fields_is_what_sync_stores_and_admin_and_api_show(sim_scan):
    gpu = sim_scan("dgx-a100-40gb", "dgx-01").gpus[0]

    assert set(gpu_fields(gpu)) == set(GPU_FIELDS)
    assert set(Gpu.DISCOVERED_FIELDS) <= {field.name for field in Gpu._meta.get_fields()}
    assert set(Gpu.DISCOVERED_FIELDS) <= set(GpuAdmin.readonly_fields)
    assert set(Gpu.DISCOVERED_FIELDS) <= set(GpuSerializer.Meta.read_only_fields)
