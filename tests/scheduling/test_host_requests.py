"""Jobs asking for host CPUs and memory on each node: the loop's snapshot made of the rows
(what a node may give: its discovered total less what is reserved; unknown: no limit), a job
that asks for more CPUs than are free waits, the submission checks, arrays, and what a job
learns of its request when it runs."""

from __future__ import annotations

import json
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from inventory.models import Node
from scheduling.jobs import arrays, limits, shape, slurm, submission
from scheduling.loop import dispatch
from scheduling.loop import passes as loop
from scheduling.loop import snapshot as loop_snapshot
from scheduling.models import Allocation, Job, JobState
from tests.scheduling.conftest import add_sim_node
from tests.scheduling.executors import MakeExecutor

pytestmark = pytest.mark.django_db

GIB = 1024


@pytest.fixture
def alice(django_user_model):
    return django_user_model.objects.create_user("alice")


def host(hostname: str, cpus: int | None, memory_mib: int | None, **reserved: int) -> Node:
    """A simulated node whose agent reported ``cpus`` and ``memory_mib`` (None: unknown)."""
    add_sim_node(hostname)
    Node.objects.filter(hostname=hostname).update(
        cpu_count=cpus, memory_total_mib=memory_mib, **reserved
    )
    shape.FleetShape.forget()
    return Node.objects.get(hostname=hostname)


def job(owner, state: str = JobState.QUEUED, **fields) -> Job:
    return Job.objects.create(owner=owner, command=["x"], state=state, **fields)


# --------------------------------------------------------------------------- the snapshot


def test_a_node_gives_jobs_its_total_less_what_is_reserved_and_unknown_is_no_limit(broker):
    host("dgx-01", 256, 1024 * GIB, cpus_reserved=8, memory_reserved_mib=16 * GIB)
    host("dgx-02", None, None, cpus_reserved=8)  # not reported (yet)
    host("dgx-03", 4, 2 * GIB, cpus_reserved=6, memory_reserved_mib=3 * GIB)  # reserved > total

    snapshot, _ = loop_snapshot.take_snapshot()

    nodes = {node.hostname: (node.cpus, node.memory_mib) for node in snapshot.nodes}
    assert nodes == {"dgx-01": (248, 1008 * GIB), "dgx-02": (None, None), "dgx-03": (0, 0)}


def test_requests_and_running_jobs_carry_their_host_resources(alice, broker):
    node = host("dgx-01", 64, 512 * GIB)
    gpu = node.gpus.order_by("index")[0]
    running = job(alice, JobState.RUNNING, cpus=12, host_memory_mib=96 * GIB)
    Allocation.objects.create(job=running, gpu=gpu, node=node, attempt=1)
    waiting = job(alice, cpus=4, host_memory_mib=8 * GIB)
    nothing = job(alice)

    snapshot, _ = loop_snapshot.take_snapshot()

    [held] = snapshot.running
    assert (held.id, held.cpus, held.host_memory_mib) == (running.pk, 12, 96 * GIB)
    queue = {request.id: (request.cpus, request.host_memory_mib) for request in snapshot.queue}
    assert queue == {waiting.pk: (4, 8 * GIB), nothing.pk: (0, 0)}


def test_the_next_pass_sees_a_change_of_reserved_cpus_and_of_a_request(alice, broker):
    """The loop reuses the frozen requests and running jobs of unchanged rows: host columns are
    part of what it compares, and nodes are read again each pass."""
    node = host("dgx-01", 64, 512 * GIB)
    gpu = node.gpus.order_by("index")[0]
    running = job(alice, JobState.RUNNING, cpus=2)
    Allocation.objects.create(job=running, gpu=gpu, node=node, attempt=1)
    waiting = job(alice, cpus=4)
    loop_snapshot.take_snapshot()

    Node.objects.filter(pk=node.pk).update(cpus_reserved=16, memory_reserved_mib=GIB)
    Job.objects.filter(pk=waiting.pk).update(cpus=6, host_memory_mib=GIB)
    Job.objects.filter(pk=running.pk).update(cpus=3)
    snapshot, _ = loop_snapshot.take_snapshot()

    [info] = snapshot.nodes
    assert (info.cpus, info.memory_mib) == (48, 511 * GIB)
    [request] = snapshot.queue
    assert (request.cpus, request.host_memory_mib) == (6, GIB)
    assert snapshot.running[0].cpus == 3


def test_a_job_asking_for_more_cpus_than_are_free_waits(alice, broker):
    """Through the loop and the engine: the node's GPUs are free, its CPUs are not."""
    # 28 CPUs and 240 GiB for jobs
    host("dgx-01", 32, 256 * GIB, cpus_reserved=4, memory_reserved_mib=16 * GIB)
    first = submission.submit_job(alice, command=["x"], cpus=20, host_memory_mib=200 * GIB)
    loop.run_pass()
    fits = submission.submit_job(alice, command=["x"], cpus=4, host_memory_mib=20 * GIB)
    cpus = submission.submit_job(alice, command=["x"], cpus=5)
    memory = submission.submit_job(alice, command=["x"], host_memory_mib=21 * GIB)
    loop.run_pass()

    jobs = {job.pk: job for job in Job.objects.all()}
    assert (jobs[first.pk].state, jobs[fits.pk].state) == (JobState.SCHEDULED, JobState.SCHEDULED)
    assert (jobs[cpus.pk].state, jobs[memory.pk].state) == (JobState.QUEUED, JobState.QUEUED)
    assert "CPU" in jobs[cpus.pk].pending_reason, jobs[cpus.pk].pending_reason
    assert "memory" in jobs[memory.pk].pending_reason, jobs[memory.pk].pending_reason
    assert Allocation.objects.filter(released_at__isnull=True).count() == 2  # 6 GPUs are free


# --------------------------------------------------------------------------- submission


def test_a_request_no_node_could_ever_hold_is_refused_naming_the_field(alice, broker):
    host("dgx-01", 64, 512 * GIB, cpus_reserved=4, memory_reserved_mib=12 * GIB)

    with pytest.raises(limits.JobRejected) as cpus:
        submission.submit_job(alice, command=["x"], cpus=61)
    assert (cpus.value.field, cpus.value.message) == (
        "cpus",
        "61 CPUs per node, but no node in the fleet has more than 60 for jobs",
    )
    with pytest.raises(limits.JobRejected) as memory:
        submission.submit_job(alice, command=["x"], host_memory_mib=500 * GIB + 1)
    assert memory.value.field == "host_memory_mib"
    assert (
        submission.submit_job(alice, command=["x"], cpus=60, host_memory_mib=500 * GIB).cpus == 60
    )


def test_host_figures_no_node_with_the_gpus_asked_for_has_are_refused(alice, broker):
    """The H100 node has the CPUs, but only the A100 node has A100s: refused on ``cpus``."""
    host("dgx-01", 64, 512 * GIB)
    add_sim_node("h100-01", "dgx-h100")
    Node.objects.filter(hostname="h100-01").update(cpu_count=256, memory_total_mib=512 * GIB)
    shape.FleetShape.forget()

    with pytest.raises(limits.JobRejected) as cpus:
        submission.submit_job(alice, command=["x"], cpus=100, gpu_model="NVIDIA A100-SXM4-80GB")
    assert (cpus.value.field, cpus.value.message) == (
        "cpus",
        "needs 100 CPUs per node; no node with 1 NVIDIA A100-SXM4-80GB GPU has that much "
        "(at most 64 CPUs)",
    )
    assert submission.submit_job(alice, command=["x"], cpus=100).cpus == 100


def test_a_node_of_unknown_size_may_hold_any_request(alice, broker):
    host("dgx-01", 64, 512 * GIB)
    host("dgx-02", None, None)

    submitted = submission.submit_job(alice, command=["x"], cpus=4096, host_memory_mib=4096 * GIB)

    assert (submitted.cpus, submitted.host_memory_mib) == (4096, 4096 * GIB)


def test_a_mig_device_or_an_mps_share_may_ask_for_cpus(alice, broker):
    host("dgx-01", 64, 512 * GIB)

    device = submission.submit_job(alice, command=["x"], mig_profile="1g.10gb", cpus=4)

    assert (device.mig_profile, device.cpus) == ("1g.10gb", 4)


def test_every_task_of_an_array_asks_for_the_same_host_resources(alice, broker):
    host("dgx-01", 64, 512 * GIB)

    submitted = submission.submit_array(
        alice, "0-2", command=["x"], cpus=8, host_memory_mib=32 * GIB
    )

    arrays.split_due()  # as the placement loop makes them jobs
    tasks = submitted.array.tasks.all()
    assert set(tasks.values_list("cpus", "host_memory_mib")) == {(8, 32 * GIB)}
    assert tasks.count() == 3


# --------------------------------------------------------------------------- when it runs


def test_a_job_learns_its_request_as_slurm_would_tell_it(alice, broker):
    host("dgx-01", 64, 512 * GIB)
    asking = submission.submit_job(
        alice, command=["x"], cpus=16, host_memory_mib=64 * GIB, env={"OMP_NUM_THREADS": "2"}
    )
    plain = submission.submit_job(alice, command=["x"])

    env = dispatch.job_spec(asking, ["GPU-x"], 0, ["dgx-01"]).env
    assert {name: env[name] for name in env if name != "OMP_NUM_THREADS"} == {
        "GPUADMIN_CPUS": "16",
        "SLURM_CPUS_PER_TASK": "16",
        "GPUADMIN_HOST_MEMORY_MIB": "65536",
        "SLURM_MEM_PER_NODE": "65536",
    }
    assert env["OMP_NUM_THREADS"] == "2"  # the job's own, untouched
    assert dispatch.job_spec(plain, ["GPU-x"], 0, ["dgx-01"]).env == {}


def test_the_executor_starts_the_job_with_its_request(
    alice, broker, make_executor: MakeExecutor, tmp_path: Path
):
    host("dgx-01", 64, 512 * GIB)
    submitted = submission.submit_job(alice, command=["x"], cpus=4)
    spec = dispatch.job_spec(submitted, ["GPU-x"], 0, ["dgx-01"])
    code = "import json, os; print(json.dumps(dict(os.environ)))"
    spec = replace(spec, argv=[sys.executable, "-c", code], cwd=str(tmp_path), unix_user=None)
    executor, events = make_executor()

    executor.launch(spec)

    assert events.finished(spec.job_id).state == "completed"
    seen = json.loads(executor.tail(spec.job_id, 1))
    assert (seen["GPUADMIN_CPUS"], seen["SLURM_CPUS_PER_TASK"]) == ("4", "4")
    assert "GPUADMIN_HOST_MEMORY_MIB" not in seen and "OMP_NUM_THREADS" not in seen


# --------------------------------------------------------------------------- Slurm's syntax


@pytest.mark.parametrize(
    ("text", "mib"),
    [
        ("64G", 64 * GIB),
        ("64g", 64 * GIB),
        ("64GiB", 64 * GIB),
        ("512M", 512),
        ("2048", 2048),  # MiB, Slurm's default unit
        ("1T", 1024 * GIB),
        ("1025K", 2),  # rounded up to whole MiB
        (" 8G ", 8 * GIB),
        ("0", 0),
    ],
)
def test_mem_reads_as_slurm_reads_it(text: str, mib: int):
    assert slurm.parse_memory(text) == mib


@pytest.mark.parametrize("text", ["", "G", "-1", "1.5G", "64GB", "64X", "1e3", "٦٤G", "9" * 16])
def test_mem_refuses_anything_else(text: str):
    with pytest.raises(slurm.SpecError, match="not a memory size"):
        slurm.parse_memory(text)


@pytest.mark.parametrize(
    ("cpus", "mib", "text"),
    [
        (16, 64 * GIB, "16 CPUs, 64 GiB RAM per node"),
        (1, 0, "1 CPU per node"),
        (0, 1536, "1536 MiB RAM per node"),
        (0, 0, ""),
    ],
)
def test_the_request_in_words(cpus: int, mib: int, text: str):
    assert slurm.host_request_text(cpus, mib) == text
