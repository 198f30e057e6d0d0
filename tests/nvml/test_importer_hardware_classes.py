"""Classes of real machines the importer and simulator got wrong (issue 30, "Hardware
fidelity"), each from a real capture in tests/nvml/captures/ (its ``.source.txt`` names where it
was captured): import -> simulator -> the real scanner -> the captured values."""

from __future__ import annotations

from typing import Any

import pynvml
import pytest

from inventory.nvml.parsers import parse_smi_text, parse_topo_matrix
from inventory.nvml.scanner import scan
from inventory.nvml.sim import SimulatedNvml
from inventory.nvml.sim.importer import model_from_capture, model_from_smi_text
from tests.nvml.captures import OWN, REAL, needs_real_captures
from tests.nvml.test_importer import _assert_topology, _fields

GH200 = OWN / "smi-q__thamada-gls__GH200-480GB__550.127.05_mig-disabled_bar1-na.txt"
H100_NVL = OWN / "smi-q__thamada-gls__2xH100-NVL__550.54.14_mig-disabled.txt"
HGX_H100_TOPO = OWN / "code-index-69641790152__8xH100-HBM3-12NIC__topo-m_numa-0-55,112-167.txt"
DELLA_TOPO = (
    OWN / "code-index-23161972012__della-8xH100-6NIC__topo-m_node-across-numa_nic-beside-numa1.txt"
)
H100_XML = OWN / "smi-q-x__gpuadmin-device__H100-80GB-HBM3__580.159.04.xml"
H100_TOPO = OWN / "gpuadmin-device__1xH100-80GB-HBM3__topo-m_gpu-numa-id-column.txt"


def _imported(path: Any) -> tuple[dict[str, Any], SimulatedNvml]:
    model = model_from_smi_text(path.read_text(), name="imported", smi_source=path.name)
    return model, SimulatedNvml.from_model(model, node_name="imported-01")


@pytest.mark.parametrize("capture", [GH200, H100_NVL], ids=["GH200", "H100-NVL"])
def test_mig_capable_boards_without_a_table_scan_back_as_captured(capture: Any) -> None:
    """GH200 and H100 NVL print "MIG Mode Current: Disabled" and the catalog has no MIG table
    for them: the scan gives back MIG disabled (not unknown), and every other captured fact."""
    model, nvml = _imported(capture)
    scanned = scan(nvml)

    assert [
        row for row in _fields(parse_smi_text(capture.read_text()), scanned) if row[2] != row[3]
    ] == []
    assert [(g.facts.mig_enabled, g.facts.mig_pending_enabled) for g in scanned.gpus] == [
        (False, False)
    ] * len(scanned.gpus)
    (key,) = model["gpu_types"]
    assert model["sources"][f"gpu_types.{key}.mig_table"].startswith("not kept: no table")


def test_enabling_mig_without_a_table_is_refused_and_disabling_is_not() -> None:
    _, nvml = _imported(H100_NVL)
    nvml.nvmlInit()
    handle = nvml.nvmlDeviceGetHandleByIndex(0)

    with pytest.raises(pynvml.NVMLError_NotSupported):
        nvml.nvmlDeviceSetMigMode(handle, pynvml.NVML_DEVICE_MIG_ENABLE)
    assert nvml.nvmlDeviceSetMigMode(handle, pynvml.NVML_DEVICE_MIG_DISABLE) == pynvml.NVML_SUCCESS
    assert nvml.nvmlDeviceGetMigMode(handle) == [0, 0]


@needs_real_captures
def test_mig_mode_na_stays_not_supported() -> None:
    capture = REAL / "nvidia-smi-q-text" / "nvidia_gpu_exporter__L40S__q-idle_595.80.txt"
    _, nvml = _imported(capture)
    nvml.nvmlInit()

    with pytest.raises(pynvml.NVMLError_NotSupported):
        nvml.nvmlDeviceGetMigMode(nvml.nvmlDeviceGetHandleByIndex(0))
    assert scan(nvml).gpus[0].facts.mig_enabled is None


def test_bar1_na_scans_back_unknown_and_a_captured_bar1_as_captured() -> None:
    model, nvml = _imported(GH200)
    nvml.nvmlInit()

    (spec,) = model["gpu_types"].values()
    assert (spec["memory"]["bar1_total_mib"], spec["memory"]["bar1_idle_used_mib"]) == (None, None)
    assert model["sources"][
        "gpu_types.GH200-480GB.memory.bar1_total_mib, bar1_idle_used_mib"
    ].startswith("capture says N/A")
    with pytest.raises(pynvml.NVMLError_NotSupported):
        nvml.nvmlDeviceGetBAR1MemoryInfo(nvml.nvmlDeviceGetHandleByIndex(0))
    assert scan(nvml).gpus[0].facts.bar1_total_mib is None
    assert [g.facts.bar1_total_mib for g in scan(_imported(H100_NVL)[1]).gpus] == [131072] * 2


def test_gpu_numa_id_na_stays_not_supported() -> None:
    """The real capture's "GPU NUMA ID" column says N/A (an x86 H100): NOT_SUPPORTED, unknown."""
    model = model_from_capture(H100_XML.read_bytes(), H100_TOPO.read_text(), name="h100")
    nvml = SimulatedNvml.from_model(model, node_name="h100-01")
    nvml.nvmlInit()

    assert "gpu_numa_id" not in model["gpus"][0]
    with pytest.raises(pynvml.NVMLError_NotSupported):
        nvml.nvmlDeviceGetNumaNodeId(nvml.nvmlDeviceGetHandleByIndex(0))
    assert scan(nvml).gpus[0].facts.gpu_numa_node is None
    assert parse_topo_matrix(nvml.topo_matrix_text()).gpus[0].gpu_numa_id is None


def test_a_gpu_numa_id_round_trips_through_topo_m() -> None:
    """A Grace Hopper GPU's own NUMA node (its memory, beside the Grace CPU's node 0): the
    simulator answers nvmlDeviceGetNumaNodeId and prints it in topo -m's "GPU NUMA ID" column,
    which the importer reads back. The GH200 capture has no topo -m: its model says so."""
    model, _ = _imported(GH200)
    assert "gpu_numa_id" in model["sources"]["gpus[].numa_node, pcie_path"]
    model["gpus"][0] |= {"numa_node": 0, "gpu_numa_id": 1}
    model["numa_nodes"] = {"0": {"socket": 0, "cpus": "0-71"}}
    nvml = SimulatedNvml.from_model(model, node_name="gh200-01")
    nvml.nvmlInit()

    assert nvml.nvmlDeviceGetNumaNodeId(nvml.nvmlDeviceGetHandleByIndex(0)) == 1
    facts = scan(nvml).gpus[0].facts
    assert (facts.numa_node, facts.gpu_numa_node) == (0, 1)
    again = model_from_smi_text(GH200.read_text(), nvml.topo_matrix_text(), name="again")
    assert again["gpus"][0]["gpu_numa_id"] == 1


@needs_real_captures
def test_hgx_h100_12_nic_capture_round_trips_with_each_nic_on_its_gpus_node() -> None:
    xml = (REAL / "nvidia-smi-q-xml" / "k8s-test-infra__hardware__qx-h100.xml").read_bytes()
    text = HGX_H100_TOPO.read_text()
    model = model_from_capture(xml, text, name="hgx-h100")

    _assert_topology(scan(SimulatedNvml.from_model(model, node_name="hgx-01")), text)
    # NIC0-5 beside GPU0-3 (NUMA 0), NIC6-11 beside GPU4-7 (NUMA 1).
    assert [nic["numa_node"] for nic in model["nics"]] == [0] * 6 + [1] * 6


@needs_real_captures
def test_nics_beside_the_second_sockets_gpus_are_on_its_numa_node() -> None:
    """Della's 8x H100: every GPU-NIC pair is NODE or PIX across both NUMA nodes. NIC3 and NIC4
    are PIX to GPU4 and NIC5 to GPU6 (node 1), NODE to GPU0 (node 0): the nearest GPU decides."""
    xml = (REAL / "nvidia-smi-q-xml" / "k8s-test-infra__hardware__qx-h100.xml").read_bytes()
    text = DELLA_TOPO.read_text()
    model = model_from_capture(xml, text, name="della")

    assert [(nic["name"], nic["numa_node"]) for nic in model["nics"]] == [
        ("mlx5_0", 0), ("mlx5_1", 0), ("mlx5_2", 0), ("mlx5_3", 1), ("mlx5_4", 1), ("mlx5_5", 1)
    ]  # fmt: skip
    _assert_topology(scan(SimulatedNvml.from_model(model, node_name="della-01")), text)
