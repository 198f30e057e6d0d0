"""The database side of sharing (``scheduling.sharing.services``): the MIG devices and MPS
shares the loop's snapshot shows, and the MIG instances it asks agents for (dynamic MIG),
carried out through inventory's audited MIG path on a simulated node whose agent
answers in-process."""

from __future__ import annotations

import pytest
from django.db import transaction
from django.utils import timezone

from gpuadmin.audit.models import AuditEvent
from inventory import live
from inventory.models import Gpu, MigInstance
from inventory.services import destroy_mig_instance
from scheduling import placement
from scheduling.loop import dispatch
from scheduling.models import Allocation, Job
from scheduling.sharing import services as sharing
from tests.inventory.conftest import node  # noqa: F401 - the simulated node fixture

pytestmark = pytest.mark.django_db

# dgx-a100-40gb: GPU 0 = 3g.20gb (GI 2 at 4) + 2x 2g.10gb (GI 3 at 0, GI 4 at 2); GPU 1 in MIG
# mode too; GPU 2 not.


@pytest.fixture
def alice(django_user_model):
    return django_user_model.objects.create_user("alice")


def holding(owner, gpu: Gpu, **allocation) -> Job:
    job = Job.objects.create(owner=owner, command=["x"], state="running")
    Allocation.objects.create(job=job, gpu=gpu, node=gpu.node, attempt=1, **allocation)
    return job


def test_mig_slots_lists_each_device_with_its_holder(node, alice):  # noqa: F811
    gpu = node.gpu(0)
    device = MigInstance.objects.get(gpu=gpu, gi_id=3)
    job = holding(alice, gpu, kind="mig", mig_instance=device, device_uuid=device.uuid)
    slots = sharing.mig_slots([gpu.pk, node.gpu(2).pk])
    assert list(slots) == [gpu.pk]  # GPU 2 has no MIG devices
    assert [
        (s.profile, s.placement_start, s.placement_size, s.allocated_to) for s in slots[gpu.pk]
    ] == [
        ("2g.10gb", 0, 2, job.pk),
        ("2g.10gb", 2, 2, None),
        ("3g.20gb", 4, 4, None),
    ]
    first = slots[gpu.pk][0]
    assert (first.id, first.gpu_id, first.uuid, first.memory_mib) == (
        device.pk,
        gpu.pk,
        device.uuid,
        device.memory_mib,
    )
    Allocation.objects.update(released_at=timezone.now())
    assert sharing.mig_slots([gpu.pk])[gpu.pk][0].allocated_to is None


def test_mig_slots_is_one_query(node, django_assert_num_queries):  # noqa: F811
    ids = [node.gpu(0).pk, node.gpu(1).pk]
    with django_assert_num_queries(1):
        assert sorted(sharing.mig_slots(ids)) == sorted(ids)


def test_mig_slots_takes_the_holders_its_caller_read(node, alice, django_assert_num_queries):  # noqa: F811
    """The loop reads every active allocation already: it passes their MIG devices' holders
    and the devices are read without a subquery per device, with the same result."""
    gpu = node.gpu(0)
    device = MigInstance.objects.get(gpu=gpu, gi_id=3)
    job = holding(alice, gpu, kind="mig", mig_instance=device, device_uuid=device.uuid)
    ids = [gpu.pk, node.gpu(1).pk]
    with django_assert_num_queries(1) as captured:
        given = sharing.mig_slots(ids, holders={device.pk: job.pk})
    assert "scheduling_allocation" not in captured.captured_queries[0]["sql"]
    assert given == sharing.mig_slots(ids)
    assert sharing.mig_slots(ids, holders={})[gpu.pk][0].allocated_to is None


def test_mps_use_sums_the_active_shares(node, alice, django_assert_num_queries):  # noqa: F811
    gpu, other = node.gpu(2), node.gpu(3)
    Gpu.objects.filter(pk__in=[gpu.pk, other.pk]).update(mps_shared=True)
    a = holding(alice, gpu, kind="mps", mps_percent=30, mps_memory_mib=4096)
    b = holding(alice, gpu, kind="mps", mps_percent=20)
    holding(alice, other, kind="mps", mps_percent=50, mps_memory_mib=100).allocations.update(
        released_at=timezone.now()
    )
    with django_assert_num_queries(1):
        use = sharing.mps_use()
    assert use == {gpu.pk: (50, 4096, (a.pk, b.pk))}


def test_the_gpu_page_shows_what_its_mps_shares_take(node, alice, client):  # noqa: F811
    gpu = node.gpu(2)
    Gpu.objects.filter(pk=gpu.pk).update(mps_shared=True)
    holding(alice, gpu, kind="mps", mps_percent=30, mps_memory_mib=4096)
    holding(alice, gpu, kind="mps", mps_percent=20)
    assert sharing.mps_use([node.gpu(3).pk]) == {}  # only the GPUs asked for
    client.force_login(alice)
    html = client.get(f"/gpus/{gpu.uuid}/").content.decode()
    assert (
        '<p class="mps-use" data-mps-percent="50">MPS-shared: 50 % of its SMs given to 2 jobs '
        "(memory limits 4 GiB); 50 % free.</p>"
    ) in html
    assert "<td>MPS 30 %, 4096 MiB</td>" in html and "<td>MPS 20 %</td>" in html
    whole = client.get(f"/gpus/{node.gpu(3).uuid}/").content.decode()
    assert "mps-use" not in whole


def test_the_mig_pages_name_the_job_holding_each_device(node, alice, client):  # noqa: F811
    """The node's MIG page and the GPU page's MIG section: each MIG device with its job (link,
    id, name, owner), the others free."""
    gpu = node.gpu(0)
    device = MigInstance.objects.get(gpu=gpu, gi_id=3)
    job = holding(alice, gpu, kind="mig", mig_instance=device, device_uuid=device.uuid)
    Job.objects.filter(pk=job.pk).update(name="train-llm")
    client.force_login(alice)
    holder = f'<a href="/jobs/{job.pk}/">job #{job.pk}</a> train-llm (alice)'
    for url in (f"/nodes/{node.hostname}/mig/", f"/gpus/{gpu.uuid}/"):
        layout = client.get(url).content.decode().split('class="mig-grid"')[1]  # GPU 0's
        layout = layout.split("</section>")[0]
        card = layout.split('data-profile="2g.10gb"')[1].split("</div>")[0]
        assert f'<span class="mig-holder">{holder}</span>' in card, url
        assert layout.count('<span class="mig-holder"><span class="muted">free</span>') == 2, url


def create_decision(node, job: Job, start: int = 0) -> placement.MigCreate:  # noqa: F811
    gpu = node.gpu(1)
    return placement.MigCreate(
        job_id=job.pk, gpu_id=gpu.pk, profile="1g.5gb", placement_start=start, explanation="x"
    )


def test_a_requested_instance_is_created_through_the_agent_and_audited(
    node,  # noqa: F811
    alice,
    monkeypatch,
    django_capture_on_commit_callbacks,
):
    woken: list[bool] = []
    monkeypatch.setattr(dispatch, "wake", lambda: woken.append(True))
    gpu = node.gpu(1)
    for gi_id in MigInstance.objects.filter(gpu=gpu).values_list("gi_id", flat=True).distinct():
        destroy_mig_instance(gpu, gi_id, actor=alice)
    job = Job.objects.create(owner=alice, command=["x"], state="queued", mig_profile="1g.5gb")
    live.client().delete(sharing._asked_key(gpu.pk))
    with django_capture_on_commit_callbacks(execute=False) as callbacks, transaction.atomic():
        sharing.request_mig_instance(create_decision(node, job, start=6))
        sharing.request_mig_instance(create_decision(node, job, start=6))  # asked already
    assert len(callbacks) == 1
    assert sharing.create_requested_instance(gpu.pk, "1g.5gb", 6, job.pk)
    assert list(
        MigInstance.objects.filter(gpu=gpu).values_list("profile_name", "placement_start")
    ) == [("1g.5gb", 6)]
    event = AuditEvent.objects.filter(event_type="gpu.mig_instance_created").latest("pk")
    assert (event.actor_name, event.target_id) == ("placement-loop", gpu.uuid)
    # The same again: no room there; refused, audited, nothing made.
    assert not sharing.create_requested_instance(gpu.pk, "1g.5gb", 6, job.pk)
    refused = AuditEvent.objects.get(event_type="gpu.mig_instance_refused")
    assert refused.message.startswith(f"for job {job.pk}: ")
    assert woken == [True, True]  # the loop looks again either way


def test_a_gpu_no_longer_idle_is_not_asked(node, alice, django_capture_on_commit_callbacks):  # noqa: F811
    gpu = node.gpu(1)
    device = MigInstance.objects.filter(gpu=gpu).first()
    holding(alice, gpu, kind="mig", mig_instance=device, device_uuid=device.uuid)
    job = Job.objects.create(owner=alice, command=["x"], state="queued", mig_profile="1g.5gb")
    live.client().delete(sharing._asked_key(gpu.pk))
    with django_capture_on_commit_callbacks(execute=False) as callbacks:
        sharing.request_mig_instance(create_decision(node, job))
    assert callbacks == []
