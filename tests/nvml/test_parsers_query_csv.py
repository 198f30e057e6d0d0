"""``--query-gpu ... --format=csv`` parser over every real CSV capture (bundles: see
test_parsers_bundles)."""

import csv
from pathlib import Path

import pytest

from inventory.nvml.parsers import parse_query_csv
from inventory.nvml.parsers.query_csv import ALIASES
from tests.nvml.captures import REAL, needs_real_captures

pytestmark = needs_real_captures
CSV_FILES = sorted((REAL / "query-csv").glob("*.csv"))

# (rows, fields per row, {field: value of the first row}), read off the files.
EXPECTED = {
    "netdata__tesla-p100.csv": (
        1,
        15,
        {
            "name": "Tesla P100-PCIE-16GB",
            "fan.speed": None,
            "memory.free": 16280,
            "power.draw": 28.16,
            "temperature.gpu": 37,
            "clocks.current.memory": 715,
        },
    ),
    "nvidia_gpu_exporter__H100-80GB-HBM3__query-gpu-all-fields-load.csv": (
        1,
        212,
        {
            "memory.total": 81559,
            "memory.used": 19818,
            "utilization.gpu": 100,
            "power.draw.instant": 625.68,
            "pci.bus_id": "00000000:00:09.0",
            "index": 0,
            "display_mode": None,
            "clocks.applications.graphics": None,
            "power.management": None,
            "clocks.max.sm": 1980,
            "edpp_multiplier": 100.0,
            "remapped_rows.histogram.max": 2560,
            "platform.chassis_serial_number": None,
        },
    ),
    "nvidia_gpu_exporter__H100-MIG__query-gpu-all-fields-idle.csv": (
        1,
        212,
        {
            "mig.mode.current": "Enabled",
            "utilization.gpu": None,
            "memory.used": 59,
            "remapped_rows.correctable": None,
            "temperature.memory": 48,
        },
    ),
    "nvidia_gpu_exporter__H200__query-gpu-all-fields-load.csv": (
        1,
        212,
        {
            "name": "NVIDIA H200",
            "memory.total": 143771,
            "power.limit": 700.0,
            "clocks.current.memory": 3201,
            "ecc.errors.uncorrected.aggregate.total": 0,
        },
    ),
    "stas00-ml-engineering__8xH100__query-gpu-name-busid-vbios.csv": (
        2,
        3,
        {
            "name": "NVIDIA H100 80GB HBM3",
            "pci.bus_id": "00000000:04:00.0",
            "vbios_version": "96.00.89.00.01",
        },
    ),
    "xuesongtap__A10__query-gpu-lms.csv": (
        5,
        8,
        {
            "timestamp": "2024/01/16 14:44:16.977",
            "pstate": "P8",
            "temperature.gpu": 25,
            "utilization.gpu": 0,
            "memory.total": 23028,
            "memory.used": 21,
        },
    ),
}


@pytest.mark.parametrize("path", CSV_FILES, ids=lambda p: p.name)
def test_every_capture_parses_with_expected_values(path: Path) -> None:
    assert path.name in EXPECTED, f"new capture {path.name}: add its verified values"
    count, width, values = EXPECTED[path.name]
    rows = parse_query_csv(path.read_text())
    assert len(rows) == count
    assert all(len(row) == width for row in rows)
    for field, value in values.items():
        assert rows[0][field] == value, field


def test_deprecated_and_na_fields_are_none() -> None:
    (row,) = parse_query_csv(
        (
            REAL
            / "query-csv"
            / "nvidia_gpu_exporter__H100-80GB-HBM3__query-gpu-all-fields-load.csv"
        ).read_text()
    )
    deprecated = [
        "display_mode",
        "power.management",
        "clocks.applications.graphics",
        "clocks.applications.memory",
        "clocks.default_applications.graphics",
        "clocks.default_applications.memory",
    ]
    assert [row[f] for f in deprecated] == [None] * 6
    assert row["retired_pages.pending"] is None
    assert row["fan.speed"] is None
    assert not any(isinstance(v, str) and v.startswith("[") for v in row.values())


def test_elided_row_in_paste_is_skipped() -> None:
    rows = parse_query_csv(
        (
            REAL / "query-csv" / "stas00-ml-engineering__8xH100__query-gpu-name-busid-vbios.csv"
        ).read_text()
    )
    assert [r["pci.bus_id"] for r in rows] == ["00000000:04:00.0", "00000000:8B:00.0"]


def test_noheader_nounits() -> None:
    text = "0, NVIDIA A100-SXM4-40GB, 40960, 66.92, 1410, [N/A]\n"
    fields = ["index", "name", "memory.total", "power.draw", "clocks.current.sm", "fan.speed"]
    (row,) = parse_query_csv(text, fields=fields)
    assert row == {
        "index": 0,
        "name": "NVIDIA A100-SXM4-40GB",
        "memory.total": 40960,
        "power.draw": 66.92,
        "clocks.current.sm": 1410,
        "fan.speed": None,
    }


def test_header_units_with_nounits_values() -> None:
    text = "memory.total [MiB], power.draw [W], utilization.gpu [%]\n81559, 68.92, 3\n"
    assert parse_query_csv(text) == [
        {"memory.total": 81559, "power.draw": 68.92, "utilization.gpu": 3}
    ]


def test_empty_input() -> None:
    assert parse_query_csv("") == []


def test_aliases_are_typed_as_their_long_names() -> None:
    """``--query-gpu=clocks.sm,...`` (the short names of --help-query-gpu) with the values of the
    H100 all-fields capture gives what the long names give."""
    text = REAL / "query-csv" / "nvidia_gpu_exporter__H100-80GB-HBM3__query-gpu-all-fields-load.csv"
    header, values = list(csv.reader(text.read_text().splitlines(), skipinitialspace=True))[:2]
    raw = {name.partition(" [")[0]: value for name, value in zip(header, values, strict=True)}
    (by_long,) = parse_query_csv(text.read_text())
    aliases = {alias: long for alias, long in ALIASES.items() if long in raw}
    (row,) = parse_query_csv(", ".join(raw[long] for long in aliases.values()), fields=[*aliases])
    assert {alias: row[alias] for alias in aliases} == {
        a: by_long[name] for a, name in aliases.items()
    }
    assert isinstance(row["clocks.sm"], int) and isinstance(row["gpu.power.draw.instant"], float)
    assert (row["remapped_rows.dbe"], row["clocks.max.mem"]) == (0, 2619)
