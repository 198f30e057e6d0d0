"""A job its agent stopped because the agent stopped (``--stop-jobs-on-exit``, what `gpuadmin
up`'s agents do) is re-queued within its retries, without counting one, and says so; with none
left it fails, saying why; a user's cancel under way still ends it canceled."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest
from django.utils import timezone

from gpuadmin.audit.models import AuditEvent
from scheduling.agent import jobs as agent
from scheduling.agent.wire import FinalState, JobFinished
from scheduling.jobs import control, reports, submission, transitions
from scheduling.loop import passes as loop
from scheduling.models import Allocation, Job, JobState
from tests.scheduling.conftest import add_sim_node


@pytest.fixture
def running(broker, django_user_model):
    add_sim_node("dgx-01")
    owner = django_user_model.objects.create_user("alice")

    def start(**fields: Any) -> Job:
        job = submission.submit_job(owner, command=["sleep", "900"], **fields)
        loop.run_pass()
        reports.job_started(job.pk, 1, 4242, timezone.now())
        job.refresh_from_db()
        assert job.state == JobState.RUNNING
        return job

    return start


def node_stopped(job: Job, *, stopped: bool = True) -> Job:
    """dgx-01's agent reports the job's end: canceled as the agent stopped."""
    name = f"{job.pk}.{job.attempt}"
    event = JobFinished(name, FinalState.CANCELED, -15, timezone.now(), "node dgx-01 stopped")
    reports.job_events([event], sender="dgx-01", node_stopped={name} if stopped else ())
    job.refresh_from_db()
    return job


@pytest.mark.django_db
@pytest.mark.parametrize("retries", [0, 1])
def test_a_job_whose_node_stopped_is_requeued_without_counting_a_retry(running, retries):
    job = node_stopped(running(max_retries=retries))
    assert (job.state, job.message, job.failures) == (
        JobState.QUEUED,
        "requeued: node dgx-01 stopped",
        0,
    )
    assert not Allocation.objects.active().filter(job=job).exists()
    audited = AuditEvent.objects.filter(target_id=str(job.pk)).latest("pk")
    assert (audited.event_type, audited.actor_name) == ("job.queued", transitions.AGENT_ACTOR)
    assert audited.message == "requeued: node dgx-01 stopped"


@pytest.mark.django_db
def test_a_cancel_asked_for_or_a_cancel_not_from_the_stop_ends_it_canceled(running):
    asked = running(max_retries=1)
    control.cancel_job(asked, actor=asked.owner)
    assert node_stopped(asked).state == JobState.CANCELED
    assert node_stopped(running(max_retries=1), stopped=False).state == JobState.CANCELED


def test_the_agent_says_which_ends_are_its_nodes_stop(monkeypatch):
    sent: list[tuple[Any, ...]] = []
    monkeypatch.setattr(agent, "send_as_node", lambda name, args: sent.append(args))
    monkeypatch.setattr(agent, "publish_sample", lambda hostname: None)
    monkeypatch.setattr(agent, "_start_sender", lambda: None)
    monkeypatch.setattr(agent, "_unsent", type(agent._unsent)())
    monkeypatch.setattr(agent, "_node_stopped", {"7.1"})
    now = datetime.now(UTC)
    agent.report(JobFinished("7.1", FinalState.CANCELED, -15, now, "node dgx-01 stopped"))
    agent.report(JobFinished("8.1", FinalState.COMPLETED, 0, now, ""))
    assert agent.send_unsent()
    [(events, stopped)] = sent
    assert ([event["job_id"] for event in events], stopped) == (["7.1", "8.1"], ["7.1"])
