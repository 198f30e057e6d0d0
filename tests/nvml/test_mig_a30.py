"""A MIG GPU with 4 memory slices, the NVIDIA A30: its profile table scans back to the real
captures (tests/nvml/captures/mig__*A30*, each with its source), and the GPU-instance geometry
(ids, placements, fit, the simulator's create/destroy, re-layouts) follows its table, not the
8 memory slices of an A100/H100."""

from __future__ import annotations

import copy
import ctypes
import json
import re

import pynvml
import pytest

from inventory.nvml import mig_fit, mig_ops
from inventory.nvml.mig_catalog import load_table, table_for_gpu
from inventory.nvml.parsers import (
    parse_mig_ci_profiles,
    parse_mig_gi_profiles,
    parse_mig_gpu_instances,
    parse_mig_placements,
)
from inventory.nvml.scanner import scan
from inventory.nvml.sim import SimulatedNvml
from inventory.nvml.sim.model import MACHINE_DIR
from tests.nvml.captures import OWN

A30 = load_table("a30-pcie-24gb")
A100 = load_table("a100-sxm4-40gb")
NEW = "mig__code-index-25510043945__A30__535.183.01"  # driver 535.183.01, 5 profiles
OLD = "mig__summer-lo-docker-configuration__A30"  # an older driver: no 2g.12gb+me
MIB = 1024 * 1024


def _read(name: str) -> str:
    return (OWN / name).read_text()


def test_the_a30_is_found_by_the_name_nvml_reports() -> None:
    # nvidia-smi -L in the capture: "GPU 0: NVIDIA A30 (UUID: ...)".
    assert table_for_gpu("NVIDIA A30") == A30
    assert (A30.compute_slices, A30.memory_slices, A30.max_mig_devices) == (4, 4, 4)


@pytest.mark.parametrize("capture", [f"{NEW}__mig-lgip.txt", f"{OLD}__mig-lgip.txt"])
def test_every_lgip_row_is_the_tables(capture: str) -> None:
    rows = parse_mig_gi_profiles(_read(capture))

    assert len(rows) >= 4
    for row in rows:
        profile = A30.by_name(row.name)
        assert (profile.id, profile.instances, profile.sm) == (
            row.profile_id,
            row.instances_total,
            row.sm,
        )
        assert (profile.dec, profile.enc, profile.ce, profile.jpeg, profile.ofa) == (
            row.dec,
            row.enc,
            row.ce,
            row.jpeg,
            row.ofa,
        )
        if profile.name != "4g.24gb" or capture.startswith(NEW):  # 23.50 GiB on the old driver
            assert f"{profile.memory_mib / 1024:.2f}" == f"{row.memory_gib:.2f}"
    assert {row.name for row in parse_mig_gi_profiles(_read(f"{NEW}__mig-lgip.txt"))} == {
        f"MIG {profile.name}" for profile in A30.profiles
    }


@pytest.mark.parametrize("capture", [f"{NEW}__mig-lgipp.txt", f"{OLD}__mig-lgipp.txt"])
def test_every_lgipp_placement_is_the_tables(capture: str) -> None:
    for row in parse_mig_placements(_read(capture)):
        profile = A30.by_id(row.profile_id)
        assert profile is not None
        assert (profile.placements, profile.memory_slices) == (row.starts, row.size)


def test_gpu_instance_ids_follow_the_four_slice_buddy_tree() -> None:
    # mig -lgi of four 1g.6gb: GIs 3, 4, 5, 6 at 0..3; a 2g.12gb at 2 is GI 2.
    for gi in parse_mig_gpu_instances(_read(f"{OLD}__mig-lgi.txt")):
        assert A30.gpu_instance_id(gi.placement_start, gi.placement_size) == gi.instance_id
        assert A30.gpu_instance_size(gi.instance_id) == gi.placement_size
    assert (A30.gpu_instance_id(2, 2), A30.gpu_instance_id(0, 4)) == (2, 0)
    # The 8-slice tree is unchanged: 4:4 is GI 2, 6:1 GI 13, the whole GPU 0.
    assert [A100.gpu_instance_id(s, n) for s, n in ((4, 4), (6, 1), (0, 8))] == [2, 13, 0]
    assert [A100.gpu_instance_size(i) for i in (0, 1, 2, 3, 6, 7, 14)] == [8, 4, 4, 2, 2, 1, 1]


def test_compute_instance_profiles_of_a_2g_gi_match_lcip() -> None:
    # -lcip -gi 2 (a 2g.12gb): 1c.2g.12gb x2 of 14 SMs (profile 0), 2g.12gb x1 of 28 (1*).
    rows = parse_mig_ci_profiles(_read(f"{NEW}__mig-lcip-gi2.txt"))
    cis = A30.ci_profiles(A30.by_name("2g.12gb"))

    assert [(r.profile_id, r.name, r.instances_total, r.sm) for r in rows] == [
        (ci.index, f"MIG {ci.name}", len(ci.placements), ci.sm) for ci in cis.values()
    ]
    # The whole GPU's GI has 1c, 2c and 4g compute instances, no 3c (NVIDIA's A30 model).
    assert [ci.slices for ci in A30.ci_profiles(A30.by_name("4g.24gb")).values()] == [1, 2, 4]


def test_mig_devices_memory_and_bar1_match_the_nvidia_smi_table() -> None:
    # "MIG devices:" of the capture: GI 2 (2g) 11968 MiB, BAR1 16383; GI 3, 4 (1g) 5952, 8191.
    text = _read(f"{NEW}__nvidia-smi-table-mig.txt")
    rows = re.findall(
        r"\|\s+0\s+(\d+)\s+0\s+\d+\s+\|\s+\d+MiB /\s+(\d+)MiB.*\n\|\s+\|\s+\d+MiB /\s+(\d+)MiB",
        text,
    )
    assert len(rows) == 3
    # The layout as the importer writes it from a capture: each GI at the start its id gives.
    layout = [
        {"gpu_instance": "2g.12gb" if int(mem) > 6000 else "1g.6gb",
         "start": A30.gpu_instance_start(int(gi))}
        for gi, mem, _ in rows
    ]  # fmt: skip
    nvml = _a30_node({"0": layout})
    gpu = nvml.nvmlDeviceGetHandleByIndex(0)
    devices = [nvml.nvmlDeviceGetMigDeviceHandleByIndex(gpu, i) for i in range(3)]

    got = [
        (
            nvml.nvmlDeviceGetGpuInstanceId(d),
            nvml.nvmlDeviceGetMemoryInfo(d).total // MIB,
            nvml.nvmlDeviceGetBAR1MemoryInfo(d).bar1Total // MIB,
        )
        for d in devices
    ]
    assert sorted(got) == sorted((int(gi), int(mem), int(bar1)) for gi, mem, bar1 in rows)


# --------------------------------------------------------------------------- the simulator


def _a30_node(mig: dict[str, list[str]]) -> SimulatedNvml:
    """A 4-GPU PCIe box with A30s: the shipped L40S box's chassis and topology, its GPU type
    given the A30's captured name, memory, power limit and MIG table (its other GPU facts stay
    the L40S's: the MIG geometry is what these tests are about)."""
    model = json.loads((MACHINE_DIR / "pcie-l40s-4x.json").read_text())
    a30 = copy.deepcopy(model["gpu_types"]["L40S"])
    a30.update(name="NVIDIA A30", mig_table="a30-pcie-24gb")
    a30["memory"].update(total_mib=24576)
    a30["power_w"].update(default_limit=165, max_limit=165)
    model.update(name="test-a30-4x", gpu_types={"A30": a30}, gpu_defaults={"type": "A30"})
    nvml = SimulatedNvml.from_fleet_spec(
        {"nodes": [{"name": "a30-01", "model": model, "mig": mig}]}, "a30-01"
    )
    nvml.nvmlInit()
    return nvml


def _gis(nvml: SimulatedNvml, gpu: object) -> list[tuple[int, int, int, int]]:
    """(gi id, profile id, start, size) of every GI, as ``mig -lgi`` lists them."""
    out = []
    for profile in A30.profiles:
        handles = (pynvml.c_nvmlGpuInstance_t * 4)()
        count = ctypes.c_uint()
        nvml.nvmlDeviceGetGpuInstances(gpu, profile.id, handles, ctypes.byref(count))
        for gi in handles[: count.value]:
            info = nvml.nvmlGpuInstanceGetInfo(gi)
            out.append((info.id, info.profileId, info.placement.start, info.placement.size))
    return sorted(out)


def test_the_simulator_creates_in_the_captured_order() -> None:
    # mig-cgi-14-14-5: 1g.6gb -> GI 3 at 0, 1g.6gb -> GI 4 at 1, 2g.12gb -> GI 2 at 2.
    nvml = _a30_node({"0": []})
    gpu = nvml.nvmlDeviceGetHandleByIndex(0)

    for profile_id in (14, 14, 5):
        nvml.nvmlDeviceCreateGpuInstance(gpu, profile_id)

    expected = [
        (gi.instance_id, gi.profile_id, gi.placement_start, gi.placement_size)
        for gi in parse_mig_gpu_instances(_read(f"{NEW}__mig-cgi-14-14-5.txt"))[-3:]
    ]
    assert _gis(nvml, gpu) == sorted(expected) == [(2, 5, 2, 2), (3, 14, 0, 1), (4, 14, 1, 1)]
    # The GPU is full: nothing else fits, and -lgip's Free column says so.
    for profile in A30.profiles:
        assert nvml.nvmlDeviceGetGpuInstanceRemainingCapacity(gpu, profile.id) == 0
    with pytest.raises(pynvml.NVMLError_InsufficientResources):
        nvml.nvmlDeviceCreateGpuInstance(gpu, 14)


def test_four_1g_then_the_whole_gpu_after_destroying_them() -> None:
    nvml = _a30_node({"0": ["1g.6gb"] * 4})
    gpu = nvml.nvmlDeviceGetHandleByIndex(0)
    assert _gis(nvml, gpu) == [(gi, 14, gi - 3, 1) for gi in (3, 4, 5, 6)]  # as -lgi shows

    for gi_id in (3, 4, 5, 6):
        mig_ops.destroy_gpu_instance(nvml, 0, gi_id)
    # An empty GPU: -lgip's Free/Total of the capture.
    free = {p.profile_id: p.instances_free for p in parse_mig_gi_profiles(
        _read(f"{NEW}__mig-lgip.txt"))}  # fmt: skip
    nvml.nvmlInit()
    for profile in A30.profiles:
        assert nvml.nvmlDeviceGetGpuInstanceRemainingCapacity(gpu, profile.id) == free[profile.id]
    nvml.nvmlShutdown()

    assert mig_ops.create_gpu_instance(nvml, 0, "4g.24gb") == (0, 0)
    with pytest.raises(mig_ops.MigOperationError) as refused:
        mig_ops.create_gpu_instance(nvml, 0, "1g.6gb", placement_start=3)
    assert refused.value.code == mig_ops.MigErrorCode.NO_ROOM
    with pytest.raises(mig_ops.MigOperationError) as refused:
        mig_ops.create_gpu_instance(nvml, 0, "2g.12gb", placement_start=1)
    assert refused.value.code == mig_ops.MigErrorCode.INVALID_PLACEMENT
    assert "valid starts: 0, 2" in refused.value.message


def test_fit_counts_the_a30s_slices() -> None:
    one_1g = [mig_fit.Placed(14, 0, 1)]
    room = {p.name: mig_fit.remaining_capacity(A30, one_1g, p) for p in A30.profiles}

    # Slice 0 taken: 3 more 1g (1g+me too), one 2g at 2 (or its +me twin), no 4g.
    assert room == {"1g.6gb": 3, "1g.6gb+me": 1, "2g.12gb": 1, "2g.12gb+me": 1, "4g.24gb": 0}
    assert mig_fit.free_starts(one_1g, A30.by_name("2g.12gb")) == [2]


def test_a_scan_of_the_a30_reads_back_the_captured_table_and_layout() -> None:
    # The scanner over NVML (here the simulator) gives -lgip's rows, Free column included, and
    # -lgi's GI ids and placements of the capture's layout (1g at 0, 1g at 1, 2g at 2).
    nvml = _a30_node({"0": ["1g.6gb", "1g.6gb", "2g.12gb"]})  # the capture's creation order
    nvml.nvmlShutdown()
    mig = scan(nvml).gpus[0].mig
    assert mig is not None and mig.profiles_source == "nvml"

    lgip = {r.profile_id: r for r in parse_mig_gi_profiles(_read(f"{NEW}__mig-lgip.txt"))}
    # (NVML enumerates by profile index, nvidia-smi prints the +me rows beside their twins.)
    assert sorted((p.id, p.name, p.instances, p.sm) for p in mig.profiles) == sorted(
        (r.profile_id, r.name.removeprefix("MIG "), r.instances_total, r.sm) for r in lgip.values()
    )
    assert all(p.remaining == 0 for p in mig.profiles)  # the GPU is full
    lgi = parse_mig_gpu_instances(_read(f"{NEW}__mig-cgi-14-14-5.txt"))[-3:]
    assert [
        (gi.gi_id, gi.profile_id, gi.placement_start, gi.placement_size) for gi in mig.gpu_instances
    ] == sorted(
        (gi.instance_id, gi.profile_id, gi.placement_start, gi.placement_size) for gi in lgi
    )
