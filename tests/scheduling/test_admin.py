"""The scheduler in the Django admin: actions through the services."""

from __future__ import annotations

import pytest

from gpuadmin.audit.models import AuditEvent
from scheduling.jobs import submission
from scheduling.models import Job, JobState, SchedulerSettings
from tests.scheduling.conftest import add_sim_node

pytestmark = pytest.mark.django_db


@pytest.fixture
def fleet(broker) -> None:
    add_sim_node("adm-01")


def test_jobs_are_read_only_and_canceled_through_the_service(admin_client, fleet, admin_user):
    job = submission.submit_job(admin_user, command=["true"])
    assert admin_client.get("/admin/scheduling/job/").status_code == 200
    response = admin_client.post(
        "/admin/scheduling/job/", {"action": "cancel_jobs", "_selected_action": [job.pk]}
    )
    assert response.status_code == 302
    job.refresh_from_db()
    assert job.state == JobState.CANCELED
    assert AuditEvent.objects.filter(event_type="job.canceled", actor=admin_user).count() == 1
    detail = admin_client.post(f"/admin/scheduling/job/{job.pk}/change/", {"state": "queued"})
    assert detail.status_code == 403
    assert Job.objects.get(pk=job.pk).state == JobState.CANCELED


def test_the_job_list_shows_borrowing_and_preemption(admin_client, fleet, admin_user):
    victim = submission.submit_job(admin_user, command=["true"], name="victim")
    winner = submission.submit_job(admin_user, command=["true"], name="winner")
    Job.objects.filter(pk=victim.pk).update(borrowed=True, preemptions=2, preempted_by=winner)

    borrowed = admin_client.get("/admin/scheduling/job/", {"borrowed__exact": "1"})

    rows = borrowed.context["cl"].result_list
    assert [job.pk for job in rows] == [victim.pk]
    html = borrowed.content.decode()
    assert '<td class="field-preemptions">2</td>' in html
    assert f"{winner}" in html  # preempted by


def test_scheduler_settings_change_through_the_audited_services(admin_client):
    assert admin_client.get("/admin/scheduling/schedulersettings/").status_code == 200
    response = admin_client.post("/admin/scheduling/schedulersettings/1/change/", {"enabled": ""})
    assert response.status_code == 302, response.content[:500]
    assert SchedulerSettings.load().enabled is False
    kinds = list(AuditEvent.objects.values_list("event_type", flat=True))
    assert kinds == ["scheduler.stopped"]


def test_the_admin_names_its_models_in_plain_words(admin_client):
    index = admin_client.get("/admin/").content.decode()
    for name in ("Scheduler settings", "API tokens", "Memberships", "Jobs", "Allocations"):
        assert f">{name}</a>" in index, name
    assert "settingss" not in index and "Api tokens" not in index
