"""Kernel Xid line parser over every real kernel-log capture."""

from pathlib import Path

import pytest

from inventory.nvml.parsers import normalize_bus_id, parse_xid_line, parse_xid_log
from tests.nvml.captures import OWN, REAL, needs_real_captures

pytestmark = needs_real_captures
LOG_FILES = sorted(
    p for p in (REAL / "xid-logs").iterdir() if p.is_file() and not p.name.endswith(".source.txt")
)

# (number of Xid events, [xid codes in order of first appearance], first event's bus id),
# read off the files.
EXPECTED = {
    "gpud__dmesg-decode-iso-xid13.log": (17, [13, 43], "00000000:38:00.0"),
    "gpud__dmesg-with-xid-119.log": (5, [119], "00000000:9B:00.0"),
    "gpud__kmsg-nvswitch.log": (0, [], None),
    "issue__Bumblebee-Project-Bumblebee-677__xid32-xid31-legacy.log": (
        3,
        [32, 31],
        "00000000:01:00.0",
    ),
    "issue__NVIDIA-NVSentinel-155__fallen-off-bus-without-xid.log": (0, [], None),
    "issue__NVIDIA-nvidia-docker-849__xid48-xid63.log": (2, [48, 63], "00000000:8A:00.0"),
    "issue__NVIDIA-open-gpu-kernel-modules-1045__reset-required-RTX5080.log": (0, [], None),
    "issue__NVIDIA-open-gpu-kernel-modules-1150__xid45-caused-by-145-149.log": (
        7,
        [45],
        "00000000:DC:00.0",
    ),
    "issue__NVIDIA-open-gpu-kernel-modules-1230__gsp-heartbeat-timeout-GH100.log": (0, [], None),
    "issue__akash-network-support-244__xid43-xid31-xid94.log": (
        4,
        [43, 31, 94],
        "00000000:00:05.0",
    ),
    "issue__leptonai-gpud-1160-1174__xid144-145-149-nvlink5.log": (
        5,
        [144, 149, 145],
        "00000000:01:00.0",
    ),
    "issue__leptonai-gpud-46__xid13-xid109.log": (4, [13, 109], "00000000:CB:00.0"),
    "issue__leptonai-gpud-500__gpud-scan-xid119.txt": (5, [119], "00000000:9B:00.0"),
    "issue__vllm-project-vllm-40652__xid119-gsp-timeout-8xA100.log": (2, [119], "00000001:6C:00.0"),
    "stas00-ml-engineering__xid63-row-remapper.log": (1, [63], "00000000:10:1C.0"),
}


def _events(name: str):
    return parse_xid_log((REAL / "xid-logs" / name).read_text(errors="replace"))


@pytest.mark.parametrize("path", LOG_FILES, ids=lambda p: p.name)
def test_every_log_parses_with_expected_values(path: Path) -> None:
    assert path.name in EXPECTED, f"new capture {path.name}: add its verified values"
    count, codes, first_bus = EXPECTED[path.name]
    events = parse_xid_log(path.read_text(errors="replace"))
    assert len(events) == count
    assert list(dict.fromkeys(e.xid for e in events)) == codes
    assert (events[0].pci_bus_id if events else None) == first_bus


def test_pid_name_and_timestamps() -> None:
    first = _events("gpud__dmesg-with-xid-119.log")[0]
    assert (first.xid, first.pid, first.process_name) == (119, 2024380, "nvidia-smi")
    assert first.timestamp == "Sun Feb 23 16:24:18 2025"
    assert first.message.startswith("Timeout after 6s of waiting for RPC response from GPU4 GSP!")
    iso = _events("gpud__dmesg-decode-iso-xid13.log")[0]
    assert iso.pid is None and iso.process_name is None  # pid='<unknown>', name=<unknown>
    assert iso.timestamp == "2025-01-21T04:41:44,283302+00:00"
    legacy = _events("issue__Bumblebee-Project-Bumblebee-677__xid32-xid31-legacy.log")[2]
    assert legacy.timestamp == "24128.834365" and legacy.pid is None
    assert legacy.message == "Ch 00000003, engmask 00000101, intr 10000000"


def test_pid_without_name_and_caused_by() -> None:
    (row_remap,) = _events("stas00-ml-engineering__xid63-row-remapper.log")
    assert row_remap.pid == 1896 and row_remap.process_name is None
    assert row_remap.message.startswith("Row Remapper: New row marked for remapping")
    caused = _events("issue__NVIDIA-open-gpu-kernel-modules-1150__xid45-caused-by-145-149.log")
    assert [e.caused_by_xid for e in caused[:2]] == [149, 145]
    assert caused[0].process_name == "python3" and caused[0].timestamp is None


def test_nvlink5_grace_domains_and_gsp_banners() -> None:
    events = _events("issue__leptonai-gpud-1160-1174__xid144-145-149-nvlink5.log")
    assert [e.pci_bus_id for e in events[-2:]] == ["00000019:01:00.0", "00000018:01:00.0"]
    assert events[0].message.startswith("SAW_MVB Nonfatal")
    # _kgspLogXid119 banner lines are not events; only the two real Xid lines are
    vllm = _events("issue__vllm-project-vllm-40652__xid119-gsp-timeout-8xA100.log")
    assert [e.pid for e in vllm] == [10200, 10200]


def test_quoted_tool_output() -> None:
    first = _events("issue__leptonai-gpud-500__gpud-scan-xid119.txt")[0]
    assert first.message.endswith("(0x20801702 0x4).")
    assert first.process_name == "python"


def test_fallen_off_the_bus_line() -> None:
    event = parse_xid_line(
        "[ 1843.308145] NVRM: Xid (PCI:0000:8a:00): 79, pid=1234, name=python, "
        "GPU has fallen off the bus."
    )
    assert event is not None
    assert (event.xid, event.pci_bus_id, event.pid) == (79, "00000000:8A:00.0", 1234)
    assert event.message == "GPU has fallen off the bus."
    assert event.pci_bus_id == normalize_bus_id("00000000:8A:00.0")
    assert parse_xid_line("NVRM: GPU at PCI:0000:00:05: GPU-efbdfde9") is None


@pytest.mark.parametrize(
    ("line", "timestamp"),
    [
        (  # journalctl -k / /var/log/syslog (a public llama-server report)
            "May 15 08:57:36 red kernel: NVRM: Xid (PCI:0000:01:00): 31, pid=80798, "
            "name=llama-server, Ch 00000008, intr 00000000.",
            "May 15 08:57:36",
        ),
        (  # journalctl -o short-precise, a one-digit day
            "Sep  2 14:25:44.984246 host kernel: NVRM: Xid (PCI:0000:01:00): 79, "
            "GPU has fallen off the bus.",
            "Sep  2 14:25:44.984246",
        ),
        (  # syslog time and the kernel's: the kernel's wins
            "May 10 22:25:01 jambi kernel: [176830.774761] NVRM: Xid (0000:03:00): 13, 0003",
            "176830.774761",
        ),
    ],
)
def test_syslog_prefixed_lines_keep_the_syslog_time(line: str, timestamp: str) -> None:
    event = parse_xid_line(line)
    assert event is not None and event.timestamp == timestamp


def test_old_driver_lines_without_pci_prefix() -> None:
    log = (OWN / "xid__ubuntuforums-2012__geforce-8500gt-no-pci-prefix.log").read_text()
    (event,) = parse_xid_log(log)
    assert (event.xid, event.pci_bus_id, event.pid) == (13, "00000000:03:00.0", None)
    assert event.timestamp == "176830.774761"
    assert event.message == "0003 00000000 00008297 00001098 00000000 00000044"
    log = (OWN / "xid__ubuntuforums-2012__geforce-6200-xid8-no-pci-prefix.log").read_text()
    (event,) = parse_xid_log(log)  # the os_schedule line mentions NVRM but is no Xid
    assert (event.xid, event.pci_bus_id, event.message) == (
        8,
        "00000000:01:00.0",
        "Channel 00000020",
    )


def test_message_repeating_the_nvrm_tag() -> None:
    log = (OWN / "xid__nvidia-forums-60990__396.24-tex-exception-nested-nvrm.log").read_text()
    events = parse_xid_log(log)
    assert [e.xid for e in events] == [13, 13]
    assert events[0].message.startswith("Graphics TEX Exception on (GPC 0, TPC 0):")


def test_mig_attributed_lines_keep_their_gpu_instance() -> None:
    # NVIDIA's examples: a contained 94 attributed to GPU instance 5, the same without MIG,
    # and an uncontained 95 (no instance: the whole GPU).
    log = (OWN / "xid__nvidia-a100-mem-error-mgmt__xid94-95-mig-gpu-i.log").read_text()
    events = parse_xid_log(log)

    assert [(e.xid, e.gpu_instance_id, e.compute_instance_id, e.pid) for e in events] == [
        (94, 5, None, 7194),
        (94, None, None, 7062),
        (95, None, None, 7062),
    ]
    assert {e.pci_bus_id for e in events} == {"00000000:01:00.0"}
    assert events[0].message == "Contained: CE User Channel (0x9). RST: No, D-RST: No"


def test_gpu_and_compute_instance_attribution() -> None:
    # Formatted by the driver's own format string for an error attributed to both
    # ("NVRM: Xid (PCI:%04x:%02x:%02x GPU-I:%02u GPU-CI:%02u): %d, pid=%s, name=%s, %s").
    event = parse_xid_line(
        "NVRM: Xid (PCI:0000:3b:00 GPU-I:01 GPU-CI:02): 13, pid=9, name=python, Graphics Exception"
    )
    assert event is not None
    assert (event.xid, event.gpu_instance_id, event.compute_instance_id) == (13, 1, 2)
    assert (event.pci_bus_id, event.process_name) == ("00000000:3B:00.0", "python")
