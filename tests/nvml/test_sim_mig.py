"""MIG on the simulator: the A100/H100 profile tables, placements and NVML's error codes."""

from __future__ import annotations

import ctypes
import json
import re

import pynvml
import pytest

from inventory.nvml.mig_catalog import TABLE_DIR, MigProfile, load_table
from inventory.nvml.sim import SimulatedNvml

MIB = 1024 * 1024
_GIP = pynvml


@pytest.fixture
def nvml() -> SimulatedNvml:
    sim = SimulatedNvml.from_model("dgx-a100-40gb", node_name="dgx-01")
    sim.nvmlInit()
    return sim


def _empty_mig_gpu(nvml: SimulatedNvml, index: int = 1) -> object:
    """GPU ``index`` with MIG on and no instances."""
    gpu = nvml.nvmlDeviceGetHandleByIndex(index)
    nvml.edit_state(lambda st: st["gpus"][index]["mig"].update(instances=[]))
    return gpu


def _gis(nvml: SimulatedNvml, gpu: object) -> list[tuple[int, int, int, int]]:
    """(gi id, profile id, start, size) of every GI, as ``mig -lgi`` lists them."""
    out = []
    for profile_id in (19, 20, 15, 14, 9, 5, 0):
        handles = (pynvml.c_nvmlGpuInstance_t * 7)()
        count = ctypes.c_uint()
        nvml.nvmlDeviceGetGpuInstances(gpu, profile_id, handles, ctypes.byref(count))
        for gi in handles[: count.value]:
            info = nvml.nvmlGpuInstanceGetInfo(gi)
            out.append((info.id, info.profileId, info.placement.start, info.placement.size))
    return sorted(out)


# `nvidia-smi mig -lgip` on an empty A100-SXM4-40GB (mig/cloud-atlas__A100-40GB__mig-lgip.txt):
# profile index, id, instances, GiB, SM, DEC, ENC, CE, JPEG, OFA
LGIP_A100_40GB = [
    (_GIP.NVML_GPU_INSTANCE_PROFILE_1_SLICE, 19, 7, 4.75, 14, 0, 0, 1, 0, 0, "MIG 1g.5gb"),
    (_GIP.NVML_GPU_INSTANCE_PROFILE_1_SLICE_REV1, 20, 1, 4.75, 14, 1, 0, 1, 1, 1, "MIG 1g.5gb+me"),
    (_GIP.NVML_GPU_INSTANCE_PROFILE_1_SLICE_REV2, 15, 4, 9.62, 14, 1, 0, 1, 0, 0, "MIG 1g.10gb"),
    (_GIP.NVML_GPU_INSTANCE_PROFILE_2_SLICE, 14, 3, 9.62, 28, 1, 0, 2, 0, 0, "MIG 2g.10gb"),
    (_GIP.NVML_GPU_INSTANCE_PROFILE_3_SLICE, 9, 2, 19.50, 42, 2, 0, 3, 0, 0, "MIG 3g.20gb"),
    (_GIP.NVML_GPU_INSTANCE_PROFILE_4_SLICE, 5, 1, 19.50, 56, 2, 0, 4, 0, 0, "MIG 4g.20gb"),
    (_GIP.NVML_GPU_INSTANCE_PROFILE_7_SLICE, 0, 1, 39.25, 98, 5, 0, 7, 1, 1, "MIG 7g.40gb"),
]  # fmt: skip


@pytest.mark.parametrize("row", LGIP_A100_40GB, ids=[r[-1] for r in LGIP_A100_40GB])
def test_profile_info_matches_lgip_capture(nvml: SimulatedNvml, row: tuple) -> None:
    index, pid, instances, gib, sm, dec, enc, ce, jpeg, ofa, name = row
    gpu = _empty_mig_gpu(nvml)

    info = nvml.nvmlDeviceGetGpuInstanceProfileInfo(gpu, index)
    v1 = nvml.nvmlDeviceGetGpuInstanceProfileInfo(gpu, index, version=1)

    assert isinstance(info, pynvml.c_nvmlGpuInstanceProfileInfo_v2_t)
    assert isinstance(v1, pynvml.c_nvmlGpuInstanceProfileInfo_t)
    assert (info.id, info.instanceCount, info.multiprocessorCount) == (pid, instances, sm)
    assert (info.decoderCount, info.encoderCount, info.copyEngineCount) == (dec, enc, ce)
    assert (info.jpegCount, info.ofaCount, info.isP2pSupported) == (jpeg, ofa, 0)
    assert f"{info.memorySizeMB / 1024:.2f}" == f"{gib:.2f}"
    assert info.name == name
    assert (v1.id, v1.memorySizeMB) == (pid, info.memorySizeMB)
    assert nvml.nvmlDeviceGetGpuInstanceRemainingCapacity(gpu, pid) == instances


def test_profile_info_errors(nvml: SimulatedNvml) -> None:
    gpu = _empty_mig_gpu(nvml)

    with pytest.raises(pynvml.NVMLError_NotSupported):  # valid index, not an A100 profile
        nvml.nvmlDeviceGetGpuInstanceProfileInfo(gpu, pynvml.NVML_GPU_INSTANCE_PROFILE_6_SLICE)
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        nvml.nvmlDeviceGetGpuInstanceProfileInfo(gpu, pynvml.NVML_GPU_INSTANCE_PROFILE_COUNT)
    with pytest.raises(pynvml.NVMLError_NotSupported):  # MIG disabled on GPU 2
        nvml.nvmlDeviceGetGpuInstanceProfileInfo(nvml.nvmlDeviceGetHandleByIndex(2), 0)


# `nvidia-smi mig -lgipp` (MIG guide lines 1659-1665, identical on H100 PCIe).
LGIPP = {19: [0, 1, 2, 3, 4, 5, 6], 20: [0, 1, 2, 3, 4, 5, 6], 15: [0, 2, 4, 6], 14: [0, 2, 4],
         9: [0, 4], 5: [0], 0: [0]}  # fmt: skip
SIZES = {19: 1, 20: 1, 15: 2, 14: 2, 9: 4, 5: 4, 0: 8}


@pytest.mark.parametrize("profile_id", sorted(LGIPP))
def test_possible_placements_match_lgipp(nvml: SimulatedNvml, profile_id: int) -> None:
    gpu = nvml.nvmlDeviceGetHandleByIndex(1)  # seven 1g.5gb GIs: placements list all anyway
    count = ctypes.c_uint()
    placements = (pynvml.c_nvmlGpuInstancePlacement_t * 8)()

    nvml.nvmlDeviceGetGpuInstancePossiblePlacements(gpu, profile_id, None, ctypes.byref(count))
    assert count.value == len(LGIPP[profile_id])
    nvml.nvmlDeviceGetGpuInstancePossiblePlacements(
        gpu, profile_id, placements, ctypes.byref(count)
    )

    got = [(p.start, p.size) for p in placements[: count.value]]
    assert got == [(s, SIZES[profile_id]) for s in LGIPP[profile_id]]


@pytest.mark.parametrize(
    ("_case", "profiles", "expected"),
    [
        ("MIG guide: -cgi 9,9 (ids 2 then 1)", [9, 9], [(2, 4), (1, 0)]),
        ("MIG guide: 3-1-2-1 geometry", [9, 19, 14, 19], [(2, 4), (7, 0), (4, 2), (8, 1)]),
        ("MIG guide: 2g then five 1g", [14, 19, 19, 19, 19, 19],
         [(5, 4), (13, 6), (7, 0), (8, 1), (9, 2), (10, 3)]),
        ("H100 capture: 3g,2g,1g,1g = GI 2,3,9,10", [9, 14, 19, 19],
         [(2, 4), (3, 0), (9, 2), (10, 3)]),
    ],
)  # fmt: skip
def test_default_placement_and_gi_ids_follow_real_creation_order(
    nvml: SimulatedNvml, _case: str, profiles: list[int], expected: list[tuple[int, int]]
) -> None:
    gpu = _empty_mig_gpu(nvml)

    got = []
    for profile_id in profiles:
        info = nvml.nvmlGpuInstanceGetInfo(nvml.nvmlDeviceCreateGpuInstance(gpu, profile_id))
        got.append((info.id, info.placement.start))

    assert got == expected


def test_known_issue_1g_1g_2g_then_3g_is_insufficient_resources(nvml: SimulatedNvml) -> None:
    # MIG guide "Example 2": -cgi 19,19,14,9 gives GI 13, 11, 3 and then fails.
    gpu = _empty_mig_gpu(nvml)
    ids = [nvml.nvmlGpuInstanceGetInfo(nvml.nvmlDeviceCreateGpuInstance(gpu, p)).id
           for p in (19, 19, 14)]  # fmt: skip

    with pytest.raises(pynvml.NVMLError_InsufficientResources):
        nvml.nvmlDeviceCreateGpuInstance(gpu, 9)
    assert ids == [13, 11, 3]
    assert _gis(nvml, gpu) == [(3, 14, 0, 2), (11, 19, 4, 1), (13, 19, 6, 1)]


def test_create_with_placement_and_its_errors(nvml: SimulatedNvml) -> None:
    gpu = _empty_mig_gpu(nvml)
    place = pynvml.c_nvmlGpuInstancePlacement_t(start=0, size=4)

    gi = nvml.nvmlDeviceCreateGpuInstanceWithPlacement(gpu, 9, place)

    assert nvml.nvmlGpuInstanceGetInfo(gi).id == 1
    with pytest.raises(pynvml.NVMLError_InsufficientResources):  # overlaps the 3g at 0:4
        nvml.nvmlDeviceCreateGpuInstanceWithPlacement(
            gpu, 14, pynvml.c_nvmlGpuInstancePlacement_t(start=2, size=2)
        )
    with pytest.raises(pynvml.NVMLError_InvalidArgument):  # 2g cannot start at 6
        nvml.nvmlDeviceCreateGpuInstanceWithPlacement(
            gpu, 14, pynvml.c_nvmlGpuInstancePlacement_t(start=6, size=2)
        )
    with pytest.raises(pynvml.NVMLError_InvalidArgument):  # unknown profile id
        nvml.nvmlDeviceCreateGpuInstance(gpu, 7)
    with pytest.raises(pynvml.NVMLError_InsufficientResources):  # one 4g at most, slices used
        nvml.nvmlDeviceCreateGpuInstance(gpu, 5)
    assert nvml.nvmlDeviceGetGpuInstanceRemainingCapacity(gpu, 9) == 1
    assert nvml.nvmlDeviceGetGpuInstanceRemainingCapacity(gpu, 19) == 3  # slices 4, 5, 6
    assert _gis(nvml, gpu) == [(1, 9, 0, 4)]


def test_exhausted_capacity_and_media_extension_limit(nvml: SimulatedNvml) -> None:
    gpu = _empty_mig_gpu(nvml)
    nvml.nvmlDeviceCreateGpuInstance(gpu, 20)

    with pytest.raises(pynvml.NVMLError_InsufficientResources):
        nvml.nvmlDeviceCreateGpuInstance(gpu, 20)
    for _ in range(6):
        nvml.nvmlDeviceCreateGpuInstance(gpu, 19)
    with pytest.raises(pynvml.NVMLError_InsufficientResources):
        nvml.nvmlDeviceCreateGpuInstance(gpu, 19)
    assert nvml.nvmlDeviceGetGpuInstanceRemainingCapacity(gpu, 19) == 0


def test_mig_calls_on_non_mig_and_mig_disabled_gpus(nvml: SimulatedNvml) -> None:
    disabled = nvml.nvmlDeviceGetHandleByIndex(2)
    l40s = SimulatedNvml.from_model("pcie-l40s-4x", node_name="box")
    l40s.nvmlInit()
    no_mig = l40s.nvmlDeviceGetHandleByIndex(0)

    assert nvml.nvmlDeviceGetMigMode(disabled) == [0, 0]
    with pytest.raises(pynvml.NVMLError_NotSupported):
        nvml.nvmlDeviceCreateGpuInstance(disabled, 19)
    with pytest.raises(pynvml.NVMLError_NotSupported):
        nvml.nvmlDeviceGetMigDeviceHandleByIndex(disabled, 0)
    with pytest.raises(pynvml.NVMLError_NotSupported):
        l40s.nvmlDeviceGetMigMode(no_mig)
    with pytest.raises(pynvml.NVMLError_NotSupported):
        l40s.nvmlDeviceSetMigMode(no_mig, pynvml.NVML_DEVICE_MIG_ENABLE)


def test_mig_mode_stays_pending_until_gpu_reset(nvml: SimulatedNvml) -> None:
    gpu = nvml.nvmlDeviceGetHandleByIndex(3)

    status = nvml.nvmlDeviceSetMigMode(gpu, pynvml.NVML_DEVICE_MIG_ENABLE)

    assert status == pynvml.NVML_ERROR_RESET_REQUIRED
    assert nvml.nvmlDeviceGetMigMode(gpu) == [0, 1]
    with pytest.raises(pynvml.NVMLError_NotSupported):
        nvml.nvmlDeviceCreateGpuInstance(gpu, 19)
    nvml.reset_gpu(3)
    assert nvml.nvmlDeviceGetMigMode(gpu) == [1, 1]
    assert nvml.nvmlDeviceSetMigMode(gpu, pynvml.NVML_DEVICE_MIG_ENABLE) == pynvml.NVML_SUCCESS


def test_reboot_applies_pending_mode_and_clears_instances(nvml: SimulatedNvml) -> None:
    gpu0 = nvml.nvmlDeviceGetHandleByIndex(0)
    nvml.nvmlDeviceSetMigMode(gpu0, pynvml.NVML_DEVICE_MIG_DISABLE)

    nvml.nvmlShutdown()
    nvml.reboot()
    nvml.nvmlInit()

    assert nvml.nvmlDeviceGetMigMode(gpu0) == [0, 0]
    gpu1 = nvml.nvmlDeviceGetHandleByIndex(1)
    assert nvml.nvmlDeviceGetMigMode(gpu1) == [1, 1]
    with pytest.raises(pynvml.NVMLError_NotFound):  # MIG instances do not survive a reboot
        nvml.nvmlDeviceGetMigDeviceHandleByIndex(gpu1, 0)


def test_initial_layout_mig_devices_and_their_attributes(nvml: SimulatedNvml) -> None:
    gpu0, gpu1 = nvml.nvmlDeviceGetHandleByIndex(0), nvml.nvmlDeviceGetHandleByIndex(1)

    devices0 = [nvml.nvmlDeviceGetMigDeviceHandleByIndex(gpu0, i) for i in range(3)]
    devices1 = [nvml.nvmlDeviceGetMigDeviceHandleByIndex(gpu1, i) for i in range(7)]

    assert nvml.nvmlDeviceGetMaxMigDeviceCount(gpu0) == 7
    assert [nvml.nvmlDeviceGetName(d) for d in devices0] == [
        "NVIDIA A100-SXM4-40GB MIG 3g.20gb",
        "NVIDIA A100-SXM4-40GB MIG 2g.10gb",
        "NVIDIA A100-SXM4-40GB MIG 2g.10gb",
    ]
    assert [nvml.nvmlDeviceGetGpuInstanceId(d) for d in devices0] == [2, 3, 4]
    assert [nvml.nvmlDeviceGetGpuInstanceId(d) for d in devices1] == [7, 8, 9, 10, 11, 12, 13]
    assert [nvml.nvmlDeviceGetComputeInstanceId(d) for d in devices1] == [0] * 7
    assert [nvml.nvmlDeviceGetMemoryInfo(d).total // MIB for d in devices0] == [19968, 9856, 9856]
    mig_uuid = re.compile(
        r"^MIG-[0-9a-f]{8}-[0-9a-f]{4}-5[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$"
    )
    uuids = [nvml.nvmlDeviceGetUUID(d) for d in devices0 + devices1]
    assert all(mig_uuid.match(u) for u in uuids) and len(set(uuids)) == 10
    assert nvml.nvmlDeviceGetHandleByUUID(uuids[0]) is devices0[0]
    attrs = nvml.nvmlDeviceGetAttributes(devices0[0])
    assert (attrs.multiprocessorCount, attrs.sharedCopyEngineCount, attrs.sharedDecoderCount) == (
        42,
        3,
        2,
    )
    assert (attrs.gpuInstanceSliceCount, attrs.computeInstanceSliceCount) == (3, 3)
    assert attrs.memorySizeMB == 19968
    assert bool(nvml.nvmlDeviceIsMigDeviceHandle(devices0[0])) is True
    assert bool(nvml.nvmlDeviceIsMigDeviceHandle(gpu0)) is False
    assert nvml.nvmlDeviceGetDeviceHandleFromMigDeviceHandle(devices0[0]) is gpu0
    for call in (
        nvml.nvmlDeviceGetUtilizationRates,
        nvml.nvmlDeviceGetPowerUsage,
        nvml.nvmlDeviceGetPciInfo,
        nvml.nvmlDeviceGetSerial,
    ):
        with pytest.raises(pynvml.NVMLError_NotSupported):
            call(devices0[0])
    with pytest.raises(pynvml.NVMLError_NotSupported):  # "Utilization: N/A" with MIG on
        nvml.nvmlDeviceGetUtilizationRates(gpu0)


def test_compute_instance_profiles_match_lcip_capture(nvml: SimulatedNvml) -> None:
    # mig/cloud-atlas__A100-40GB__mig-lcip.txt, GI 1 = 3g.20gb: 1c x3 14 SM, 2c x1 28 SM,
    # 3g x1 42 SM; shared DEC 2, CE 3.
    gpu = _empty_mig_gpu(nvml)
    gi = nvml.nvmlDeviceCreateGpuInstance(gpu, 9)
    shared = pynvml.NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED

    rows = []
    for profile in range(pynvml.NVML_COMPUTE_INSTANCE_PROFILE_COUNT):
        try:
            info = nvml.nvmlGpuInstanceGetComputeInstanceProfileInfo(gi, profile, shared)
        except pynvml.NVMLError_NotSupported:
            continue
        rows.append((info.id, info.name, info.instanceCount, info.multiprocessorCount,
                     info.sharedDecoderCount, info.sharedCopyEngineCount))  # fmt: skip

    assert rows == [
        (0, "MIG 1c.3g.20gb", 3, 14, 2, 3),
        (1, "MIG 2c.3g.20gb", 1, 28, 2, 3),
        (2, "MIG 3g.20gb", 1, 42, 2, 3),
    ]


def test_compute_instances_lifecycle_and_in_use_errors(nvml: SimulatedNvml) -> None:
    gpu = _empty_mig_gpu(nvml)
    gi = nvml.nvmlDeviceCreateGpuInstance(gpu, 9)

    cis = [nvml.nvmlGpuInstanceCreateComputeInstance(gi, 0) for _ in range(3)]

    infos = [nvml.nvmlComputeInstanceGetInfo(ci) for ci in cis]
    assert [(i.id, i.profileId, i.placement.start, i.placement.size) for i in infos] == [
        (0, 0, 0, 1),
        (1, 0, 1, 1),
        (2, 0, 2, 1),
    ]
    assert nvml.nvmlGpuInstanceGetComputeInstanceRemainingCapacity(gi, 0) == 0
    with pytest.raises(pynvml.NVMLError_InsufficientResources):
        nvml.nvmlGpuInstanceCreateComputeInstance(gi, 0)
    with pytest.raises(pynvml.NVMLError_InvalidArgument):  # 4c does not fit a 3g GI
        nvml.nvmlGpuInstanceCreateComputeInstance(gi, pynvml.NVML_COMPUTE_INSTANCE_PROFILE_4_SLICE)
    with pytest.raises(pynvml.NVMLError_InUse):
        nvml.nvmlGpuInstanceDestroy(gi)
    listed = (pynvml.c_nvmlComputeInstance_t * 3)()
    count = ctypes.c_uint()
    nvml.nvmlGpuInstanceGetComputeInstances(gi, 0, listed, ctypes.byref(count))
    assert count.value == 3
    assert nvml.nvmlComputeInstanceGetInfo(listed[1]).id == 1  # a plain pynvml pointer works
    for ci in cis:
        nvml.nvmlComputeInstanceDestroy(ci)
    with pytest.raises(pynvml.NVMLError_InvalidArgument):  # destroyed handle
        nvml.nvmlComputeInstanceGetInfo(cis[0])
    assert nvml.nvmlGpuInstanceDestroy(gi) == pynvml.NVML_SUCCESS
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        nvml.nvmlGpuInstanceGetInfo(gi)
    assert _gis(nvml, gpu) == []


def test_gi_info_device_field_is_the_parent_handle(nvml: SimulatedNvml) -> None:
    gpu = nvml.nvmlDeviceGetHandleByIndex(0)
    gi = nvml.nvmlDeviceGetGpuInstanceById(gpu, 2)

    info = nvml.nvmlGpuInstanceGetInfo(gi)

    assert nvml.nvmlDeviceGetUUID(info.device) == nvml.nvmlDeviceGetUUID(gpu)
    with pytest.raises(pynvml.NVMLError_NotFound):
        nvml.nvmlDeviceGetGpuInstanceById(gpu, 1)


def test_h100_pcie_and_sxm_tables_differ_in_sms_per_profile() -> None:
    pcie, sxm = load_table("h100-pcie-80gb"), load_table("h100-sxm5-80gb")

    assert [p.sm for p in pcie.profiles] == [14, 14, 14, 30, 46, 62, 114]
    assert [p.sm for p in sxm.profiles] == [16, 16, 26, 32, 60, 64, 132]
    assert [p.id for p in pcie.profiles] == [p.id for p in sxm.profiles]


@pytest.mark.parametrize("name", [path.stem for path in sorted(TABLE_DIR.glob("*.json"))])
def test_every_catalog_row_is_exactly_one_mig_profile(name: str) -> None:
    rows = json.loads((TABLE_DIR / f"{name}.json").read_text())["gpu_instance_profiles"]
    profiles = load_table(name).profiles

    for row, profile in zip(rows, profiles, strict=True):
        expected = {key: value for key, value in row.items() if key != "profile"}
        assert profile.to_dict() == expected | {
            "index": getattr(pynvml, row["profile"]),
            "remaining": None,
        }
        assert MigProfile.from_dict(json.loads(json.dumps(profile.to_dict()))) == profile


def test_h100_mig_devices_match_the_mig_capture() -> None:
    # mig/nvidia_gpu_exporter__H100-80GB-HBM3__nvidia-smi-table-mig.txt: GI 2/3/9/10 with
    # 40448/20096/9984/9984 MiB and 60/32/16/16 SMs, BAR1 24739/12369/6184/6184 MiB.
    spec = {"nodes": [{"name": "h1", "model": "dgx-h100",
                       "mig": {"0": ["3g.40gb", "2g.20gb", "1g.10gb", "1g.10gb"]}}]}  # fmt: skip
    nvml = SimulatedNvml.from_fleet_spec(spec, "h1")
    nvml.nvmlInit()
    gpu = nvml.nvmlDeviceGetHandleByIndex(0)

    devices = [nvml.nvmlDeviceGetMigDeviceHandleByIndex(gpu, i) for i in range(4)]

    assert [nvml.nvmlDeviceGetGpuInstanceId(d) for d in devices] == [2, 3, 9, 10]
    assert [nvml.nvmlDeviceGetMemoryInfo(d).total // MIB for d in devices] == [
        40448,
        20096,
        9984,
        9984,
    ]
    assert [nvml.nvmlDeviceGetAttributes(d).multiprocessorCount for d in devices] == [
        60,
        32,
        16,
        16,
    ]
    assert [nvml.nvmlDeviceGetBAR1MemoryInfo(d).bar1Total // MIB for d in devices] == [
        24739,
        12369,
        6184,
        6184,
    ]


@pytest.mark.parametrize(
    ("table", "gi", "sms"),
    [
        ("a100-sxm4-40gb", "3g.20gb", [14, 28, 42]),
        # Hopper: a 1c/2c CI has a 1g/2g GI's SMs, as the H200 -q capture shows (16/32 of 60).
        ("h100-sxm5-80gb", "3g.40gb", [16, 32, 60]),
        ("h200-sxm5-141gb", "3g.71gb", [16, 32, 60]),
        ("h100-sxm5-80gb", "7g.80gb", [16, 32, 60, 64, 132]),
    ],
)
def test_compute_instance_sms_are_those_of_the_k_slice_gpu_instance(
    table: str, gi: str, sms: list[int]
) -> None:
    mig_table = load_table(table)
    profiles = mig_table.ci_profiles(mig_table.by_name(gi)).values()
    assert sorted(ci.sm for ci in profiles) == sms
