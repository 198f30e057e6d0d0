"""``nvidia-smi -q -x`` parser over every real XML capture in ../shared/fixtures/real."""

from pathlib import Path

import pytest

from inventory.nvml.parsers import ParseError, parse_smi_xml
from tests.nvml.captures import REAL, needs_real_captures

pytestmark = needs_real_captures
XML_FILES = sorted((REAL / "nvidia-smi-q-xml").glob("*.xml"))

# Per capture, read off the file by hand: (number of <gpu>, root driver_version, first GPU's
# product_name, pci bus id, fb_memory_usage/total in MiB).
EXPECTED = {
    "k8s-test-infra__hardware__qx-a100.xml": (
        1,
        "570.148.08",
        "NVIDIA A100-SXM4-40GB",
        "00000000:06:00.0",
        40960,
    ),
    "k8s-test-infra__hardware__qx-b200.xml": (
        8,
        "580.105.08",
        "NVIDIA B200",
        "00000000:8F:00.0",
        183359,
    ),
    "k8s-test-infra__hardware__qx-gb200.xml": (
        4,
        "580.173.02",
        "NVIDIA GB200",
        "00000000:29:00.0",
        189471,
    ),
    "k8s-test-infra__hardware__qx-gb300.xml": (
        4,
        "580.173.02",
        "NVIDIA GB300",
        "00000008:06:00.0",
        284208,
    ),
    "k8s-test-infra__hardware__qx-h100.xml": (
        8,
        "580.105.08",
        "NVIDIA H100 80GB HBM3",
        "00000000:53:00.0",
        81559,
    ),
    "k8s-test-infra__hardware__qx-l40s.xml": (
        1,
        "595.91.07",
        "NVIDIA L40S",
        "00000000:30:00.0",
        46068,
    ),
    "k8s-test-infra__hardware__qx-t4.xml": (1, "595.91.07", "Tesla T4", "00000000:00:1E.0", 15360),
    "netdata__a100-sxm4-mig.xml": (
        1,
        "510.47.03",
        "NVIDIA A100-SXM4-40GB",
        "00000000:00:04.0",
        40960,
    ),
    "netdata__rtx-2080-win.xml": (1, "516.59", "NVIDIA GeForce RTX 2080", "00000000:0A:00.0", 8192),
    "netdata__rtx-3060.xml": (
        1,
        "515.65.01",
        "NVIDIA GeForce RTX 3060 Laptop GPU",
        "00000000:01:00.0",
        6144,
    ),
    "netdata__rtx-4090-driver-535.xml": (
        1,
        "535.86.05",
        "NVIDIA GeForce RTX 4090",
        "00000000:84:00.0",
        24564,
    ),
    "netdata__rtx-pro-6000-driver-580.xml": (
        1,
        None,
        "NVIDIA RTX PRO 6000 Blackwell",
        "00000000:01:00.0",
        None,
    ),
    "netdata__tesla-p100.xml": (1, "510.47.03", "Tesla P100-PCIE-16GB", "00000000:00:04.0", 16384),
    "telegraf__3090-v13.xml": (
        1,
        "590.44.01",
        "NVIDIA GeForce RTX 3090",
        "00000000:09:00.0",
        24576,
    ),
    "telegraf__a100-sxm4-v12.xml": (
        1,
        "535.54.03",
        "NVIDIA A100-SXM4-80GB",
        "00000000:01:00.0",
        81920,
    ),
    "telegraf__a10g.xml": (1, "515.105.01", "NVIDIA A10G", "00000000:00:1E.0", 23028),
    "telegraf__dual_2070-v13.xml": (
        2,
        "590.44.01",
        "NVIDIA GeForce RTX 2070",
        "00000000:01:00.0",
        8192,
    ),
    "telegraf__dual_2080-v13.xml": (
        2,
        "590.44.01",
        "NVIDIA GeForce RTX 2080",
        "00000000:01:00.0",
        8192,
    ),
    "telegraf__dual_a5000-v13.xml": (2, "590.44.01", "NVIDIA RTX A5000", "00000000:81:00.0", 24564),
    "telegraf__gt-1030.xml": (1, "470.74", "NVIDIA GeForce GT 1030", "00000000:2D:00.0", 1998),
    "telegraf__gtx-1070-ti.xml": (1, None, "GeForce GTX 1070 Ti", "00000000:01:00.0", 4096),
    "telegraf__gtx-1660-ti.xml": (1, "418.43", "Graphics Device", "00000000:43:00.0", 5912),
    "telegraf__pro-6000-maxq-blackwell-v13.xml": (
        1,
        "590.44.01",
        "NVIDIA RTX PRO 6000 Blackwell Max-Q Workstation Edition",
        "00000000:61:00.0",
        97887,
    ),
    "telegraf__quadro-p2000-v12.xml": (1, "525.125.06", "Quadro P2000", "00000000:17:00.0", 5120),
    "telegraf__quadro-p400.xml": (1, "418.43", "Quadro P400", "00000000:43:00.0", 1998),
    "telegraf__rtx-3060-v12.xml": (
        1,
        "570.124.04",
        "NVIDIA GeForce RTX 3060",
        "00000000:2D:00.0",
        12288,
    ),
    "telegraf__rtx-3080-v12.xml": (
        1,
        "536.40",
        "NVIDIA GeForce RTX 3080",
        "00000000:04:00.0",
        10240,
    ),
    "telegraf__rtx-3080-v13.xml": (
        1,
        "595.58.03",
        "NVIDIA GeForce RTX 3080",
        "00000000:0C:00.0",
        10240,
    ),
    "telegraf__rtx-3090-v12.xml": (
        1,
        "525.147.05",
        "NVIDIA GeForce RTX 3090",
        "00000000:00:10.0",
        24576,
    ),
    "telegraf__rtx-4000-sff-ada-v13.xml": (
        1,
        "595.84",
        "NVIDIA RTX 4000 SFF Ada Generation",
        "00000000:06:00.0",
        20475,
    ),
    "telegraf__tesla-t4.xml": (1, "515.105.01", "Tesla T4", "00000000:00:1E.0", 15360),
    "telegraf__tesla_p4.xml": (1, "513.46", "GRID P4-1Q", "00000000:00:0B.0", 1024),
}


def _parse(name: str):
    return parse_smi_xml((REAL / "nvidia-smi-q-xml" / name).read_bytes())


@pytest.mark.parametrize("path", XML_FILES, ids=lambda p: p.name)
def test_every_capture_parses_with_expected_values(path: Path) -> None:
    assert path.name in EXPECTED, f"new capture {path.name}: add its verified values"
    count, driver, name, bus_id, fb_total = EXPECTED[path.name]
    log = parse_smi_xml(path.read_bytes())
    assert len(log.gpus) == count
    assert log.driver_version == driver
    first = log.gpus[0]
    assert first.product_name == name
    assert first.pci_bus_id == bus_id
    assert first.fb_memory.total_mib == fb_total
    for gpu in log.gpus:
        assert gpu.uuid is not None and gpu.uuid.startswith("GPU-")
        assert gpu.temperature.gpu_c is not None


def test_h100_8gpu_hgx() -> None:
    log = _parse("k8s-test-infra__hardware__qx-h100.xml")
    assert log.attached_gpus == 8
    assert log.cuda_version == "13.0"
    assert {g.product_name for g in log.gpus} == {"NVIDIA H100 80GB HBM3"}
    assert {g.fb_memory.total_mib for g in log.gpus} == {81559}
    assert [g.pci_bus_id for g in log.gpus] == [
        "00000000:53:00.0",
        "00000000:64:00.0",
        "00000000:75:00.0",
        "00000000:86:00.0",
        "00000000:97:00.0",
        "00000000:A8:00.0",
        "00000000:B9:00.0",
        "00000000:CA:00.0",
    ]
    gpu = log.gpus[0]
    assert gpu.architecture == "Hopper"
    assert gpu.pci_device_id == "233010DE"
    # new-style <gpu_power_readings>: instant draw preferred over the average
    assert gpu.power.draw_w == pytest.approx(68.92)
    assert gpu.power.average_draw_w == pytest.approx(68.57)
    assert gpu.power.limit_w == pytest.approx(700.0)
    assert gpu.power.min_limit_w == pytest.approx(200.0)
    assert gpu.clock_event_reasons == {"gpu_idle"}
    # v13 reports T.Limit margins only: no absolute slowdown/shutdown thresholds
    assert gpu.temperature.slowdown_c is None and gpu.temperature.shutdown_c is None


def test_a100_new_schema_full_record() -> None:
    gpu = _parse("k8s-test-infra__hardware__qx-a100.xml").gpus[0]
    assert gpu.product_brand == "NVIDIA"
    assert gpu.serial == "1650000000001"
    assert gpu.minor_number == 0
    assert gpu.vbios_version == "92.00.45.00.03"
    assert gpu.board_part_number == "692-2G506-0200-003"
    assert gpu.persistence_mode is True
    assert (gpu.mig_current, gpu.mig_pending) == (False, False)
    assert gpu.mig_devices == ()
    assert gpu.fb_memory.reserved_mib == 518
    assert (gpu.fb_memory.used_mib, gpu.fb_memory.free_mib) == (0, 40443)
    assert gpu.bar1_memory.total_mib == 65536
    assert gpu.compute_mode == "Default"
    assert (gpu.gpu_util_pct, gpu.memory_util_pct) == (0, 0)
    assert gpu.fan_speed_pct is None
    assert gpu.performance_state == "P0"
    assert gpu.temperature.gpu_c == 33
    assert gpu.temperature.memory_c == 34
    assert gpu.temperature.slowdown_c == 89
    assert gpu.temperature.shutdown_c == 92
    assert gpu.temperature.max_operating_c == 85
    assert gpu.power.draw_w == pytest.approx(49.68)
    assert gpu.power.default_limit_w == pytest.approx(400.0)
    assert (gpu.clocks.graphics_mhz, gpu.clocks.sm_mhz, gpu.clocks.memory_mhz) == (210, 210, 1215)
    assert (gpu.max_clocks.graphics_mhz, gpu.max_clocks.memory_mhz) == (1410, 1215)
    assert gpu.ecc_current is True and gpu.ecc_pending is True
    assert gpu.ecc_volatile.corrected == 0 and gpu.ecc_aggregate.uncorrected == 0
    assert gpu.retired_pages.single_bit is None  # N/A on A100 (row remapping instead)
    assert gpu.remapped_rows.correctable == 0
    assert gpu.remapped_rows.pending is False and gpu.remapped_rows.failure is False
    assert gpu.virtualization_mode == "Pass-Through"


def test_a100_mig_devices_old_power_schema() -> None:
    log = _parse("netdata__a100-sxm4-mig.xml")
    gpu = log.gpus[0]
    assert gpu.mig_current is True and gpu.mig_pending is True
    assert [(d.index, d.gpu_instance_id, d.compute_instance_id) for d in gpu.mig_devices] == [
        (0, 1, 0),
        (1, 2, 0),
    ]
    assert [d.memory.total_mib for d in gpu.mig_devices] == [19968, 19968]
    assert gpu.mig_devices[0].memory.used_mib == 19
    assert gpu.mig_devices[0].multiprocessor_count == 42
    assert gpu.mig_devices[0].bar1.total_mib == 32767
    # old <power_readings> block
    assert gpu.power.draw_w == pytest.approx(66.92)
    assert gpu.power.limit_w == pytest.approx(400.0)
    # "Not Active\n   " with a line break inside the element is still inactive
    assert gpu.clock_event_reasons == frozenset()
    assert gpu.remapped_rows.correctable is None  # <remapped_rows>N/A</remapped_rows>
    assert gpu.gpu_util_pct is None  # <gpu_util>N/A</gpu_util> in MIG mode


def test_a100_80gb_v12_trimmed_to_one_of_four_gpus() -> None:
    log = _parse("telegraf__a100-sxm4-v12.xml")
    assert log.attached_gpus == 4 and len(log.gpus) == 1
    gpu = log.gpus[0]
    assert [d.gpu_instance_id for d in gpu.mig_devices] == [3, 4, 5, 6]
    assert {d.multiprocessor_count for d in gpu.mig_devices} == {14}
    assert gpu.pci_device_id == "20B210DE"


def test_old_driver_names_and_pascal_ecc_schema() -> None:
    gtx = _parse("telegraf__gtx-1660-ti.xml").gpus[0]
    assert gtx.product_name == "Graphics Device"  # 418.43 did not know the TU116 name
    assert gtx.product_brand == "GeForce"
    assert gtx.architecture is None and gtx.mig_current is None  # elements absent in 418
    assert gtx.serial is None
    assert gtx.fan_speed_pct == 0
    assert gtx.power.draw_w == pytest.approx(8.93) and gtx.power.limit_w == pytest.approx(130.0)
    assert gtx.clock_event_reasons == {"gpu_idle"}  # old <clocks_throttle_reasons>
    assert gtx.max_clocks.memory_mhz == 4001
    assert gtx.fb_memory.reserved_mib is None

    p100 = _parse("netdata__tesla-p100.xml").gpus[0]
    assert p100.product_name == "Tesla P100-PCIE-16GB"  # no "NVIDIA " prefix on old drivers
    assert p100.ecc_current is True
    # <single_bit>/<double_bit> schema: totals from <total>
    assert p100.ecc_aggregate.corrected == 3
    assert p100.ecc_aggregate.uncorrected == 0
    assert p100.retired_pages.single_bit == 0 and p100.retired_pages.pending is False


@pytest.mark.parametrize(
    ("name", "part_number"),
    [
        ("netdata__tesla-p100.xml", "900-2H400-6300-031"),  # 510: <gpu_part_number> only
        ("netdata__a100-sxm4-mig.xml", "692-2G506-0200-003"),
        ("telegraf__quadro-p400.xml", "900-5G212-1701-000"),  # 418
        ("telegraf__gt-1030.xml", None),  # <gpu_part_number>N/A</gpu_part_number>
        ("k8s-test-infra__hardware__qx-a100.xml", "692-2G506-0200-003"),  # 570: both, chip's
        ("telegraf__3090-v13.xml", None),  # <board_part_number>N/A, <gpu_part_number> the chip
    ],
)
def test_board_part_number_old_and_new_tags(name: str, part_number: str | None) -> None:
    assert _parse(name).gpus[0].board_part_number == part_number


def test_trimmed_fragments() -> None:
    ti = _parse("telegraf__gtx-1070-ti.xml")
    assert ti.driver_version is None and ti.attached_gpus is None
    gpu = ti.gpus[0]
    assert gpu.fan_speed_pct == 100
    assert gpu.power.draw_w is None
    assert gpu.clocks.graphics_mhz == 135
    pro = _parse("netdata__rtx-pro-6000-driver-580.xml").gpus[0]
    assert pro.fan_speed_pct == 40  # " 40 % " with padding
    assert pro.temperature.gpu_c == 37
    assert pro.temperature.tlimit_c == 56
    assert pro.power.draw_w == pytest.approx(66.84)  # power_draw N/A -> instant_power_draw


def test_vgpu_guest_and_windows_processes() -> None:
    p4 = _parse("telegraf__tesla_p4.xml").gpus[0]
    assert p4.product_brand == "NVIDIA RTX Virtual Workstation"
    assert p4.virtualization_mode == "VGPU"
    assert p4.persistence_mode is None and p4.minor_number is None
    assert len(p4.processes) == 13
    win = _parse("netdata__rtx-2080-win.xml").gpus[0]
    assert len(win.processes) == 26
    first = win.processes[0]
    assert first.pid == 7724 and first.type == "C+G"
    assert first.name is not None and first.name.endswith("PhoneExperienceHost.exe")
    assert first.used_memory_mib is None  # WDDM: N/A
    assert first.gpu_instance_id is None
    assert any(p.name is None for p in win.processes)  # empty <process_name></process_name>


def test_linux_process_memory() -> None:
    gpu = _parse("telegraf__gt-1030.xml").gpus[0]
    assert gpu.processes[0].pid == 607
    assert gpu.processes[0].name == "/usr/lib/Xorg"
    assert gpu.processes[0].used_memory_mib == 547


def test_redacted_and_odd_device_ids_become_none_or_kept() -> None:
    assert _parse("telegraf__rtx-3090-v12.xml").gpus[0].pci_device_id is None  # [REDACTED]
    assert _parse("telegraf__a10g.xml").gpus[0].pci_device_id == "000000DE"


def test_gb300_non_zero_pci_domain() -> None:
    log = _parse("k8s-test-infra__hardware__qx-gb300.xml")
    assert [g.pci_bus_id for g in log.gpus] == [
        "00000008:06:00.0",
        "00000009:06:00.0",
        "00000018:06:00.0",
        "00000019:06:00.0",
    ]


def test_malformed_xml_raises_parse_error() -> None:
    with pytest.raises(ParseError):
        parse_smi_xml("<nvidia_smi_log><gpu id='x'>")
    with pytest.raises(ParseError):
        parse_smi_xml("<something/>")
