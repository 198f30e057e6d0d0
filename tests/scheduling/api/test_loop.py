"""'Why is my job pending?': after a placement pass, the API shows each job's placement or
its reason, queue position, estimated start and what-if."""

from __future__ import annotations

from datetime import datetime, timedelta

import pytest

from scheduling import loop
from scheduling.models import JobState
from tests.scheduling.api.conftest import submit

pytestmark = pytest.mark.django_db


def test_job_detail_after_a_placement_pass(api_as, fleet, broker):
    alice = api_as("alice")
    placed = submit(alice.user, gpu_count=8, estimated_duration_s=3600)
    other = submit(alice.user, gpu_count=8, estimated_duration_s=3600)
    waiting = submit(alice.user, gpu_count=8)
    summary = loop.run_pass()
    assert (summary.placed, summary.waiting) == (2, 1)

    body = alice.get(f"/api/v1/jobs/{placed.pk}/").json()
    assert body["state"] == JobState.SCHEDULED
    assert set(body["placement"]) == {
        "topology_class",
        "numa_nodes",
        "score",
        "explanation",
        "nodes",
    }
    [node] = body["placement"]["nodes"]
    assert body["placement"]["nodes"][node] == list(range(8))
    assert [(a["node"], a["gpu_index"]) for a in body["allocations"]] == [
        (node, i) for i in range(8)
    ]
    assert all(a["gpu_uuid"].startswith("GPU-") for a in body["allocations"])
    assert (body["pending_code"], body["queue_position"]) == ("", None)
    assert alice.get(f"/api/v1/jobs/{other.pk}/").json()["state"] == JobState.SCHEDULED

    pending = alice.get(f"/api/v1/jobs/{waiting.pk}/").json()
    assert pending["state"] == JobState.QUEUED
    assert pending["queue_position"] == 1
    assert (pending["pending_code"], pending["pending_reason"], pending["what_if"]) == (
        "resources_busy",
        "needs 8 free GPUs on one node; none is free",
        "",
    )
    # The placed jobs are expected to end in an hour: it starts then.
    started = datetime.fromisoformat(pending["estimated_start_at"])
    placed.refresh_from_db()
    assert abs((started - placed.scheduled_at - timedelta(hours=1)).total_seconds()) < 2
    queue = alice.get("/queue").json()
    assert [job["id"] for job in queue["waiting"]] == [waiting.pk]
    assert sorted(job["id"] for job in queue["running"]) == [placed.pk, other.pk]
