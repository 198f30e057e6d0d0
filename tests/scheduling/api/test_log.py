"""GET /api/v1/jobs/{id}/log/: the log's tail, read through the node's agent."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from inventory.models import Node
from scheduling.allocations import manual
from scheduling.models import Job
from tests.scheduling.api.conftest import submit, write_log

pytestmark = pytest.mark.django_db


@pytest.fixture
def alice(api_as):
    return api_as("alice")


@pytest.fixture
def ran(alice, fleet, agent_broker) -> Job:
    """A job placed (attempt 1) on GPU 0 of dgx-01."""
    job = submit(alice.user)
    gpu = fleet[0].gpus.get(index=0)
    manual.allocate_by_hand(job, [gpu.uuid], actor=alice.user)
    return Job.objects.get(pk=job.pk)


def test_tail_of_the_log(alice, ran, agent_broker):
    write_log(ran, "epoch 1\nepoch 2\nepoch 3\n")
    response = alice.get(f"/api/v1/jobs/{ran.pk}/log/?tail=2")
    assert response.status_code == 200
    assert response.json() == {
        "text": "epoch 2\nepoch 3\n",
        "exists": True,
        "node": "dgx-01",
        "nodes": ["dgx-01"],
        "attempt": 1,
    }
    assert agent_broker.named("scheduling.tail_log") == [((ran.pk, 1, 2), "node.dgx-01")]


def test_no_log_yet(alice, ran):
    body = alice.get(f"/api/v1/jobs/{ran.pk}/log/").json()
    assert (body["text"], body["exists"]) == ("", False)


def test_a_job_that_never_ran_has_no_log(alice, fleet, agent_broker):
    job = submit(alice.user)
    response = alice.get(f"/api/v1/jobs/{job.pk}/log/")
    assert response.status_code == 404
    assert response.json() == {"detail": f"job {job.pk} has not run yet (it is queued)"}
    assert agent_broker.sent == []


def test_log_of_another_node(alice, ran):
    response = alice.get(f"/api/v1/jobs/{ran.pk}/log/?node=dgx-02")
    assert response.status_code == 404
    assert response.json() == {"detail": f"attempt 1 of job {ran.pk} ran on dgx-01, not dgx-02"}


def test_silent_agent_is_a_503(alice, ran, agent_broker):
    agent_broker.answer = False
    response = alice.get(f"/api/v1/jobs/{ran.pk}/log/")
    assert response.status_code == 503
    assert response.json() == {"detail": "node dgx-01 did not answer within 5 s; try again later"}


def test_unreachable_node_is_a_503_without_asking(alice, ran, agent_broker):
    Node.objects.filter(hostname="dgx-01").update(
        last_heartbeat_at=timezone.now() - timedelta(hours=1)
    )
    response = alice.get(f"/api/v1/jobs/{ran.pk}/log/")
    assert response.status_code == 503
    assert response.json() == {
        "detail": "node dgx-01 is unreachable: no heartbeat in the last 30 s"
    }
    assert agent_broker.named("scheduling.tail_log") == []


@pytest.mark.parametrize("tail", ["0", "-3", "lots", "100001"])
def test_bad_tail_is_a_400(alice, ran, tail):
    response = alice.get(f"/api/v1/jobs/{ran.pk}/log/?tail={tail}")
    assert response.status_code == 400
    assert list(response.json()) == ["tail"]
