"""Inventory changes that make GPUs schedulable wake the placement loop once they commit
(``inventory.signals`` -> ``scheduling.receivers``), so queued jobs do not wait for beat's
backstop pass; changes that only take GPUs away wake nothing."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from gpuadmin.celery import app
from inventory import live
from inventory.choices import GpuState, NodeState
from inventory.models import Node
from inventory.services import record_heartbeat, set_gpu_state, set_node_state
from scheduling import tasks
from scheduling.agent.wire import JobSpec
from scheduling.jobs import submission
from scheduling.loop import dispatch
from scheduling.loop import passes as loop
from scheduling.models import Job, JobState
from tests.scheduling.conftest import RecordingBroker, add_sim_node

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def no_wake_asked_for():
    """A wake asked for by an earlier test, whose pass never ran, would coalesce this test's."""
    live.client().delete(dispatch.wake_key())
    yield
    live.client().delete(dispatch.wake_key())


@pytest.fixture
def admin(django_user_model):
    return django_user_model.objects.create_user("olga", is_staff=True)


@pytest.fixture
def node(broker) -> Node:
    return add_sim_node("dgx-01")


def wakes(broker: RecordingBroker) -> int:
    return len(broker.named("scheduling.placement_pass"))


def test_a_job_waiting_for_a_drained_node_is_placed_once_the_node_is_online(
    admin, node, broker, django_capture_on_commit_callbacks
):
    set_node_state(node, NodeState.DRAINING, actor=admin)
    job = submission.submit_job(admin, command=["sleep", "60"], gpu_count=8)
    loop.run_pass()
    job.refresh_from_db()
    assert (job.state, job.pending_code) == (JobState.QUEUED, "nodes_unavailable")

    with django_capture_on_commit_callbacks(execute=True):
        set_node_state(node, NodeState.ONLINE, actor=admin)
    [(name, args, queue)] = broker.sent
    assert (name, queue) == (tasks.placement_pass.name, None)  # on the central queue

    with django_capture_on_commit_callbacks(execute=True):
        app.tasks[name](*args)  # what the central worker runs
    job = Job.objects.get(pk=job.pk)
    assert job.state == JobState.SCHEDULED
    assert job.placement["nodes"] == {"dgx-01": list(range(8))}
    [(spec, queue)] = broker.job_specs()
    assert (JobSpec.from_dict(spec).job_id, queue) == (f"{job.pk}.1", "node.dgx-01")


def test_only_changes_that_give_gpus_back_wake_the_loop(
    admin, node, broker, django_capture_on_commit_callbacks
):
    three = node.gpus.get(index=3)
    with django_capture_on_commit_callbacks(execute=True):
        record_heartbeat(node.hostname)  # heard from within its grace already
        set_gpu_state(three, GpuState.DRAINING, actor=admin)
        set_node_state(node, NodeState.OFFLINE, actor=admin)
    assert wakes(broker) == 0

    Node.objects.filter(pk=node.pk).update(last_heartbeat_at=timezone.now() - timedelta(minutes=5))
    with django_capture_on_commit_callbacks(execute=True):
        set_node_state(node, NodeState.ONLINE, actor=admin)  # but its agent is silent
    assert wakes(broker) == 0

    with django_capture_on_commit_callbacks(execute=True):
        record_heartbeat(node.hostname)  # heard from again
    assert wakes(broker) == 1
    # Until that pass starts, more GPUs coming back ask for no other one.
    with django_capture_on_commit_callbacks(execute=True):
        set_gpu_state(three, GpuState.AVAILABLE, actor=admin)
    assert wakes(broker) == 1
