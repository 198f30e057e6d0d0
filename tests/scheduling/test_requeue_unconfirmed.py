"""A job SCHEDULED longer than GPUADMIN_SCHEDULED_CONFIRM_S that no agent started goes back to
the queue (beat, and its node's agent at start), audited with the reason, and ``gpuadmin
check`` reports one that is still there; the node that counts is the one of its active
allocation, not of an earlier attempt's."""

from __future__ import annotations

import re
from datetime import timedelta

import pytest
from django.utils import timezone

from gpuadmin.audit.models import AuditEvent
from inventory.models import Gpu, Node
from scheduling.checks import run_checks
from scheduling.jobs import reports, transitions
from scheduling.models import Allocation, Job, JobState
from tests.scheduling.conftest import add_sim_node

pytestmark = pytest.mark.django_db

STUCK = "no job stays scheduled without its agent starting it"


@pytest.fixture
def alice(django_user_model):
    return django_user_model.objects.create_user("alice")


def scheduled(owner, gpu: Gpu, minutes_ago: int) -> Job:
    job = Job.objects.create(
        owner=owner,
        command=["x"],
        state=JobState.SCHEDULED,
        attempt=2,
        max_retries=1,
        scheduled_at=timezone.now() - timedelta(minutes=minutes_ago),
    )
    Allocation.objects.create(job=job, gpu=gpu, node=gpu.node, attempt=2)
    return job


def states() -> dict[int, str]:
    return dict(Job.objects.values_list("pk", "state"))


def test_a_job_no_agent_started_within_the_bound_is_requeued_audited_and_canceled(
    alice, broker, settings, django_capture_on_commit_callbacks
):
    """Its agent heartbeats (it lost the message, or restarted): the bound alone counts."""
    settings.GPUADMIN_SCHEDULED_CONFIRM_S = 120
    alive = add_sim_node("dgx-01")
    gpus = Gpu.objects.filter(node=alive).order_by("index")
    stuck = scheduled(alice, gpus[0], minutes_ago=5)
    fresh = scheduled(alice, gpus[1], minutes_ago=1)  # its message may still be on its way
    [found] = run_checks()[STUCK]
    assert re.fullmatch(
        rf"job {stuck.pk} is scheduled for 30\d s, longer than GPUADMIN_SCHEDULED_CONFIRM_S "
        r"\(120 s\), and no agent has started it",
        found,
    )

    with django_capture_on_commit_callbacks(execute=True):
        assert reports.requeue_unconfirmed() == [stuck.pk]

    assert (states()[stuck.pk], states()[fresh.pk]) == (JobState.QUEUED, JobState.SCHEDULED)
    stuck.refresh_from_db()
    message = "requeued: dgx-01 did not start it within 120 s"
    assert (stuck.message, stuck.failures) == (message, 0)  # not its own failure
    assert not Allocation.objects.active().filter(job=stuck).exists()
    audited = AuditEvent.objects.filter(target_id=str(stuck.pk), event_type="job.queued").get()
    assert (audited.actor_name, audited.message) == (transitions.LOOP_ACTOR, message)
    # Should its message still reach the agent, that attempt never starts.
    assert broker.named("scheduling.cancel_job") == [((stuck.pk, 2, message), "node.dgx-01")]
    assert run_checks()[STUCK] == []


def test_only_the_node_of_the_active_allocation_counts_and_a_silent_one_too(alice, broker):
    silent, alive = add_sim_node("dgx-01"), add_sim_node("dgx-02")
    Node.objects.filter(pk=silent.pk).update(last_heartbeat_at=None)
    on_silent = Gpu.objects.filter(node=silent).order_by("index")
    on_alive = Gpu.objects.filter(node=alive).order_by("index")
    lost = scheduled(alice, on_silent[0], minutes_ago=5)
    moved = scheduled(alice, on_alive[0], minutes_ago=5)
    # Its first attempt ran on the silent node; the second is on the other one.
    Allocation.objects.create(
        job=moved, gpu=on_silent[2], node=silent, attempt=1, released_at=timezone.now()
    )

    assert reports.requeue_unconfirmed() == [lost.pk, moved.pk]
    moved.refresh_from_db()
    assert moved.message == "requeued: dgx-02 did not start it within 120 s"


def test_an_agent_at_start_requeues_its_own_unconfirmed_jobs_but_not_those_it_runs(alice, broker):
    """``agent_jobs``: the (job, attempt) it runs (re-adopted: its start report was lost)
    stay, another node's wait for beat, and a job placed within the bound may still be in
    its queue."""
    node, other = add_sim_node("dgx-01"), add_sim_node("dgx-02")
    gpus = Gpu.objects.filter(node=node).order_by("index")
    stuck = scheduled(alice, gpus[0], minutes_ago=5)
    runs = scheduled(alice, gpus[1], minutes_ago=5)
    fresh = scheduled(alice, gpus[2], minutes_ago=0)
    elsewhere = scheduled(alice, Gpu.objects.filter(node=other).first(), minutes_ago=5)

    assert reports.reconcile_node_jobs("dgx-01", {(runs.pk, 2)}) == [stuck.pk]

    assert {pk: state for pk, state in states().items() if state == JobState.SCHEDULED} == {
        runs.pk: JobState.SCHEDULED,
        fresh.pk: JobState.SCHEDULED,
        elsewhere.pk: JobState.SCHEDULED,
    }
