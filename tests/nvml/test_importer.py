"""``gpuadmin sim import``: real captures -> machine model -> simulator -> scan == the capture."""

from __future__ import annotations

import json
import re
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import pynvml
import pytest

from inventory.nvml.parsers import SmiLog, parse_smi_text, parse_smi_xml, parse_topo_matrix
from inventory.nvml.parsers.common import parse_cpu_list
from inventory.nvml.scanner import NodeScan, scan
from inventory.nvml.sim import SimulatedNvml
from inventory.nvml.sim.importer import (
    CaptureError,
    main,
    model_from_capture,
    model_from_smi_text,
    synthesize_pcie_paths,
)
from inventory.nvml.sim.model import parse_model
from tests.nvml.captures import OWN, REAL, needs_real_captures

pytestmark = needs_real_captures
XML_DIR = REAL / "nvidia-smi-q-xml"
TOPO_DIR = REAL / "topo"
XML_FILES = sorted(p.name for p in XML_DIR.glob("*.xml"))
XML_PATHS = [XML_DIR / name for name in XML_FILES] + sorted(OWN.glob("*.xml"))
A100_TEXT = REAL / "nvidia-smi-q-text" / "xuesongtap__8xA100-SXM4-40GB__nvidia-smi-a_535.129.03.txt"

# Trimmed fragments without a driver version: nothing to build a machine from.
TRIMMED = {
    "netdata__rtx-pro-6000-driver-580.xml": "no driver version (a trimmed fragment?)",
    "telegraf__gtx-1070-ti.xml": "no driver version (a trimmed fragment?)",
}
# Captured values the simulator cannot represent yet. NVML's volatile ECC counts of a GPU in
# MIG mode: nvidia-smi prints N/A, the simulator counts.
_MIG_VOLATILE_ECC = "MIG mode: the capture's volatile ECC counts are N/A, the simulator's 0"
KNOWN_GAPS = {
    ("netdata__a100-sxm4-mig.xml", "ecc_volatile_corrected"): _MIG_VOLATILE_ECC,
    ("netdata__a100-sxm4-mig.xml", "ecc_volatile_uncorrected"): _MIG_VOLATILE_ECC,
}


def _scan(model: dict[str, Any]) -> NodeScan:
    return scan(SimulatedNvml.from_model(model, node_name="imported-01"))


def _import(name: str, topo: str | None = None) -> tuple[dict[str, Any], SmiLog]:
    text = (XML_DIR / name).read_bytes()
    topo_text = None if topo is None else (TOPO_DIR / topo).read_text()
    model = model_from_capture(text, topo_text, name="imported", smi_source=name, topo_source=topo)
    return model, parse_smi_xml(text)


def _enabled(flag: bool | None) -> str | None:
    """A captured Enabled/Disabled/N/A flag as the scanner names it."""
    return None if flag is None else "Enabled" if flag else "Disabled"


def _cuda(version: str | None) -> str | None:
    """``"12.20"`` as the scanner prints it: ``"12.2"``."""
    return None if version is None else "{}.{}".format(*(int(p) for p in version.split(".")))


def _fields(log: SmiLog, scanned: NodeScan) -> list[tuple[str, int, Any, Any]]:
    """(field, GPU index, captured, scanned) for every fact and health counter the parser reads
    and the scan gives back. Readings (temperature, power draw, memory used, fan) are left out:
    the simulator adds noise to them, and GPUs of one type share the first one's idle readings."""
    rows = [
        ("gpu_count", -1, len(log.gpus), scanned.system.gpu_count),
        ("driver_version", -1, log.driver_version, scanned.system.driver_version),
        ("cuda_driver_version", -1, _cuda(log.cuda_version), scanned.system.cuda_driver_version),
    ]
    for index, (gpu, got) in enumerate(zip(log.gpus, scanned.gpus, strict=True)):
        facts, power, metrics = got.facts, gpu.power, got.metrics
        device_id = None if gpu.pci_device_id is None else f"0x{gpu.pci_device_id}"
        rows += [
            ("error_message", index, None, facts.error_message),
            ("name", index, gpu.product_name, facts.name),
            ("uuid", index, gpu.uuid, facts.uuid),
            ("serial", index, gpu.serial, facts.serial),
            ("pci_bus_id", index, gpu.pci_bus_id, facts.pci_bus_id),
            ("pci_device_id", index, device_id, facts.pci_device_id),
            ("architecture", index, gpu.architecture, facts.architecture),
            ("compute_mode", index, gpu.compute_mode, facts.compute_mode),
            ("bar1_total_mib", index, gpu.bar1_memory.total_mib, facts.bar1_total_mib),
            ("sm_clock_mhz", index, gpu.clocks.sm_mhz, metrics.sm_clock_mhz),
            ("mem_clock_mhz", index, gpu.clocks.memory_mhz, metrics.mem_clock_mhz),
            ("pstate", index, gpu.performance_state, metrics.pstate),
            (
                "throttle_reasons",
                index,
                sorted(gpu.clock_event_reasons - {"gpu_idle"}),  # idle: the simulator's load
                sorted(set(metrics.throttle_reasons) - {"gpu_idle"}),
            ),
            ("mig_pending_enabled", index, gpu.mig_pending, facts.mig_pending_enabled),
            ("minor_number", index, gpu.minor_number, facts.minor_number),
            ("memory_total_mib", index, gpu.fb_memory.total_mib, facts.memory_total_mib),
            ("vbios_version", index, gpu.vbios_version, facts.vbios_version),
            ("board_part_number", index, gpu.board_part_number, facts.board_part_number),
            ("power_limit_default_w", index, power.default_limit_w, facts.power_limit_default_w),
            ("power_limit_enforced_w", index, power.limit_w, facts.power_limit_enforced_w),
            ("power_limit_min_w", index, power.min_limit_w, facts.power_limit_min_w),
            ("power_limit_max_w", index, power.max_limit_w, facts.power_limit_max_w),
            ("max_sm_clock_mhz", index, gpu.max_clocks.sm_mhz, facts.max_sm_clock_mhz),
            ("max_mem_clock_mhz", index, gpu.max_clocks.memory_mhz, facts.max_mem_clock_mhz),
            ("mig_enabled", index, gpu.mig_current, facts.mig_enabled),
            ("ecc_enabled", index, gpu.ecc_current, facts.ecc_enabled),
            ("ecc_pending_enabled", index, gpu.ecc_pending, facts.ecc_pending_enabled),
            ("persistence_mode", index, _enabled(gpu.persistence_mode), facts.persistence_mode),
        ]
        rows += [
            (
                f"ecc_{counter}_{error}",
                index,
                getattr(captured, error),
                getattr(got.health, f"ecc_{counter}_{error}"),
            )
            for counter, captured in (
                ("volatile", gpu.ecc_volatile),
                ("aggregate", gpu.ecc_aggregate),
            )
            for error in ("corrected", "uncorrected")
        ]
        rows += [
            (
                f"remapped_rows_{field}",
                index,
                getattr(gpu.remapped_rows, field),
                getattr(got.health, f"remapped_rows_{field}"),
            )
            for field in ("correctable", "uncorrectable", "pending", "failure")
        ]
        pages = gpu.retired_pages
        rows += [
            ("retired_pages_sbe", index, pages.single_bit, got.health.retired_pages_sbe),
            ("retired_pages_dbe", index, pages.double_bit, got.health.retired_pages_dbe),
            ("retired_pages_pending", index, pages.pending, got.health.retired_pages_pending),
        ]
    return rows


# The model field whose "sources" entry must say why a compared fact differs (default: the
# fact's own name); None: a fact that must always come back as captured.
_MODEL_FIELDS: dict[str, str | None] = {
    "gpu_count": None,
    "driver_version": None,
    "error_message": None,
    "name": None,
    "pci_bus_id": None,
    "memory_total_mib": "total_mib",
    "power_limit_default_w": "default_limit",
    "power_limit_enforced_w": "enforced_limit",
    "power_limit_min_w": "min_limit",
    "power_limit_max_w": "max_limit",
    "max_sm_clock_mhz": "clocks_max_mhz",
    "max_mem_clock_mhz": "clocks_max_mhz",
    "sm_clock_mhz": "clocks_idle_mhz",
    "mem_clock_mhz": "clocks_idle_mhz",
    "pstate": "pstate.idle",
    "throttle_reasons": "clock_event_reasons",
    "mig_enabled": "mig_table",
    "mig_pending_enabled": "mig_table",
    "ecc_enabled": "ecc",
    "ecc_pending_enabled": "ecc",
}
# How a "sources" entry says that a value is not the captured one.
_NOT_AS_CAPTURED = ("assumed", "derived", "not kept", "modelled", "capture says N/A")


def _explained(field: str, sources: dict[str, str]) -> bool:
    """``sources`` says why ``field`` does not come back as captured."""
    wanted = _MODEL_FIELDS.get(field, field)
    return wanted is not None and any(
        text.startswith(_NOT_AS_CAPTURED) and re.search(rf"(^|[ .\]]){re.escape(wanted)}\b", key)
        for key, text in sources.items()
    )


@pytest.mark.parametrize("path", XML_PATHS, ids=lambda path: path.name)
def test_every_complete_xml_capture_round_trips(path: Path) -> None:
    """A scan of the imported model gives back every captured fact, or ``sources`` says why."""
    if path.name in TRIMMED:
        with pytest.raises(CaptureError, match=re.escape(TRIMMED[path.name])):
            model_from_capture(path.read_bytes(), name="imported")
        pytest.skip(f"{path.name}: {TRIMMED[path.name]}")
    text = path.read_bytes()
    model = model_from_capture(text, name="imported", smi_source=path.name)
    parse_model(model)
    mismatches = [
        (field, index, captured, got)
        for field, index, captured, got in _fields(parse_smi_xml(text), _scan(model))
        if captured != got
        and not _explained(field, model["sources"])
        and (path.name, field) not in KNOWN_GAPS
    ]
    assert mismatches == []


@pytest.mark.parametrize(
    ("name", "field"),
    [
        pytest.param(*gap, marks=pytest.mark.xfail(strict=True, raises=AssertionError, reason=why))
        for gap, why in sorted(KNOWN_GAPS.items())
    ],
)
def test_known_simulator_gaps(name: str, field: str) -> None:
    """Each gap fails as expected; a fixed gap passes and fails the run: drop it from the list."""
    model, log = _import(name)
    rows = [row for row in _fields(log, _scan(model)) if row[0] == field]
    if not rows:
        pytest.fail(f"{name} has no {field!r} to compare")
    assert [(index, captured) for _, index, captured, got in rows if captured != got] == []


def test_a100_text_capture_round_trips_with_the_dgx_a100_topology() -> None:
    text = A100_TEXT.read_text()
    topo = (TOPO_DIR / "gengwg__DGX-A100__topo-m.txt").read_text()
    model = model_from_smi_text(text, topo, name="dgx-a100", smi_source=A100_TEXT.name)
    log = parse_smi_text(text)
    scanned = _scan(model)
    assert [row for row in _fields(log, scanned) if row[2] != row[3]] == []
    _assert_topology(scanned, topo)
    assert [g.facts.nvlink_count for g in scanned.gpus] == [12] * 8
    assert len(model["nvswitches"]) == 6
    assert model["gpu_types"]["A100-SXM4-40GB"]["pci_subsystem_id"] == "0x134F10DE"
    assert model["gpu_types"]["A100-SXM4-40GB"]["inforom_image_version"] == "G506.0200.00.04"
    assert model["gpu_types"]["A100-SXM4-40GB"]["row_remapper_banks"] == 640


def _assert_topology(
    scanned: NodeScan, topo_text: str, numa_nodes: list[int | None] | None = None
) -> None:
    """The scanned GPU matrix, NUMA nodes (the lowest) and NUMA affinity sets (``numa_nodes``
    where topo -m prints none), CPU affinity and GPU-NIC links equal ``topo -m``'s, cell by
    cell."""
    matrix = parse_topo_matrix(topo_text)
    names = [device.name for device in matrix.gpus]
    captured = [[matrix.links.get((a, b), "X") for b in names] for a in names]
    assert [list(row) for row in scanned.topology.matrix] == captured
    affinity = (
        [None if node is None else (node,) for node in numa_nodes]
        if numa_nodes
        else [d.numa_nodes for d in matrix.gpus]
    )
    assert [parse_cpu_list(gpu.facts.numa_affinity) for gpu in scanned.gpus] == affinity
    assert list(scanned.topology.numa_nodes) == [nodes and nodes[0] for nodes in affinity]
    assert list(scanned.topology.cpu_affinity) == [d.cpu_affinity for d in matrix.gpus]
    nic_links = matrix.nic_links()
    assert scanned.topology.nics == matrix.nics
    assert [list(row) for row in scanned.topology.nic_links] == [
        [nic_links[name][nic] for nic in matrix.nics] for name in names
    ]


def test_h100_xml_round_trips_with_the_8xh100_topology() -> None:
    topo = "stas00-ml-engineering__8xH100-SXM__topo-m_no-NICs.txt"
    model, _ = _import("k8s-test-infra__hardware__qx-h100.xml", topo)
    scanned = _scan(model)
    _assert_topology(scanned, (TOPO_DIR / topo).read_text())
    assert [g.facts.nvlink_count for g in scanned.gpus] == [18] * 8
    assert model["sources"]["nvswitches"].startswith("modelled: NV18")


def test_h100_driver_580_capture_keeps_its_lifetime_ecc_counts_and_topology() -> None:
    xml = OWN / "smi-q-x__gpuadmin-device__H100-80GB-HBM3__580.159.04.xml"
    topo = (OWN / "gpuadmin-device__1xH100-80GB-HBM3__topo-m_gpu-numa-id-column.txt").read_text()
    model = model_from_capture(xml.read_bytes(), topo, name="h100", smi_source=xml.name)
    captured = model["initial_state"]["gpus"]["0"]
    assert captured["ecc"] == {"aggregate": {"corrected": {"dram": 5, "sram": 0}}}
    assert captured["remapped_rows"]["correctable"] == 2
    scanned = _scan(model)
    _assert_topology(scanned, topo)
    health = scanned.gpus[0].health
    assert (health.ecc_aggregate_corrected, health.ecc_volatile_corrected) == (5, 0)
    assert health.remapped_rows_correctable == 2


def test_a100_text_capture_round_trips_with_its_own_17_nic_topology() -> None:
    # The same xuesongtap machine: one NUMA node, 17 NICs, NV12.
    topo = (TOPO_DIR / "xuesongtap__8xA100-SXM4-40GB-17NIC__topo-m.txt").read_text()
    model = model_from_smi_text(A100_TEXT.read_text(), topo, name="a100")
    _assert_topology(_scan(model), topo)


def test_desktop_with_numa_na_keeps_numa_unknown() -> None:
    # No 2x GTX 1080 Ti XML exists: the 2x RTX 2080 desktop stands in for its GPUs.
    model, _ = _import("telegraf__dual_2080-v13.xml", "xuesongtap__2x1080Ti-desktop__topo-m.txt")
    scanned = _scan(model)
    assert scanned.topology.matrix == (("X", "PHB"), ("PHB", "X"))
    assert scanned.topology.numa_nodes == (None, None)
    assert model["numa_nodes"] == {}
    assert [gpu["cpu_affinity"] for gpu in model["gpus"]] == ["0-11", "0-11"]


def test_cpu_affinity_without_numa_node_round_trips() -> None:
    topo = "xuesongtap__2x1080Ti-desktop__topo-m.txt"
    model, _ = _import("telegraf__dual_2080-v13.xml", topo)
    _assert_topology(_scan(model), (TOPO_DIR / topo).read_text())


def _xml_with_gpus(name: str, count: int) -> str:
    """The capture ``name`` with its first GPU repeated on ``count`` distinct bus ids."""
    root = ET.fromstring((XML_DIR / name).read_bytes())
    template = root.find("gpu")
    assert template is not None
    for gpu in root.findall("gpu"):
        root.remove(gpu)
    for index in range(count):
        gpu = ET.fromstring(ET.tostring(template))
        bus_id = f"00000000:{0x41 + 0x10 * index:02X}:00.0"
        gpu.set("id", bus_id)
        gpu.find("pci/pci_bus_id").text = bus_id  # type: ignore[union-attr]
        gpu.find("uuid").text = f"GPU-{index:08d}-0000-0000-0000-000000000000"  # type: ignore[union-attr]
        root.append(gpu)
    return ET.tostring(root, encoding="unicode")


def test_bridged_pair_gets_direct_nvlinks() -> None:
    topo = (TOPO_DIR / "siboehm-bench__3xRTX-A6000-NVLink-bridge__topo-m.txt").read_text()
    model = model_from_capture(_xml_with_gpus("netdata__tesla-p100.xml", 3), topo, name="ws")
    assert model["nvswitches"] == []
    assert [gpu.get("nvlink_gpu_links") for gpu in model["gpus"]] == [[1] * 4, [0] * 4, None]
    scanned = _scan(model)
    _assert_topology(scanned, topo)
    assert [g.facts.nvlink_count for g in scanned.gpus] == [4, 4, 0]


@pytest.mark.parametrize(
    ("xml", "count", "topo"),
    [
        ("telegraf__a10g.xml", 4, TOPO_DIR / "xuesongtap__4xA10-PCIe__topo-m.txt"),
        (
            "netdata__rtx-4090-driver-535.xml",
            8,
            OWN / "8x-rtx4090-pcie__topo-m_sys-within-numa.txt",
        ),
    ],
    ids=["4xA10", "8xRTX4090"],
)
def test_sys_within_one_numa_node_imports_as_separate_root_complexes(
    xml: str, count: int, topo: Path
) -> None:
    # PCIe boxes with several root complexes: GPUs of one NUMA node are SYS apart.
    text = topo.read_text()
    model = model_from_capture(_xml_with_gpus(xml, count), text, name="pcie")
    roots = [gpu["root_complex"] for gpu in model["gpus"]]
    assert len(set(roots[:4])) > 1
    assert model["sources"]["gpus[].root_complex"].endswith("root complexes synthesized")
    _assert_topology(_scan(model), text)


def test_dgx1_topo_without_numa_column_imports_with_its_nvlink_mesh() -> None:
    # Old topo -m of a DGX-1: NV1/NV2 hybrid cube mesh, no NVSwitch, no NUMA Affinity column.
    topo = (OWN / "dgx1-v100__topo-m_no-numa-column.txt").read_text()
    model = model_from_capture(_xml_with_gpus("netdata__tesla-p100.xml", 8), topo, name="dgx1")
    assert [gpu["numa_node"] for gpu in model["gpus"]] == [0] * 4 + [1] * 4
    assert model["numa_nodes"] == {
        "0": {"socket": 0, "cpus": "0-19,40-59"},
        "1": {"socket": 1, "cpus": "20-39,60-79"},
    }
    assert model["sources"]["gpus[].numa_node"].startswith("derived: ")
    assert model["nvswitches"] == []
    assert model["gpus"][0]["nvlink_gpu_links"] == [1, 2, 3, 3, 4, 4]
    assert [nic["name"] for nic in model["nics"]] == ["mlx5_0", "mlx5_2", "mlx5_1", "mlx5_3"]
    scanned = _scan(model)
    _assert_topology(scanned, topo, numa_nodes=[0] * 4 + [1] * 4)
    assert [g.facts.nvlink_count for g in scanned.gpus] == [6] * 8
    nvml = SimulatedNvml.from_model(model, node_name="dgx1-01")
    nvml.nvmlInit()
    gpu0 = nvml.nvmlDeviceGetHandleByIndex(0)
    assert nvml.nvmlDeviceGetNvLinkVersion(gpu0, 5) == pynvml.NVML_NVLINK_VERSION_1_0  # Pascal
    assert nvml.nvmlDeviceGetNvLinkCapability(gpu0, 5, pynvml.NVML_NVLINK_CAP_P2P_SUPPORTED) == 1


def test_nic_rows_are_kept_in_the_model() -> None:
    topo = (TOPO_DIR / "xuesongtap__8xA100-SXM4-40GB-17NIC__topo-m.txt").read_text()
    model = model_from_smi_text(A100_TEXT.read_text(), topo, name="a100")
    assert [nic["name"] for nic in model["nics"]] == list(parse_topo_matrix(topo).nics)
    assert len(model["nics"]) == 17


def test_node_across_numa_nodes_and_an_empty_cpu_affinity_round_trip() -> None:
    # A Slurm job's topo -m: CPU Affinity "0" on NUMA node 0, empty on NUMA node 1, and every
    # GPU-NIC pair NODE across the two NUMA nodes (one socket's root complex spans both).
    topo = (
        OWN / "hpc-docs__4xA100-NV4__topo-m_empty-cpu-affinity_node-across-numa.txt"
    ).read_text()
    model = model_from_capture(
        _xml_with_gpus("k8s-test-infra__hardware__qx-a100.xml", 4), topo, name="n"
    )
    assert [gpu["numa_node"] for gpu in model["gpus"]] == [0, 0, 1, 1]
    assert model["numa_nodes"] == {"0": {"socket": 0, "cpus": "0"}, "1": {"socket": 0, "cpus": ""}}
    assert model["sources"]["numa_nodes[].socket"].startswith("derived: ")
    scanned = _scan(model)
    _assert_topology(scanned, topo)
    assert [gpu.facts.socket for gpu in scanned.gpus] == [0] * 4


def test_a_level_nearer_than_sys_across_numa_nodes_shares_a_root_complex() -> None:
    paths, roots = synthesize_pcie_paths({(0, 1): "PHB", (0, 2): "SYS", (1, 2): "SYS"}, [0, 1, 1])
    assert roots == [0, 0, 1]
    assert paths[0][0] == paths[1][0] != paths[2][0]


_A100, _H100 = "k8s-test-infra__hardware__qx-a100.xml", "k8s-test-infra__hardware__qx-h100.xml"


@pytest.mark.parametrize(
    ("topo", "xml", "nvlinks"),
    [
        ("alcf-polaris__4xA100-NV4__topo-m_mlx5-empty-cells.txt", _A100, 12),
        ("issue__NVIDIA-nccl-1617__4xH100-NV6__topo-m_nps-numa-3-1-7-5.txt", _H100, 18),
        ("nvlink-test__4xA100-NV4__topo-m_numa-range-0-3.txt", _A100, 12),
        ("hpc-docs__4xA100-NV4__topo-m_empty-cpu-affinity_node-across-numa.txt", _A100, 12),
    ],
    ids=["polaris-numa-3210", "4xH100-NV6-nps", "numa-range-0-3", "slurm-cpuset"],
)
def test_4_gpu_nvlink_boards_round_trip(topo: str, xml: str, nvlinks: int) -> None:
    # 4-GPU boards with direct NVLinks (NV4 x 3 peers on A100, NV6 x 3 on H100): no NVSwitch.
    text = (OWN / topo).read_text()
    model = model_from_capture(_xml_with_gpus(xml, 4), text, name="board")
    assert model["nvswitches"] == []
    scanned = _scan(model)
    _assert_topology(scanned, text)
    assert [gpu.facts.nvlink_count for gpu in scanned.gpus] == [nvlinks] * 4


def test_a_numa_affinity_of_several_nodes_is_kept() -> None:
    # 4x A100 whose every GPU is equally near NUMA nodes 0-3 (CPU Affinity "0,64").
    text = (OWN / "nvlink-test__4xA100-NV4__topo-m_numa-range-0-3.txt").read_text()
    model = model_from_capture(_xml_with_gpus(_A100, 4), text, name="board")
    gpu = model["gpus"][0]
    assert (gpu["numa_node"], gpu["numa_nodes"], gpu["cpu_affinity"]) == (0, [0, 1, 2, 3], "0,64")
    assert model["numa_nodes"]["3"] == {"socket": 3, "cpus": ""}
    assert model["sources"]["numa_nodes.3.cpus"].startswith("assumed: none")
    assert "numa_node is the lowest" in model["sources"]["gpus[].numa_nodes, cpu_affinity"]
    nvml = SimulatedNvml.from_model(model, node_name="imported-01")
    assert nvml.topo_matrix_text().splitlines()[1].split("\t")[6:8] == ["0,64", "0-3"]
    assert [g.facts.numa_affinity for g in scan(nvml).gpus] == ["0-3"] * 4


def test_synthesized_paths_reproduce_every_pcie_level() -> None:
    levels = {
        (0, 1): "PIX", (0, 2): "PXB", (1, 2): "PXB", (0, 3): "PHB", (1, 3): "PHB",
        (2, 3): "PHB", (0, 4): "NODE", (1, 4): "NODE", (2, 4): "NODE", (3, 4): "NODE",
        (0, 5): "SYS", (1, 5): "SYS", (2, 5): "SYS", (3, 5): "SYS", (4, 5): "SYS",
    }  # fmt: skip
    numa = [0, 0, 0, 0, 0, 1]
    model, _ = _import("telegraf__dual_2070-v13.xml")
    model["gpus"] = [
        {**model["gpus"][0], "bus_id": f"00000000:{10 + i:02X}:00.0", "numa_node": numa[i],
         "pcie_path": path}
        for i, path in enumerate(synthesize_pcie_paths(levels, numa)[0])
    ]  # fmt: skip
    model["numa_nodes"] = {"0": {"socket": 0, "cpus": "0-7"}, "1": {"socket": 1, "cpus": "8-15"}}
    matrix = _scan(model).topology.matrix
    assert {(a, b): matrix[a][b] for a, b in levels} == levels


def test_non_transitive_matrix_is_refused() -> None:
    levels = {(0, 1): "PIX", (1, 2): "PIX", (0, 2): "PXB"}
    with pytest.raises(CaptureError) as err:
        synthesize_pcie_paths(levels, [0, 0, 0])
    assert str(err.value) == (
        "inconsistent topo matrix: GPU0-GPU2 is PXB, but the other pairs put them at PIX"
    )


def test_without_topo_every_pair_is_node_and_numa_unknown() -> None:
    model, _ = _import("telegraf__dual_a5000-v13.xml")
    scanned = _scan(model)
    assert scanned.topology.matrix == (("X", "NODE"), ("NODE", "X"))
    assert scanned.topology.numa_nodes == (None, None)
    assert model["sources"]["gpus[].numa_node, pcie_path"].startswith("assumed: no topo -m")


@pytest.mark.parametrize("name", ["netdata__a100-sxm4-mig.xml", "telegraf__a100-sxm4-v12.xml"])
def test_captured_mig_layout_is_rebuilt(name: str) -> None:
    model, log = _import(name)
    layout = _scan(model).gpus[0].mig
    assert layout is not None and layout.enabled
    devices = log.gpus[0].mig_devices
    captured = sorted((d.gpu_instance_id, d.multiprocessor_count) for d in devices)
    scanned = sorted(
        (gi.gi_id, ci.sm_count) for gi in layout.gpu_instances for ci in gi.compute_instances
    )
    assert scanned == captured


@pytest.mark.parametrize(
    ("name", "table"),
    [
        ("nvidia_gpu_exporter__H100-80GB-HBM3-MIG__q-idle_590.48.01.txt", "h100-sxm5-80gb"),
        # 1c.3g.71gb + 2c.3g.71gb in one GI: CIs of 16 and 32 SMs (not 20/40) of 60.
        ("nvidia_gpu_exporter__H200-MIG__q-idle_590.48.01.txt", "h200-sxm5-141gb"),
    ],
)
def test_captured_mig_layout_of_a_text_capture_is_rebuilt(name: str, table: str) -> None:
    text = (REAL / "nvidia-smi-q-text" / name).read_text()
    model = model_from_smi_text(text, name="imported", smi_source=name)
    log = parse_smi_text(text)
    assert [t["mig_table"] for t in model["gpu_types"].values()] == [table]
    layout = _scan(model).gpus[0].mig
    assert layout is not None and layout.enabled
    captured = sorted((d.gpu_instance_id, d.multiprocessor_count) for d in log.gpus[0].mig_devices)
    scanned = sorted(
        (gi.gi_id, ci.sm_count) for gi in layout.gpu_instances for ci in gi.compute_instances
    )
    assert scanned == captured


def test_board_facts_and_sources() -> None:
    model, _ = _import("k8s-test-infra__hardware__qx-h100.xml")
    # GPU 3 has another board part number: two types; idle readings differ within a type.
    assert sorted(model["gpu_types"]) == ["H100-80GB-HBM3", "H100-80GB-HBM3-2"]
    h100 = model["gpu_types"]["H100-80GB-HBM3"]
    assert h100["architecture"] == "NVML_DEVICE_ARCH_HOPPER"
    assert h100["mig_table"] == "h100-sxm5-80gb"
    assert h100["temperature_c"]["shutdown"] == 95  # 29 C + 58 C T.Limit margin + 8
    assert model["system"] == {
        "driver_version": "580.105.08",
        "cuda_driver_version": 13000,
        "nvml_version": "13.580.105.08",
    }
    sources = model["sources"]
    assert "k8s-test-infra__hardware__qx-h100.xml" in sources["gpu_types.H100-80GB-HBM3"]
    assert sources["gpu_types.H100-80GB-HBM3.num_gpu_cores"].startswith("assumed:")


@pytest.mark.parametrize(
    ("name", "idle_mw"),
    [
        ("netdata__rtx-3060.xml", 8_700),  # limits N/A, draw 8.70 W
        ("telegraf__quadro-p400.xml", None),  # limits and draw N/A
        ("telegraf__tesla_p4.xml", None),
        ("telegraf__gt-1030.xml", None),  # limits captured, draw N/A
    ],
)
def test_captured_na_power_draw_is_not_supported(name: str, idle_mw: int | None) -> None:
    model, _ = _import(name)
    nvml = SimulatedNvml.from_model(model, node_name="imported-01")
    nvml.nvmlInit()
    h = nvml.nvmlDeviceGetHandleByIndex(0)
    if idle_mw is None:
        with pytest.raises(pynvml.NVMLError_NotSupported):
            nvml.nvmlDeviceGetPowerUsage(h)
    else:
        assert nvml.nvmlDeviceGetPowerUsage(h) == pytest.approx(idle_mw, rel=0.011)


def test_na_and_disabled_features_are_imported_as_null_and_modes() -> None:
    laptop = next(iter(_import("netdata__rtx-3060.xml")[0]["gpu_types"].values()))
    a5000 = next(iter(_import("telegraf__dual_a5000-v13.xml")[0]["gpu_types"].values()))
    rtx3090 = next(iter(_import("telegraf__rtx-3090-v12.xml")[0]["gpu_types"].values()))
    windows = next(iter(_import("telegraf__rtx-3080-v12.xml")[0]["gpu_types"].values()))
    assert [laptop["power_w"][k] for k in ("default_limit", "min_limit", "max_limit")] == [None] * 3
    assert a5000["ecc"] == {"current": False, "pending": False}
    assert (rtx3090["power_w"]["default_limit"], rtx3090["power_w"]["enforced_limit"]) == (350, 200)
    assert windows["persistence_mode"] is None


def test_old_driver_names_and_unknown_architecture_are_kept() -> None:
    model, _ = _import("telegraf__gtx-1660-ti.xml")
    (spec,) = model["gpu_types"].values()
    assert spec["name"] == "Graphics Device"
    assert spec["architecture"] == "NVML_DEVICE_ARCH_UNKNOWN"
    key = next(k for k in model["sources"] if k.endswith(".architecture"))
    assert model["sources"][key] == "assumed: NVML_DEVICE_ARCH_UNKNOWN (capture says None)"


@pytest.mark.parametrize(
    ("name", "cuda"),
    # 410's -q prints no CUDA Version: NVML still answers CUDA 10.0 (10000), not 0.
    [("smi-q__code-index-44773982537__V100-PCIE-32GB__410.48_no-cuda-version.txt", "10.0")],
)
def test_old_driver_text_capture_round_trips(name: str, cuda: str) -> None:
    text = (OWN / name).read_text()
    model = model_from_smi_text(text, name="old", smi_source=name)
    scanned = _scan(model)
    rows = _fields(parse_smi_text(text), scanned)
    assert [row for row in rows if row[2] != row[3] and row[0] != "cuda_driver_version"] == []
    assert scanned.system.cuda_driver_version == cuda
    assert model["sources"]["system.cuda_driver_version"].startswith("derived: ")


def test_captured_uuid_and_serial_round_trip() -> None:
    model, log = _import("telegraf__dual_a5000-v13.xml")
    facts = [gpu.facts for gpu in _scan(model).gpus]
    assert [f.uuid for f in facts] == [g.uuid for g in log.gpus]
    assert [f.serial for f in facts] == [g.serial for g in log.gpus]


# --------------------------------------------------------------------------- CLI


def test_cli_writes_a_loadable_model(tmp_path: Path) -> None:
    out = tmp_path / "h100.json"
    xml = XML_DIR / "k8s-test-infra__hardware__qx-h100.xml"
    topo = TOPO_DIR / "stas00-ml-engineering__8xH100-SXM__topo-m_no-NICs.txt"
    assert main([str(xml), str(topo), "--name", "h100-imported", "--output", str(out)]) == 0
    model = json.loads(out.read_text())
    assert parse_model(model).name == "h100-imported"
    assert len(model["gpus"]) == 8


def test_cli_prints_to_stdout_and_names_the_model_after_the_file(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main([str(XML_DIR / "k8s-test-infra__hardware__qx-t4.xml")]) == 0
    assert json.loads(capsys.readouterr().out)["name"] == "k8s-test-infra__hardware__qx-t4"


def test_cli_reads_smi_text_too(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([str(A100_TEXT)]) == 0
    assert len(json.loads(capsys.readouterr().out)["gpus"]) == 8


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["/nonexistent/x.xml"], "cannot read /nonexistent/x.xml: No such file or directory"),
        (
            [
                str(XML_DIR / "k8s-test-infra__hardware__qx-a100.xml"),
                str(TOPO_DIR / "stas00-ml-engineering__8xH100-SXM__topo-m_no-NICs.txt"),
            ],
            "stas00-ml-engineering__8xH100-SXM__topo-m_no-NICs.txt shows 8 GPUs but "
            "k8s-test-infra__hardware__qx-a100.xml has 1",
        ),
        (
            [str(XML_DIR / "telegraf__gtx-1070-ti.xml")],
            "telegraf__gtx-1070-ti.xml: no driver version (a trimmed fragment?)",
        ),
    ],
)
def test_cli_errors(
    args: list[str], message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "model.json"
    assert main([*args, "--output", str(out)]) == 2
    assert capsys.readouterr().err == f"gpuadmin sim import: {message}\n"
    assert not out.exists()
