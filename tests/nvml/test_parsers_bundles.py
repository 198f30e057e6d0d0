"""Multi-command capture bundles: the ``-L``, ``topo -m``, ``-q`` and ``--query-gpu`` sections of
every bundle go through their parsers, and the sections must agree with each other."""

from pathlib import Path

import pytest

from inventory.nvml.parsers import (
    ParseError,
    parse_gpu_list,
    parse_query_csv,
    parse_smi_text,
    parse_topo_matrix,
    split_capture_bundle,
)
from tests.nvml.captures import REAL, needs_real_captures

pytestmark = needs_real_captures
BUNDLES = sorted(
    p
    for p in (REAL / "capture-bundles").glob("nvidia_gpu_exporter__*-x86_64__*.txt")
    if not p.name.endswith(".source.txt")
)

# Per bundle, read off the file: (driver, GPU name, bus id, fb total MiB, MIG devices in -L,
# topo -m CPU affinity of GPU0, or TOPO_ERROR where that section is an error message).
TOPO_ERROR = "error"
EXPECTED = {
    "linux-x86_64__nvidia-geforce-rtx-2080-super__595.71.05": (
        "595.71.05",
        "NVIDIA GeForce RTX 2080 SUPER",
        "00000000:0C:00.0",
        8192,
        0,
        "0-23",
    ),
    "linux-x86_64__nvidia-geforce-rtx-2080-super__610.57.04": (
        "610.57.04",
        "NVIDIA GeForce RTX 2080 SUPER",
        "00000000:0C:00.0",
        8192,
        0,
        "0-23",
    ),
    "linux-x86_64__nvidia-geforce-rtx-4080-super__595.71.05": (
        "595.71.05",
        "NVIDIA GeForce RTX 4080 SUPER",
        "00000000:01:00.0",
        16376,
        0,
        "0-15",
    ),
    "linux-x86_64__nvidia-h100-80gb-hbm3__590.48.01": (
        "590.48.01",
        "NVIDIA H100 80GB HBM3",
        "00000000:00:09.0",
        81559,
        0,
        "0-19",
    ),
    "linux-x86_64__nvidia-h100-mig__590.48.01": (
        "590.48.01",
        "NVIDIA H100 80GB HBM3",
        "00000000:00:09.0",
        81559,
        4,
        "0-19",
    ),
    "linux-x86_64__nvidia-h200-mig__590.48.01": (
        "590.48.01",
        "NVIDIA H200",
        "00000000:83:00.0",
        143771,
        5,
        "0-23",
    ),
    "linux-x86_64__nvidia-h200__590.48.01": (
        "590.48.01",
        "NVIDIA H200",
        "00000000:83:00.0",
        143771,
        0,
        "0-23",
    ),
    "linux-x86_64__nvidia-l40s__595.80": (
        "595.80",
        "NVIDIA L40S",
        "00000000:01:00.0",
        46068,
        0,
        "0-7",
    ),
    "windows-x86_64__nvidia-geforce-rtx-2080-super__591.86": (
        "591.86",
        "NVIDIA GeForce RTX 2080 SUPER",
        "00000000:0C:00.0",
        8192,
        0,
        TOPO_ERROR,
    ),
    "windows-x86_64__nvidia-geforce-rtx-2080-super__610.62": (
        "610.62",
        "NVIDIA GeForce RTX 2080 SUPER",
        "00000000:0C:00.0",
        8192,
        0,
        None,
    ),
}


def _key(path: Path) -> str:
    return path.stem.removeprefix("nvidia_gpu_exporter__")


def _sections(path: Path, *arguments: str) -> list[str]:
    return [s.body for s in split_capture_bundle(path.read_text()) if s.runs(*arguments)]


@pytest.mark.parametrize("path", BUNDLES, ids=_key)
def test_list_section(path: Path) -> None:
    _, name, _, _, migs, _ = EXPECTED[_key(path)]
    (body,) = _sections(path, "-L")
    (gpu,) = parse_gpu_list(body)
    assert gpu.name == name
    assert len(gpu.mig_devices) == migs


@pytest.mark.parametrize("path", BUNDLES, ids=_key)
def test_topo_section(path: Path) -> None:
    *_, affinity = EXPECTED[_key(path)]
    (body,) = _sections(path, "topo", "-m")
    if affinity == TOPO_ERROR:  # 591.86 on Windows: "ERROR: Option -m is missing its value."
        with pytest.raises(ParseError):
            parse_topo_matrix(body)
        return
    topo = parse_topo_matrix(body)
    assert topo.names == ("GPU0",)
    gpu = topo.device("GPU0")
    # 610.62 on Windows prints empty affinity cells: "GPU0\t X \t\t\t\tN/A"
    assert gpu.cpu_affinity == affinity
    assert gpu.numa_node == (None if affinity is None else 0)
    assert gpu.gpu_numa_id is None


@pytest.mark.parametrize("path", BUNDLES, ids=_key)
def test_query_sections_agree_with_csv(path: Path) -> None:
    driver, name, bus_id, fb_total, migs, _ = EXPECTED[_key(path)]
    texts = _sections(path, "-q")
    csvs = _sections(path, "--query-gpu", "--format=csv")
    assert len(texts) == len(csvs) == 2  # idle and load
    for text, table in zip(texts, csvs, strict=True):
        log = parse_smi_text(text)
        (gpu,) = log.gpus
        (row,) = parse_query_csv(table)
        assert log.driver_version == row["driver_version"] == driver
        assert gpu.product_name == row["name"] == name
        assert gpu.pci_bus_id == row["pci.bus_id"] == bus_id
        assert gpu.fb_memory.total_mib == row["memory.total"] == fb_total
        assert gpu.fb_memory.used_mib == row["memory.used"]  # same second, same value
        assert len(gpu.mig_devices) == migs
        assert gpu.mig_current is (migs > 0) or gpu.mig_current is None
        assert gpu.power.limit_w == row["power.limit"]
        assert isinstance(row["power.draw"], float) and gpu.power.draw_w is not None


def test_load_sections_show_processes_and_utilization() -> None:
    path = (
        REAL
        / "capture-bundles"
        / ("nvidia_gpu_exporter__linux-x86_64__nvidia-h100-80gb-hbm3__590.48.01.txt")
    )
    idle, load = (parse_smi_text(t).gpus[0] for t in _sections(path, "-q"))
    assert idle.gpu_util_pct == 0 and load.gpu_util_pct == 100
    assert load.fb_memory.used_mib == 19818
    assert len(load.processes) == 3 and all(p.pid for p in load.processes)
    (apps_csv,) = [
        s.body
        for s in split_capture_bundle(path.read_text())
        if s.title.startswith("load :: query-compute-apps")
    ]
    apps = parse_query_csv(apps_csv)
    assert sorted(a["pid"] for a in apps) == sorted(p.pid for p in load.processes)
    assert {a["gpu_bus_id"] for a in apps} == {"00000000:00:09.0"}


def test_610_kmd_version_replaces_deprecated_driver_version() -> None:
    path = (
        REAL
        / "capture-bundles"
        / ("nvidia_gpu_exporter__linux-x86_64__nvidia-geforce-rtx-2080-super__610.57.04.txt")
    )
    log = parse_smi_text(_sections(path, "-q")[0])
    assert log.driver_version == "610.57.04"  # not "610.57.04 [Deprecated; ...]"
    assert log.cuda_version == "13.3"
    # 610 nests the limits under "GPU Ceiling Power Limit"
    assert log.gpus[0].power.limit_w == pytest.approx(250.0)
    assert log.gpus[0].power.min_limit_w == pytest.approx(105.0)
