"""Cancelling from the job page: who sees the button, who may post it, what happens."""

from __future__ import annotations

import pytest

from gpuadmin.audit.models import AuditEvent
from scheduling.models import Job, JobState
from tests.scheduling.pages.helpers import add_fleet, place, submit

pytestmark = pytest.mark.django_db

BUTTON = ">Cancel job</button>"


def cancel_events(job: Job) -> list[str]:
    return list(
        AuditEvent.objects.filter(target_type="scheduling.job", target_id=str(job.pk))
        .exclude(event_type__in=["job.submitted", "job.scheduled"])
        .values_list("event_type", flat=True)
    )


def test_the_owner_cancels_a_waiting_job(client, alice, agents):
    add_fleet()
    job = submit(alice, hold=True)
    client.force_login(alice)
    assert BUTTON in client.get(f"/jobs/{job.pk}/").content.decode()

    response = client.post(f"/jobs/{job.pk}/cancel/", follow=True)

    job.refresh_from_db()
    assert job.state == JobState.CANCELED
    assert response.redirect_chain == [(f"/jobs/{job.pk}/", 302)]
    html = response.content.decode()
    assert f"Job {job.pk} canceled." in html
    assert BUTTON not in html
    assert cancel_events(job) == ["job.canceled"]


def test_cancelling_a_running_job_asks_its_agent(
    client, alice, agents, django_capture_on_commit_callbacks
):
    (node,) = add_fleet()
    job = submit(alice)
    place(job)
    client.force_login(alice)

    with django_capture_on_commit_callbacks(execute=True):
        response = client.post(f"/jobs/{job.pk}/cancel/", follow=True)

    job.refresh_from_db()
    assert job.state == JobState.SCHEDULED  # until the agent reports its processes gone
    assert "Cancel requested: the agents are stopping job" in response.content.decode()
    assert cancel_events(job) == ["job.cancel_requested"]
    assert agents.named("scheduling.cancel_job") == [
        ((job.pk, 1, "canceled by alice"), f"node.{node.hostname}")
    ]


def test_a_finished_job_has_nothing_to_cancel(client, alice, agents):
    add_fleet()
    job = submit(alice)
    client.force_login(alice)
    client.post(f"/jobs/{job.pk}/cancel/")

    response = client.post(f"/jobs/{job.pk}/cancel/", follow=True)

    assert "is canceled: nothing to cancel." in response.content.decode()
    assert cancel_events(job) == ["job.canceled"]


def test_a_viewer_reads_the_job_but_gets_no_button_and_is_refused(client, alice, viewer, agents):
    add_fleet()
    job = submit(alice)
    client.force_login(viewer)

    html = client.get(f"/jobs/{job.pk}/").content.decode()
    response = client.post(f"/jobs/{job.pk}/cancel/")

    assert f"<h1>Job {job.pk}</h1>" in html and BUTTON not in html
    assert response.status_code == 403
    job.refresh_from_db()
    assert job.state == JobState.QUEUED
    assert cancel_events(job) == []


def test_another_user_neither_reads_nor_cancels_the_job(client, alice, bob, agents):
    add_fleet()
    job = submit(alice)
    client.force_login(bob)
    assert client.get(f"/jobs/{job.pk}/").status_code == 404  # as in the API
    assert client.get(f"/jobs/{job.pk}/log/").status_code == 404
    assert client.post(f"/jobs/{job.pk}/cancel/").status_code == 404
    job.refresh_from_db()
    assert job.state == JobState.QUEUED
    assert cancel_events(job) == []


def test_an_operator_cancels_anyones_job(client, alice, operator, agents):
    add_fleet()
    job = submit(alice)
    client.force_login(operator)
    assert BUTTON in client.get(f"/jobs/{job.pk}/").content.decode()
    client.post(f"/jobs/{job.pk}/cancel/")
    job.refresh_from_db()
    assert (job.state, job.message) == (JobState.CANCELED, "canceled by otto")


def test_cancel_needs_post_and_csrf(alice, agents):
    from django.test import Client

    add_fleet()
    job = submit(alice)
    client = Client(enforce_csrf_checks=True)
    client.force_login(alice)
    assert client.get(f"/jobs/{job.pk}/cancel/").status_code == 405
    assert client.post(f"/jobs/{job.pk}/cancel/").status_code == 403
    job.refresh_from_db()
    assert job.state == JobState.QUEUED
