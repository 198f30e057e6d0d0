"""``gpuadmin sim import`` of machines the first importer got wrong: a pre-470 V100 capture
taken under load, captured minor numbers, remapped rows and clock-event reasons."""

from __future__ import annotations

from typing import Any

import pytest

from inventory.nvml import pci_ids
from inventory.nvml.parsers import parse_smi_xml
from inventory.nvml.scanner import NodeScan, scan
from inventory.nvml.sim import SimulatedNvml
from inventory.nvml.sim.importer import model_from_capture, model_from_smi_text
from tests.nvml.captures import OWN, REAL, needs_real_captures

V100S = OWN / "smi-q-x__datakit__8xV100S-PCIE-32GB__460.73.01__gpu0-under-load.xml"
A100_I0 = REAL / "nvidia-smi-q-text" / "xuesongtap__A100-SXM4-40GB__nvidia-smi-i0-q_535.129.03.txt"
REMAPPED = (
    REAL / "nvidia-smi-q-text"
    / "stas00-ml-engineering__A100-SXM4-80GB__q-excerpt_ECC-RemappedRows-pending.txt"
)  # fmt: skip
POWER_BRAKE = OWN / "smi-q__l4rz-idrac__V100-SXM2-32GB__hw-power-brake.txt"


def _scan(model: dict[str, Any]) -> NodeScan:
    return scan(SimulatedNvml.from_model(model, node_name="imported-01"))


def _v100s() -> dict[str, Any]:
    return model_from_capture(V100S.read_text(), name="v100s", smi_source=V100S.name)


def test_pre_470_v100_gets_architecture_and_compute_capability_from_its_pci_id() -> None:
    assert parse_smi_xml(V100S.read_text()).gpus[0].architecture == "Volta"
    model = _v100s()
    (spec,) = model["gpu_types"].values()
    assert spec["architecture"] == "NVML_DEVICE_ARCH_VOLTA"
    assert spec["cuda_compute_capability"] == [7, 0]
    facts = _scan(model).gpus[0].facts
    assert (facts.architecture, facts.compute_capability) == ("Volta", "7.0")
    note = model["sources"]["gpu_types.Tesla-V100S-PCIE-32GB.architecture"]
    assert note.startswith("derived: Volta from PCI device id 1DF610DE")


def test_a_capture_under_load_is_not_the_idle_baseline() -> None:
    model = _v100s()
    (spec,) = model["gpu_types"].values()
    power, memory = spec["power_w"], spec["memory"]
    # Captured: 97 % utilization, 232.80 W of 250 W, 31689 MiB used (31683 MiB by python).
    assert power["idle"] < power["full_load"] <= power["max_limit"] == 250
    assert power["full_load"] == 240.0  # 232.8 W at 97 % -> 100 %
    assert memory["idle_used_mib"] == 6
    assert spec["temperature_c"]["full_load"] == 66
    assert "97 % utilization" in model["sources"]["gpu_types.Tesla-V100S-PCIE-32GB.captured_load"]
    gpu = _scan(model).gpus[0]
    assert gpu.metrics.utilization_gpu_pct == 0
    assert gpu.metrics.power_w < 250 * 0.2
    assert gpu.facts.memory_used_mib == 6


def test_pre_410_xml_gets_its_cuda_version_from_the_driver_branch() -> None:
    # Tesla M10 (Maxwell, 4 GPUs on one board) under vGPU, driver 390.94: no <cuda_version>.
    m10 = OWN / "smi-q-x__check_nvidia_smi__Tesla-M10-vGPU__390.94.xml"
    model = model_from_capture(m10.read_text(), name="m10", smi_source=m10.name)
    assert model["system"]["cuda_driver_version"] == 9010
    assert model["sources"]["system.cuda_driver_version"].startswith("derived: CUDA 9.1")
    scanned = _scan(model)
    assert scanned.system.cuda_driver_version == "9.1"
    facts = scanned.gpus[0].facts
    assert (facts.architecture, facts.compute_capability) == ("Maxwell", "5.0")
    assert facts.memory_used_mib == 8141 - 2 * 4064  # less the two vGPU VMs' memory


def test_scan_gives_back_the_captured_minor_numbers() -> None:
    xml = (REAL / "nvidia-smi-q-xml" / "telegraf__dual_a5000-v13.xml").read_text()
    scanned = _scan(model_from_capture(xml, name="a5000"))
    assert [gpu.facts.minor_number for gpu in scanned.gpus] == [1, 0]
    windows = (REAL / "nvidia-smi-q-xml" / "telegraf__rtx-3080-v12.xml").read_text()
    assert _scan(model_from_capture(windows, name="win")).gpus[0].facts.minor_number is None


def _section(text: str, start: str, end: str | None) -> str:
    """The lines of ``text`` from the one equal to ``start`` up to (without) ``end``."""
    lines = text.splitlines(keepends=True)
    first = lines.index(start)
    last = lines.index(end, first) if end is not None else len(lines)
    return "".join(lines[first:last])


def test_scan_gives_back_captured_remapped_rows_and_clock_event_reasons() -> None:
    """A complete real A100 capture with two real excerpts spliced in (no complete capture has
    them): stas00's Remapped Rows block and l4rz's Clocks Throttle Reasons (HW Power Brake)."""
    text = A100_I0.read_text()
    remapped = _section(REMAPPED.read_text(), "    Remapped Rows\n", "[...]\n")
    brake = _section(POWER_BRAKE.read_text(), "Clocks Throttle Reasons\n", "\n")
    text = text.replace(_section(text, "    Remapped Rows\n", "    Temperature\n"), remapped)
    text = text.replace(
        _section(text, "    Clocks Event Reasons\n", "    FB Memory Usage\n"),
        "".join(f"    {line}" for line in brake.splitlines(keepends=True)),
    )
    model = model_from_smi_text(text, name="a100")
    assert model["initial_state"]["gpus"]["0"]["remapped_rows"]["pending"] is True
    health = _scan(model).gpus[0].health
    assert (
        health.remapped_rows_correctable,
        health.remapped_rows_uncorrectable,
        health.remapped_rows_pending,
        health.remapped_rows_failure,
    ) == (1, 0, True, False)
    assert set(health.throttle_reasons) == {"gpu_idle", "hw_slowdown", "hw_power_brake_slowdown"}


@pytest.mark.parametrize(
    ("device_id", "architecture", "capability"),
    [
        ("102D10DE", "Kepler", (3, 7)),  # K80
        ("15F810DE", "Pascal", (6, 0)),  # P100 PCIe 16GB
        ("1DB110DE", "Volta", (7, 0)),  # V100 SXM2 16GB
        ("1EB810DE", "Turing", (7, 5)),  # T4
        ("223610DE", "Ampere", (8, 6)),  # A10
        ("20B710DE", "Ampere", (8, 0)),  # A30
        ("27B810DE", "Ada Lovelace", (8, 9)),  # L4
        ("233510DE", "Hopper", (9, 0)),  # H200
        ("31C210DE", "Blackwell", (10, 3)),  # GB300
    ],
)
def test_pci_id_table(device_id: str, architecture: str, capability: tuple[int, int]) -> None:
    device = pci_ids.lookup(device_id)
    assert device is not None
    assert (device.architecture, device.compute_capability) == (architecture, capability)


def test_pci_id_table_ignores_other_vendors_and_unknown_ids() -> None:
    assert pci_ids.lookup("1DB11002") is None  # vendor 1002
    assert pci_ids.lookup("220410DE") is None  # GeForce RTX 3090: not in the table
    assert pci_ids.lookup(None) is None


pytestmark = needs_real_captures
