"""A job on this host's real GPU, end to end: a central worker places it, a real-NVML agent runs
it, CUDA sees only the GPU it was given, the live samples show its process on that GPU, and it
ends completed. Skipped without an NVIDIA driver and GPU."""

from __future__ import annotations

import sys
import uuid
from collections.abc import Iterator

import pytest
from django.contrib.auth import get_user_model

from inventory import live
from inventory.models import Node
from inventory.nvml.real import probe
from scheduling.jobs import submission
from scheduling.models import Job, JobState
from tests.integration.stack import worker_and_agent
from tests.waiting import wait_for

pytestmark = [pytest.mark.integration, pytest.mark.gpu, pytest.mark.django_db(transaction=True)]

# A CUDA context through the driver's own library (no CUDA toolkit or framework needed): how
# many devices the job sees and the name of the first, written to argv[1], then a few seconds
# holding the context.
CUDA_JOB = """
import ctypes, os, sys, time
cuda = ctypes.CDLL("libcuda.so.1")
assert cuda.cuInit(0) == 0, "cuInit failed"
count, device, context = ctypes.c_int(), ctypes.c_int(), ctypes.c_void_p()
cuda.cuDeviceGetCount(ctypes.byref(count))
cuda.cuDeviceGet(ctypes.byref(device), 0)
assert cuda.cuCtxCreate_v2(ctypes.byref(context), 0, device) == 0, "no CUDA context"
name = ctypes.create_string_buffer(256)
cuda.cuDeviceGetName(name, 256, device)
with open(sys.argv[1], "w") as out:
    print(os.environ["CUDA_VISIBLE_DEVICES"], count.value, name.value.decode(), file=out)
time.sleep(6)
"""


@pytest.fixture
def real_node(gpuadmin_env, tmp_path) -> Iterator[str]:
    """A central worker and this host's agent on the real NVML (jobs run as the agent)."""
    status = probe()
    if not status.available:
        pytest.skip(f"no NVIDIA driver/GPU: {status.reason}")
    hostname = f"gpu-{uuid.uuid4().hex[:6]}"
    agent_args = ("--jobs-as-agent", "--stop-jobs-on-exit")
    with worker_and_agent(
        gpuadmin_env, hostname, agent_args, status.gpu_count, tmp_path, GPUADMIN_NVML="real"
    ):
        yield hostname


def test_a_job_runs_on_the_real_gpu_it_was_given(real_node, tmp_path):
    node = Node.objects.get(hostname=real_node)
    assert node.nvml_backend == "real"
    out = tmp_path / "cuda.txt"
    job = submission.submit_job(
        get_user_model().objects.create_user("gpu-user"),
        command=[sys.executable, "-c", CUDA_JOB, str(out)],
        gpu_count=1,
        working_dir=str(tmp_path),
    )
    wait_for(lambda: Job.objects.get(pk=job.pk).state == JobState.RUNNING, 60, "the job to start")
    (given,) = job.allocations.values_list("gpu__uuid", flat=True)

    def processes_on_given_gpu() -> int:
        return live.latest([real_node])[real_node].get(given, {}).get("processes") or 0

    wait_for(processes_on_given_gpu, 30, "the live sample to show the job's process")
    wait_for(lambda: Job.objects.get(pk=job.pk).state in (JobState.COMPLETED, JobState.FAILED),
             60, "the job to end")  # fmt: skip
    job.refresh_from_db()
    assert (job.state, job.exit_code) == (JobState.COMPLETED, 0), job.message
    visible, count, _name = out.read_text().split(maxsplit=2)
    assert (visible, count) == (given, "1")
