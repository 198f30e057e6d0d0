"""``gpuadmin sim`` commands, through ``inventory.nvml.sim.cli.main``."""

from __future__ import annotations

import json
from pathlib import Path

import pynvml
import pytest

from inventory.nvml.sim import SimulatedNvml
from inventory.nvml.sim.cli import main
from tests.nvml.captures import REAL, needs_real_captures


@pytest.fixture
def agent(tmp_path: Path) -> SimulatedNvml:
    sim = SimulatedNvml.from_model(
        "dgx-a100-40gb", node_name="dgx-01", state_dir=tmp_path, reload_interval=0
    )
    sim.nvmlInit()
    return sim


def test_models_lists_every_model(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["models"]) == 0

    names = [line.split("\t")[0] for line in capsys.readouterr().out.splitlines()]
    assert names == ["dgx-1-v100", "dgx-a100-40gb", "dgx-a100-80gb", "dgx-h100", "pcie-l40s-4x",
                     "rtx-4080-super"]  # fmt: skip


def test_inject_commands_change_the_running_agent(agent: SimulatedNvml, tmp_path: Path) -> None:
    d = ["--state-dir", str(tmp_path)]
    events = agent.nvmlEventSetCreate()
    agent.nvmlDeviceRegisterEvents(agent.nvmlDeviceGetHandleByIndex(3), 0x8, events)
    gpu4 = agent.nvmlDeviceGetHandleByIndex(4)

    assert main(["inject", "xid", "dgx-01", "3", "48", *d]) == 0
    assert main(["inject", "ecc", "dgx-01", "4", "2", *d]) == 0
    assert main(["inject", "temp", "dgx-01", "4", "91", *d]) == 0
    assert main(["inject", "remap", "dgx-01", "4", "--uncorrectable", "1", "--pending", *d]) == 0
    assert main(["inject", "fail", "dgx-01", "5", "--code", "NOT_FOUND", *d]) == 0
    assert main(["inject", "lost", "dgx-01", "6", *d]) == 0

    assert agent.nvmlEventSetWait(events, 0).eventData == 48
    assert agent.nvmlDeviceGetTotalEccErrors(gpu4, 1, 1) == 2
    assert agent.nvmlDeviceGetTemperature(gpu4, 0) == 91
    assert agent.nvmlDeviceGetRemappedRows(gpu4) == (0, 1, 1, 0)
    with pytest.raises(pynvml.NVMLError_NotFound):
        agent.nvmlDeviceGetName(agent.nvmlDeviceGetHandleByIndex(5))
    with pytest.raises(pynvml.NVMLError_GpuIsLost):
        agent.nvmlDeviceGetHandleByIndex(6)

    assert main(["inject", "clear", "dgx-01", *d]) == 0
    assert agent.nvmlDeviceGetName(agent.nvmlDeviceGetHandleByIndex(6)) == "NVIDIA A100-SXM4-40GB"
    assert agent.nvmlDeviceGetTotalEccErrors(gpu4, 1, 1) == 0


def test_inject_temp_over_ramps_from_the_current_temperature(
    agent: SimulatedNvml, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    d = ["--state-dir", str(tmp_path)]
    gpu = agent.nvmlDeviceGetHandleByIndex(2)
    before = agent.nvmlDeviceGetTemperature(gpu, 0)

    assert main(["inject", "temp", "dgx-01", "2", "95", "--over", "2m", *d]) == 0

    assert capsys.readouterr().out == "dgx-01: GPU 2 ramping to 95 °C over 120 s\n"
    ramp = json.loads((tmp_path / "dgx-01.json").read_text())["gpus"][2]["temperature_ramp"]
    assert (ramp["from_c"], ramp["to_c"], ramp["over_s"]) == (before, 95, 120)
    assert before <= agent.nvmlDeviceGetTemperature(gpu, 0) < 95  # seconds into two minutes
    for bad in ("0s", "soon", "5d", "-1m"):
        with pytest.raises(SystemExit) as exit_:
            main(["inject", "temp", "dgx-01", "2", "95", "--over", bad, *d])
        assert exit_.value.code == 2
        assert "--over" in capsys.readouterr().err


def test_proc_reset_and_reboot(agent: SimulatedNvml, tmp_path: Path) -> None:
    d = ["--state-dir", str(tmp_path)]
    gpu2 = agent.nvmlDeviceGetHandleByIndex(2)

    assert main(["proc", "start", "dgx-01", "2", "77", "--mem", "512", "--util", "50", *d]) == 0
    assert [p.pid for p in agent.nvmlDeviceGetComputeRunningProcesses(gpu2)] == [77]
    assert agent.nvmlDeviceGetUtilizationRates(gpu2).gpu == 50
    assert main(["proc", "stop", "dgx-01", "77", *d]) == 0
    agent.nvmlDeviceSetMigMode(gpu2, pynvml.NVML_DEVICE_MIG_ENABLE)
    assert main(["reset", "dgx-01", "2", *d]) == 0
    assert agent.nvmlDeviceGetMigMode(gpu2) == [1, 1]
    assert main(["reboot", "dgx-01", *d]) == 0
    assert agent.state["boot_id"] == 2


def test_errors_exit_2_with_a_message(
    agent: SimulatedNvml, tmp_path: Path, capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    monkeypatch.delenv("GPUADMIN_SIM_STATE_DIR", raising=False)

    assert main(["inject", "xid", "dgx-01", "9", "79", "--state-dir", str(tmp_path)]) == 2
    assert main(["inject", "xid", "nobody", "0", "79", "--state-dir", str(tmp_path)]) == 2
    assert main(["inject", "xid", "dgx-01", "0", "79"]) == 2

    assert capsys.readouterr().err.splitlines() == [
        "gpuadmin sim: node dgx-01 has no GPU 9",
        f"gpuadmin sim: no simulator state for node at {tmp_path / 'nobody.json'}: is its agent "
        "running (gpuadmin up, or gpuadmin agent --node NAME --sim MODEL)?",
        "gpuadmin sim: --state-dir (or $GPUADMIN_SIM_STATE_DIR) is required",
    ]


def test_state_dir_from_the_environment(
    agent: SimulatedNvml, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("GPUADMIN_SIM_STATE_DIR", str(tmp_path))

    assert main(["inject", "temp", "dgx-01", "0", "50"]) == 0

    assert agent.nvmlDeviceGetTemperature(agent.nvmlDeviceGetHandleByIndex(0), 0) == 50


def test_every_call_of_a_full_scan_answers_on_a_dgx_a100_again_after_a_shutdown() -> None:
    # How fast is bench/scan.py's business; this checks only that every call answers.
    nvml = SimulatedNvml.from_model("dgx-a100-40gb", node_name="dgx-01")

    def scan() -> None:
        nvml.nvmlInit()
        nvml.nvmlSystemGetDriverVersion()
        handles = [nvml.nvmlDeviceGetHandleByIndex(i) for i in range(nvml.nvmlDeviceGetCount())]
        for h in handles:
            for call in (nvml.nvmlDeviceGetName, nvml.nvmlDeviceGetUUID, nvml.nvmlDeviceGetSerial,
                         nvml.nvmlDeviceGetPciInfo, nvml.nvmlDeviceGetMemoryInfo,
                         nvml.nvmlDeviceGetBAR1MemoryInfo, nvml.nvmlDeviceGetPowerUsage,
                         nvml.nvmlDeviceGetTotalEnergyConsumption, nvml.nvmlDeviceGetMigMode,
                         nvml.nvmlDeviceGetPerformanceState, nvml.nvmlDeviceGetRemappedRows,
                         nvml.nvmlDeviceGetCurrentClocksEventReasons,
                         nvml.nvmlDeviceGetComputeRunningProcesses):  # fmt: skip
                call(h)
            nvml.nvmlDeviceGetTemperature(h, 0)
            nvml.nvmlDeviceGetCpuAffinity(h, 32)
            for counter in (0, 1):
                nvml.nvmlDeviceGetTotalEccErrors(h, 1, counter)
            for link in range(12):
                nvml.nvmlDeviceGetNvLinkState(h, link)
                nvml.nvmlDeviceGetNvLinkRemotePciInfo(h, link)
            for other in handles:
                nvml.nvmlDeviceGetTopologyCommonAncestor(h, other)
                nvml.nvmlDeviceGetP2PStatus(h, other, pynvml.NVML_P2P_CAPS_INDEX_NVLINK)
            if nvml.nvmlDeviceGetMigMode(h)[0]:
                for index in range(7):
                    try:
                        mig = nvml.nvmlDeviceGetMigDeviceHandleByIndex(h, index)
                    except pynvml.NVMLError_NotFound:
                        break
                    nvml.nvmlDeviceGetUUID(mig)
                    nvml.nvmlDeviceGetMemoryInfo(mig)
                for profile in range(pynvml.NVML_GPU_INSTANCE_PROFILE_COUNT):
                    try:
                        info = nvml.nvmlDeviceGetGpuInstanceProfileInfo(h, profile)
                    except pynvml.NVMLError_NotSupported:
                        continue
                    nvml.nvmlDeviceGetGpuInstanceRemainingCapacity(h, info.id)
        nvml.nvmlShutdown()

    scan()
    scan()


@needs_real_captures
def test_help_lists_import_which_runs_through_the_sim_cli(capsys: pytest.CaptureFixture[str]):
    with pytest.raises(SystemExit):
        main(["--help"])
    commands = capsys.readouterr().out.split("{", 1)[1].split("}", 1)[0].split(",")
    assert "import" in commands
    xml = REAL / "nvidia-smi-q-xml" / "k8s-test-infra__hardware__qx-t4.xml"
    assert main(["import", str(xml), "--name", "t4"]) == 0
    assert json.loads(capsys.readouterr().out)["name"] == "t4"
