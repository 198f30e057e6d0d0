"""Device facts of every simulated machine model against the real captures they cite."""

from __future__ import annotations

import re

import pynvml
import pytest

from inventory.nvml.sim import SimulatedNvml, list_models, load_fleet

MIB = 1024 * 1024


def _sim(model: str, node: str = "node-01") -> SimulatedNvml:
    nvml = SimulatedNvml.from_model(model, node_name=node)
    nvml.nvmlInit()
    return nvml


def test_list_models_names_the_shipped_models() -> None:
    assert list_models() == [
        "dgx-1-v100",
        "dgx-a100-40gb",
        "dgx-a100-80gb",
        "dgx-h100",
        "pcie-l40s-4x",
        "rtx-4080-super",
    ]


@pytest.mark.parametrize(
    ("_case", "model", "name", "count", "fb_mib", "bar1_mib", "bus_ids"),
    [
        ("dcgmi discovery + xuesongtap -a", "dgx-a100-40gb", "NVIDIA A100-SXM4-40GB", 8, 40960,
         65536, ["07", "0F", "47", "4E", "87", "90", "B7", "BD"]),
        ("telegraf a100-sxm4-v12", "dgx-a100-80gb", "NVIDIA A100-SXM4-80GB", 8, 81920, 131072,
         ["07", "0F", "47", "4E", "87", "90", "B7", "BD"]),
        ("k8s qx-h100", "dgx-h100", "NVIDIA H100 80GB HBM3", 8, 81559, 131072,
         ["53", "64", "75", "86", "97", "A8", "B9", "CA"]),
        ("nvidia_gpu_exporter l40s", "pcie-l40s-4x", "NVIDIA L40S", 4, 46068, 65536,
         ["17", "18", "CA", "E1"]),
        ("nvidia_gpu_exporter 4080 super", "rtx-4080-super", "NVIDIA GeForce RTX 4080 SUPER", 1,
         16376, 16384, ["01"]),
    ],
)  # fmt: skip
def test_names_memory_and_bus_ids_match_captures(
    _case: str, model: str, name: str, count: int, fb_mib: int, bar1_mib: int, bus_ids: list[str]
) -> None:
    nvml = _sim(model)

    handles = [nvml.nvmlDeviceGetHandleByIndex(i) for i in range(nvml.nvmlDeviceGetCount())]

    assert len(handles) == count
    assert {nvml.nvmlDeviceGetName(h) for h in handles} == {name}
    assert [nvml.nvmlDeviceGetMemoryInfo(h).total for h in handles] == [fb_mib * MIB] * count
    assert [nvml.nvmlDeviceGetBAR1MemoryInfo(h).bar1Total for h in handles] == [
        bar1_mib * MIB
    ] * count
    assert [nvml.nvmlDeviceGetPciInfo(h).busId for h in handles] == [
        f"00000000:{b}:00.0" for b in bus_ids
    ]


def test_dgx_a100_40gb_facts_match_the_535_capture() -> None:
    nvml = _sim("dgx-a100-40gb")
    h = nvml.nvmlDeviceGetHandleByIndex(0)

    pci = nvml.nvmlDeviceGetPciInfo_v3(h)
    memory = nvml.nvmlDeviceGetMemoryInfo(h, version=pynvml.nvmlMemory_v2)

    assert nvml.nvmlSystemGetDriverVersion() == "535.129.03"
    assert nvml.nvmlSystemGetCudaDriverVersion() == 12020
    assert nvml.nvmlSystemGetCudaDriverVersion_v2() == 12020
    assert nvml.nvmlSystemGetNVMLVersion() == "12.535.129.03"
    assert (pci.domain, pci.bus, pci.device) == (0, 0x07, 0)
    assert (pci.pciDeviceId, pci.pciSubSystemId) == (0x20B010DE, 0x134F10DE)
    assert pci.busIdLegacy == "0000:07:00.0"
    assert (memory.total, memory.reserved, memory.used, memory.free) == (
        40960 * MIB,
        620 * MIB,
        4 * MIB,
        40336 * MIB,
    )
    assert nvml.nvmlDeviceGetVbiosVersion(h) == "92.00.36.00.04"
    assert nvml.nvmlDeviceGetBoardPartNumber(h) == "692-2G506-0200-002"
    assert nvml.nvmlDeviceGetInforomImageVersion(h) == "G506.0200.00.04"
    assert nvml.nvmlDeviceGetArchitecture(h) == pynvml.NVML_DEVICE_ARCH_AMPERE
    assert nvml.nvmlDeviceGetCudaComputeCapability(h) == (8, 0)
    assert nvml.nvmlDeviceGetBrand(h) == pynvml.NVML_BRAND_NVIDIA
    assert nvml.nvmlDeviceGetMaxClockInfo(h, pynvml.NVML_CLOCK_GRAPHICS) == 1410
    assert nvml.nvmlDeviceGetMaxClockInfo(h, pynvml.NVML_CLOCK_SM) == 1410
    assert nvml.nvmlDeviceGetMaxClockInfo(h, pynvml.NVML_CLOCK_MEM) == 1215
    assert nvml.nvmlDeviceGetMaxClockInfo(h, pynvml.NVML_CLOCK_VIDEO) == 1290
    assert nvml.nvmlDeviceGetPowerManagementLimit(h) == 400000
    assert nvml.nvmlDeviceGetPowerManagementDefaultLimit(h) == 400000
    assert nvml.nvmlDeviceGetEnforcedPowerLimit(h) == 400000
    assert nvml.nvmlDeviceGetPowerManagementLimitConstraints(h) == [100000, 400000]
    assert nvml.nvmlDeviceGetPersistenceMode(h) == pynvml.NVML_FEATURE_DISABLED
    assert nvml.nvmlDeviceGetComputeMode(h) == pynvml.NVML_COMPUTEMODE_DEFAULT
    assert nvml.nvmlDeviceGetEccMode(h) == [1, 1]
    assert nvml.nvmlDeviceGetMinorNumber(h) == 0
    assert nvml.nvmlDeviceGetIndex(h) == 0
    assert nvml.nvmlDeviceGetMultiGpuBoard(h) == 0
    assert nvml.nvmlDeviceGetNumGpuCores(h) == 6912
    assert nvml.nvmlDeviceGetTemperatureThreshold(h, 0) == 92  # shutdown
    assert nvml.nvmlDeviceGetTemperatureThreshold(h, 1) == 89  # slowdown
    assert nvml.nvmlDeviceGetRowRemapperHistogram(h).max == 640


def test_dgx_h100_versions_and_limits_match_qx_h100() -> None:
    nvml = _sim("dgx-h100")
    h = nvml.nvmlDeviceGetHandleByIndex(7)

    assert nvml.nvmlSystemGetDriverVersion() == "580.105.08"
    assert nvml.nvmlSystemGetCudaDriverVersion() == 13000
    assert nvml.nvmlDeviceGetArchitecture(h) == pynvml.NVML_DEVICE_ARCH_HOPPER
    assert nvml.nvmlDeviceGetCudaComputeCapability(h) == (9, 0)
    assert nvml.nvmlDeviceGetPowerManagementLimitConstraints(h) == [200000, 700000]
    assert nvml.nvmlDeviceGetMaxClockInfo(h, pynvml.NVML_CLOCK_MEM) == 2619
    assert nvml.nvmlDeviceGetPersistenceMode(h) == pynvml.NVML_FEATURE_ENABLED
    assert nvml.nvmlDeviceGetVbiosVersion(h) == "96.00.99.00.01"


def test_data_center_boards_have_no_fan_and_the_geforce_card_reports_zero_rpm_idle() -> None:
    dgx = _sim("dgx-a100-40gb")
    l40s = _sim("pcie-l40s-4x")
    desk = _sim("rtx-4080-super")

    with pytest.raises(pynvml.NVMLError_NotSupported):
        dgx.nvmlDeviceGetFanSpeed(dgx.nvmlDeviceGetHandleByIndex(2))
    with pytest.raises(pynvml.NVMLError_NotSupported):
        l40s.nvmlDeviceGetFanSpeed(l40s.nvmlDeviceGetHandleByIndex(0))
    assert desk.nvmlDeviceGetFanSpeed(desk.nvmlDeviceGetHandleByIndex(0)) == 0


def test_geforce_card_reports_na_fields_as_not_supported() -> None:
    nvml = _sim("rtx-4080-super")
    h = nvml.nvmlDeviceGetHandleByIndex(0)

    for call in (
        nvml.nvmlDeviceGetSerial,
        nvml.nvmlDeviceGetBoardPartNumber,
        nvml.nvmlDeviceGetEccMode,
        nvml.nvmlDeviceGetMigMode,
        nvml.nvmlDeviceGetNumaNodeId,
        nvml.nvmlDeviceGetRemappedRows,
        nvml.nvmlDeviceGetRetiredPagesPendingStatus,
    ):
        with pytest.raises(pynvml.NVMLError_NotSupported):
            call(h)
    with pytest.raises(pynvml.NVMLError_NotSupported):
        nvml.nvmlDeviceGetTotalEccErrors(h, 1, 0)
    assert nvml.nvmlDeviceGetBrand(h) == pynvml.NVML_BRAND_GEFORCE
    assert nvml.nvmlDeviceGetPerformanceState(h) == 8
    assert nvml.nvmlDeviceGetMaxMigDeviceCount(h) == 0


def test_identities_have_real_formats_and_differ_between_nodes() -> None:
    a = _sim("dgx-a100-40gb", "dgx-a")
    b = _sim("dgx-a100-40gb", "dgx-b")

    def ids(nvml: SimulatedNvml) -> list[tuple[str, str]]:
        return [
            (nvml.nvmlDeviceGetUUID(h), nvml.nvmlDeviceGetSerial(h))
            for h in map(nvml.nvmlDeviceGetHandleByIndex, range(8))
        ]

    ids_a, ids_b = ids(a), ids(b)

    uuid_re = re.compile(r"^GPU-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")
    assert all(uuid_re.match(u) for u, _ in ids_a + ids_b)
    assert all(re.fullmatch(r"1323\d{9}", s) for _, s in ids_a + ids_b)
    assert len({u for u, _ in ids_a + ids_b}) == 16
    assert len({s for _, s in ids_a + ids_b}) == 16
    assert ids(_sim("dgx-a100-40gb", "dgx-a")) == ids_a  # deterministic per node


def test_handles_resolve_by_uuid_and_pci_bus_id() -> None:
    nvml = _sim("dgx-a100-40gb")
    h3 = nvml.nvmlDeviceGetHandleByIndex(3)

    assert nvml.nvmlDeviceGetHandleByUUID(nvml.nvmlDeviceGetUUID(h3)) is h3
    assert nvml.nvmlDeviceGetHandleByPciBusId("00000000:4E:00.0") is h3
    assert nvml.nvmlDeviceGetHandleByPciBusId("0000:4e:00.0") is h3
    with pytest.raises(pynvml.NVMLError_NotFound):
        nvml.nvmlDeviceGetHandleByPciBusId("0000:4F:00.0")
    with pytest.raises(pynvml.NVMLError_NotFound):
        nvml.nvmlDeviceGetHandleByUUID("GPU-00000000-0000-0000-0000-000000000000")
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        nvml.nvmlDeviceGetHandleByIndex(8)


def test_every_call_before_init_raises_uninitialized() -> None:
    nvml = SimulatedNvml.from_model("dgx-a100-40gb", node_name="n")
    nvml.nvmlInit()
    handle = nvml.nvmlDeviceGetHandleByIndex(0)
    nvml.nvmlShutdown()

    for call, args in (
        (nvml.nvmlDeviceGetCount, ()),
        (nvml.nvmlSystemGetDriverVersion, ()),
        (nvml.nvmlDeviceGetHandleByIndex, (0,)),
        (nvml.nvmlDeviceGetName, (handle,)),
        (nvml.nvmlDeviceGetMigMode, (handle,)),
        (nvml.nvmlEventSetCreate, ()),
    ):
        with pytest.raises(pynvml.NVMLError_Uninitialized):
            call(*args)
    with pytest.raises(pynvml.NVMLError_Uninitialized):
        nvml.nvmlShutdown()


def test_init_and_shutdown_are_reference_counted() -> None:
    nvml = SimulatedNvml.from_model("rtx-4080-super", node_name="n")

    nvml.nvmlInit()
    nvml.nvmlInitWithFlags(0)
    nvml.nvmlShutdown()

    assert nvml.nvmlDeviceGetCount() == 1
    nvml.nvmlShutdown()
    with pytest.raises(pynvml.NVMLError_Uninitialized):
        nvml.nvmlDeviceGetCount()


def test_unmodelled_pynvml_function_raises_function_not_found() -> None:
    nvml = _sim("rtx-4080-super")

    with pytest.raises(pynvml.NVMLError_FunctionNotFound):
        nvml.nvmlDeviceGetGspFirmwareVersion(nvml.nvmlDeviceGetHandleByIndex(0))
    with pytest.raises(AttributeError):
        nvml.not_an_nvml_function  # noqa: B018


def test_fleet_spec_builds_the_named_node_with_mig_overrides() -> None:
    spec = {
        "nodes": [
            {"name": "dgx-1", "model": "dgx-a100-40gb", "mig": {"0": None, "5": ["7g.40gb"]}},
            {"name": "box-1", "model": "pcie-l40s-4x"},
        ]
    }

    nvml = SimulatedNvml.from_fleet_spec(spec, "dgx-1")
    nvml.nvmlInit()
    gpu0, gpu1, gpu5 = (nvml.nvmlDeviceGetHandleByIndex(i) for i in (0, 1, 5))

    assert [n.name for n in load_fleet(spec)] == ["dgx-1", "box-1"]
    assert nvml.nvmlDeviceGetMigMode(gpu0) == [0, 0]
    assert nvml.nvmlDeviceGetMigMode(gpu1) == [1, 1]  # the model's initial_state
    mig5 = nvml.nvmlDeviceGetMigDeviceHandleByIndex(gpu5, 0)
    assert nvml.nvmlDeviceGetName(mig5) == "NVIDIA A100-SXM4-40GB MIG 7g.40gb"
    with pytest.raises(ValueError, match="no node"):
        SimulatedNvml.from_fleet_spec(spec, "missing")
