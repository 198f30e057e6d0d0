"""``nvidia-smi -q`` text parser over every real text capture (bundles: test_parsers_bundles)."""

from pathlib import Path

import pytest

from inventory.nvml.parsers import ParseError, parse_smi_text
from tests.nvml.captures import REAL, needs_real_captures

pytestmark = needs_real_captures
TEXT_FILES = sorted(
    p for p in (REAL / "nvidia-smi-q-text").glob("*.txt") if not p.name.endswith(".source.txt")
)

# (GPUs in the paste, driver, first product name, first bus id, fb total MiB), read off the files.
EXPECTED = {
    "llm-action__H800__nvidia-smi-q-i0_525.105.17.txt": (
        1,
        "525.105.17",
        "NVIDIA H800",
        "00000000:18:00.0",
        81559,
    ),
    "nvidia_gpu_exporter__H100-80GB-HBM3-MIG__q-idle_590.48.01.txt": (
        1,
        "590.48.01",
        "NVIDIA H100 80GB HBM3",
        "00000000:00:09.0",
        81559,
    ),
    "nvidia_gpu_exporter__H100-80GB-HBM3__q-idle_590.48.01.txt": (
        1,
        "590.48.01",
        "NVIDIA H100 80GB HBM3",
        "00000000:00:09.0",
        81559,
    ),
    "nvidia_gpu_exporter__H200-MIG__q-idle_590.48.01.txt": (
        1,
        "590.48.01",
        "NVIDIA H200",
        "00000000:83:00.0",
        143771,
    ),
    "nvidia_gpu_exporter__H200__q-idle_590.48.01.txt": (
        1,
        "590.48.01",
        "NVIDIA H200",
        "00000000:83:00.0",
        143771,
    ),
    "nvidia_gpu_exporter__L40S__q-idle_595.80.txt": (
        1,
        "595.80",
        "NVIDIA L40S",
        "00000000:01:00.0",
        46068,
    ),
    "nvidia_gpu_exporter__RTX-4080-SUPER__q-idle_595.71.05.txt": (
        1,
        "595.71.05",
        "NVIDIA GeForce RTX 4080 SUPER",
        "00000000:01:00.0",
        16376,
    ),
    "stas00-ml-engineering__A100-SXM4-80GB__q-excerpt_ECC-RemappedRows-pending.txt": (
        1,
        "510.73.08",
        "NVIDIA A100-SXM4-80GB",
        "00000000:10:1C.0",
        None,
    ),
    "stas00-ml-engineering__ECC-Errors-SRAM-uncorrectable.txt": (1, None, None, None, None),
    "xuesongtap__8xA100-SXM4-40GB__nvidia-smi-a_535.129.03.txt": (
        8,
        "535.129.03",
        "NVIDIA A100-SXM4-40GB",
        "00000000:2F:00.0",
        40960,
    ),
    "xuesongtap__A100-SXM4-40GB__nvidia-smi-i0-q_535.129.03.txt": (
        1,
        "535.129.03",
        "NVIDIA A100-SXM4-40GB",
        "00000000:2F:00.0",
        40960,
    ),
}


def _parse(name: str):
    return parse_smi_text((REAL / "nvidia-smi-q-text" / name).read_text())


@pytest.mark.parametrize("path", TEXT_FILES, ids=lambda p: p.name)
def test_every_capture_parses_with_expected_values(path: Path) -> None:
    assert path.name in EXPECTED, f"new capture {path.name}: add its verified values"
    count, driver, name, bus_id, fb_total = EXPECTED[path.name]
    log = parse_smi_text(path.read_text())
    assert len(log.gpus) == count
    assert log.driver_version == driver
    assert log.gpus[0].product_name == name
    assert log.gpus[0].pci_bus_id == bus_id
    assert log.gpus[0].fb_memory.total_mib == fb_total


def test_h800_525_old_labels() -> None:
    log = _parse("llm-action__H800__nvidia-smi-q-i0_525.105.17.txt")
    assert log.attached_gpus == 8 and log.cuda_version == "12.0"
    gpu = log.gpus[0]
    assert gpu.pci_device_id == "232410DE"
    assert gpu.serial == "1651323018291"
    assert gpu.clock_event_reasons == {"gpu_idle"}  # "Clocks Throttle Reasons" section
    assert gpu.power.draw_w == pytest.approx(74.71)  # "Power Readings / Power Draw"
    assert gpu.power.limit_w == pytest.approx(700.0)
    assert gpu.temperature.shutdown_c == 92 and gpu.temperature.slowdown_c == 89
    assert gpu.ecc_current is False  # "Ecc Mode" spelled differently
    assert gpu.ecc_aggregate.corrected is None  # all N/A with ECC off
    assert gpu.remapped_rows.correctable == 0 and gpu.remapped_rows.pending is False


def test_8x_a100_all_gpus() -> None:
    log = _parse("xuesongtap__8xA100-SXM4-40GB__nvidia-smi-a_535.129.03.txt")
    assert [g.minor_number for g in log.gpus] == list(range(8))
    assert log.gpus[1].pci_bus_id == "00000000:35:00.0"
    assert log.gpus[1].uuid == "GPU-20af7308-7522-d66f-fe01-fb6f0551a4b9"
    assert log.gpus[0].power.draw_w == pytest.approx(52.12)
    assert log.gpus[0].fb_memory.reserved_mib == 620


def test_h200_mig_text_devices() -> None:
    gpu = _parse("nvidia_gpu_exporter__H200-MIG__q-idle_590.48.01.txt").gpus[0]
    assert gpu.mig_current is True
    assert [(d.gpu_instance_id, d.compute_instance_id) for d in gpu.mig_devices] == [
        (2, 0),
        (2, 1),
        (3, 0),
        (9, 0),
        (10, 0),
    ]
    assert [d.multiprocessor_count for d in gpu.mig_devices] == [16, 32, 32, 16, 16]
    assert gpu.mig_devices[0].memory.total_mib == 71424  # "Shared FB Memory Usage"
    assert gpu.mig_devices[2].bar1.total_mib == 29618  # "Shared BAR1 Memory"
    assert gpu.power.draw_w == pytest.approx(77.88) and gpu.power.average_draw_w == 78.28
    assert gpu.temperature.tlimit_c == 59 and gpu.temperature.shutdown_c is None
    assert gpu.board_part_number == "695-2G520-0280-001"
    assert gpu.ecc_aggregate.sram_uncorrected == 0  # parity + SEC-DED summed


def test_rtx4080_processes_text_form() -> None:
    gpu = _parse("nvidia_gpu_exporter__RTX-4080-SUPER__q-idle_595.71.05.txt").gpus[0]
    assert len(gpu.processes) == 5
    assert gpu.processes[0].pid == 2165
    assert gpu.processes[0].type == "C+G"
    assert gpu.processes[0].name == "/usr/bin/kwin_wayland"
    assert gpu.processes[0].used_memory_mib == 25
    assert gpu.processes[1].used_memory_mib == 200
    assert gpu.serial is None and gpu.fan_speed_pct == 0
    assert gpu.temperature.shutdown_c == 101


def test_ecc_and_remapped_rows_excerpts() -> None:
    a100 = _parse("stas00-ml-engineering__A100-SXM4-80GB__q-excerpt_ECC-RemappedRows-pending.txt")
    gpu = a100.gpus[0]
    assert gpu.ecc_volatile.dram_corrected == 177 and gpu.ecc_volatile.corrected == 177
    assert gpu.ecc_aggregate.uncorrected == 0
    assert gpu.remapped_rows.correctable == 1
    assert gpu.remapped_rows.pending is True and gpu.remapped_rows.failure is False
    broken = _parse("stas00-ml-engineering__ECC-Errors-SRAM-uncorrectable.txt").gpus[0]
    assert broken.ecc_volatile.sram_uncorrected == 1
    assert broken.ecc_aggregate.sram_uncorrected == 5 and broken.ecc_aggregate.uncorrected == 5


def test_value_column_position_does_not_matter() -> None:
    narrow = "GPU 00000000:2F:00.0\n    FB Memory Usage\n        Total : 40960 MiB\n"
    wide = "GPU 00000000:2F:00.0\n    FB Memory Usage\n        Total" + " " * 60 + ": 40960 MiB\n"
    assert parse_smi_text(narrow).gpus == parse_smi_text(wide).gpus
    assert parse_smi_text(wide).gpus[0].fb_memory.total_mib == 40960


def test_empty_text_raises() -> None:
    with pytest.raises(ParseError):
        parse_smi_text("\n\n")
