"""A node's host CPUs and memory: reported by the scan (real host or simulated machine model),
stored and audited by discovery, kept back in part by admins (admin, API), shown on its page."""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path

import pytest

from gpuadmin.audit.models import AuditEvent
from inventory import tasks
from inventory.models import Node
from inventory.nvml.host import memory_total_mib, parse_meminfo_total_mib
from inventory.nvml.parsers import parse_topo_matrix
from inventory.nvml.parsers.capture_bundle import split_capture_bundle
from inventory.nvml.real import RealNvml
from inventory.nvml.scanner import SECTIONS, scan
from inventory.nvml.sim import SimulatedNvml, list_models
from inventory.nvml.sim.model import load_model, parse_cpulist
from inventory.services import apply_discovery
from tests.inventory.conftest import model_with_uuids, simulated_agent_sync
from tests.inventory.pages import add_node, unique_host
from tests.nvml.captures import OWN, REAL, needs_real_captures

TIB = 1024 * 1024


# --------------------------------------------------------------------------- what a scan reports


@pytest.mark.parametrize("model", list_models())
def test_the_simulator_reports_its_machine_models_cpus_and_memory(model):
    raw = load_model(model).raw
    cpus = {cpu for node in raw["numa_nodes"].values() for cpu in parse_cpulist(node["cpus"])}

    system = scan(SimulatedNvml.from_model(model)).system

    assert (system.cpu_count, system.memory_total_mib) == (len(cpus), raw["host_memory_mib"])
    assert raw["sources"]["host_memory_mib"]  # every figure says where it comes from


@pytest.mark.parametrize(
    ("model", "cpus", "memory_mib"),
    [
        ("dgx-a100-40gb", 256, 1 * TIB),  # DGX A100 320GB: 1 TB
        ("dgx-a100-80gb", 256, 2 * TIB),  # DGX A100 640GB: 2 TB
        ("dgx-h100", 224, 2 * TIB),  # 2x Xeon Platinum 8480C, 56 cores + SMT each
        ("dgx-1-v100", 80, TIB // 2),
    ],
)
def test_the_dgx_models_have_their_datasheets_memory(model, cpus, memory_mib):
    system = scan(SimulatedNvml.from_model(model)).system
    assert (system.cpu_count, system.memory_total_mib) == (cpus, memory_mib)


def _captured_topo(path: str) -> str:
    if path.startswith("capture-bundles/"):
        sections = split_capture_bundle((REAL / path).read_text())
        (section,) = [s for s in sections if s.runs("topo", "-m")]
        return section.body
    return (REAL / path).read_text()


@needs_real_captures
@pytest.mark.parametrize(
    ("model", "capture"),
    [
        ("dgx-a100-40gb", "topo/gengwg__DGX-A100__topo-m.txt"),
        ("dgx-a100-80gb", "topo/gengwg__DGX-A100__topo-m.txt"),
        (
            "dgx-h100",
            str(OWN / "code-index-69641790152__8xH100-HBM3-12NIC__topo-m_numa-0-55,112-167.txt"),
        ),
        ("dgx-1-v100", "topo/gengwg__DGX-1__topo-mp.txt"),
        (
            "rtx-4080-super",
            "capture-bundles/nvidia_gpu_exporter__linux-x86_64__nvidia-geforce-rtx-4080-super"
            "__595.71.05.txt",
        ),
    ],
)
def test_the_simulated_cpus_are_the_captured_machines(model, capture):
    """``topo -m`` lists the CPUs near each GPU: the simulated host has every one of them, and
    as many CPUs as the highest captured CPU number says (Linux numbers them from 0)."""
    gpus = parse_topo_matrix(_captured_topo(capture)).gpus
    captured = {cpu for gpu in gpus for cpu in gpu.cpus or ()}
    assert all(gpu.cpus for gpu in gpus)  # every GPU's affinity captured

    assert captured <= load_model(model).cpus
    assert scan(SimulatedNvml.from_model(model)).system.cpu_count == max(captured) + 1


def test_a_real_host_reports_the_cpus_the_agent_may_use_and_memtotal():
    """On real NVML (with or without a driver: the host is read either way)."""
    system = scan(RealNvml()).system

    assert system.cpu_count == len(os.sched_getaffinity(0))
    assert system.memory_total_mib == parse_meminfo_total_mib(Path("/proc/meminfo").read_text())
    assert system.memory_total_mib and system.memory_total_mib > 0


def test_meminfo_parsing_and_an_unreadable_meminfo(tmp_path):
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal:       1056420740 kB\nMemFree:        1000000000 kB\n")
    assert memory_total_mib(meminfo) == 1031660  # kB are KiB; rounded down to whole MiB
    meminfo.write_text("MemFree:        1000000000 kB\n")
    assert memory_total_mib(meminfo) is None
    assert memory_total_mib(tmp_path / "absent") is None


def test_live_samples_do_not_read_the_host():
    nvml = SimulatedNvml.from_model("dgx-h100")
    sample = scan(nvml, include=("facts", "metrics", "health")).system
    assert (sample.cpu_count, sample.memory_total_mib) == (None, None)


# --------------------------------------------------------------------------- discovery


@pytest.mark.django_db
def test_the_agents_sync_carries_the_host_to_the_catalog(settings, tmp_path):
    name, args = simulated_agent_sync(settings, tmp_path)

    tasks.sync_node(*json.loads(json.dumps(args)))  # as JSON over the broker

    node = Node.objects.get(hostname="box-01")
    assert (node.cpu_count, node.memory_total_mib) == (128, TIB // 2)


def _node() -> Node:
    return Node.objects.get(hostname="dgx-01")


@pytest.mark.django_db
def test_discovery_stores_the_figures_and_audits_a_change(sim_scan):
    apply_discovery("dgx-01", sim_scan("dgx-h100", "dgx-01"))
    assert (_node().cpu_count, _node().memory_total_mib) == (224, 2 * TIB)
    assert not AuditEvent.objects.filter(event_type="node.host_changed").exists()  # first report

    # Hyper-threading off on socket 1 and half its DIMMs gone.
    changed = model_with_uuids("dgx-h100", "dgx-01")
    changed["numa_nodes"]["1"]["cpus"] = "56-111"
    changed["host_memory_mib"] = TIB
    apply_discovery("dgx-01", sim_scan(changed, "dgx-01"))

    assert (_node().cpu_count, _node().memory_total_mib) == (168, TIB)
    event = AuditEvent.objects.get(event_type="node.host_changed")
    assert (event.actor_name, event.target_id) == ("discovery", str(_node().pk))
    assert event.before == {"cpu_count": 224, "memory_total_mib": 2 * TIB}
    assert event.after == {"cpu_count": 168, "memory_total_mib": TIB}
    assert not AuditEvent.objects.filter(event_type="node.driver_changed").exists()

    assert apply_discovery("dgx-01", sim_scan(changed, "dgx-01")).is_empty  # nothing new


@pytest.mark.django_db
def test_a_scan_that_cannot_read_the_figures_keeps_the_stored_ones(sim_scan):
    apply_discovery("dgx-01", sim_scan("dgx-h100", "dgx-01"))
    events = AuditEvent.objects.count()

    without_host = scan(
        SimulatedNvml.from_model("dgx-h100", node_name="dgx-01"),
        include=[section for section in SECTIONS if section != "host"],
    )
    assert apply_discovery("dgx-01", without_host).is_empty
    silent = model_with_uuids("dgx-h100", "dgx-01")
    del silent["host_memory_mib"]  # a model that does not say: memory unknown, CPUs known
    assert sim_scan(silent, "dgx-01").system.memory_total_mib is None
    assert apply_discovery("dgx-01", sim_scan(silent, "dgx-01")).is_empty
    failed = sim_scan("dgx-h100", "dgx-01")
    unread = dataclasses.replace(failed.system, cpu_count=None, memory_total_mib=None)
    assert apply_discovery("dgx-01", dataclasses.replace(failed, system=unread)).is_empty

    assert (_node().cpu_count, _node().memory_total_mib) == (224, 2 * TIB)
    assert AuditEvent.objects.count() == events


# --------------------------------------------------------------------------- reserved: admin, API


@pytest.fixture
def dgx(sim_scan) -> Node:
    apply_discovery("dgx-01", sim_scan("dgx-a100-40gb", "dgx-01"))
    return _node()


def _admin_post(admin_client, node: Node, **values: object):
    form = {
        "cpus_reserved": node.cpus_reserved,
        "memory_reserved_mib": node.memory_reserved_mib,
        "label": "",
        "notes": "",
        "tags": "",
        "gpus-TOTAL_FORMS": "0",
        "gpus-INITIAL_FORMS": "0",
        "gpus-MIN_NUM_FORMS": "0",
        "gpus-MAX_NUM_FORMS": "1000",
        **values,
    }
    return admin_client.post(f"/admin/inventory/node/{node.pk}/change/", form)


@pytest.mark.django_db
def test_the_admin_edits_the_reserved_part_and_shows_the_totals_read_only(admin_client, dgx):
    form = admin_client.get(f"/admin/inventory/node/{dgx.pk}/change/").context["adminform"].form
    assert {"cpus_reserved", "memory_reserved_mib"} <= set(form.fields)
    assert not {"cpu_count", "memory_total_mib"} & set(form.fields)

    response = _admin_post(
        admin_client, dgx, cpus_reserved=8, memory_reserved_mib=16384, cpu_count=1
    )

    assert response.status_code == 302, response.content[:2000]
    node = _node()
    assert (node.cpus_reserved, node.memory_reserved_mib, node.cpu_count) == (8, 16384, 256)
    event = AuditEvent.objects.get(event_type="node.catalog_changed")
    assert event.before == {"cpus_reserved": 0, "memory_reserved_mib": 0}
    assert event.after == {"cpus_reserved": 8, "memory_reserved_mib": 16384}


@pytest.mark.django_db
def test_the_admin_refuses_reserving_more_than_the_host_has(admin_client, dgx):
    response = _admin_post(admin_client, dgx, cpus_reserved=257, memory_reserved_mib=TIB + 1)

    assert response.status_code == 200
    errors = response.context["adminform"].form.errors
    assert errors["cpus_reserved"] == [
        "Ensure this value is less than or equal to 256: the node has 256 CPUs."
    ]
    assert errors["memory_reserved_mib"] == [
        "Ensure this value is less than or equal to 1048576: the node has 1048576 MiB of memory."
    ]
    assert (_node().cpus_reserved, _node().memory_reserved_mib) == (0, 0)
    assert not AuditEvent.objects.filter(event_type="node.catalog_changed").exists()
    assert _admin_post(admin_client, dgx, cpus_reserved=256).status_code == 302  # all of it


@pytest.mark.django_db
def test_the_api_shows_the_figures_and_admins_patch_the_reserved_part(admin_client, dgx):
    url = "/api/v1/nodes/dgx-01/"
    body = admin_client.get(url).json()
    assert {name: body[name] for name in ("cpu_count", "memory_total_mib")} == {
        "cpu_count": 256,
        "memory_total_mib": TIB,
    }
    assert (body["cpus_reserved"], body["memory_reserved_mib"]) == (0, 0)

    response = admin_client.patch(
        url,
        {"cpus_reserved": 8, "memory_reserved_mib": 16384, "cpu_count": 1},
        content_type="application/json",
    )

    assert response.status_code == 200
    assert {name: response.json()[name] for name in ("cpu_count", "cpus_reserved")} == {
        "cpu_count": 256,  # discovered: read-only
        "cpus_reserved": 8,
    }
    event = AuditEvent.objects.get(event_type="node.catalog_changed")
    assert event.after == {"cpus_reserved": 8, "memory_reserved_mib": 16384}


@pytest.mark.django_db
def test_the_api_refuses_reserving_more_than_the_host_has_naming_the_field(admin_client, dgx):
    url = "/api/v1/nodes/dgx-01/"
    response = admin_client.patch(url, {"cpus_reserved": 300}, content_type="application/json")

    assert response.status_code == 400
    assert response.json() == {
        "cpus_reserved": ["Ensure this value is less than or equal to 256: the node has 256 CPUs."]
    }
    response = admin_client.patch(url, {"memory_reserved_mib": -1}, content_type="application/json")
    assert response.status_code == 400 and set(response.json()) == {"memory_reserved_mib"}
    assert _node().cpus_reserved == 0


@pytest.mark.django_db
def test_an_unknown_total_limits_nothing(admin_client):
    Node.objects.create(hostname="new-01")  # no agent has reported its host yet
    response = admin_client.patch(
        "/api/v1/nodes/new-01/", {"cpus_reserved": 4}, content_type="application/json"
    )
    assert response.status_code == 200
    assert response.json()["cpu_count"] is None


# --------------------------------------------------------------------------- the node page


@pytest.mark.django_db
def test_the_node_page_shows_the_host_and_what_is_kept_back(client):
    host = unique_host()
    add_node(host, "dgx-a100-80gb")
    Node.objects.filter(hostname=host).update(cpus_reserved=8, memory_reserved_mib=16384)

    html = client.get(f"/nodes/{host}/").content.decode()

    assert '<dd id="node-host">CPUs 256 (8 reserved), memory 2 TiB (16 GiB reserved)</dd>' in html


@pytest.mark.django_db
def test_the_node_page_says_when_the_host_is_not_reported(client):
    Node.objects.create(hostname="new-01", cpus_reserved=2)
    html = client.get("/nodes/new-01/").content.decode()
    assert '<dd id="node-host">CPUs not reported (2 reserved), memory not reported</dd>' in html
