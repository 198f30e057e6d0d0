"""Value helpers shared by the nvidia-smi parsers."""

import pytest

from inventory.nvml.parsers import (
    none_if_na,
    normalize_bus_id,
    parse_bool,
    parse_celsius,
    parse_cpu_list,
    parse_mhz,
    parse_mib,
    parse_percent,
    parse_watts,
)
from inventory.nvml.parsers.common import parse_hex_id, parse_int, strip_ansi

SENTINELS = [
    None,
    "",
    "  ",
    "N/A",
    "[N/A]",
    "Not Supported",
    "[Not Supported]",
    "[Unknown Error]",
    "Requested functionality has been deprecated",
    "[Requested functionality has been deprecated]",
    "[Insufficient Permissions]",
]


@pytest.mark.parametrize("value", SENTINELS)
def test_sentinels_become_none_everywhere(value: str | None) -> None:
    assert none_if_na(value) is None
    for parse in (
        parse_mib,
        parse_watts,
        parse_mhz,
        parse_celsius,
        parse_percent,
        parse_bool,
        parse_int,
        parse_hex_id,
        normalize_bus_id,
        parse_cpu_list,
    ):
        assert parse(value) is None


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("00000000:2F:00.0", "00000000:2F:00.0"),
        ("00000000:2f:00.0", "00000000:2F:00.0"),
        ("0000:2f:00.0", "00000000:2F:00.0"),
        ("PCI:0000:8a:00", "00000000:8A:00.0"),
        ("PCI:0019:01:00", "00000019:01:00.0"),
        ("2f:00.1", "00000000:2F:00.1"),
        ("00000008:06:00.0", "00000008:06:00.0"),
        ("GPU0", None),
        ("0000:zz:00.0", None),
    ],
)
def test_normalize_bus_id(value: str, expected: str | None) -> None:
    assert normalize_bus_id(value) == expected


def test_units() -> None:
    assert parse_mib("81559 MiB") == 81559
    assert parse_mib("81559") == 81559
    assert parse_mib("2 GiB") == 2048
    assert parse_mib("640 bank(s)") is None
    assert parse_watts("66.92 W") == pytest.approx(66.92)
    assert parse_watts(" 66.84 W ") == pytest.approx(66.84)
    assert parse_watts("500 mW") == pytest.approx(0.5)
    assert parse_mhz("1410 MHz") == 1410
    assert parse_celsius("33 C") == 33 and parse_celsius("-5 C") == -5
    assert parse_percent("30 %") == 30 and parse_percent("100.00%") == 100
    assert parse_int("0x10") is None and parse_int("12") == 12


def test_bool_and_ids() -> None:
    assert parse_bool("Enabled") is True and parse_bool("Not Active") is False
    assert parse_bool("Not Active\n            ") is False
    assert parse_bool("Pass-Through") is None
    assert parse_hex_id("0x233510DE") == "233510DE" and parse_hex_id("20b010de") == "20B010DE"
    assert parse_hex_id("[REDACTED]") is None


def test_cpu_list_and_ansi() -> None:
    assert parse_cpu_list("0-3,8") == (0, 1, 2, 3, 8)
    assert parse_cpu_list("-31,64-95") is None
    assert parse_cpu_list("5-1") is None
    assert strip_ansi("\x1b[4mGPU0\tCPU Affinity\x1b[0m") == "GPU0\tCPU Affinity"
