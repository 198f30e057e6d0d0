"""Board features a capture reports as N/A or switched off: power management, power readings,
a lowered power limit, ECC supported but disabled, persistence mode on Windows."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pynvml
import pytest

from inventory.nvml.scanner import scan
from inventory.nvml.sim import SimulatedNvml, faults

T0 = 1_700_000_000.0
_DESKTOP = Path(faults.__file__).parent / "machines" / "rtx-4080-super.json"
_POWER_LIMIT_CALLS = (
    "nvmlDeviceGetPowerManagementMode",
    "nvmlDeviceGetPowerManagementLimit",
    "nvmlDeviceGetPowerManagementDefaultLimit",
    "nvmlDeviceGetPowerManagementLimitConstraints",
    "nvmlDeviceGetEnforcedPowerLimit",
)
_UNCORRECTED, _VOLATILE = pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, pynvml.NVML_VOLATILE_ECC
_ECC_COUNTER_CALLS: tuple[Callable[[SimulatedNvml, Any], int], ...] = (
    lambda nvml, h: nvml.nvmlDeviceGetTotalEccErrors(h, _UNCORRECTED, _VOLATILE),
    lambda nvml, h: nvml.nvmlDeviceGetMemoryErrorCounter(
        h, _UNCORRECTED, _VOLATILE, pynvml.NVML_MEMORY_LOCATION_DRAM
    ),
)


def _desktop(clock: Callable[[], float] = lambda: T0, **changes: Any) -> SimulatedNvml:
    """The RTX 4080 SUPER model with its GPU type's fields replaced by ``changes``."""
    model = json.loads(_DESKTOP.read_text())
    model["gpu_types"]["RTX-4080-SUPER"].update(changes)
    nvml = SimulatedNvml.from_model(model, node_name="desk", clock=clock)
    nvml.nvmlInit()
    return nvml


def _power(**changes: float | None) -> dict[str, float | None]:
    """The model's ``power_w`` with ``changes``."""
    base = {"default_limit": 320, "min_limit": 150, "max_limit": 400, "idle": 25.92}
    return {**base, "full_load": 305, **changes}


def test_power_limits_na_are_not_supported_and_draw_is_not_capped() -> None:
    # netdata rtx-3060 (laptop): power_management and every limit N/A, power_draw 8.70 W.
    nvml = _desktop(power_w=_power(default_limit=None, min_limit=None, max_limit=None, idle=8.7))
    h = nvml.nvmlDeviceGetHandleByIndex(0)

    for name in _POWER_LIMIT_CALLS:
        with pytest.raises(pynvml.NVMLError_NotSupported):
            getattr(nvml, name)(h)
    assert 8_600 <= nvml.nvmlDeviceGetPowerUsage(h) <= 8_800
    faults.start_process(nvml, None, 0, 4242, used_mib=1000)
    assert nvml.nvmlDeviceGetPowerUsage(h) > 290_000
    reasons = nvml.nvmlDeviceGetCurrentClocksEventReasons(h)
    assert not reasons & pynvml.nvmlClocksEventReasonSwPowerCap
    facts = scan(nvml).gpus[0].facts
    assert (facts.power_limit_default_w, facts.power_limit_enforced_w) == (None, None)


def test_power_draw_na_is_not_supported_and_has_no_energy_counter() -> None:
    # telegraf quadro-p400 / tesla_p4: power_draw N/A as well.
    nvml = _desktop(power_w=_power(idle=None, full_load=None))
    h = nvml.nvmlDeviceGetHandleByIndex(0)

    faults.start_process(nvml, None, 0, 4242, used_mib=1000)

    for call in (nvml.nvmlDeviceGetPowerUsage, nvml.nvmlDeviceGetTotalEnergyConsumption):
        with pytest.raises(pynvml.NVMLError_NotSupported):
            call(h)
    assert nvml.nvmlDeviceGetUtilizationRates(h).gpu == 100
    assert scan(nvml).gpus[0].metrics.power_w is None


def test_enforced_limit_below_the_default_caps_the_draw() -> None:
    # telegraf rtx-3090-v12: power_limit / enforced_power_limit 200 W, default 350 W.
    nvml = _desktop(power_w=_power(default_limit=350, max_limit=375, enforced_limit=200))
    h = nvml.nvmlDeviceGetHandleByIndex(0)

    faults.start_process(nvml, None, 0, 4242, used_mib=1000)

    assert nvml.nvmlDeviceGetPowerManagementLimit(h) == 200_000
    assert nvml.nvmlDeviceGetEnforcedPowerLimit(h) == 200_000
    assert nvml.nvmlDeviceGetPowerManagementDefaultLimit(h) == 350_000
    assert nvml.nvmlDeviceGetPowerManagementLimitConstraints(h) == [150_000, 375_000]
    assert nvml.nvmlDeviceGetPowerUsage(h) == 200_000
    assert nvml.nvmlDeviceGetCurrentClocksEventReasons(h) & pynvml.nvmlClocksEventReasonSwPowerCap


def test_without_enforced_limit_every_limit_is_the_default() -> None:
    nvml = _desktop()
    h = nvml.nvmlDeviceGetHandleByIndex(0)

    assert nvml.nvmlDeviceGetPowerManagementMode(h) == pynvml.NVML_FEATURE_ENABLED
    assert nvml.nvmlDeviceGetPowerManagementLimit(h) == 320_000
    assert nvml.nvmlDeviceGetEnforcedPowerLimit(h) == 320_000


@pytest.mark.parametrize(
    ("ecc", "mode"),
    [
        ({"current": False, "pending": False}, [0, 0]),  # RTX 4090, A5000, PRO 6000, 4000 SFF
        ({"current": False, "pending": True}, [0, 1]),  # `nvidia-smi -e 1` before the reboot
    ],
)
def test_ecc_supported_but_disabled(ecc: dict[str, bool], mode: list[int]) -> None:
    nvml = _desktop(ecc=ecc, row_remapper_banks=192)
    h = nvml.nvmlDeviceGetHandleByIndex(0)

    assert nvml.nvmlDeviceGetEccMode(h) == mode
    for call in _ECC_COUNTER_CALLS:  # the captures' ecc_errors blocks are all N/A
        with pytest.raises(pynvml.NVMLError_NotSupported):
            call(nvml, h)
    assert not nvml.nvmlDeviceGetSupportedEventTypes(h) & pynvml.nvmlEventTypeDoubleBitEccError
    assert nvml.nvmlDeviceGetRemappedRows(h) == (0, 0, 0, 0)  # still reported with ECC off
    with pytest.raises(ValueError, match="ECC is disabled"):
        faults.set_ecc(nvml, None, 0, count=1)
    health = scan(nvml).gpus[0].health
    assert (health.ecc_volatile_corrected, health.remapped_rows_correctable) == (None, 0)


def test_ecc_true_is_enabled_and_false_is_not_supported() -> None:
    on, off = _desktop(ecc=True), _desktop()

    h = on.nvmlDeviceGetHandleByIndex(0)
    assert on.nvmlDeviceGetEccMode(h) == [1, 1]
    assert [call(on, h) for call in _ECC_COUNTER_CALLS] == [0, 0]
    with pytest.raises(pynvml.NVMLError_NotSupported):
        off.nvmlDeviceGetEccMode(off.nvmlDeviceGetHandleByIndex(0))


def test_persistence_mode_na_is_not_supported() -> None:
    # Windows captures (rtx-3080-v12, tesla_p4, rtx-2080-win): persistence_mode N/A.
    nvml = _desktop(persistence_mode=None)

    with pytest.raises(pynvml.NVMLError_NotSupported):
        nvml.nvmlDeviceGetPersistenceMode(nvml.nvmlDeviceGetHandleByIndex(0))
    assert scan(nvml).gpus[0].facts.persistence_mode is None
