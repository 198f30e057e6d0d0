"""The seed queue endpoints: GET /queue, DELETE /queue/{id}, PATCH priority, statistics."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from gpuadmin.audit.models import AuditEvent
from scheduling.models import Job, JobState
from tests.scheduling.api.conftest import events, submit

pytestmark = pytest.mark.django_db


@pytest.fixture
def alice(api_as):
    return api_as("alice")


def test_queue_lists_waiting_jobs_in_queue_order_then_running(alice, fleet):
    first, second, held = submit(alice.user), submit(alice.user), submit(alice.user, hold=True)
    running = submit(alice.user)
    Job.objects.filter(pk=running.pk).update(state=JobState.RUNNING, scheduled_at=timezone.now())
    Job.objects.filter(pk=second.pk).update(
        queue_position=1, pending_code="no-capacity", pending_reason="needs 1 GPU"
    )
    Job.objects.filter(pk=first.pk).update(queue_position=2)
    body = alice.get("/queue").json()
    assert [job["id"] for job in body["waiting"]] == [second.pk, first.pk, held.pk]
    assert (body["waiting_count"], body["running_count"]) == (3, 1)
    assert [job["id"] for job in body["running"]] == [running.pk]
    head = body["waiting"][0]
    assert (head["queue_position"], head["pending_code"], head["pending_reason"]) == (
        1,
        "no-capacity",
        "needs 1 GPU",
    )
    limited = alice.get("/queue?limit=1").json()
    assert ([job["id"] for job in limited["waiting"]], limited["waiting_count"]) == ([second.pk], 3)
    assert alice.get("/queue?limit=0").json() == {
        "limit": ["Ensure this value is greater than or equal to 1."]
    }


def test_cancel_a_queued_job(alice, fleet):
    job = submit(alice.user)
    response = alice.delete(f"/queue/{job.pk}")
    assert response.status_code == 200
    assert response.json()["job"]["state"] == "canceled"
    job.refresh_from_db()
    assert (job.state, job.finished_at is not None) == (JobState.CANCELED, True)
    assert events(target_id=job.pk) == ["job.submitted", "job.canceled"]
    again = alice.delete(f"/queue/{job.pk}")
    assert again.status_code == 409
    assert again.json() == {"detail": f"job {job.pk} is already canceled"}
    assert alice.delete("/queue/999999999").status_code == 404


def test_change_a_waiting_jobs_priority(alice, fleet):
    job = submit(alice.user)
    response = alice.patch(f"/queue/{job.pk}/priority", {"priority": "critical"}, format="json")
    assert response.status_code == 200
    assert response.json()["priority"] == "critical"
    event = AuditEvent.objects.get(event_type="job.priority_changed")
    assert (event.before, event.after) == ({"priority": "normal"}, {"priority": "critical"})
    bad = alice.patch(f"/queue/{job.pk}/priority", {"priority": "urgent"}, format="json")
    assert bad.json() == {"priority": ['"urgent" is not a valid choice.']}
    Job.objects.filter(pk=job.pk).update(state=JobState.RUNNING)
    late = alice.patch(f"/queue/{job.pk}/priority", {"priority": "low"}, format="json")
    assert late.status_code == 409
    assert late.json() == {
        "detail": f"job {job.pk} is running: only a waiting job's priority can change"
    }
    assert Job.objects.get(pk=job.pk).priority == "critical"


def test_statistics(alice, fleet):
    now = timezone.now()
    waits = [timedelta(seconds=30), timedelta(minutes=5), timedelta(minutes=5), timedelta(hours=2)]
    for wait in waits:
        job = submit(alice.user)
        Job.objects.filter(pk=job.pk).update(
            state=JobState.COMPLETED,
            submitted_at=now - wait - timedelta(minutes=1),
            started_at=now - timedelta(minutes=1),
            finished_at=now,
        )
    old = submit(alice.user)
    Job.objects.filter(pk=old.pk).update(
        state=JobState.FAILED,
        submitted_at=now - timedelta(days=3),
        started_at=now - timedelta(days=2),
        finished_at=now - timedelta(days=2),
    )
    queued = submit(alice.user)
    submit(alice.user, hold=True)
    body = alice.get("/queue/statistics").json()
    assert body["total_queued"] == 1
    assert body["by_state"] == {
        "pending": 1,
        "queued": 1,
        "scheduled": 0,
        "running": 0,
        "completed": 4,
        "failed": 1,
        "canceled": 0,
        "preempted": 0,
    }
    assert body["started_last_24h"] == 4
    assert body["average_wait_s"] == pytest.approx(sum(w.total_seconds() for w in waits) / 4)
    assert body["wait_distribution"] == [
        {"label": "<1m", "count": 1},
        {"label": "1-10m", "count": 2},
        {"label": "10-60m", "count": 0},
        {"label": "1-6h", "count": 1},
        {"label": ">6h", "count": 0},
    ]
    assert body["throughput_jobs_per_hour"] == 4
    queued.refresh_from_db()
    assert body["oldest_queued_submitted_at"] == queued.submitted_at.isoformat().replace(
        "+00:00", "Z"
    )


def test_statistics_of_an_empty_queue(alice, db):
    body = alice.get("/queue/statistics").json()
    assert (body["total_queued"], body["average_wait_s"], body["started_last_24h"]) == (0, None, 0)
    assert [bucket["count"] for bucket in body["wait_distribution"]] == [0] * 5


def test_a_held_job_waits_until_released(alice, fleet):
    response = alice.post("/queue/submit", {"command": ["true"], "hold": True}, format="json")
    assert response.status_code == 201, response.json()
    job_id = response.json()["id"]
    assert response.json()["state"] == "pending"
    released = alice.post(f"/api/v1/jobs/{job_id}/release/")
    assert (released.status_code, released.json()["state"]) == (200, "queued")
    again = alice.post(f"/api/v1/jobs/{job_id}/release/")
    assert again.status_code == 409
    assert events(target_id=job_id) == ["job.submitted", "job.queued"]
