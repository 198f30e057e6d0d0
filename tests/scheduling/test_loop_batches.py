"""The loop commits its placements in batches (``allocation_services.allocate_many``): a refused
decision never costs the others, every allocation and every placement is audited as one at a time
would be, a batch takes the same statements however many jobs it places, and a pass that finds the
queue as it was writes nothing, even after the clock moved."""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta

import pytest
from django.db import connection, transaction
from django.utils import timezone

from gpuadmin.audit.models import AuditEvent
from inventory.models import Gpu, MigInstance, Node
from scheduling.allocations import services as allocation_services
from scheduling.jobs import transitions
from scheduling.loop import passes as loop
from scheduling.models import Allocation, Job, JobState
from tests.scheduling.conftest import add_sim_node

pytestmark = pytest.mark.django_db


@pytest.fixture
def alice(django_user_model):
    return django_user_model.objects.create_user("alice")


@pytest.fixture
def gpus(broker) -> list[Gpu]:
    """dgx-01 (A100 80 GB, no MIG) then dgx-02 (A100 40 GB: GPUs 0 and 1 in MIG mode)."""
    add_sim_node("dgx-01")
    add_sim_node("dgx-02", "dgx-a100-40gb")
    return list(Gpu.objects.order_by("node__hostname", "index"))


def queued(owner, count: int, **fields) -> list[Job]:
    return [
        Job.objects.create(owner=owner, command=["x"], state=JobState.QUEUED, **fields)
        for _ in range(count)
    ]


def grant(job: Job, *gpus: Gpu, **share) -> allocation_services.Grant:
    return allocation_services.Grant(
        job.pk, tuple(gpu.pk for gpu in gpus), {"why": job.pk}, **share
    )


def audited(event_type: str) -> list[AuditEvent]:
    return list(AuditEvent.objects.filter(event_type=event_type).order_by("pk"))


def assert_granted_and_audited(jobs: list[Job], gpus: list[Gpu]) -> None:
    """Each job SCHEDULED on its GPU (one each), attempt counted, each write audited."""
    for job, gpu in zip(jobs, gpus, strict=True):
        job.refresh_from_db()
        assert (job.state, job.attempt, job.placement) == (JobState.SCHEDULED, 1, {"why": job.pk})
        [allocation] = Allocation.objects.filter(job=job)
        assert (allocation.gpu_id, allocation.attempt, allocation.kind) == (gpu.pk, 1, "gpu")
        assert allocation.device_uuid == gpu.uuid
    created = {event.target_id: event for event in audited("allocation.created")}
    for allocation in Allocation.objects.filter(job__in=jobs).select_related("gpu", "node"):
        event = created[str(allocation.pk)]
        assert (event.actor_name, event.target_type) == ("placement-loop", "scheduling.allocation")
        assert event.after == {
            "job": allocation.job_id,
            "gpu": allocation.gpu.uuid,
            "node": allocation.node.hostname,
        }
    scheduled = {event.target_id: event for event in audited("job.scheduled")}
    assert {str(job.pk) for job in jobs} <= set(scheduled)
    for job in jobs:
        event = scheduled[str(job.pk)]
        assert event.before == {"state": "queued"}
        assert event.after is not None
        assert event.after["state"] == "scheduled"
        assert (event.after["attempt"], event.after["placement"]) == (1, {"why": job.pk})
        assert event.after["borrowed"] is False


@pytest.mark.parametrize("refusal", ["taken", "canceled", "unusable", "twice"])
def test_a_refused_grant_in_the_middle_of_a_batch_costs_the_others_nothing(alice, gpus, refusal):
    first, middle, last = queued(alice, 3)
    wanted = gpus[0]
    if refusal == "taken":  # the database refuses it: the batch is committed one by one
        allocation_services.allocate(queued(alice, 1)[0], [wanted.pk], actor=alice)
    elif refusal == "canceled":
        transitions.transition(middle, JobState.CANCELED, actor=alice)
    elif refusal == "unusable":
        Gpu.objects.filter(pk=wanted.pk).update(state="degraded")
    else:  # "twice": its GPU is also the first job's, in the same batch
        wanted = gpus[1]
    before = Counter(AuditEvent.objects.values_list("event_type", flat=True))
    outcome = allocation_services.allocate_many(
        [grant(first, gpus[1]), grant(middle, wanted), grant(last, gpus[2])],
        actor_name="placement-loop",
    )
    assert [job.pk for job, _ in outcome.granted] == [first.pk, last.pk]
    assert list(outcome.refused) == [middle.pk]
    assert_granted_and_audited([first, last], [gpus[1], gpus[2]])
    assert not Allocation.objects.filter(job=middle).exists()
    middle.refresh_from_db()
    assert middle.attempt == 0
    after = Counter(AuditEvent.objects.values_list("event_type", flat=True))
    assert after - before == Counter({"allocation.created": 2, "job.scheduled": 2})


def test_refusals_say_why(alice, gpus):
    canceled, degraded, elsewhere, whole = queued(alice, 4)
    Job.objects.filter(pk=elsewhere.pk).update(mig_profile="1g.10gb")
    transitions.transition(canceled, JobState.CANCELED, actor=alice)
    Gpu.objects.filter(pk=gpus[3].pk).update(state="degraded")
    mig_device = MigInstance.objects.filter(gpu__node__hostname="dgx-02", gpu__index=0)[0]
    outcome = allocation_services.allocate_many(
        [
            grant(canceled, gpus[0]),
            grant(degraded, gpus[3]),
            grant(elsewhere, gpus[1], mig_instance=mig_device.pk),
            grant(whole, gpus[2], mig_instance=mig_device.pk),
        ],
        actor_name="placement-loop",
    )
    assert outcome.granted == []
    assert outcome.refused == {
        canceled.pk: f"job {canceled.pk} already ended: it is canceled",
        degraded.pk: f"GPUs not usable now: {gpus[3].uuid} (the GPU is degraded (fenced by a "
        "health policy))",
        elsewhere.pk: f"MIG device {mig_device.pk} is no longer a device of GPU {gpus[1].pk}",
        whole.pk: f"job {whole.pk} asks for whole GPUs, not a MIG device",
    }


def test_shares_are_committed_with_their_device_and_the_trigger_refuses_too_much(alice, gpus):
    mig_gpu = Gpu.objects.get(node__hostname="dgx-02", index=0)
    device = MigInstance.objects.filter(gpu=mig_gpu, uuid__isnull=False).order_by("gi_id")[0]
    mps_gpu = Gpu.objects.get(node__hostname="dgx-02", index=2)
    Gpu.objects.filter(pk=mps_gpu.pk).update(mps_shared=True)
    [on_device] = queued(alice, 1, mig_profile=device.profile_name)
    sixty, fifty, forty = (queued(alice, 1, mps_percent=share)[0] for share in (60, 50, 40))
    outcome = allocation_services.allocate_many(
        [
            grant(on_device, mig_gpu, mig_instance=device.pk),
            grant(sixty, mps_gpu, mps_percent=60, mps_memory_mib=1000),
            grant(fifty, mps_gpu, mps_percent=50),  # 110 %: the trigger refuses the batch
            grant(forty, mps_gpu, mps_percent=40),
            grant(queued(alice, 1)[0], mps_gpu),  # a whole GPU of an MPS-shared one
        ],
        actor_name="placement-loop",
    )
    assert [job.pk for job, _ in outcome.granted] == [on_device.pk, sixty.pk, forty.pk]
    assert "would pass 100" in outcome.refused[fifty.pk]
    assert len(outcome.refused) == 2
    mig = Allocation.objects.get(job=on_device)
    assert (mig.kind, mig.mig_instance_id, mig.device_uuid) == ("mig", device.pk, device.uuid)
    shares = Allocation.objects.filter(gpu=mps_gpu).order_by("mps_percent")
    assert [(a.kind, a.mps_percent, a.device_uuid) for a in shares] == [
        ("mps", 40, mps_gpu.uuid),
        ("mps", 60, mps_gpu.uuid),
    ]
    created = {event.target_id: event.after or {} for event in audited("allocation.created")}
    assert created[str(mig.pk)]["device"] == device.uuid
    assert created[str(shares[1].pk)] == {
        "job": sixty.pk,
        "gpu": mps_gpu.uuid,
        "node": "dgx-02",
        "kind": "mps",
        "mps_percent": 60,
        "mps_memory_mib": 1000,
    }


def test_a_batch_takes_the_same_statements_however_many_jobs_it_places(
    alice, gpus, django_assert_num_queries
):
    whole = [gpu for gpu in gpus if not gpu.mig_enabled]
    one, *many = queued(alice, 9)
    # savepoint; lock the jobs, lock the GPUs; read the GPUs' reservation windows; insert the
    # allocations, audit them; update the jobs, audit them; release the savepoint
    with django_assert_num_queries(9) as one_batch:
        allocation_services.allocate_many([grant(one, whole[0])], actor_name="placement-loop")
    with django_assert_num_queries(len(one_batch.captured_queries)):
        outcome = allocation_services.allocate_many(
            [grant(job, gpu) for job, gpu in zip(many, whole[1:], strict=False)],
            actor_name="placement-loop",
        )
    assert len(outcome.granted) == 8


def test_a_pass_over_an_unchanged_queue_writes_nothing_even_after_the_clock_moved(
    alice, gpus, monkeypatch
):
    # The heartbeats stay fresh for the clock moved below.
    Node.objects.update(last_heartbeat_at=timezone.now() + timedelta(hours=1))
    # The fleet's whole GPUs taken: 8 on dgx-01 by a job about to be past its expected end
    # (the jobs waiting behind it could start "now"), 6 on dgx-02 by one ending in two hours.
    overdue = queued(alice, 1, gpu_count=8, estimated_duration_s=60)
    queued(alice, 1, gpu_count=6, estimated_duration_s=7200)
    waiting = queued(alice, 2, gpu_count=8) + queued(alice, 2, gpu_count=4)
    assert loop.run_pass().placed == 2
    Job.objects.filter(pk=overdue[0].pk).update(scheduled_at=timezone.now() - timedelta(minutes=5))
    assert loop.run_pass().pending_saved == len(waiting)  # they could start now
    stored = dict(Job.objects.filter(state=JobState.QUEUED).values_list("pk", "estimated_start_at"))
    assert stored.keys() == {job.pk for job in waiting}
    assert None not in stored.values()

    later = timezone.now() + timedelta(minutes=10)
    monkeypatch.setattr(timezone, "now", lambda: later)
    assert loop.run_pass().pending_saved == 0
    rows = Job.objects.filter(state=JobState.QUEUED).values_list("pk", "estimated_start_at")
    assert dict(rows) == stored


def test_the_pass_after_a_placing_one_finds_the_estimates_it_left(alice, gpus, monkeypatch):
    # Jobs are scheduled at the time the pass saw, not when its commit came: a slow commit
    # must not move the estimated starts of the jobs waiting behind them in the next pass.
    allocate_many = allocation_services.allocate_many

    def slow_allocate_many(*args, **kwargs):
        time.sleep(1.1)
        return allocate_many(*args, **kwargs)

    monkeypatch.setattr(allocation_services, "allocate_many", slow_allocate_many)
    queued(alice, 1, gpu_count=8, estimated_duration_s=3600)
    queued(alice, 1, gpu_count=6, estimated_duration_s=7200)
    waiting = queued(alice, 2, gpu_count=8)
    first = loop.run_pass()
    assert (first.placed, first.pending_saved) == (2, len(waiting))
    assert None not in Job.objects.filter(pk__in=[j.pk for j in waiting]).values_list(
        "estimated_start_at", flat=True
    )
    assert loop.run_pass().pending_saved == 0


@pytest.mark.django_db(transaction=True)
def test_many_clients_committing_batches_at_once_never_give_a_gpu_twice(alice, gpus):
    """20 clients commit overlapping batches at once (one connection each): every GPU ends
    with at most one holder, and each allocation and placement is audited once."""
    whole = [gpu for gpu in gpus if not gpu.mig_enabled]
    clients = 20
    jobs = queued(alice, clients * 3)
    barrier = threading.Barrier(clients)
    errors: list[BaseException] = []

    def client(n: int) -> None:
        try:
            mine = jobs[n * 3 : n * 3 + 3]
            batch = [grant(job, whole[(n + k) % len(whole)]) for k, job in enumerate(mine)]
            barrier.wait()
            allocation_services.allocate_many(batch, actor_name="placement-loop")
        except BaseException as exc:  # surfaced below
            errors.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=client, args=(n,)) for n in range(clients)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors, errors
    holders = Counter(Allocation.objects.active().values_list("gpu_id", flat=True))
    assert set(holders) == {gpu.pk for gpu in whole}
    assert set(holders.values()) == {1}
    placed = Job.objects.filter(state=JobState.SCHEDULED)
    assert placed.count() == len(whole)
    assert len(audited("allocation.created")) == len(whole)
    assert {event.target_id for event in audited("job.scheduled")} == {
        str(job.pk) for job in placed
    }


def test_a_refused_batchs_grants_are_fenced_each_in_a_transaction_of_its_own(alice, gpus):
    """When the database refuses a batch, its grants are committed one by one, each in a fence
    (the loop's lease) and a transaction of its own: one transaction holding a committed
    grant's locks while taking the next grant's would lock a job after GPUs, against the lock
    order (a deadlock with allocations by hand, seen under churn)."""
    first, second, third = queued(alice, 3)
    depths: list[int] = []

    @contextmanager
    def fence() -> Iterator[None]:
        depths.append(len(connection.savepoint_ids))  # how deep in transactions it starts
        with transaction.atomic():
            yield

    outcome = allocation_services.allocate_many(
        # The second takes the first's GPU: the database refuses the batch.
        [grant(first, gpus[0]), grant(second, gpus[0]), grant(third, gpus[1])],
        actor_name="placement-loop",
        fence=fence,
    )
    assert [job.pk for job, _ in outcome.granted] == [first.pk, third.pk]
    assert list(outcome.refused) == [second.pk]
    assert len(depths) == 4 and len(set(depths)) == 1  # the batch, then each grant: none nested
