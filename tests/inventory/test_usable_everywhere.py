"""Inventory's callers of the one rule agree: the agent's sample of a GPU that fell off the bus
carries its NVML error, and such a GPU, a MIG-mode GPU or one running a foreign process is
not free in ``/api/v1/gpus/?free=true`` nor on the fleet page; the seed's ``is_available``
means "NVML answered", with ``error_message`` set exactly when it is false."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from django.utils import timezone

from inventory import live
from inventory.models import Gpu, Node
from inventory.nvml.scanner import scan
from inventory.nvml.sim import SimulatedNvml, faults
from inventory.services import apply_discovery
from tests.inventory.pages import unique_host
from tests.inventory.test_pages_fleet import count, live_row

pytestmark = pytest.mark.django_db

MIG_GPUS, LOST_GPU, BUSY_GPU = (0, 1), 5, 3


@pytest.fixture
def node() -> Iterator[tuple[str, SimulatedNvml]]:
    """A reachable DGX A100 (GPUs 0 and 1 in MIG mode) with its live samples published."""
    host = unique_host()
    nvml = SimulatedNvml.from_model("dgx-a100-40gb", node_name=host)
    apply_discovery(host, scan(nvml))
    Node.objects.filter(hostname=host).update(last_heartbeat_at=timezone.now())
    sample(host, nvml)
    yield host, nvml
    live.client().delete(live.KEY_PREFIX + host)


def sample(host: str, nvml: SimulatedNvml) -> None:
    """What the agent's loop does every few seconds."""
    live.publish(host, scan(nvml, include=("facts", "metrics")))


def uuid_of(host: str, index: int) -> str:
    return Gpu.objects.get(node__hostname=host, index=index).uuid


def free_indexes(client, host: str) -> list[int]:
    rows = client.get(f"/api/v1/gpus/?free=true&node={host}").json()["results"]
    return [row["index"] for row in rows]


def test_the_sample_of_a_gpu_that_fell_off_the_bus_carries_its_error(node):
    host, nvml = node
    faults.fall_off_bus(nvml, None, LOST_GPU)
    sample(host, nvml)

    lost = live.latest([host])[host][uuid_of(host, LOST_GPU)]

    assert "NVML_ERROR_GPU_IS_LOST" in lost["error_message"]


def test_a_lost_gpu_is_not_free_at_once(admin_client, node):
    host, nvml = node
    faults.fall_off_bus(nvml, None, LOST_GPU)
    sample(host, nvml)  # no rescan: the catalog row has no error yet
    assert Gpu.objects.get(node__hostname=host, index=LOST_GPU).error_message == ""

    assert LOST_GPU not in free_indexes(admin_client, host)
    html = admin_client.get(f"/fleet/?node={host}").content.decode()
    row, cells = live_row(html, uuid_of(host, LOST_GPU))
    assert row.startswith('<tr class="s-degraded">')
    assert "GPU_IS_LOST" in cells["status"]
    assert count(html, "free") == 5  # 8 less the lost one and the MIG ones


def test_a_mig_gpu_is_not_free_as_a_whole_gpu(admin_client, node):
    host, _ = node

    assert free_indexes(admin_client, host) == [2, 3, 4, 5, 6, 7]
    html = admin_client.get(f"/fleet/?node={host}").content.decode()
    for index in MIG_GPUS:
        row, _ = live_row(html, uuid_of(host, index))
        assert row.startswith('<tr class="s-mig">')
    assert (count(html, "free"), count(html, "mig")) == (6, 2)


def test_a_foreign_process_makes_a_gpu_foreign_not_free(admin_client, node):
    host, nvml = node
    faults.start_process(nvml, None, BUSY_GPU, 4242, used_mib=1_000, util=50)
    sample(host, nvml)

    assert BUSY_GPU not in free_indexes(admin_client, host)
    html = admin_client.get(f"/fleet/?node={host}").content.decode()
    row, _ = live_row(html, uuid_of(host, BUSY_GPU))
    assert row.startswith('<tr class="s-foreign">')
    assert count(html, "free") == 5


def test_seed_is_available_is_false_exactly_with_an_error_message(admin_client, node):
    host, nvml = node
    faults.fall_off_bus(nvml, None, LOST_GPU)
    faults.start_process(nvml, None, BUSY_GPU, 4242, used_mib=1_000, util=50)
    sample(host, nvml)
    Gpu.objects.filter(node__hostname=host, index=6).update(state="draining")

    devices = admin_client.get(f"/api/gpu/devices?node={host}").json()["devices"]

    assert [(d["index"], d["is_available"]) for d in devices if not d["is_available"]] == [
        (LOST_GPU, False)
    ]
    assert all((d["error_message"] is None) == d["is_available"] for d in devices)
    assert "NVML_ERROR_GPU_IS_LOST" in devices[LOST_GPU]["error_message"]
