"""The executor runs shares right: a MIG device by its UUID; an MPS share with its thread
percentage, memory limit and its GPU's pipe and log directories, the GPU's control daemon
started before the first share and stopped after the last (the simulator's stand-in, the same
code path as ``nvidia-cuda-mps-control``); and a cancel that chooses its first signal and
grace (preemption)."""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path

import pytest

from scheduling.agent import mps_standin
from scheduling.agent.mps import MpsDaemons, memory_limit
from scheduling.agent.wire import FinalState, JobSpec

GPU = "GPU-6f1b0a4c-1111-2222-3333-444455556666"
MIG = "MIG-9c0e2f3a-aaaa-bbbb-cccc-ddddeeeeffff"
PRINT_ENV = "env | grep -E '^(CUDA_|GPUADMIN_JOB)' | sort"


@pytest.fixture
def daemons(tmp_path: Path) -> tuple[MpsDaemons, list[tuple[str, str, int]]]:
    calls: list[tuple[str, str, int]] = []
    mps = MpsDaemons(
        tmp_path / "mps",
        command=(sys.executable, mps_standin.__file__),
        on_started=lambda uuid, pid: calls.append(("started", uuid, pid)),
        on_stopped=lambda uuid, pid: calls.append(("stopped", uuid, pid)),
    )
    yield mps, calls
    mps.stop(GPU, {"PATH": os.environ["PATH"]})


def variables(log: str) -> dict[str, str]:
    return dict(line.split("=", 1) for line in log.splitlines() if "=" in line)


def test_a_mig_job_sees_its_mig_device(make_executor, tmp_path):
    executor, events = make_executor()
    executor.launch(JobSpec(job_id="1.1", shell_command=PRINT_ENV, gpu_uuids=[MIG], cwd="/"))
    assert events.finished("1.1").state is FinalState.COMPLETED
    seen = variables(executor.tail("1.1"))
    assert seen["CUDA_VISIBLE_DEVICES"] == MIG
    assert not any(name.startswith("CUDA_MPS") for name in seen)


def test_mps_shares_run_under_their_gpus_daemon(make_executor, daemons):
    mps, calls = daemons
    executor, events = make_executor(mps=mps)
    first = JobSpec(
        job_id="2.1",
        shell_command=f"{PRINT_ENV}; sleep 0.5",
        gpu_uuids=[GPU],
        cwd="/",
        mps_percent=30,
        mps_memory_mib=8192,
    )
    second = JobSpec(job_id="3.1", argv=["sleep", "1"], gpu_uuids=[GPU], cwd="/", mps_percent=50)
    executor.launch(first)
    executor.launch(second)
    daemon = mps.pid(GPU)
    assert daemon is not None and calls == [("started", GPU, daemon)]
    assert events.finished("2.1").state is FinalState.COMPLETED
    seen = variables(executor.tail("2.1"))
    dirs = mps.dirs(GPU)
    assert seen == {
        "CUDA_VISIBLE_DEVICES": GPU,
        "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "30",
        "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": "0=8192M",
        "CUDA_MPS_PIPE_DIRECTORY": str(dirs.pipe),
        "CUDA_MPS_LOG_DIRECTORY": str(dirs.log),
        "GPUADMIN_JOB_ID": "2.1",
    }
    assert mps.pid(GPU) == daemon  # the second share still runs on it
    assert events.finished("3.1").state is FinalState.COMPLETED
    assert mps.pid(GPU) is None
    assert calls == [("started", GPU, daemon), ("stopped", GPU, daemon)]


def test_a_share_without_mps_on_the_node_fails_to_start(make_executor):
    executor, events = make_executor()
    spec = JobSpec(job_id="4.1", argv=["true"], gpu_uuids=[GPU], cwd="/", mps_percent=10)
    executor.launch(spec)
    finished = events.finished("4.1")
    assert finished.state is FinalState.FAILED
    assert "runs no MPS" in finished.message


def test_a_daemon_that_cannot_start_fails_the_job(make_executor, tmp_path):
    executor, events = make_executor(mps=MpsDaemons(tmp_path / "mps", command=("false",)))
    spec = JobSpec(job_id="5.1", argv=["true"], gpu_uuids=[GPU], cwd="/", mps_percent=10)
    executor.launch(spec)
    finished = events.finished("5.1")
    assert (finished.state, "false -d exited with 1" in finished.message) == (
        FinalState.FAILED,
        True,
    )


@pytest.mark.parametrize(
    ("fields", "error"),
    [
        ({"mps_percent": 0}, "1-100 percent of exactly one GPU"),
        ({"mps_percent": 101}, "1-100 percent of exactly one GPU"),
        ({"mps_percent": 10, "gpu_uuids": [GPU, GPU]}, "exactly one GPU"),
        ({"mps_memory_mib": 100}, "positive MiB count of an MPS share"),
        ({"mps_percent": 10, "mps_memory_mib": 0}, "positive MiB count"),
        ({"mps_percent": 10, "container_image": "ubuntu"}, "not in a container"),
    ],
)
def test_invalid_shares_are_refused(fields, error):
    with pytest.raises(ValueError, match=error):
        JobSpec(job_id="6.1", argv=["true"], **{"gpu_uuids": [GPU], **fields})


def test_a_share_travels_in_the_wire_format():
    spec = JobSpec(job_id="7.1", argv=["x"], gpu_uuids=[GPU], mps_percent=25, mps_memory_mib=9)
    assert JobSpec.from_dict(spec.to_dict()) == spec
    assert memory_limit(9) == "0=9M"


def test_a_preemption_chooses_the_first_signal_and_the_grace(make_executor, tmp_path):
    """The job checkpoints on SIGUSR1 within its grace (the executor's own grace is shorter),
    and the end is reported canceled."""
    executor, events = make_executor()
    marker = tmp_path / "checkpoint"
    script = (
        f"trap 'sleep 0.5; echo saved > {marker}; exit 0' USR1; while true; do sleep 0.05; done"
    )
    executor.launch(JobSpec(job_id="8.1", shell_command=script, cwd="/"))
    events.started("8.1")
    time.sleep(0.2)  # the shell sets its trap
    assert executor.cancel("8.1", stop_signal=signal.SIGUSR1, grace_s=5)
    # A second request (e.g. an admin's cancel) does not shorten the checkpoint's grace.
    assert executor.cancel("8.1")
    finished = events.finished("8.1")
    assert finished.state is FinalState.CANCELED
    assert marker.read_text() == "saved\n"


def test_a_preemption_kills_after_its_grace(make_executor):
    executor, events = make_executor()
    executor.launch(JobSpec(job_id="9.1", shell_command="trap '' USR1; sleep 30", cwd="/"))
    events.started("9.1")
    time.sleep(0.2)
    started = time.monotonic()
    executor.cancel("9.1", stop_signal=signal.SIGUSR1, grace_s=1)
    assert events.finished("9.1").state is FinalState.CANCELED
    assert 0.9 <= time.monotonic() - started < 5
