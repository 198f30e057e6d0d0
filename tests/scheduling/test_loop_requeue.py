"""A job SCHEDULED on a node whose agent went silent goes back to the queue at the next pass;
the node that counts is the one of its active allocation, not of an earlier attempt's."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from inventory.models import Gpu, Node
from scheduling import loop
from scheduling.models import Allocation, Job, JobState
from tests.scheduling.conftest import add_sim_node

pytestmark = pytest.mark.django_db


@pytest.fixture
def alice(django_user_model):
    return django_user_model.objects.create_user("alice")


def scheduled(owner, gpu: Gpu, minutes_ago: int) -> Job:
    job = Job.objects.create(
        owner=owner,
        command=["x"],
        state=JobState.SCHEDULED,
        attempt=2,
        scheduled_at=timezone.now() - timedelta(minutes=minutes_ago),
    )
    Allocation.objects.create(job=job, gpu=gpu, node=gpu.node, attempt=2)
    return job


def test_only_jobs_whose_active_allocation_is_on_a_silent_node_are_requeued(alice, broker):
    silent, alive = add_sim_node("dgx-01"), add_sim_node("dgx-02")
    Node.objects.filter(pk=silent.pk).update(last_heartbeat_at=None)
    on_silent = Gpu.objects.filter(node=silent).order_by("index")
    on_alive = Gpu.objects.filter(node=alive).order_by("index")

    lost = scheduled(alice, on_silent[0], minutes_ago=5)
    fresh = scheduled(alice, on_silent[1], minutes_ago=0)  # its agent may still start it
    moved = scheduled(alice, on_alive[0], minutes_ago=5)
    # Its first attempt ran on the silent node; the second is on a live one.
    Allocation.objects.create(
        job=moved, gpu=on_silent[2], node=silent, attempt=1, released_at=timezone.now()
    )

    assert loop.requeue_lost_scheduled_jobs() == 1

    states = dict(Job.objects.values_list("pk", "state"))
    assert states[lost.pk] == JobState.QUEUED
    assert (states[fresh.pk], states[moved.pk]) == (JobState.SCHEDULED, JobState.SCHEDULED)
    assert not Allocation.objects.active().filter(job=lost).exists()
