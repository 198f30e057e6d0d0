"""Dynamic MIG through the real placement loop: a job asks for a MIG profile no device offers;
in a pool that allows it, the loop asks an idle MIG-mode GPU's agent for the instance (the
central task), the agent creates it, and the next pass places the job on the new device. A
pool that does not allow it leaves the job waiting and asks nothing."""

from __future__ import annotations

from typing import Any

import pytest

from gpuadmin.celery import app
from inventory import live
from inventory.models import MigInstance
from inventory.services import destroy_mig_instance
from scheduling.jobs import submission
from scheduling.loop import passes as loop
from scheduling.models import Allocation, AllocationKind, JobState, PoolPolicy
from scheduling.sharing import services as sharing
from tests.inventory.conftest import node  # noqa: F401 - the simulated node fixture

pytestmark = pytest.mark.django_db

CREATE = "scheduling.create_mig_instance"


@pytest.fixture
def central(node, monkeypatch) -> list[tuple[str, tuple]]:  # noqa: F811
    """The tasks sent to the central worker or to an agent's job queue, recorded; the node's
    inventory tasks (scans, MIG changes) answered by its in-process agent."""
    sent: list[tuple[str, tuple]] = []

    def send_task(name: str, args: tuple = (), **options: Any) -> Any:
        if name.startswith("inventory."):
            return node.broker.send_task(name, args=args, **options)
        sent.append((name, tuple(args)))
        return None

    monkeypatch.setattr(app, "send_task", send_task)
    return sent


def empty(gpu, actor) -> None:
    for gi_id in MigInstance.objects.filter(gpu=gpu).values_list("gi_id", flat=True).distinct():
        destroy_mig_instance(gpu, gi_id, actor=actor)


@pytest.mark.parametrize("allowed", [True, False])
def test_the_loop_asks_for_the_instance_then_places_the_job_on_it(
    node,  # noqa: F811
    central,
    django_user_model,
    django_capture_on_commit_callbacks,
    allowed,
):
    alice = django_user_model.objects.create_user("alice")
    PoolPolicy.objects.create(pool=None, dynamic_mig=allowed)
    # GPU 0 offers 3g.20gb and 2g.10gb devices; GPU 1 is in MIG mode with none; GPU 2 not.
    gpu = node.gpu(1)
    empty(gpu, alice)
    live.client().delete(sharing._asked_key(gpu.pk))  # no ask left by an earlier test
    job = submission.submit_job(alice, command=["true"], mig_profile="1g.5gb")

    with django_capture_on_commit_callbacks(execute=True):
        first = loop.run_pass()

    asked = [args for name, args in central if name == CREATE]
    job.refresh_from_db()
    assert job.state == JobState.QUEUED
    if not allowed:
        assert (first.mig_requested, asked) == (0, [])
        assert not MigInstance.objects.filter(gpu=gpu).exists()
        return
    assert first.mig_requested == 1
    ((gpu_id, profile, start, job_id),) = asked
    assert (gpu_id, profile, job_id) == (gpu.pk, "1g.5gb", job.pk)

    # The central worker's task: the agent creates it, its fresh scan shows the device.
    assert sharing.create_requested_instance(gpu_id, profile, start, job_id)
    device = MigInstance.objects.get(gpu=gpu)
    assert (device.profile_name, device.placement_start) == ("1g.5gb", start)

    with django_capture_on_commit_callbacks(execute=True):
        second = loop.run_pass()

    assert (second.placed, second.mig_requested) == (1, 0)
    job.refresh_from_db()
    assert job.state == JobState.SCHEDULED
    allocation = Allocation.objects.get(job=job)
    assert (allocation.kind, allocation.gpu, allocation.mig_instance) == (
        AllocationKind.MIG,
        gpu,
        device,
    )
    assert allocation.device_uuid == device.uuid
