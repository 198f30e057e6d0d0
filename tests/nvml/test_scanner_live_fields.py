"""What the live sample needs from the scanner: memory temperature, PCIe throughput, NVLink
error counters and MIG devices' memory, against the simulator and the real captures."""

from __future__ import annotations

import pynvml
import pytest

from inventory.nvml import scan
from inventory.nvml.parsers.smi_xml import parse_smi_xml
from inventory.nvml.sim import SimulatedNvml, faults
from tests.nvml.captures import REAL, needs_real_captures

LIVE = ("facts", "metrics", "health")


def sim(model: str) -> SimulatedNvml:
    nvml = SimulatedNvml.from_model(model, node_name=f"{model}-01")
    nvml.nvmlInit()
    return nvml


@needs_real_captures
@pytest.mark.parametrize(
    ("model", "capture"),
    [
        ("dgx-h100", "k8s-test-infra__hardware__qx-h100.xml"),
        ("dgx-a100-80gb", "telegraf__a100-sxm4-v12.xml"),
        ("pcie-l40s-4x", "k8s-test-infra__hardware__qx-l40s.xml"),
    ],
)
def test_memory_temperature_matches_the_capture_at_its_gpu_temperature(
    model: str, capture: str
) -> None:
    captured = parse_smi_xml((REAL / "nvidia-smi-q-xml" / capture).read_bytes()).gpus[0]
    nvml = sim(model)
    faults.set_temperature(nvml, None, 0, captured.temperature.gpu_c)

    metrics = scan(nvml, include=LIVE).gpus[0].metrics

    assert metrics is not None
    assert metrics.temperature_c == captured.temperature.gpu_c
    # HBM boards report it (37 C on the H100 at 29 C); GDDR ones say N/A: None.
    assert metrics.memory_temperature_c == captured.temperature.memory_c


def test_field_values_answer_per_field_like_nvml() -> None:
    nvml = sim("dgx-h100")
    handle = nvml.nvmlDeviceGetHandleByIndex(0)

    values = nvml.nvmlDeviceGetFieldValues(
        handle,
        [
            pynvml.NVML_FI_DEV_MEMORY_TEMP,
            pynvml.NVML_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL,
            (pynvml.NVML_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_L0, 0),
            pynvml.NVML_FI_DEV_POWER_INSTANT,  # not modelled: its own NOT_SUPPORTED
        ],
    )

    assert isinstance(values[0], pynvml.c_nvmlFieldValue_t)
    assert values[0].valueType == pynvml.NVML_VALUE_TYPE_UNSIGNED_INT
    assert values[0].nvmlReturn == pynvml.NVML_SUCCESS and 30 <= values[0].value.uiVal <= 45
    assert (values[1].nvmlReturn, values[1].value.ullVal) == (pynvml.NVML_SUCCESS, 0)
    assert values[2].fieldId == pynvml.NVML_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_L0
    assert values[3].nvmlReturn == pynvml.NVML_ERROR_NOT_SUPPORTED


def test_nvlink_errors_sum_every_counter_of_every_link() -> None:
    nvml = sim("dgx-a100-40gb")
    faults.add_nvlink_errors(nvml, None, 2, count=3, counter="crc_flit", link=0)
    faults.add_nvlink_errors(nvml, None, 2, count=2, counter="replay", link=11)
    faults.add_nvlink_errors(nvml, None, 2, count=1, counter="recovery", link=5)
    handle = nvml.nvmlDeviceGetHandleByIndex(2)

    gpus = scan(nvml, include=LIVE).gpus

    assert [gpu.health.nvlink_errors for gpu in gpus if gpu.health] == [0, 0, 6, 0, 0, 0, 0, 0]
    flit = pynvml.NVML_NVLINK_ERROR_DL_CRC_FLIT
    assert nvml.nvmlDeviceGetNvLinkErrorCounter(handle, 0, flit) == 3
    assert nvml.nvmlDeviceGetNvLinkErrorCounter(handle, 1, flit) == 0
    with pytest.raises(ValueError, match="no NVLink 12"):
        faults.add_nvlink_errors(nvml, None, 2, link=12)
    faults.clear(nvml, None, 2)
    assert scan(nvml, include=LIVE).gpus[2].health.nvlink_errors == 0  # type: ignore[union-attr]


def test_a_gpu_without_nvlink_has_no_nvlink_errors() -> None:
    health = scan(sim("pcie-l40s-4x"), include=LIVE).gpus[0].health
    assert health is not None and health.nvlink_errors is None


def test_pcie_throughput_follows_the_load() -> None:
    nvml = sim("dgx-h100")
    faults.start_process(nvml, None, 1, 4242, used_mib=1000, util=100)

    idle, busy = (gpu.metrics for gpu in scan(nvml, include=LIVE).gpus[:2])

    assert idle is not None and busy is not None
    assert (idle.pcie_tx_kbps, idle.pcie_rx_kbps) == (540, 486)  # the model's idle, RX 9/10
    assert busy.pcie_tx_kbps == 20000


def test_mig_devices_report_their_memory_and_the_gpu_no_utilization() -> None:
    nvml = sim("dgx-a100-40gb")  # GPU 0: 3g.20gb (GI 2) + 2x 2g.10gb (GI 3, 4)
    faults.start_process(nvml, None, 0, 77, used_mib=5000, gpu_instance=3)

    metrics = scan(nvml, include=LIVE).gpus[0].metrics

    assert metrics is not None and metrics.utilization_gpu_pct is None
    devices = [(d.gi_id, d.ci_id, d.profile, d.memory_used_mib, d.memory_total_mib)
               for d in metrics.mig_devices]  # fmt: skip
    assert devices == [
        (2, 0, "3g.20gb", 0, 19968),
        (3, 0, "2g.10gb", 5000, 9856),
        (4, 0, "2g.10gb", 0, 9856),
    ]
    assert all(d.uuid and d.uuid.startswith("MIG-") for d in metrics.mig_devices)
    assert scan(nvml, include=LIVE).gpus[3].metrics.mig_devices == ()  # type: ignore[union-attr]


def test_power_brake_and_memory_over_its_limit_show_the_clock_events_nvml_reports() -> None:
    nvml = sim("dgx-a100-80gb")
    handle = nvml.nvmlDeviceGetHandleByIndex(0)
    faults.power_brake(nvml, None, 0)
    braked = nvml.nvmlDeviceGetCurrentClocksEventReasons(handle)
    faults.power_brake(nvml, None, 0, engaged=False)
    # GPU 78 C, under its 85 C max; memory 17 C warmer (the capture): at its 95 C max.
    faults.set_temperature(nvml, None, 0, 78)

    hot = scan(nvml, include=LIVE).gpus[0]

    assert braked & pynvml.nvmlClocksEventReasonHwPowerBrakeSlowdown
    assert braked & pynvml.nvmlClocksEventReasonHwSlowdown
    assert hot.metrics is not None and hot.metrics.memory_temperature_c == 95
    assert "sw_thermal_slowdown" in hot.metrics.throttle_reasons
    assert "hw_power_brake_slowdown" not in hot.metrics.throttle_reasons
