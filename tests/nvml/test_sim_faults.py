"""Injected faults, simulated processes and the shared state file."""

from __future__ import annotations

import json
from pathlib import Path

import pynvml
import pytest

from inventory.nvml.sim import SimulatedNvml, faults
from inventory.nvml.sim.state import SimStateError

MIB = 1024 * 1024
T0 = 1_700_000_000.0


class Clock:
    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def nvml(clock: Clock) -> SimulatedNvml:
    sim = SimulatedNvml.from_model("dgx-a100-40gb", node_name="dgx-01", clock=clock)
    sim.nvmlInit()
    return sim


def test_fall_off_bus_makes_every_call_gpu_is_lost(nvml: SimulatedNvml) -> None:
    before = nvml.nvmlDeviceGetHandleByIndex(4)
    uuid = nvml.nvmlDeviceGetUUID(before)

    faults.fall_off_bus(nvml, None, 4)

    for call, args in (
        (nvml.nvmlDeviceGetHandleByIndex, (4,)),
        (nvml.nvmlDeviceGetHandleByUUID, (uuid,)),
        (nvml.nvmlDeviceGetHandleByPciBusId, ("00000000:87:00.0",)),
        (nvml.nvmlDeviceGetName, (before,)),
        (nvml.nvmlDeviceGetMemoryInfo, (before,)),
        (nvml.nvmlDeviceGetTemperature, (before, pynvml.NVML_TEMPERATURE_GPU)),
        (nvml.nvmlDeviceGetTotalEccErrors, (before, 1, 0)),
        (nvml.nvmlDeviceGetNvLinkState, (before, 0)),
    ):
        with pytest.raises(pynvml.NVMLError_GpuIsLost):
            call(*args)
    other = nvml.nvmlDeviceGetHandleByIndex(5)
    with pytest.raises(pynvml.NVMLError_GpuIsLost):
        nvml.nvmlDeviceGetTopologyCommonAncestor(other, before)
    assert nvml.nvmlDeviceGetCount() == 8
    assert nvml.nvmlDeviceGetName(other) == "NVIDIA A100-SXM4-40GB"


def test_failing_device_fails_while_the_others_answer(nvml: SimulatedNvml) -> None:
    faults.fail_queries(nvml, None, 2, pynvml.NVML_ERROR_UNKNOWN)
    bad = nvml.nvmlDeviceGetHandleByIndex(2)  # the handle itself is still obtainable
    good = nvml.nvmlDeviceGetHandleByIndex(3)

    with pytest.raises(pynvml.NVMLError_Unknown):
        nvml.nvmlDeviceGetUUID(bad)
    with pytest.raises(pynvml.NVMLError_Unknown):
        nvml.nvmlDeviceGetPowerUsage(bad)
    assert nvml.nvmlDeviceGetPciInfo(good).busId == "00000000:4E:00.0"

    faults.clear(nvml, None, 2)
    assert nvml.nvmlDeviceGetPciInfo(bad).busId == "00000000:47:00.0"


def test_xid_is_delivered_to_registered_event_sets_only(nvml: SimulatedNvml) -> None:
    gpu3 = nvml.nvmlDeviceGetHandleByIndex(3)
    faults.inject_xid(nvml, None, 3, 31)  # before registration: not delivered
    events = nvml.nvmlEventSetCreate()
    nvml.nvmlDeviceRegisterEvents(gpu3, pynvml.nvmlEventTypeXidCriticalError, events)

    faults.inject_xid(nvml, None, 5, 43)  # another GPU: not registered
    faults.inject_xid(nvml, None, 3, 79, message="GPU has fallen off the bus")
    data = nvml.nvmlEventSetWait_v2(events, 0)

    assert isinstance(data, pynvml.c_nvmlEventData_t)
    assert (data.eventType, data.eventData) == (pynvml.nvmlEventTypeXidCriticalError, 79)
    assert (data.gpuInstanceId, data.computeInstanceId) == (0xFFFFFFFF, 0xFFFFFFFF)
    assert nvml.nvmlDeviceGetUUID(data.device) == nvml.nvmlDeviceGetUUID(gpu3)
    with pytest.raises(pynvml.NVMLError_Timeout):
        nvml.nvmlEventSetWait(events, 0)
    nvml.nvmlEventSetFree(events)
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        nvml.nvmlEventSetWait(events, 0)


def test_xid_on_a_mig_device_carries_its_instance_ids(nvml: SimulatedNvml) -> None:
    events = nvml.nvmlEventSetCreate()
    nvml.nvmlDeviceRegisterEvents(
        nvml.nvmlDeviceGetHandleByIndex(0), pynvml.nvmlEventTypeXidCriticalError, events
    )

    faults.inject_xid(nvml, None, 0, 13, gpu_instance=2, compute_instance=0)
    data = nvml.nvmlEventSetWait(events, 10)

    assert (data.eventData, data.gpuInstanceId, data.computeInstanceId) == (13, 2, 0)


def test_event_wait_times_out_when_nothing_arrives(nvml: SimulatedNvml) -> None:
    events = nvml.nvmlEventSetCreate()
    nvml.nvmlDeviceRegisterEvents(nvml.nvmlDeviceGetHandleByIndex(0), 0x8, events)

    with pytest.raises(pynvml.NVMLError_Timeout):
        nvml.nvmlEventSetWait_v2(events, 20)


def test_supported_event_types_and_unsupported_registration() -> None:
    desk = SimulatedNvml.from_model("rtx-4080-super", node_name="desk")
    desk.nvmlInit()
    h = desk.nvmlDeviceGetHandleByIndex(0)
    events = desk.nvmlEventSetCreate()

    assert desk.nvmlDeviceGetSupportedEventTypes(h) == 0x1C  # PState | Xid | Clock, no ECC
    with pytest.raises(pynvml.NVMLError_NotSupported):
        desk.nvmlDeviceRegisterEvents(h, pynvml.nvmlEventTypeDoubleBitEccError, events)


def test_ecc_counters_and_dbe_event(nvml: SimulatedNvml) -> None:
    h = nvml.nvmlDeviceGetHandleByIndex(1)
    events = nvml.nvmlEventSetCreate()
    nvml.nvmlDeviceRegisterEvents(h, pynvml.nvmlEventTypeDoubleBitEccError, events)

    faults.set_ecc(nvml, None, 1, count=177, error="corrected")
    faults.set_ecc(nvml, None, 1, count=5, error="uncorrected", counter="aggregate",
                   location="sram")  # fmt: skip
    faults.set_ecc(nvml, None, 1, count=1, error="uncorrected", location="sram")

    corrected, uncorrected = (pynvml.NVML_MEMORY_ERROR_TYPE_CORRECTED,
                              pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED)  # fmt: skip
    vol, agg = pynvml.NVML_VOLATILE_ECC, pynvml.NVML_AGGREGATE_ECC
    assert nvml.nvmlDeviceGetTotalEccErrors(h, corrected, vol) == 177
    assert nvml.nvmlDeviceGetTotalEccErrors(h, corrected, agg) == 177
    assert nvml.nvmlDeviceGetTotalEccErrors(h, uncorrected, vol) == 1
    assert nvml.nvmlDeviceGetTotalEccErrors(h, uncorrected, agg) == 1
    sram = pynvml.NVML_MEMORY_LOCATION_SRAM
    assert nvml.nvmlDeviceGetMemoryErrorCounter(h, uncorrected, vol, sram) == 1
    assert nvml.nvmlDeviceGetMemoryErrorCounter(h, corrected, vol, 2) == 177  # DRAM
    with pytest.raises(pynvml.NVMLError_NotSupported):
        nvml.nvmlDeviceGetMemoryErrorCounter(
            h, corrected, vol, pynvml.NVML_MEMORY_LOCATION_L1_CACHE
        )
    assert nvml.nvmlEventSetWait(events, 0).eventType == pynvml.nvmlEventTypeDoubleBitEccError
    nvml.reset_gpu(1)
    assert nvml.nvmlDeviceGetTotalEccErrors(h, corrected, vol) == 0
    assert nvml.nvmlDeviceGetTotalEccErrors(h, corrected, agg) == 177


def test_row_remapping_and_page_retirement_on_ampere(nvml: SimulatedNvml) -> None:
    h = nvml.nvmlDeviceGetHandleByIndex(6)

    faults.remap_rows(nvml, None, 6, correctable=1, pending=True)

    assert nvml.nvmlDeviceGetRemappedRows(h) == (1, 0, 1, 0)
    histogram = nvml.nvmlDeviceGetRowRemapperHistogram(h)
    assert (histogram.max, histogram.high) == (639, 1)  # stas00 A100 excerpt
    with pytest.raises(pynvml.NVMLError_NotSupported):
        nvml.nvmlDeviceGetRetiredPagesPendingStatus(h)
    with pytest.raises(pynvml.NVMLError_NotSupported):
        nvml.nvmlDeviceGetRetiredPages(h, 1)
    with pytest.raises(ValueError, match="row remapping"):
        faults.add_retired_pages(nvml, None, 6, [0x1000])
    nvml.reset_gpu(6)
    assert nvml.nvmlDeviceGetRemappedRows(h) == (1, 0, 0, 0)


def test_page_retirement_on_a_pre_ampere_style_model(clock: Clock) -> None:
    model = json.loads(
        (Path(faults.__file__).parent / "machines" / "rtx-4080-super.json").read_text()
    )
    gpu_type = model["gpu_types"]["RTX-4080-SUPER"]
    gpu_type.update(ecc=True, page_retirement=True)
    nvml = SimulatedNvml.from_model(model, node_name="old", clock=clock)
    nvml.nvmlInit()
    h = nvml.nvmlDeviceGetHandleByIndex(0)

    faults.add_retired_pages(nvml, None, 0, [0x1F000, 0x2F000], cause="double_bit")

    dbe = pynvml.NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR
    assert nvml.nvmlDeviceGetRetiredPages(h, dbe) == [0x1F000, 0x2F000]
    assert nvml.nvmlDeviceGetRetiredPages_v2(h, dbe)[0] == {"address": 0x1F000, "timestamp": T0}
    assert nvml.nvmlDeviceGetRetiredPages(h, 0) == []
    assert nvml.nvmlDeviceGetRetiredPagesPendingStatus(h) == 1


def test_temperature_fault_raises_throttle_reasons(nvml: SimulatedNvml) -> None:
    h = nvml.nvmlDeviceGetHandleByIndex(2)
    hw = pynvml.nvmlClocksEventReasonHwSlowdown | pynvml.nvmlClocksEventReasonHwThermalSlowdown

    faults.set_temperature(nvml, None, 2, 86)  # above the A100's 85 C max operating temp
    sw_reasons = nvml.nvmlDeviceGetCurrentClocksEventReasons(h)
    faults.set_temperature(nvml, None, 2, 90)  # above the 89 C slowdown threshold
    hw_reasons = nvml.nvmlDeviceGetCurrentClocksThrottleReasons(h)

    assert nvml.nvmlDeviceGetTemperature(h, pynvml.NVML_TEMPERATURE_GPU) == 90
    assert sw_reasons == pynvml.nvmlClocksEventReasonGpuIdle | (
        pynvml.nvmlClocksEventReasonSwThermalSlowdown
    )
    # Above the slowdown threshold the die is above its max operating temperature too.
    assert hw_reasons == pynvml.nvmlClocksEventReasonGpuIdle | (
        pynvml.nvmlClocksEventReasonSwThermalSlowdown | hw
    )
    faults.set_temperature(nvml, None, 2, None)
    assert nvml.nvmlDeviceGetCurrentClocksEventReasons(h) == pynvml.nvmlClocksEventReasonGpuIdle


def test_a_temperature_ramp_is_worked_out_from_the_clock(nvml: SimulatedNvml, clock: Clock) -> None:
    """From what the GPU reads now to the target in a straight line, then held; the reasons
    follow the ramped value; nothing runs in between (only the clock moves)."""
    h = nvml.nvmlDeviceGetHandleByIndex(2)
    before = nvml.nvmlDeviceGetTemperature(h, pynvml.NVML_TEMPERATURE_GPU)

    faults.set_temperature(nvml, None, 2, 95, over_s=60)

    readings = []
    for _ in range(5):
        readings.append(nvml.nvmlDeviceGetTemperature(h, pynvml.NVML_TEMPERATURE_GPU))
        clock.now += 15
    assert readings == [round(before + (95 - before) * q) for q in (0, 0.25, 0.5, 0.75, 1)]
    clock.now += 3600
    assert nvml.nvmlDeviceGetTemperature(h, pynvml.NVML_TEMPERATURE_GPU) == 95
    assert nvml.nvmlDeviceGetCurrentClocksEventReasons(h) & pynvml.nvmlClocksEventReasonHwSlowdown
    # A new ramp starts where the GPU is; a pin or a clear ends it.
    faults.set_temperature(nvml, None, 2, 55, over_s=40)
    clock.now += 20
    assert nvml.nvmlDeviceGetTemperature(h, pynvml.NVML_TEMPERATURE_GPU) == 75
    faults.set_temperature(nvml, None, 2, 70)
    clock.now += 20
    assert nvml.nvmlDeviceGetTemperature(h, pynvml.NVML_TEMPERATURE_GPU) == 70
    faults.set_temperature(nvml, None, 2, 90, over_s=10)
    faults.clear(nvml, None, 2)
    clock.now += 20
    assert nvml.nvmlDeviceGetTemperature(h, pynvml.NVML_TEMPERATURE_GPU) <= 23
    with pytest.raises(ValueError, match="a ramp needs"):
        faults.set_temperature(nvml, None, 2, 90, over_s=0)


def test_processes_drive_utilization_memory_power_and_temperature(
    nvml: SimulatedNvml, clock: Clock
) -> None:
    h = nvml.nvmlDeviceGetHandleByIndex(3)
    idle_temp = nvml.nvmlDeviceGetTemperature(h, 0)
    idle_power = nvml.nvmlDeviceGetPowerUsage(h)
    idle_energy = nvml.nvmlDeviceGetTotalEnergyConsumption(h)

    faults.start_process(nvml, None, 3, 4242, used_mib=30000, util=100, name="train.py")
    clock.now += 120

    util = nvml.nvmlDeviceGetUtilizationRates(h)
    procs = nvml.nvmlDeviceGetComputeRunningProcesses(h)
    assert (util.gpu, util.memory) == (100, 30)
    assert [(p.pid, p.usedGpuMemory, p.gpuInstanceId) for p in procs] == [
        (4242, 30000 * MIB, 0xFFFFFFFF)
    ]
    assert nvml.nvmlDeviceGetMemoryInfo(h).used == (620 + 4 + 30000) * MIB
    assert 370_000 <= nvml.nvmlDeviceGetPowerUsage(h) <= 384_000
    assert idle_power < 60_000
    assert 62 <= nvml.nvmlDeviceGetTemperature(h, 0) <= 66 and idle_temp <= 23
    assert nvml.nvmlDeviceGetClockInfo(h, pynvml.NVML_CLOCK_SM) == 1410
    assert nvml.nvmlDeviceGetCurrentClocksEventReasons(h) == 0
    assert nvml.nvmlSystemGetProcessName(4242) == "train.py"
    energy = nvml.nvmlDeviceGetTotalEnergyConsumption(h)
    assert energy - idle_energy == pytest.approx(120 * 380 * 1000, rel=0.001)

    faults.stop_process(nvml, None, 4242)
    assert nvml.nvmlDeviceGetUtilizationRates(h).gpu == 0
    assert nvml.nvmlDeviceGetComputeRunningProcesses(h) == []
    assert nvml.nvmlDeviceGetTotalEnergyConsumption(h) == energy


def test_process_on_a_mig_device(nvml: SimulatedNvml) -> None:
    gpu = nvml.nvmlDeviceGetHandleByIndex(1)
    mig = nvml.nvmlDeviceGetMigDeviceHandleByIndex(gpu, 0)  # GI 7, 1g.5gb

    with pytest.raises(ValueError, match="MIG-enabled GPU needs gpu_instance"):
        faults.start_process(nvml, None, 1, 10, used_mib=100)
    faults.start_process(nvml, None, 1, 10, used_mib=2000, gpu_instance=7)

    assert [p.pid for p in nvml.nvmlDeviceGetComputeRunningProcesses(mig)] == [10]
    assert [p.gpuInstanceId for p in nvml.nvmlDeviceGetComputeRunningProcesses(gpu)] == [7]
    assert nvml.nvmlDeviceGetMemoryInfo(mig).used == 2000 * MIB
    gi = nvml.nvmlDeviceGetGpuInstanceById(gpu, 7)
    ci = nvml.nvmlGpuInstanceGetComputeInstanceById(gi, 0)
    with pytest.raises(pynvml.NVMLError_InUse):
        nvml.nvmlComputeInstanceDestroy(ci)
    with pytest.raises(pynvml.NVMLError_InUse):
        nvml.nvmlDeviceSetMigMode(gpu, pynvml.NVML_DEVICE_MIG_DISABLE)


def test_metrics_are_deterministic_for_a_fixed_clock(clock: Clock) -> None:
    def readings() -> list[tuple[int, int]]:
        sim = SimulatedNvml.from_model("dgx-h100", node_name="h-01", clock=clock)
        sim.nvmlInit()
        return [
            (sim.nvmlDeviceGetTemperature(h, 0), sim.nvmlDeviceGetPowerUsage(h))
            for h in map(sim.nvmlDeviceGetHandleByIndex, range(8))
        ]

    assert readings() == readings()
    assert all(28 <= t <= 30 and 67_000 <= p <= 70_000 for t, p in readings())


def test_state_file_round_trip_between_two_instances(tmp_path: Path) -> None:
    agent = SimulatedNvml.from_model(
        "dgx-a100-40gb", node_name="dgx-07", state_dir=tmp_path, reload_interval=0
    )
    other = SimulatedNvml.from_model(
        "dgx-a100-40gb", node_name="dgx-07", state_dir=tmp_path, reload_interval=0
    )
    agent.nvmlInit()
    other.nvmlInit()
    events = agent.nvmlEventSetCreate()
    agent.nvmlDeviceRegisterEvents(agent.nvmlDeviceGetHandleByIndex(1), 0x8, events)

    faults.inject_xid(tmp_path, "dgx-07", 1, 94, message="contained ECC error")
    faults.fall_off_bus(tmp_path, "dgx-07", 6)
    other_gpu2 = other.nvmlDeviceGetHandleByIndex(2)
    other.nvmlDeviceSetMigMode(other_gpu2, pynvml.NVML_DEVICE_MIG_ENABLE)

    assert agent.nvmlEventSetWait(events, 1000).eventData == 94
    with pytest.raises(pynvml.NVMLError_GpuIsLost):
        agent.nvmlDeviceGetHandleByIndex(6)
    assert agent.nvmlDeviceGetMigMode(agent.nvmlDeviceGetHandleByIndex(2)) == [0, 1]
    state = json.loads((tmp_path / "dgx-07.json").read_text())
    assert state["gpus"][6]["lost"] is True
    assert [e["message"] for e in state["events"]] == [
        "contained ECC error",
        "GPU has fallen off the bus.",
    ]
    third = SimulatedNvml.from_model("dgx-a100-40gb", node_name="dgx-07", state_dir=tmp_path)
    third.nvmlInit()
    with pytest.raises(pynvml.NVMLError_GpuIsLost):  # an existing state file wins
        third.nvmlDeviceGetHandleByIndex(6)


def test_reload_is_throttled_between_polls(tmp_path: Path) -> None:
    agent = SimulatedNvml.from_model(
        "rtx-4080-super", node_name="desk", state_dir=tmp_path, reload_interval=3600
    )
    agent.nvmlInit()
    h = agent.nvmlDeviceGetHandleByIndex(0)

    faults.set_temperature(tmp_path, "desk", 0, 77)

    assert agent.nvmlDeviceGetTemperature(h, 0) != 77  # not re-read within the interval
    agent.nvmlShutdown()
    agent.nvmlInit()  # nvmlInit always re-reads
    assert agent.nvmlDeviceGetTemperature(h, 0) == 77


def test_faults_need_an_existing_node_state(tmp_path: Path) -> None:
    with pytest.raises(SimStateError):
        faults.inject_xid(tmp_path, "nobody", 0, 79)

    faults.ensure_node(tmp_path, "nobody", "rtx-4080-super")
    faults.inject_xid(tmp_path, "nobody", 0, 79)

    assert json.loads((tmp_path / "nobody.json").read_text())["seq"] == 1
