"""Preemption's database side: victims are marked, told on both jobs and audited, signalled
with the pool's signal and grace through their agents (the real executor here), and
re-queued when their end is reported, never lost or failed, their preempted attempts not
counted against their retries."""

from __future__ import annotations

import signal
import time
from datetime import timedelta

import pytest
from django.utils import timezone

from gpuadmin.audit.models import AuditEvent
from inventory.models import Gpu, Node
from scheduling import placement
from scheduling.agent.wire import JobSpec, executor_id
from scheduling.allocations import services as allocation_services
from scheduling.jobs import control, reports, submission
from scheduling.loop.preemption import preempt
from scheduling.models import Allocation, Job, JobState
from scheduling.policies import services as policy_services
from tests.scheduling.conftest import add_sim_node, processes_gone

pytestmark = pytest.mark.django_db


@pytest.fixture
def alice(django_user_model):
    return django_user_model.objects.create_user("alice")


@pytest.fixture
def gpus(broker) -> list[Gpu]:
    add_sim_node("dgx-01")
    return list(Gpu.objects.schedulable().order_by("index"))


def running(owner, gpu: Gpu, **fields) -> Job:
    """A job started on ``gpu`` (allocated by hand, reported started by its agent)."""
    job = Job.objects.create(owner=owner, command=["sleep", "60"], state="queued", **fields)
    allocation_services.allocate(job, [gpu.pk], actor=owner)
    reports.job_started(job.pk, job.attempt, 4242, timezone.now())
    job.refresh_from_db()
    return job


def waiting(owner) -> Job:
    return Job.objects.create(owner=owner, command=["train"], state="queued", priority="high")


def events(job: Job) -> list[str]:
    return list(
        AuditEvent.objects.filter(target_type="scheduling.job", target_id=str(job.pk))
        .order_by("pk")
        .values_list("event_type", flat=True)
    )


def decision(job: Job, *victims: Job) -> placement.Preemption:
    return placement.Preemption(
        job_id=job.pk,
        victims=tuple(v.pk for v in victims),
        gpu_ids=tuple(a.gpu_id for v in victims for a in v.allocations.active()),
        reason="priority high over low",
    )


def test_victims_are_marked_told_audited_and_signalled(
    alice, gpus, broker, django_capture_on_commit_callbacks
):
    first, second = running(alice, gpus[0]), running(alice, gpus[1])
    high = waiting(alice)
    with django_capture_on_commit_callbacks(execute=True):
        ids = preempt(decision(high, second, first), signal="SIGUSR1", grace_s=90)
    assert ids == [first.pk, second.pk]
    said = f"preempted by job {high.pk}: priority high over low"
    for victim in (first, second):
        victim.refresh_from_db()
        assert (victim.state, victim.preempted_by_id, victim.message) == (
            JobState.RUNNING,  # it keeps its GPUs until its processes are gone
            high.pk,
            said,
        )
        assert victim.preempt_requested_at is not None
        event = AuditEvent.objects.get(event_type="job.preempt_requested", target_id=victim.pk)
        assert event.after == {"preempted_by": high.pk, "signal": "SIGUSR1", "grace_s": 90}
    high.refresh_from_db()
    assert high.message == f"preempting jobs {first.pk} and {second.pk}"
    assert broker.named("scheduling.cancel_job") == [
        ((first.pk, 1, said, "SIGUSR1", 90), "node.dgx-01"),
        ((second.pk, 1, said, "SIGUSR1", 90), "node.dgx-01"),
    ]
    # Asked again (the next pass), nothing more happens.
    assert preempt(decision(high, first), signal="SIGUSR1", grace_s=90) == []
    assert len(broker.named("scheduling.cancel_job")) == 2


def test_the_reported_end_requeues_the_victim_keeping_the_message(alice, gpus):
    victim, high = running(alice, gpus[0]), waiting(alice)
    preempt(decision(high, victim), signal="SIGTERM", grace_s=30)
    now = timezone.now()
    assert reports.job_finished(victim.pk, 1, "canceled", -15, "canceled", now) == "queued"
    victim.refresh_from_db()
    assert (victim.state, victim.preempted_by_id, victim.preempt_requested_at) == (
        JobState.QUEUED,
        None,
        None,
    )
    assert victim.message == f"preempted by job {high.pk}: priority high over low"
    assert not Allocation.objects.active().filter(job=victim).exists()
    assert events(victim)[-3:] == ["job.preempt_requested", "job.preempted", "job.queued"]
    # Counted in the same audited write as its end.
    assert victim.preemptions == 1
    counted = AuditEvent.objects.get(target_id=str(victim.pk), event_type="job.preempted")
    assert counted.after["preemptions"] == 1


def test_the_count_is_on_the_jobs_api_body_and_page(alice, gpus, client):
    victim, high = running(alice, gpus[0]), waiting(alice)
    client.force_login(alice)
    assert client.get(f"/api/v1/jobs/{victim.pk}/").json()["preemptions"] == 0
    assert "Preempted" not in client.get(f"/jobs/{victim.pk}/").content.decode()
    preempt(decision(high, victim), signal="SIGTERM", grace_s=30)
    reports.job_finished(victim.pk, 1, "canceled", -15, "", timezone.now())
    allocation_services.allocate(victim, [gpus[1].pk], actor=alice)
    reports.job_started(victim.pk, 2, 4343, timezone.now())
    preempt(decision(high, victim), signal="SIGTERM", grace_s=30)
    reports.job_finished(victim.pk, 2, "canceled", -15, "", timezone.now())

    assert client.get(f"/api/v1/jobs/{victim.pk}/").json()["preemptions"] == 2
    html = client.get(f"/jobs/{victim.pk}/").content.decode()
    assert "<dt>Preempted</dt><dd>2 times, re-queued each time" in html


@pytest.mark.parametrize("outcome", ["canceled", "failed", "lost", "timed_out"])
def test_a_preempted_victim_is_never_failed(alice, gpus, outcome):
    victim, high = running(alice, gpus[0]), waiting(alice)
    preempt(decision(high, victim), signal="SIGTERM", grace_s=30)
    assert reports.job_finished(victim.pk, 1, outcome, 1, "", timezone.now()) == "queued"


def test_a_victim_that_completed_first_is_completed(alice, gpus):
    victim, high = running(alice, gpus[0]), waiting(alice)
    preempt(decision(high, victim), signal="SIGTERM", grace_s=30)
    assert reports.job_finished(victim.pk, 1, "completed", 0, "", timezone.now()) == "completed"


def test_preempted_attempts_do_not_count_against_retries(alice, gpus):
    victim, high = running(alice, gpus[0], max_retries=1), waiting(alice)
    preempt(decision(high, victim), signal="SIGTERM", grace_s=30)
    reports.job_finished(victim.pk, 1, "canceled", -15, "", timezone.now())
    victim.refresh_from_db()
    allocation_services.allocate(victim, [gpus[1].pk], actor=alice)
    reports.job_started(victim.pk, 2, 4343, timezone.now())
    assert victim.preemptions == 1
    # Attempt 2 is its first failure: one retry is left.
    assert reports.job_finished(victim.pk, 2, "failed", 3, "", timezone.now()) == "queued"
    victim.refresh_from_db()
    assert victim.message.startswith("retry 1/1 after attempt 2 failed")


def test_a_victim_on_an_unreachable_node_is_requeued_at_once(alice, gpus, broker):
    victim, high = running(alice, gpus[0]), waiting(alice)
    Node.objects.update(last_heartbeat_at=timezone.now() - timedelta(hours=1))
    assert preempt(decision(high, victim), signal="SIGTERM", grace_s=30) == [victim.pk]
    victim.refresh_from_db()
    assert victim.state == JobState.QUEUED
    assert not broker.named("scheduling.cancel_job")
    assert "job.preempted" in events(victim)
    assert victim.preemptions == 1


def test_a_cancel_during_the_grace_wins(alice, gpus, django_capture_on_commit_callbacks):
    victim, high = running(alice, gpus[0]), waiting(alice)
    preempt(decision(high, victim), signal="SIGTERM", grace_s=30)
    with django_capture_on_commit_callbacks(execute=True):
        control.cancel_job(victim, actor=alice)
    assert reports.job_finished(victim.pk, 1, "canceled", -15, "", timezone.now()) == "canceled"


def test_a_job_being_canceled_is_no_victim_and_its_end_is_a_cancel(
    alice, gpus, django_capture_on_commit_callbacks
):
    """A pass during its cancel's grace cannot make it a victim (it would be re-queued), and
    whatever its processes made of the signal, its end is a cancel, not a retry."""
    victim, high = running(alice, gpus[0], max_retries=3), waiting(alice)
    with django_capture_on_commit_callbacks(execute=True):
        control.cancel_job(victim, actor=alice)
    assert preempt(decision(high, victim), signal="SIGTERM", grace_s=30) == []
    victim.refresh_from_db()
    assert (victim.preempted_by_id, victim.cancel_requested_at is not None) == (None, True)
    assert reports.job_finished(victim.pk, 1, "failed", 143, "", timezone.now()) == "canceled"
    victim.refresh_from_db()
    assert (victim.message, victim.failures, victim.cancel_requested_at) == (
        "canceled (failed as it stopped)",
        0,
        None,
    )


def test_a_job_being_canceled_that_its_hardware_stops_is_canceled(
    alice, gpus, django_capture_on_commit_callbacks
):
    victim = running(alice, gpus[0])
    with django_capture_on_commit_callbacks(execute=True):
        control.cancel_job(victim, actor=alice)
    control.stop_jobs_on_gpus([gpus[0].pk], requeue=True, reason="XID 79 on its GPU")
    victim.refresh_from_db()
    assert (victim.state, victim.ending) == (JobState.RUNNING, None)  # its cancel goes on
    ended = reports.job_finished(victim.pk, 1, "failed", -15, "", timezone.now())
    assert ended == JobState.CANCELED
    victim.refresh_from_db()
    assert victim.message == "canceled (failed as it stopped)"

    gone = running(alice, gpus[1])  # no node to wait for: it ends at once, canceled as asked
    with django_capture_on_commit_callbacks(execute=True):
        control.cancel_job(gone, actor=alice)
    Node.objects.update(last_heartbeat_at=timezone.now() - timedelta(hours=1))
    control.stop_jobs_on_gpus([gpus[1].pk], requeue=True, reason="XID 79 on its GPU")
    gone.refresh_from_db()
    assert (gone.state, gone.message) == (
        JobState.CANCELED,
        "canceled (queued as it stopped: XID 79 on its GPU)",
    )


def test_requeues_for_the_hardware_count_no_failure(alice, gpus):
    """A re-layout's or a fault's re-queue is not the job's failure: max_retries is left."""
    job = running(alice, gpus[0], max_retries=1)
    control.stop_jobs_on_gpus([gpus[0].pk], requeue=True, reason="its GPU went offline")
    assert processes_gone(job) == JobState.QUEUED
    allocation_services.allocate(job, [gpus[1].pk], actor=alice)
    reports.job_started(job.pk, 2, 4343, timezone.now())
    assert reports.job_finished(job.pk, 2, "failed", 3, "", timezone.now()) == "queued"
    job.refresh_from_db()
    assert (job.failures, job.message[:29]) == (1, "retry 1/1 after attempt 2 fai")
    allocation_services.allocate(job, [gpus[1].pk], actor=alice)
    assert reports.job_finished(job.pk, 3, "failed", 3, "", timezone.now()) == "failed"
    job.refresh_from_db()
    assert job.failures == 2


def test_nothing_happens_for_a_job_no_longer_waiting_or_a_bad_signal(alice, gpus):
    victim, other = running(alice, gpus[0]), running(alice, gpus[1])
    assert preempt(decision(other, victim), signal="SIGTERM", grace_s=30) == []
    with pytest.raises(ValueError, match="'SIGNOPE' is not a signal name"):
        preempt(decision(waiting(alice), victim), signal="SIGNOPE", grace_s=30)
    victim.refresh_from_db()
    assert victim.preempted_by_id is None


def test_end_to_end_with_the_real_executor(
    alice, gpus, broker, make_executor, tmp_path, django_capture_on_commit_callbacks
):
    """The agent gets the pool's signal; the job checkpoints on it, its end is reported, and
    it is back in the queue."""
    victim, high = running(alice, gpus[0]), waiting(alice)
    executor, recorder = make_executor()
    name = executor_id(victim.pk, victim.attempt)
    marker = tmp_path / "saved"
    script = f"trap 'echo ok > {marker}; exit 0' USR1; while true; do sleep 0.05; done"
    executor.launch(JobSpec(job_id=name, shell_command=script, cwd="/"))
    recorder.started(name)
    time.sleep(0.2)  # the shell sets its trap
    with django_capture_on_commit_callbacks(execute=True):
        preempt(decision(high, victim), signal="SIGUSR1", grace_s=5)
    [((job_id, attempt, _message, signal_name, grace_s), _queue)] = broker.named(
        "scheduling.cancel_job"
    )
    executor.cancel(
        executor_id(job_id, attempt), stop_signal=signal.Signals[signal_name], grace_s=grace_s
    )
    reports.job_event(recorder.finished(name))
    victim.refresh_from_db()
    assert victim.state == JobState.QUEUED
    assert marker.read_text() == "ok\n"


def test_a_victim_requeued_otherwise_is_no_longer_being_preempted(alice, gpus):
    """Its GPU failed during the grace: it goes back to the queue, and its next attempt's
    failure is a failure, not a preemption."""
    victim, high = running(alice, gpus[0]), waiting(alice)
    preempt(decision(high, victim), signal="SIGTERM", grace_s=30)
    control.stop_jobs_on_gpus([gpus[0].pk], requeue=True, reason="XID 79")
    assert processes_gone(victim) == JobState.QUEUED
    assert (victim.state, victim.preempted_by_id, victim.preempt_requested_at) == (
        JobState.QUEUED,
        None,
        None,
    )
    allocation_services.allocate(victim, [gpus[1].pk], actor=alice)
    assert reports.job_finished(victim.pk, 2, "failed", 1, "", timezone.now()) == "failed"


@pytest.mark.parametrize("preemption", [True, False])
def test_the_loop_preempts_with_its_pools_signal_and_grace_or_not_at_all(
    alice, gpus, broker, django_capture_on_commit_callbacks, preemption
):
    """A pass of the real loop: a critical job in a full pool stops one preemptible low job,
    told with the pool's own signal and grace; with the pool's preemption off it waits."""
    from inventory.models import Pool
    from scheduling.loop import passes as loop

    pool = Pool.objects.create(name="a100")
    Node.objects.filter(hostname="dgx-01").update(pool=pool)
    policy_services.set_pool_policy(
        pool,
        actor=alice,
        preemption=preemption,
        preempt_exempt_s=0,
        preempt_signal="SIGUSR1",
        preempt_grace_s=45,
    )
    low = [running(alice, gpu, pool=pool, priority="low", preemptible=True) for gpu in gpus]
    urgent = submission.submit_job(alice, command=["train"], pool="a100", priority="critical")
    with django_capture_on_commit_callbacks(execute=True):
        summary = loop.run_pass()
    marked = Job.objects.filter(preempted_by=urgent)
    cancels = broker.named("scheduling.cancel_job")
    if not preemption:
        assert (summary.preempting, marked.exists(), cancels) == (0, False, [])
        return
    [victim] = marked
    assert victim in low and summary.preempting == 1
    [((job_id, attempt, message, signal_name, grace_s), queue)] = cancels
    assert (job_id, signal_name, grace_s, queue) == (victim.pk, "SIGUSR1", 45, "node.dgx-01")
    assert message == f"preempted by job {urgent.pk}: higher priority (critical over low)"


def test_by_default_the_loop_preempts_work_that_just_started(
    alice, gpus, django_capture_on_commit_callbacks
):
    """No policy row: `preempt_exempt_s` is 0 (the model's default, as Slurm's), so a critical
    job stops low-priority preemptible work at once."""
    from scheduling.loop import passes as loop

    low = [running(alice, gpu, priority="low", preemptible=True) for gpu in gpus]
    urgent = submission.submit_job(alice, command=["train"], priority="critical")
    with django_capture_on_commit_callbacks(execute=True):
        summary = loop.run_pass()
    assert summary.preempting == 1
    assert Job.objects.get(preempted_by=urgent) in low


def test_a_job_kept_from_preempting_by_the_exemption_says_until_when(
    alice, gpus, client, django_capture_on_commit_callbacks
):
    """Through the API: the waiting job's code and sentence name the exempt victim and the
    end of its exemption."""
    from scheduling.loop import passes as loop

    policy_services.set_pool_policy(None, actor=alice, preempt_exempt_s=600)
    low = [running(alice, gpu, priority="low", preemptible=True) for gpu in gpus]
    urgent = submission.submit_job(alice, command=["train"], priority="critical")
    with django_capture_on_commit_callbacks(execute=True):
        assert loop.run_pass().preempting == 0
    first = min(low, key=lambda job: (job.started_at, job.pk))
    until = (first.started_at + timedelta(seconds=600)).strftime("%Y-%m-%d %H:%M UTC")
    client.force_login(alice)
    body = client.get(f"/api/v1/jobs/{urgent.pk}/").json()
    assert body["pending_code"] == "preempt_exempt"
    assert (
        f"no job is preempted for it: low-priority job {first.pk} is exempt from preemption "
        f"until {until} (preempt_exempt_s 600)"
    ) in body["pending_reason"]
