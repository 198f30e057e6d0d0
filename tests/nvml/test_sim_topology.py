"""Topology on the simulator reproduces the captured ``nvidia-smi topo -m`` matrices."""

from __future__ import annotations

import pynvml
import pytest

from inventory.nvml.parsers import parse_topo_matrix
from inventory.nvml.scanner import scan
from inventory.nvml.sim import SimulatedNvml
from inventory.nvml.sim.model import load_model, parse_model
from tests.nvml.captures import OWN

# topo -m legend -> NVML topology level
LEVEL = {
    "PIX": pynvml.NVML_TOPOLOGY_SINGLE,
    "PXB": pynvml.NVML_TOPOLOGY_MULTIPLE,
    "PHB": pynvml.NVML_TOPOLOGY_HOSTBRIDGE,
    "NODE": pynvml.NVML_TOPOLOGY_NODE,
    "SYS": pynvml.NVML_TOPOLOGY_SYSTEM,
}


DGX_H100_TOPO = "code-index-69641790152__8xH100-HBM3-12NIC__topo-m_numa-0-55,112-167.txt"


def _sim(model: str) -> tuple[SimulatedNvml, list[object]]:
    nvml = SimulatedNvml.from_model(model, node_name="topo-01")
    nvml.nvmlInit()
    return nvml, [nvml.nvmlDeviceGetHandleByIndex(i) for i in range(nvml.nvmlDeviceGetCount())]


def _cpulist(words: object) -> str:
    """Bitmask words -> "48-63,176-191", the way topo -m prints CPU affinity."""
    cpus = [w * 64 + b for w, word in enumerate(words) for b in range(64) if word >> b & 1]
    ranges: list[list[int]] = []
    for cpu in cpus:
        if ranges and cpu == ranges[-1][1] + 1:
            ranges[-1][1] = cpu
        else:
            ranges.append([cpu, cpu])
    return ",".join(f"{a}-{b}" if a != b else str(a) for a, b in ranges)


def _nv_matrix(nvml: SimulatedNvml, handles: list[object]) -> list[list[str]]:
    """topo -m GPU block: NV<links> where NVLink P2P is OK, else the PCIe level."""
    names = {v: k for k, v in LEVEL.items()}
    out = []
    for a in handles:
        links = 0
        for link in range(pynvml.NVML_NVLINK_MAX_LINKS):
            try:
                links += nvml.nvmlDeviceGetNvLinkState(a, link)
            except pynvml.NVMLError_NotSupported:
                break
        row = []
        for b in handles:
            if a is b:
                row.append("X")
            elif (
                nvml.nvmlDeviceGetP2PStatus(a, b, pynvml.NVML_P2P_CAPS_INDEX_NVLINK)
                == pynvml.NVML_P2P_STATUS_OK
            ):
                row.append(f"NV{links}")
            else:
                row.append(names[nvml.nvmlDeviceGetTopologyCommonAncestor(a, b)])
        out.append(row)
    return out


def test_dgx_a100_matrix_is_nv12_everywhere_with_captured_affinity() -> None:
    # topo/gengwg__DGX-A100__topo-m.txt
    nvml, handles = _sim("dgx-a100-40gb")

    matrix = _nv_matrix(nvml, handles)

    assert matrix == [["X" if i == j else "NV12" for j in range(8)] for i in range(8)]
    assert [_cpulist(nvml.nvmlDeviceGetCpuAffinity(h, 4)) for h in handles] == [
        "48-63,176-191",
        "48-63,176-191",
        "16-31,144-159",
        "16-31,144-159",
        "112-127,240-255",
        "112-127,240-255",
        "80-95,208-223",
        "80-95,208-223",
    ]
    nodes = [nvml.nvmlDeviceGetMemoryAffinity(h, 1, pynvml.NVML_AFFINITY_SCOPE_NODE)[0]
             for h in handles]  # fmt: skip
    assert nodes == [1 << 3, 1 << 3, 1 << 1, 1 << 1, 1 << 7, 1 << 7, 1 << 5, 1 << 5]


def test_dgx_a100_pcie_levels_behind_the_nvlinks() -> None:
    nvml, h = _sim("dgx-a100-40gb")

    assert nvml.nvmlDeviceGetTopologyCommonAncestor(h[0], h[0]) == pynvml.NVML_TOPOLOGY_INTERNAL
    assert nvml.nvmlDeviceGetTopologyCommonAncestor(h[0], h[1]) == LEVEL["PXB"]
    assert nvml.nvmlDeviceGetTopologyCommonAncestor(h[0], h[2]) == LEVEL["SYS"]
    assert nvml.nvmlDeviceGetTopologyNearestGpus(h[0], LEVEL["PXB"]) == [h[1]]
    assert len(nvml.nvmlDeviceGetTopologyNearestGpus(h[0], LEVEL["SYS"])) == 7


def test_topo_c_lists_the_gpus_near_a_cpu() -> None:
    # topo/gengwg__DGX-A100__topo-c.txt: CPU 48 -> GPUs 0,1; CPU 222 -> GPUs 6,7
    nvml, h = _sim("dgx-a100-40gb")

    assert nvml.nvmlSystemGetTopologyGpuSet(48) == [h[0], h[1]]
    assert nvml.nvmlSystemGetTopologyGpuSet(222) == [h[6], h[7]]


def test_dgx_a100_nvlinks_go_to_six_nvswitches() -> None:
    nvml, h = _sim("dgx-a100-40gb")

    remotes = [nvml.nvmlDeviceGetNvLinkRemotePciInfo(h[0], link) for link in range(12)]

    assert {nvml.nvmlDeviceGetNvLinkRemoteDeviceType(h[0], link) for link in range(12)} == {
        pynvml.NVML_NVLINK_DEVICE_TYPE_SWITCH
    }
    assert len({r.busId for r in remotes}) == 6
    assert {r.pciDeviceId for r in remotes} == {0x1AF110DE}  # lspci 10de:1af1
    # An A100 answers the enum NVLINK_VERSION_3_1 (5), as real ones do (open-mpi/hwloc#658).
    assert nvml.nvmlDeviceGetNvLinkVersion(h[0], 0) == pynvml.NVML_NVLINK_VERSION_3_1
    # nvlink/cloud-atlas__A100-SXM4-80GB__nvlink-capabilities.txt
    caps = [nvml.nvmlDeviceGetNvLinkCapability(h[0], 11, c) for c in range(6)]
    assert caps == [1, 1, 1, 1, 1, 0]
    with pytest.raises(pynvml.NVMLError_NotSupported):  # link 12 does not exist on A100
        nvml.nvmlDeviceGetNvLinkState(h[0], 12)
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        nvml.nvmlDeviceGetNvLinkState(h[0], pynvml.NVML_NVLINK_MAX_LINKS)


def test_dgx_h100_matrix_is_nv18_with_the_captured_numa_layout() -> None:
    """A real 8x H100 NV18 capture: 2x 56 cores with SMT, as a DGX H100's 2x Xeon 8480C."""
    captured = parse_topo_matrix((OWN / DGX_H100_TOPO).read_text()).gpus
    nvml, handles = _sim("dgx-h100")

    matrix = _nv_matrix(nvml, handles)

    assert matrix == [["X" if i == j else "NV18" for j in range(8)] for i in range(8)]
    assert [_cpulist(nvml.nvmlDeviceGetCpuAffinity(h, 4)) for h in handles] == [
        gpu.cpu_affinity for gpu in captured
    ]
    assert [gpu.facts.numa_node for gpu in scan(nvml).gpus] == [gpu.numa_node for gpu in captured]
    assert nvml.nvmlDeviceGetNvLinkVersion(handles[0], 17) == pynvml.NVML_NVLINK_VERSION_4_0
    assert nvml.nvmlDeviceGetTopologyCommonAncestor(handles[0], handles[1]) == LEVEL["NODE"]


def test_pcie_box_shows_pix_node_and_sys_and_no_nvlink() -> None:
    nvml, handles = _sim("pcie-l40s-4x")

    matrix = _nv_matrix(nvml, handles)

    assert matrix == [
        ["X", "PIX", "SYS", "SYS"],
        ["PIX", "X", "SYS", "SYS"],
        ["SYS", "SYS", "X", "NODE"],
        ["SYS", "SYS", "NODE", "X"],
    ]
    assert [_cpulist(nvml.nvmlDeviceGetCpuAffinity(h, 2)) for h in handles] == (
        ["0-31,64-95"] * 2 + ["32-63,96-127"] * 2
    )
    read = 0  # pynvml.NVML_P2P_CAPS_INDEX_READ is the tuple (0,) in pynvml 13
    assert nvml.nvmlDeviceGetP2PStatus(handles[0], handles[1], read) == pynvml.NVML_P2P_STATUS_OK
    assert (
        nvml.nvmlDeviceGetP2PStatus(handles[0], handles[2], read)
        == pynvml.NVML_P2P_STATUS_IOH_TOPOLOGY_NOT_SUPPORTED
    )
    for link in (0, 5):
        with pytest.raises(pynvml.NVMLError_NotSupported):
            nvml.nvmlDeviceGetNvLinkState(handles[0], link)


def test_p2p_with_pynvml_read_constant_fails_like_the_real_binding() -> None:
    nvml, h = _sim("pcie-l40s-4x")

    with pytest.raises(Exception, match="argument 3") as info:
        nvml.nvmlDeviceGetP2PStatus(h[0], h[1], pynvml.NVML_P2P_CAPS_INDEX_READ)
    assert type(info.value).__name__ == "ArgumentError"


def test_numa_node_id_is_not_supported_on_x86_like_the_captures() -> None:
    # Every x86 topo -m capture prints "GPU NUMA ID: N/A"; the CPU-side node comes from
    # nvmlDeviceGetMemoryAffinity instead.
    nvml, h = _sim("rtx-4080-super")

    with pytest.raises(pynvml.NVMLError_NotSupported):
        nvml.nvmlDeviceGetNumaNodeId(h[0])
    assert nvml.nvmlDeviceGetMemoryAffinity(h[0], 1, pynvml.NVML_AFFINITY_SCOPE_NODE)[0] == 1
    assert _cpulist(nvml.nvmlDeviceGetCpuAffinity(h[0], 1)) == "0-15"


DGX1_TOPO = OWN / "dgx1-v100__topo-m_no-numa-column.txt"


def test_dgx1_prints_the_captured_hybrid_cube_mesh_and_nic_affinity() -> None:
    nvml, _ = _sim("dgx-1-v100")
    captured = parse_topo_matrix(DGX1_TOPO.read_text())
    printed = parse_topo_matrix(nvml.topo_matrix_text())

    gpus = [device.name for device in captured.gpus]
    assert {(a, b): printed.links[(a, b)] for a in gpus for b in gpus if a != b} == {
        (a, b): captured.links[(a, b)] for a in gpus for b in gpus if a != b
    }
    assert printed.nic_links() == captured.nic_links()
    assert printed.nic_names == {f"NIC{i}": f"mlx5_{i}" for i in range(4)}
    assert [d.cpu_affinity for d in printed.gpus] == [d.cpu_affinity for d in captured.gpus]
    assert [d.numa_node for d in printed.gpus] == [0] * 4 + [1] * 4


def test_dgx1_direct_nvlinks_answer_version_capability_and_remote_gpu() -> None:
    nvml, h = _sim("dgx-1-v100")
    bus = [nvml.nvmlDeviceGetPciInfo(handle).busId for handle in h]

    assert [nvml.nvmlDeviceGetNvLinkState(h[0], link) for link in range(6)] == [1] * 6
    assert {nvml.nvmlDeviceGetNvLinkVersion(h[0], link) for link in range(6)} == {
        pynvml.NVML_NVLINK_VERSION_2_0  # Volta: NVLink 2.0
    }
    caps = [nvml.nvmlDeviceGetNvLinkCapability(h[0], 5, c) for c in range(6)]
    assert caps == [1, 1, 1, 1, 1, 0]
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        nvml.nvmlDeviceGetNvLinkCapability(h[0], 5, pynvml.NVML_NVLINK_CAP_COUNT)
    assert {nvml.nvmlDeviceGetNvLinkRemoteDeviceType(h[0], link) for link in range(6)} == {
        pynvml.NVML_NVLINK_DEVICE_TYPE_GPU
    }
    remotes = [nvml.nvmlDeviceGetNvLinkRemotePciInfo(h[0], link).busId for link in range(6)]
    assert remotes == [bus[1], bus[2], bus[3], bus[3], bus[4], bus[4]]  # NV1 NV1 NV2 NV2
    with pytest.raises(pynvml.NVMLError_NotSupported):  # V100 has 6 links
        nvml.nvmlDeviceGetNvLinkVersion(h[0], 6)
    nvlink = pynvml.NVML_P2P_CAPS_INDEX_NVLINK
    assert nvml.nvmlDeviceGetP2PStatus(h[0], h[4], nvlink) == pynvml.NVML_P2P_STATUS_OK
    assert nvml.nvmlDeviceGetP2PStatus(h[0], h[5], nvlink) == pynvml.NVML_P2P_STATUS_NOT_SUPPORTED


def test_scan_reports_the_nics_of_topo_m() -> None:
    topology = scan(SimulatedNvml.from_model("dgx-1-v100", node_name="dgx1-01")).topology

    assert topology.nics == ("mlx5_0", "mlx5_1", "mlx5_2", "mlx5_3")
    assert topology.nic_links[0] == ("PIX", "PHB", "SYS", "SYS")
    assert topology.nic_links[7] == ("SYS", "SYS", "PHB", "PIX")
    assert topology.matrix[0] == ("X", "NV1", "NV1", "NV2", "NV2", "SYS", "SYS", "SYS")


def test_a_gpu_affine_to_several_numa_nodes() -> None:
    """AMD NPS / Intel SNC: GPU 0's memory is affine to NUMA nodes 0 and 1 (topo -m "0-1")."""
    data = load_model("pcie-l40s-4x").raw
    gpus = [{**data["gpus"][0], "numa_nodes": [1, 0]}, *data["gpus"][1:]]
    nvml, handles = _sim({**data, "gpus": gpus})
    node = pynvml.NVML_AFFINITY_SCOPE_NODE
    assert list(nvml.nvmlDeviceGetMemoryAffinity(handles[0], 1, node)) == [0b11]
    assert list(nvml.nvmlDeviceGetMemoryAffinity(handles[1], 1, node)) == [0b01]
    socket = pynvml.NVML_AFFINITY_SCOPE_SOCKET
    assert list(nvml.nvmlDeviceGetMemoryAffinity(handles[0], 1, socket)) == [0b11]
    assert _cpulist(nvml.nvmlDeviceGetCpuAffinity(handles[0], 2)) == "0-127"
    assert nvml.nvmlSystemGetTopologyGpuSet(40) == [handles[0], *handles[2:]]
    row = parse_topo_matrix(nvml.topo_matrix_text()).device("GPU0")
    assert (row.numa_nodes, row.cpu_affinity) == ((0, 1), "0-127")
    facts = scan(nvml).gpus[0].facts
    assert (facts.numa_node, facts.numa_affinity, facts.cpu_affinity) == (0, "0-1", "0-127")
    with pytest.raises(ValueError, match="GPU 0 numa_node is not its lowest node"):
        parse_model({**data, "gpus": [{**gpus[0], "numa_nodes": [1, 2]}, *gpus[1:]]})


def test_a_model_with_nvlinks_but_no_nvlink_spec_is_refused() -> None:
    data = load_model("dgx-1-v100").raw
    broken = {
        **data,
        "gpu_types": {k: {**v, "nvlink": None} for k, v in data["gpu_types"].items()},
    }
    with pytest.raises(ValueError, match="GPU 0 has NVLinks but its type no nvlink"):
        parse_model(broken)
