"""``nvidia-smi topo -m`` parser over every real topo capture (bundles: test_parsers_bundles)."""

from itertools import permutations
from pathlib import Path

import pytest

from inventory.nvml.parsers import ParseError, parse_topo_matrix
from tests.nvml.captures import OWN, REAL, needs_real_captures

pytestmark = needs_real_captures
# topo -c output ("GPUs with affinity to CPU n") is a different command.
TOPO_FILES = sorted(
    p
    for p in (REAL / "topo").glob("*.txt")
    if not p.name.endswith(".source.txt") and "topo-c" not in p.name
)

# Per file: (device names, GPU0<->GPU1 link, NUMA affinity per GPU), read off the files.
EXPECTED = {
    "gengwg__DGX-1__topo-mp.txt": (
        [f"GPU{i}" for i in range(8)] + [f"mlx5_{i}" for i in range(4)],
        "PIX",
        [0, 0, 0, 0, 1, 1, 1, 1],
    ),
    "gengwg__DGX-A100__topo-m.txt": (
        [f"GPU{i}" for i in range(8)] + [f"mlx5_{i}" for i in range(12)],
        "NV12",
        [3, 3, 1, 1, 7, 7, 5, 5],
    ),
    "issue__NVIDIA-nccl-1453__8xH100-9NIC__topo-m.PARTIAL.txt": (
        [f"GPU{i}" for i in range(8)] + [f"NIC{i}" for i in range(9)],
        "NV18",
        [0, 0, 0, 0, 1, 1, 1, 1],
    ),
    "llm-action__8xA800-SXM4-80GB__topo-matrix.txt": (
        [f"GPU{i}" for i in range(8)] + [f"NIC{i}" for i in range(4)],
        "NV8",
        [0, 0, 0, 0, 1, 1, 1, 1],
    ),
    "llm-action__8xH800__topo-matrix.txt": (
        [f"GPU{i}" for i in range(8)],
        "NV8",
        [0, 0, 0, 0, 1, 1, 1, 1],
    ),
    "nvidia_gpu_exporter__1xH100-VM__topo-m_ANSI.txt": (["GPU0"], None, [0]),
    "siboehm-bench__3xRTX-A6000-NVLink-bridge__topo-m.txt": (
        ["GPU0", "GPU1", "GPU2"],
        "NV4",
        [0, 0, 0],
    ),
    "stas00-ml-engineering__8xH100-SXM__topo-m_no-NICs.txt": (
        [f"GPU{i}" for i in range(8)],
        "NV18",
        [0, 0, 0, 0, 1, 1, 1, 1],
    ),
    "xuesongtap__2x1080Ti-desktop__topo-m.txt": (["GPU0", "GPU1"], "PHB", [None, None]),
    "xuesongtap__4xA10-PCIe__topo-m.txt": (
        ["GPU0", "GPU1", "GPU2", "GPU3", "NIC0", "NIC1"],
        "SYS",
        [0, 0, 0, 0],
    ),
    "xuesongtap__8xA100-SXM4-40GB-17NIC__topo-m.txt": (
        [f"GPU{i}" for i in range(8)] + [f"NIC{i}" for i in range(17)],
        "NV12",
        [0] * 8,
    ),
}


def _parse(name: str):
    return parse_topo_matrix((REAL / "topo" / name).read_text())


@pytest.mark.parametrize("path", TOPO_FILES, ids=lambda p: p.name)
def test_every_capture_parses_with_expected_values(path: Path) -> None:
    assert path.name in EXPECTED, f"new capture {path.name}: add its verified values"
    names, gpu01, numa = EXPECTED[path.name]
    topo = parse_topo_matrix(path.read_text())
    assert list(topo.names) == names
    assert topo.links.get(("GPU0", "GPU1")) == gpu01
    assert [g.numa_node for g in topo.gpus] == numa
    # the matrix is symmetric wherever both cells were printed
    for (a, b), link in topo.links.items():
        assert topo.links.get((b, a), link) == link


def test_dgx_a100_nv12_everywhere_and_affinity() -> None:
    topo = _parse("gengwg__DGX-A100__topo-m.txt")
    gpus = [g.name for g in topo.gpus]
    for a, b in permutations(gpus, 2):
        assert topo.links[(a, b)] == "NV12"
        assert topo.nvlink_count(a, b) == 12
    assert topo.device("GPU0").cpu_affinity == "48-63,176-191"
    assert topo.device("GPU0").cpus == tuple(range(48, 64)) + tuple(range(176, 192))
    assert topo.device("GPU4").cpus[0] == 112
    assert topo.links[("GPU0", "mlx5_0")] == "PXB"
    assert topo.links[("mlx5_0", "mlx5_1")] == "PXB"
    assert topo.links[("mlx5_10", "mlx5_11")] == "PIX"
    assert topo.nvlink_count("GPU0", "mlx5_0") == 0
    assert not topo.device("mlx5_0").is_gpu and topo.device("mlx5_0").cpu_affinity is None
    assert topo.nic_names == {}  # old-style mlx5_N columns: no NIC legend


def test_17_nic_capture_keeps_nic_legend_and_gpu_numa_id_column() -> None:
    topo = _parse("xuesongtap__8xA100-SXM4-40GB-17NIC__topo-m.txt")
    assert len(topo.nic_names) == 17
    assert topo.nic_names["NIC0"] == "mlx5_2"
    assert topo.nic_names["NIC15"] == "mlx5_17"
    assert topo.nic_names["NIC16"] == "mlx5_bond_0"
    assert topo.links[("GPU0", "NIC0")] == "PXB"
    assert topo.links[("NIC16", "GPU7")] == "SYS"
    assert topo.links[("NIC0", "NIC1")] == "PIX"
    gpu0 = topo.device("GPU0")
    assert gpu0.cpu_affinity == "0-103" and len(gpu0.cpus) == 104
    assert gpu0.gpu_numa_id is None  # N/A


def test_h100_partial_paste_with_empty_tab_before_gpu_numa_id() -> None:
    topo = _parse("issue__NVIDIA-nccl-1453__8xH100-9NIC__topo-m.PARTIAL.txt")
    assert topo.device("GPU4").cpu_affinity == "80-159"
    assert topo.links[("GPU0", "NIC8")] == "PIX"
    assert topo.links[("NIC4", "GPU4")] == "PIX"
    assert ("NIC5", "GPU0") not in topo.links  # the paste stops after NIC4's row
    assert topo.nvlink_count("GPU3", "GPU6") == 18


def test_ansi_header_single_gpu_vm() -> None:
    topo = _parse("nvidia_gpu_exporter__1xH100-VM__topo-m_ANSI.txt")
    gpu = topo.device("GPU0")
    assert gpu.cpu_affinity == "0-19" and gpu.numa_node == 0 and gpu.gpu_numa_id is None
    assert topo.links == {}


def test_h800_truncated_cpu_affinity_kept_raw() -> None:
    topo = _parse("llm-action__8xH800__topo-matrix.txt")
    assert topo.device("GPU0").cpu_affinity == "-31,64-95"
    assert topo.device("GPU0").cpus is None  # cut by the author's paste: not guessed
    assert topo.device("GPU4").cpus == tuple(range(32, 64)) + tuple(range(96, 128))
    assert topo.nic_names["NIC3"] == "mlx5_3"  # trailing spaces stripped


def test_crlf_and_space_separated_paste() -> None:
    topo = _parse("llm-action__8xA800-SXM4-80GB__topo-matrix.txt")
    assert topo.device("GPU7").numa_node == 1
    assert topo.links[("GPU7", "NIC3")] == "PIX"
    assert topo.nic_names["NIC0"] == "mlx5_0"


def test_pcie_only_and_nvlink_bridge() -> None:
    a6000 = _parse("siboehm-bench__3xRTX-A6000-NVLink-bridge__topo-m.txt")
    assert a6000.nvlink_count("GPU0", "GPU1") == 4
    assert a6000.nvlink_count("GPU1", "GPU2") == 0
    assert a6000.links[("GPU2", "GPU0")] == "NODE"
    desktop = _parse("xuesongtap__2x1080Ti-desktop__topo-m.txt")
    assert desktop.device("GPU1").cpus == tuple(range(12))


def test_error_output_raises() -> None:
    with pytest.raises(ParseError):
        parse_topo_matrix("ERROR: Option -m is missing its value. Please run 'nvidia-smi -h'\n")


def test_nic_columns_give_gpu_nic_affinity_by_legend_name() -> None:
    topo = _parse("xuesongtap__4xA10-PCIe__topo-m.txt")
    legend = topo.nic_names
    assert topo.nics == tuple(legend[f"NIC{i}"] for i in range(2))
    links = topo.nic_links()
    assert set(links) == {"GPU0", "GPU1", "GPU2", "GPU3"}
    assert all(set(row) == set(topo.nics) for row in links.values())
    assert "NUMA Affinity" in topo.columns


def test_old_dgx1_paste_has_mlx5_columns_and_no_numa_column() -> None:
    topo = parse_topo_matrix((OWN / "dgx1-v100__topo-m_no-numa-column.txt").read_text())
    assert topo.columns == ("CPU Affinity",)
    assert topo.nics == ("mlx5_0", "mlx5_2", "mlx5_1", "mlx5_3")
    assert topo.nic_links()["GPU0"] == {
        "mlx5_0": "PIX", "mlx5_2": "SYS", "mlx5_1": "PHB", "mlx5_3": "SYS",
    }  # fmt: skip
    assert topo.nvlink_count("GPU0", "GPU3") == 2


def test_numa_affinity_range_is_kept() -> None:
    text = "\tGPU0\tCPU Affinity\tNUMA Affinity\nGPU0\t X \t0-63\t0-1\n"
    (gpu,) = parse_topo_matrix(text).gpus
    assert gpu.numa_nodes == (0, 1)
    assert gpu.numa_node == 0  # the lowest, as nvmlDeviceGetMemoryAffinity's lowest bit
