"""The loop's snapshot reuses what did not change since the previous pass (``loop_snapshot.Reuse``:
the frozen requests, running jobs and GPU slots of rows whose inputs compare equal; the NVLink
domains while the links and the GPUs' places are the same), and sees every change at the next pass:
a changed row, sample or link gives a new object, an unchanged one the same."""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta

import pytest
from django.utils import timezone

from inventory import live
from inventory.models import Gpu, GpuLink, Node
from inventory.nvml.scanner import scan
from inventory.nvml.sim import SimulatedNvml
from inventory.services import apply_discovery
from scheduling import placement
from scheduling.loop import snapshot as loop_snapshot
from scheduling.models import Allocation, Job, JobState
from tests.inventory.pages import unique_host
from tests.scheduling.conftest import add_sim_node

pytestmark = pytest.mark.django_db


@pytest.fixture
def alice(django_user_model):
    return django_user_model.objects.create_user("alice")


def queued(owner, **fields) -> Job:
    return Job.objects.create(owner=owner, command=["x"], state=JobState.QUEUED, **fields)


def requests() -> dict[int, placement.JobRequest]:
    snapshot, _ = loop_snapshot.take_snapshot()
    return {job.id: job for job in snapshot.queue}


def test_an_unchanged_job_keeps_its_request_and_a_changed_one_is_read_again(alice, broker):
    add_sim_node("dgx-01")
    same, edited = queued(alice, gpu_count=2), queued(alice, gpu_count=2, priority="low")
    gone = queued(alice)
    first = requests()

    Job.objects.filter(pk=edited.pk).update(gpu_count=4, priority="high", topology="nvlink")
    Job.objects.filter(pk=gone.pk).update(state=JobState.CANCELED)
    later = queued(alice, gpu_count=8)
    second = requests()

    assert second[same.pk] is first[same.pk]
    assert (second[edited.pk].gpus_per_node, second[edited.pk].priority) == (4, "high")
    assert second[edited.pk].topology == "nvlink"
    assert gone.pk not in second
    assert second[later.pk].gpus_per_node == 8


def test_a_job_s_earlier_attempts_and_its_stored_word_are_read_each_pass(alice, broker):
    [gpu, *_] = Gpu.objects.filter(node=add_sim_node("dgx-01")).order_by("index")
    job = queued(alice)
    assert requests()[job.pk].attained_service_s == 0
    start = timezone.now() - timedelta(hours=1)
    Allocation.objects.create(job=job, gpu=gpu, node=gpu.node, attempt=1)
    Allocation.objects.filter(job=job).update(
        allocated_at=start, released_at=start + timedelta(seconds=600)
    )

    assert requests()[job.pk].attained_service_s == pytest.approx(600)
    moment = timezone.now().replace(microsecond=0) + timedelta(minutes=5)
    Job.objects.filter(pk=job.pk).update(
        pending_code="resources_busy", queue_position=1, estimated_start_at=moment
    )
    waiting = loop_snapshot.read_pass_input().waiting[job.pk]
    assert waiting[:3] == ("resources_busy", "", 1)
    assert waiting[3] == moment.timestamp()


def test_running_jobs_follow_their_rows(alice, broker):
    gpus = list(Gpu.objects.filter(node=add_sim_node("dgx-01")).order_by("index"))
    now = timezone.now()
    runs, stops = (
        Job.objects.create(owner=alice, command=["x"], state="running", started_at=now)
        for _ in range(2)
    )
    for job, gpu in ((runs, gpus[0]), (stops, gpus[1])):
        Allocation.objects.create(job=job, gpu=gpu, node=gpu.node, attempt=1)
    first, _ = loop_snapshot.take_snapshot()

    Job.objects.filter(pk=stops.pk).update(preempt_requested_at=now, estimated_duration_s=60)
    Allocation.objects.create(job=runs, gpu=gpus[2], node=gpus[2].node, attempt=1)
    second, _ = loop_snapshot.take_snapshot()

    before = {job.id: job for job in first.running}
    after = {job.id: job for job in second.running}
    assert before[stops.pk].stopping is False
    assert after[stops.pk].stopping is True
    assert after[stops.pk].expected_end == pytest.approx(now.timestamp() + 60)
    assert sorted(after[runs.pk].gpu_ids) == [gpus[0].pk, gpus[2].pk]
    assert len(before[runs.pk].gpu_ids) == 1


def test_a_gpu_slot_follows_its_row_its_node_and_its_latest_sample(broker):
    host = unique_host()
    nvml = SimulatedNvml.from_model("dgx-a100-80gb", node_name=host)
    apply_discovery(host, scan(nvml))
    Node.objects.filter(hostname=host).update(last_heartbeat_at=timezone.now())
    live.publish(host, scan(nvml, include=("facts", "metrics")))
    gpus = list(Gpu.objects.filter(node__hostname=host).order_by("index"))
    _, first = loop_snapshot.take_snapshot()
    assert first[gpus[0].pk].unavailable is None

    Gpu.objects.filter(pk=gpus[0].pk).update(state="draining")
    _, second = loop_snapshot.take_snapshot()
    assert second[gpus[0].pk].unavailable == "draining"
    assert second[gpus[3].pk] is first[gpus[3].pk]

    sample = scan(nvml, include=("facts", "metrics"))
    gpu = sample.gpus[3]
    used = replace(gpu.facts, memory_used_mib=gpus[3].memory_total_mib - 1024)
    gpus_now = (*sample.gpus[:3], replace(gpu, facts=used), *sample.gpus[4:])
    live.publish(host, replace(sample, gpus=gpus_now))  # something else took its memory
    _, third = loop_snapshot.take_snapshot()
    assert third[gpus[3].pk].memory_free_mib == 1024
    assert third[gpus[3].pk] is not second[gpus[3].pk]

    Node.objects.filter(hostname=host).update(last_heartbeat_at=None)
    _, fourth = loop_snapshot.take_snapshot()
    assert fourth[gpus[4].pk].unavailable == "unreachable"


def domains(hostname: str) -> dict[int, str | None]:
    snapshot, _ = loop_snapshot.take_snapshot()
    return {slot.index: slot.nvlink_domain for slot in snapshot.gpus if slot.node == hostname}


def test_nvlink_domains_follow_the_links_and_the_nodes(broker):
    node = add_sim_node("dgx-01")
    assert set(domains("dgx-01").values()) == {"dgx-01/nvlink-gpu0"}
    gpus = {gpu.index: gpu for gpu in Gpu.objects.filter(node=node)}

    # GPU 7 loses its NVLinks (a rescan that finds them down rewrites the node's links).
    GpuLink.objects.filter(gpu_b=gpus[7], link_type__startswith="NV").update(link_type="SYS")
    after = domains("dgx-01")
    assert after[7] is None
    assert set(after.values()) == {"dgx-01/nvlink-gpu0", None}

    Node.objects.filter(pk=node.pk).update(hostname="dgx-99")
    assert set(domains("dgx-99").values()) == {"dgx-99/nvlink-gpu0", None}
