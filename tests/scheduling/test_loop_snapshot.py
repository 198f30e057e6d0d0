"""What a pass reads into the engine's snapshot beyond the hardware: pools, MIG devices and
MPS shares, who holds what, the queue's sharing requests, reservations and array caps, what
earlier attempts ran, and which jobs wait on their dependencies."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from inventory.models import Gpu, MigInstance, Node, Pool
from scheduling.loop import snapshot as loop_snapshot
from scheduling.models import (
    Allocation,
    DependencyKind,
    Job,
    JobArray,
    JobDependency,
    PoolPolicy,
)
from tests.scheduling.conftest import add_sim_node

pytestmark = pytest.mark.django_db


@pytest.fixture
def alice(django_user_model):
    return django_user_model.objects.create_user("alice")


def test_the_snapshot_carries_pools_shares_holders_and_the_queue_s_requests(alice, broker):
    add_sim_node("dgx-01")
    add_sim_node("dgx-02", "dgx-a100-40gb")  # GPUs 0 and 1 in MIG mode
    training = Pool.objects.create(name="training")
    Node.objects.filter(hostname="dgx-02").update(pool=training)
    dgx1 = list(Gpu.objects.filter(node__hostname="dgx-01").order_by("index"))
    Gpu.objects.filter(pk=dgx1[7].pk).update(pool=training)  # a GPU's own pool wins
    mig_gpu = Gpu.objects.get(node__hostname="dgx-02", index=0)
    device = MigInstance.objects.filter(gpu=mig_gpu, uuid__isnull=False).order_by("gi_id")[0]
    mps_gpu = Gpu.objects.get(node__hostname="dgx-02", index=3)
    Gpu.objects.filter(pk=mps_gpu.pk).update(mps_shared=True)
    PoolPolicy.objects.create(pool=training, policy="fairshare", backfill=False)
    array = JobArray.objects.create(owner=alice, spec="0-9%2", size=10, max_running=2)

    def job(state: str, **fields) -> Job:
        return Job.objects.create(owner=alice, command=["x"], state=state, **fields)

    now = timezone.now()
    whole = job("running", project="nlp", started_at=now, gpu_count=2, borrowed=True, array=array)
    for gpu in dgx1[:2]:
        Allocation.objects.create(job=whole, gpu=gpu, node=gpu.node, attempt=1)
    on_device = job("running", started_at=now, pool=training, mig_profile=device.profile_name)
    Allocation.objects.create(
        job=on_device,
        gpu=mig_gpu,
        node=mig_gpu.node,
        kind="mig",
        mig_instance=device,
        device_uuid=str(device.uuid),
        attempt=1,
    )
    share = job(
        "scheduled", scheduled_at=now, pool=training, mps_percent=30, preempt_requested_at=now
    )
    Allocation.objects.create(
        job=share, gpu=mps_gpu, node=mps_gpu.node, kind="mps", mps_percent=30, mps_memory_mib=512
    )
    retried = job("queued", pool=training, mps_percent=20, mps_memory_mib=256, project="cv")
    Allocation.objects.create(
        job=retried,
        gpu=mps_gpu,
        node=mps_gpu.node,
        kind="mps",
        mps_percent=20,
        released_at=timezone.now() + timedelta(seconds=360),  # held for about 6 minutes
    )
    mig_waiting = job("queued", pool=training, mig_profile="1g.5gb", array=array)
    blocked = job("queued")
    JobDependency.objects.create(job=blocked, on=whole, kind=DependencyKind.AFTEROK)

    snapshot, slots = loop_snapshot.take_snapshot()

    assert slots[dgx1[0].pk].pool is None
    assert slots[dgx1[7].pk].pool == "training"
    assert slots[mig_gpu.pk].pool == "training"
    assert (slots[dgx1[0].pk].allocated_to, slots[mig_gpu.pk].allocated_to) == (whole.pk, None)
    assert slots[mig_gpu.pk].unavailable == "mig"
    assert slots[mig_gpu.pk].mig_table is not None
    held = {slot.id: slot.allocated_to for slot in slots[mig_gpu.pk].mig_slots}
    assert held[device.pk] == on_device.pk
    assert slots[dgx1[0].pk].mig_slots == ()
    mps = slots[mps_gpu.pk]
    assert (mps.unavailable, mps.allocated_to) == ("mps", None)
    assert (mps.mps_used_percent, mps.mps_used_memory_mib, mps.mps_jobs) == (30, 512, (share.pk,))

    running = {job.id: job for job in snapshot.running}
    assert set(running) == {whole.pk, on_device.pk, share.pk}
    first = running[whole.pk]
    assert (first.owner, first.project, first.pool, first.borrowed, first.stopping) == (
        str(alice.pk),
        "nlp",
        None,
        True,
        False,
    )
    assert (sorted(first.gpu_ids), first.array) == ([dgx1[0].pk, dgx1[1].pk], array.pk)
    assert (running[share.pk].stopping, running[share.pk].gpu_ids) == (True, (mps_gpu.pk,))
    assert running[on_device.pk].pool == "training"

    queue = {job.id: job for job in snapshot.queue}
    assert set(queue) == {retried.pk, mig_waiting.pk}  # the blocked job waits for `whole`
    request = queue[retried.pk]
    assert (request.pool, request.project, request.mps_percent, request.mps_memory_mib) == (
        "training",
        "cv",
        20,
        256,
    )
    # 6 minutes at 20 % of a GPU
    assert request.attained_service_s == pytest.approx(0.2 * 360, abs=1)
    assert (queue[mig_waiting.pk].mig_profile, queue[mig_waiting.pk].array) == ("1g.5gb", array.pk)
    assert queue[mig_waiting.pk].attained_service_s == 0

    assert snapshot.pools["training"].policy == "fairshare"
    assert snapshot.pools["training"].backfill is False
    assert snapshot.array_limits == {array.pk: 2}
    assert snapshot.reservations == ()


def test_attained_service_counts_earlier_attempts_of_waiting_and_running_jobs(alice, broker):
    """LAS reads the GPU-seconds of every earlier attempt: a running job's (its current
    attempt the engine adds itself) and a waiting one's, with when its last attempt ended."""
    add_sim_node("dgx-01")
    gpus = list(Gpu.objects.filter(node__hostname="dgx-01").order_by("index"))
    now = timezone.now()

    def held(job: Job, gpu: Gpu, attempt: int, start: float, end: float | None) -> None:
        Allocation.objects.create(
            job=job,
            gpu=gpu,
            node=gpu.node,
            attempt=attempt,
            allocated_at=now - timedelta(seconds=start),
            released_at=None if end is None else now - timedelta(seconds=end),
        )

    again = Job.objects.create(owner=alice, command=["x"], state="running", gpu_count=2)
    again.attempt = 2
    again.save()
    for gpu in gpus[:2]:
        held(again, gpu, 1, 7200, 3600)  # an hour on 2 GPUs: 7,200 GPU-seconds
        held(again, gpu, 2, 600, None)  # running now: not counted here
    requeued = Job.objects.create(owner=alice, command=["x"], state="queued")
    held(requeued, gpus[2], 1, 5000, 4000)
    held(requeued, gpus[3], 2, 3000, 1200)  # its last attempt ended 20 minutes ago
    fresh = Job.objects.create(owner=alice, command=["x"], state="queued")

    snapshot, _ = loop_snapshot.take_snapshot()

    [running] = snapshot.running
    assert running.attained_service_s == pytest.approx(7200, abs=1)
    queue = {job.id: job for job in snapshot.queue}
    assert queue[requeued.pk].attained_service_s == pytest.approx(1000 + 1800, abs=1)
    assert queue[requeued.pk].queued_at == pytest.approx(
        (now - timedelta(seconds=1200)).timestamp()
    )
    assert (queue[fresh.pk].attained_service_s, queue[fresh.pk].queued_at) == (0.0, None)
