"""The scanner against the simulator: every machine model, MIG, topology, faults, JSON."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pynvml
import pytest

from inventory.nvml import NodeScan, open_backend, scan
from inventory.nvml.scanner import ProcessInfo, cpulist, throttle_reason_names
from inventory.nvml.sim import SimulatedNvml, faults
from tests.nvml.scan_invariants import assert_clean_scan, assert_round_trip

MODELS = {
    "dgx-1-v100": (8, "Tesla V100-SXM2-32GB"),
    "dgx-a100-40gb": (8, "NVIDIA A100-SXM4-40GB"),
    "dgx-a100-80gb": (8, "NVIDIA A100-SXM4-80GB"),
    "dgx-h100": (8, "NVIDIA H100 80GB HBM3"),
    "pcie-l40s-4x": (4, "NVIDIA L40S"),
    "rtx-4080-super": (1, "NVIDIA GeForce RTX 4080 SUPER"),
}
# gengwg__DGX-A100__topo-m.txt: CPU and NUMA affinity per GPU of a DGX A100.
DGX_A100_AFFINITY = [
    ("48-63,176-191", 3),
    ("48-63,176-191", 3),
    ("16-31,144-159", 1),
    ("16-31,144-159", 1),
    ("112-127,240-255", 7),
    ("112-127,240-255", 7),
    ("80-95,208-223", 5),
    ("80-95,208-223", 5),
]
DGX_A100_BUS_IDS = [
    f"00000000:{bus}:00.0" for bus in ("07", "0F", "47", "4E", "87", "90", "B7", "BD")
]
# mig/cloud-atlas__A100-40GB__mig-lgip.txt (its GiB are these MiB), with the placements that
# `nvidia-smi mig -lgipp` prints on an A100-40GB: name -> (id, instances, MiB, SMs, placements)
# name: (profile id, instances, MiB, SMs, memory slices, placement starts)
A100_40GB_PROFILES = {
    "1g.5gb": (19, 7, 4864, 14, 1, list(range(7))),
    "1g.5gb+me": (20, 1, 4864, 14, 1, list(range(7))),
    "1g.10gb": (15, 4, 9856, 14, 2, [0, 2, 4, 6]),
    "2g.10gb": (14, 3, 9856, 28, 2, [0, 2, 4]),
    "3g.20gb": (9, 2, 19968, 42, 4, [0, 4]),
    "4g.20gb": (5, 1, 19968, 56, 4, [0]),
    "7g.40gb": (0, 1, 40192, 98, 8, [0]),
}


def sim(model: str) -> SimulatedNvml:
    return open_backend("sim", sim_model=model, node_name=f"{model}-01")


@pytest.fixture(scope="module")
def dgx_a100() -> NodeScan:
    return scan(sim("dgx-a100-40gb"))


@pytest.mark.parametrize("model", MODELS)
def test_every_model_scans_clean(model: str) -> None:
    result = scan(sim(model))

    count, name = MODELS[model]
    assert result.system.gpu_count == count
    assert [gpu.facts.name for gpu in result.gpus] == [name] * count
    assert_clean_scan(result)


def test_dgx_a100_identity_and_system_facts(dgx_a100: NodeScan) -> None:
    assert dgx_a100.system.driver_version == "535.129.03"
    assert dgx_a100.system.cuda_driver_version == "12.2"
    assert [gpu.facts.pci_bus_id for gpu in dgx_a100.gpus] == DGX_A100_BUS_IDS
    assert len({gpu.uuid for gpu in dgx_a100.gpus}) == 8
    facts = dgx_a100.gpus[0].facts
    assert facts.pci_device_id == "0x20B010DE"
    assert facts.architecture == "Ampere"
    assert facts.compute_capability == "8.0"
    assert facts.memory_total_mib == 40960
    assert facts.power_limit_default_w == 400.0
    assert facts.ecc_enabled is True
    assert facts.nvlink_count == 12


def test_dgx_a100_numa_and_cpu_affinity_match_the_real_machine(dgx_a100: NodeScan) -> None:
    found = [(gpu.facts.cpu_affinity, gpu.facts.numa_node) for gpu in dgx_a100.gpus]
    assert found == DGX_A100_AFFINITY
    assert list(zip(dgx_a100.topology.cpu_affinity, dgx_a100.topology.numa_nodes, strict=True)) == (
        DGX_A100_AFFINITY
    )


@pytest.mark.parametrize(
    ("model", "label"), [("dgx-a100-40gb", "NV12"), ("dgx-a100-80gb", "NV12"), ("dgx-h100", "NV18")]
)
def test_nvswitch_machines_show_one_nvlink_class_between_all_gpus(model: str, label: str) -> None:
    topology = scan(sim(model), include=("topology",)).topology

    expected = tuple(tuple("X" if a == b else label for b in range(8)) for a in range(8))
    assert topology.matrix == expected


def test_pcie_box_link_classes_follow_its_pcie_tree() -> None:
    result = scan(sim("pcie-l40s-4x"))

    assert result.topology.matrix == (
        ("X", "PIX", "SYS", "SYS"),
        ("PIX", "X", "SYS", "SYS"),
        ("SYS", "SYS", "X", "NODE"),
        ("SYS", "SYS", "NODE", "X"),
    )
    assert result.topology.numa_nodes == (0, 0, 1, 1)
    assert [gpu.facts.nvlink_count for gpu in result.gpus] == [0, 0, 0, 0]


def test_mig_profile_table_of_a100_40gb_matches_nvidia_smi(dgx_a100: NodeScan) -> None:
    for index in (0, 1):
        mig = dgx_a100.gpus[index].mig
        table = {
            p.name: (p.id, p.instances, p.memory_mib, p.sm, p.memory_slices, list(p.placements))
            for p in mig.profiles
        }
        assert table == A100_40GB_PROFILES


def test_mig_layout_of_the_demo_dgx_a100(dgx_a100: NodeScan) -> None:
    gpu0, gpu1 = dgx_a100.gpus[0].mig, dgx_a100.gpus[1].mig
    assert gpu0.enabled and gpu1.enabled
    assert [
        (gi.profile_name, gi.placement_start, gi.placement_size, gi.memory_mib)
        for gi in gpu0.gpu_instances
    ] == [("3g.20gb", 4, 4, 19968), ("2g.10gb", 0, 2, 9856), ("2g.10gb", 2, 2, 9856)]
    assert sorted((gi.placement_start, gi.profile_name) for gi in gpu1.gpu_instances) == [
        (start, "1g.5gb") for start in range(7)
    ]
    # Both GPUs are fully partitioned: nothing more fits.
    assert {p.remaining for p in gpu0.profiles + gpu1.profiles} == {0}
    for gi in gpu0.gpu_instances + gpu1.gpu_instances:
        (ci,) = gi.compute_instances
        assert (ci.ci_id, ci.name, ci.placement_start) == (0, gi.profile_name, 0)
    uuids = [
        ci.uuid for gi in gpu0.gpu_instances + gpu1.gpu_instances for ci in gi.compute_instances
    ]
    assert len(set(uuids)) == 10 and all(uuid.startswith("MIG-") for uuid in uuids)


def test_mig_disabled_gpus_show_the_catalog_profile_table(dgx_a100: NodeScan) -> None:
    from_nvml = dgx_a100.gpus[0].mig
    for gpu in dgx_a100.gpus[2:]:
        assert gpu.facts.mig_enabled is False
        assert (gpu.mig.enabled, gpu.mig.gpu_instances) == (False, ())
        assert gpu.mig.profiles_source == "catalog"
        # Same table as NVML reports once MIG is on, but with no remaining capacity known.
        assert [p.to_dict() | {"remaining": None} for p in from_nvml.profiles] == [
            p.to_dict() for p in gpu.mig.profiles
        ]


def test_non_mig_gpus_have_no_mig_layout() -> None:
    result = scan(sim("pcie-l40s-4x"))

    assert [(gpu.facts.mig_enabled, gpu.mig) for gpu in result.gpus] == [(None, None)] * 4


def fleet_node(tmp_path: Path, mig: dict[str, list[object]]) -> SimulatedNvml:
    """Node "n1" (a DGX A100 40GB) of a fleet spec with MIG layouts on top of the model's."""
    spec = tmp_path / "fleet.json"
    spec.write_text(json.dumps({"nodes": [{"name": "n1", "model": "dgx-a100-40gb", "mig": mig}]}))
    return open_backend("sim", sim_fleet=str(spec), node_name="n1")


def test_remaining_capacity_follows_the_free_slices(tmp_path: Path) -> None:
    result = scan(fleet_node(tmp_path, {"0": ["3g.20gb"]}))

    mig = result.gpus[0].mig
    assert [(gi.profile_name, gi.placement_start) for gi in mig.gpu_instances] == [("3g.20gb", 4)]
    remaining = {p.name: p.remaining for p in mig.profiles}
    assert remaining == {
        "1g.5gb": 4,
        "1g.5gb+me": 1,
        "1g.10gb": 2,
        "2g.10gb": 2,
        "3g.20gb": 1,
        "4g.20gb": 1,
        "7g.40gb": 0,
    }
    assert result.gpus[2].mig.enabled is False


def test_compute_instances_of_a_split_gpu_instance(tmp_path: Path) -> None:
    split = {"gpu_instance": "3g.20gb", "compute_instances": ["1c.3g.20gb"] * 3}

    (gi,) = scan(fleet_node(tmp_path, {"0": [split]})).gpus[0].mig.gpu_instances

    # mig/cloud-atlas__A100-40GB__mig-lci.txt: three "MIG 1c.3g.20gb", profile 0, ids 0-2.
    assert [(ci.ci_id, ci.profile_id, ci.name, ci.sm_count) for ci in gi.compute_instances] == [
        (ci_id, 0, "1c.3g.20gb", 14) for ci_id in range(3)
    ]
    assert [ci.placement_start for ci in gi.compute_instances] == [0, 1, 2]
    assert len({ci.uuid for ci in gi.compute_instances}) == 3


def test_fan_is_none_on_sxm_and_a_percentage_on_a_consumer_card(dgx_a100: NodeScan) -> None:
    assert {gpu.metrics.fan_pct for gpu in dgx_a100.gpus} == {None}
    assert {gpu.metrics.fan_pct for gpu in scan(sim("dgx-h100")).gpus} == {None}
    (card,) = scan(sim("rtx-4080-super")).gpus
    assert isinstance(card.metrics.fan_pct, int) and 0 <= card.metrics.fan_pct <= 100


def test_consumer_card_without_ecc_reports_none_counters() -> None:
    (card,) = scan(sim("rtx-4080-super")).gpus

    assert card.facts.ecc_enabled is None
    assert card.health.ecc_volatile_uncorrected is None
    assert card.health.remapped_rows_pending is None
    assert card.facts.error_message is None


def test_processes_on_whole_gpus_and_mig_devices() -> None:
    backend = sim("dgx-a100-40gb")
    faults.start_process(backend, None, 2, 4242, used_mib=10000, util=90)
    faults.start_process(backend, None, 0, 4243, used_mib=3000, util=50, gpu_instance=2)

    result = scan(backend)

    assert result.gpus[2].metrics.processes == (ProcessInfo(4242, "C", 10000, None, None),)
    assert result.gpus[2].metrics.utilization_gpu_pct == 90
    assert result.gpus[2].facts.memory_used_mib >= 10000
    assert result.gpus[0].metrics.processes == (ProcessInfo(4243, "C", 3000, 2, 0),)
    assert result.gpus[0].metrics.utilization_gpu_pct is None  # NVML has none with MIG on


def test_health_counters_follow_injected_faults() -> None:
    backend = sim("dgx-a100-40gb")
    faults.set_ecc(backend, None, 4, count=3)
    faults.remap_rows(backend, None, 4, uncorrectable=2, pending=True)
    faults.set_temperature(backend, None, 6, 95)

    result = scan(backend)

    health = result.gpus[4].health
    assert (health.ecc_volatile_uncorrected, health.ecc_aggregate_uncorrected) == (3, 3)
    assert health.ecc_volatile_corrected == 0
    assert (health.remapped_rows_uncorrectable, health.remapped_rows_pending) == (2, True)
    assert health.remapped_rows_failure is False
    # A100 remaps rows instead of retiring pages: NVML says NOT_SUPPORTED.
    assert (health.retired_pages_dbe, health.retired_pages_pending) == (None, None)
    hot = result.gpus[6]
    assert hot.metrics.temperature_c == 95
    assert "hw_thermal_slowdown" in hot.metrics.throttle_reasons
    assert hot.health.throttle_reasons == hot.metrics.throttle_reasons


def test_a_lost_gpu_and_a_failing_gpu_only_fail_themselves(
    caplog: pytest.LogCaptureFixture,
) -> None:
    backend = sim("dgx-a100-40gb")
    faults.fall_off_bus(backend, None, 3)
    faults.fail_queries(backend, None, 5)

    with caplog.at_level(logging.DEBUG, logger="gpuadmin.nvml"):
        result = scan(backend)

    assert result.system.error is None and result.system.gpu_count == 8
    lost, failing = result.gpus[3], result.gpus[5]
    assert "NVML_ERROR_GPU_IS_LOST" in lost.error_message
    assert lost.health.gpu_lost is True and lost.metrics is None
    assert "NVML_ERROR_UNKNOWN" in failing.error_message
    assert failing.health.gpu_lost is False and failing.mig is None
    for gpu in result.gpus:
        if gpu.index not in (3, 5):
            assert gpu.error_message is None and gpu.metrics is not None
            assert gpu.health.gpu_lost is False
    topology = result.topology
    assert topology.matrix[3] == (None, None, None, "X", None, None, None, None)
    assert topology.link(0, 7) == "NV12" and topology.link(5, 0) is None
    errors = [r.getMessage() for r in caplog.records if r.getMessage().startswith("GPU ")]
    assert errors == [f"GPU 3: {lost.error_message}", f"GPU 5: {failing.error_message}"]
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]  # the agent logs changes
    assert any("8 GPUs, driver 535.129.03" in r.getMessage() for r in caplog.records)
    assert_round_trip(result)


def test_scan_always_shuts_nvml_down() -> None:
    backend = sim("dgx-a100-40gb")
    faults.fail_queries(backend, None, 0)

    scan(backend)

    with pytest.raises(pynvml.NVMLError_Uninitialized):
        backend.nvmlDeviceGetCount()


def test_sections_can_be_left_out() -> None:
    backend = sim("dgx-a100-40gb")

    facts_only = scan(backend, include=("facts",))
    metrics_only = scan(backend, include=("metrics",))

    assert facts_only.topology is None
    assert all(g.metrics is None and g.mig is None and g.health is None for g in facts_only.gpus)
    assert facts_only.gpus[0].facts.nvlink_count == 12
    gpu = metrics_only.gpus[0]
    assert gpu.uuid == facts_only.gpus[0].uuid and gpu.metrics is not None
    assert gpu.facts.memory_total_mib is None and gpu.mig is None
    with pytest.raises(ValueError, match="unknown scan sections"):
        scan(backend, include=("facts", "fans"))


def test_scan_round_trips_through_json(dgx_a100: NodeScan) -> None:
    payload = json.dumps(dgx_a100.to_dict())
    rebuilt = NodeScan.from_dict(json.loads(payload))

    assert rebuilt == dgx_a100
    assert rebuilt.topology.link(2, 5) == "NV12"
    assert rebuilt.gpus[0].mig.profiles[0].placements == tuple(range(7))


def test_open_backend_rejects_unknown_kinds() -> None:
    with pytest.raises(ValueError, match="unknown NVML backend"):
        open_backend("fake")
    with pytest.raises(ValueError, match="needs sim_model"):
        open_backend("sim")


@pytest.mark.parametrize(
    ("words", "expected"),
    [
        ([0xFFFF << 48, 0, 0xFFFF << 48, 0], "48-63,176-191"),
        ([0b1011], "0-1,3"),
        ([1 << 63, 1], "63-64"),
        ([0, 0], ""),
    ],
)
def test_cpulist_decodes_nvml_affinity_words(words: list[int], expected: str) -> None:
    assert cpulist(words) == expected


def test_throttle_reason_names() -> None:
    assert throttle_reason_names(0) == ()
    assert throttle_reason_names(0x5) == ("gpu_idle", "sw_power_cap")
    assert throttle_reason_names(0x40 | 0x1000) == ("hw_thermal_slowdown", "0x1000")
