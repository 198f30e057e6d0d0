"""The scheduler in the Django admin: role edits audited, actions through the services."""

from __future__ import annotations

import pytest

from gpuadmin.audit.models import AuditEvent
from scheduling import auth, services
from scheduling.models import ApiToken, Job, JobState, Membership, SchedulerSettings
from tests.scheduling.conftest import add_sim_node

pytestmark = pytest.mark.django_db


@pytest.fixture
def fleet(broker) -> None:
    add_sim_node("adm-01")


def test_a_role_change_is_audited(admin_client, django_user_model):
    erin = django_user_model.objects.create_user("erin")
    response = admin_client.post(
        "/admin/scheduling/membership/add/", {"user": erin.pk, "role": "operator"}
    )
    assert response.status_code == 302, response.content[:500]
    assert auth.role_of(erin) == "operator"
    membership = Membership.objects.get(user=erin)
    admin_client.post(f"/admin/scheduling/membership/{membership.pk}/delete/", {"post": "yes"})
    assert auth.role_of(django_user_model.objects.get(pk=erin.pk)) == "user"
    changes = AuditEvent.objects.filter(event_type="membership.role_changed").order_by("pk")
    assert [(e.before["role"], e.after["role"]) for e in changes] == [
        (None, "operator"),
        ("operator", None),
    ]


def test_jobs_are_read_only_and_canceled_through_the_service(admin_client, fleet, admin_user):
    job = services.submit_job(admin_user, command=["true"])
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


def test_tokens_are_revoked_from_the_admin(admin_client, admin_user):
    token, _ = auth.create_token(admin_user, "laptop")
    admin_client.post(
        "/admin/scheduling/apitoken/", {"action": "revoke_tokens", "_selected_action": [token.pk]}
    )
    assert ApiToken.objects.get(pk=token.pk).revoked_at is not None
    assert AuditEvent.objects.filter(event_type="token.revoked").count() == 1


def test_scheduler_settings_change_through_the_audited_services(admin_client):
    assert admin_client.get("/admin/scheduling/schedulersettings/").status_code == 200
    response = admin_client.post(
        "/admin/scheduling/schedulersettings/1/change/",
        {"enabled": "", "policy": "fcfs", "aging_interval_s": "120"},
    )
    assert response.status_code == 302, response.content[:500]
    config = SchedulerSettings.load()
    assert (config.enabled, config.policy, config.aging_interval_s) == (False, "fcfs", 120)
    kinds = set(AuditEvent.objects.values_list("event_type", flat=True))
    assert {"scheduler.policy_changed", "scheduler.stopped"} <= kinds
