"""'Why is my job pending?': after a placement pass, the API shows each job's placement or
its reason, queue position, estimated start and what-if."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest
from django.db import IntegrityError, connection, transaction
from django.utils import timezone

from gpuadmin.leases import services as leases
from gpuadmin.leases.models import Lease
from scheduling.jobs import submission, transitions
from scheduling.loop import passes as loop
from scheduling.loop import switch
from scheduling.models import NOT_WAITING, Job, JobState
from scheduling.placement import Pending, Reason
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
    # A DGX A100 has two sockets of four NUMA nodes: its sockets are counted, never given
    # the numbers of their lowest NUMA nodes ("on sockets 0 and 4").
    assert body["placement"]["explanation"] == (
        f"8 GPUs in one NVLink domain on {node} (GPUs 0-7), NUMA nodes 1, 3, 5 and 7 across "
        "2 sockets; best fit: leaves 0 free GPUs on that node"
    )
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


def _ctid(job) -> str:
    """Where the row's current version lies: an UPDATE, even to equal values, moves it."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT ctid::text FROM scheduling_job WHERE id = %s", [job.pk])
        return cursor.fetchone()[0]


def test_save_pending_writes_only_changed_rows_of_waiting_jobs_in_one_statement(
    api_as, fleet, django_assert_num_queries
):
    alice = api_as("alice").user
    jobs = [submit(alice, gpu_count=8) for _ in range(3)]
    start = timezone.now() + timedelta(hours=1, microseconds=600_000)
    pending = tuple(
        Pending(job.pk, position, Reason.RESOURCES_BUSY, "busy", start.timestamp(), None)
        for position, job in enumerate(jobs, start=1)
    )
    now = timezone.now().timestamp()
    with django_assert_num_queries(1):
        assert loop.save_pending(pending, {}, now) == 3
    stored = Job.objects.get(pk=jobs[0].pk)
    assert (stored.pending_code, stored.pending_reason, stored.queue_position) == (
        "resources_busy",
        "busy",
        1,
    )
    assert stored.estimated_start_at == datetime.fromtimestamp(round(start.timestamp()), UTC)
    assert stored.what_if == ""

    before = [_ctid(job) for job in jobs]
    transitions.transition(jobs[2], JobState.CANCELED, actor=alice)  # no longer waiting
    changed = (
        pending[0],
        replace(pending[1], position=5, estimated_start=None, what_if="with 4 GPUs"),
        replace(pending[2], message="changed"),
    )
    with django_assert_num_queries(1):  # nothing known of the stored rows: the database compares
        assert loop.save_pending(changed, {}, now) == 1
    assert _ctid(jobs[0]) == before[0]  # unchanged: not rewritten
    assert _ctid(jobs[1]) != before[1]
    second = Job.objects.get(pk=jobs[1].pk)
    assert (second.queue_position, second.estimated_start_at, second.what_if) == (
        5,
        None,
        "with 4 GPUs",
    )
    canceled = Job.objects.get(pk=jobs[2].pk)  # cleared when it ended, and not written back
    assert (canceled.pending_reason, canceled.queue_position) == ("", None)


WAITING_WORDS = ("resources_busy", "needs 8 free GPUs on one node", "with 4 GPUs")


def test_a_job_canceled_while_waiting_keeps_no_word_on_its_wait(api_as, fleet, admin_client):
    alice = api_as("alice")
    running = [submit(alice.user, gpu_count=8, estimated_duration_s=3600) for _ in range(2)]
    waiting = submit(alice.user, gpu_count=8)
    loop.run_pass()
    Job.objects.filter(pk=waiting.pk).update(what_if="with 4 GPUs")
    assert {job.state for job in Job.objects.filter(pk__in=[j.pk for j in running])} == {
        JobState.SCHEDULED
    }
    before = alice.get(f"/api/v1/jobs/{waiting.pk}/").json()
    assert (before["pending_code"], before["queue_position"]) == ("resources_busy", 1)
    assert "resources_busy" in admin_client.get("/admin/scheduling/job/").content.decode()

    assert alice.post(f"/api/v1/jobs/{waiting.pk}/cancel/").status_code == 200
    body = alice.get(f"/api/v1/jobs/{waiting.pk}/").json()
    assert body["state"] == JobState.CANCELED
    assert [body[name] for name in NOT_WAITING] == list(NOT_WAITING.values())
    changelist = admin_client.get("/admin/scheduling/job/").content.decode()
    page = alice.get(f"/jobs/{waiting.pk}/")
    assert page.status_code == 200
    page = page.content.decode()
    for words in WAITING_WORDS:
        assert words not in changelist and words not in page
    # A pass that explained the job before it ended does not write the explanation back.
    explained = Pending(waiting.pk, 1, Reason.RESOURCES_BUSY, "busy", None, "with 4 GPUs")
    assert loop.save_pending((explained,), {}, timezone.now().timestamp()) == 0


def test_the_database_refuses_a_word_on_the_wait_of_a_job_that_is_not_queued(api_as, fleet):
    job = submit(api_as("alice").user, hold=True)  # PENDING: held, not in the queue
    with pytest.raises(IntegrityError), transaction.atomic():
        Job.objects.filter(pk=job.pk).update(pending_code="resources_busy")


def test_a_pass_reads_the_fleet_and_queue_in_a_fixed_number_of_queries(
    api_as, fleet, broker, django_assert_max_num_queries
):
    alice = api_as("alice").user
    for _ in range(3):
        submit(alice, gpu_count=8, estimated_duration_s=600)
    loop.run_pass()  # two placed, one waits
    # the loop's lease, settings, lost jobs, job arrays to split; nodes, GPUs, allocations,
    # NVLink links, MPS shares, running jobs, dependencies, earlier attempts' service, the
    # queue, pool policies, quotas, reservations, array caps; the pending rows in a
    # transaction fenced by the lease (a savepoint here, its renewal, its release), the lease
    # given back (the fair-share usage is cached)
    for added in (20, 40):  # the same queries however long the queue
        for _ in range(added):
            submit(alice, gpu_count=2)
        waiting = Job.objects.filter(state=JobState.QUEUED).count()
        with django_assert_max_num_queries(21):
            summary = loop.run_pass()
        # Only the new jobs' rows are written: the others keep their word and position.
        assert (summary.placed, summary.waiting, summary.pending_saved) == (0, waiting, added)


def test_a_pass_that_lost_the_loops_lease_places_nothing(api_as, fleet, broker, monkeypatch):
    """A worker that stalls in its pass past the lease's time to live (another worker took the
    loop over meanwhile) commits none of its decisions: they may be stale."""
    job = submit(api_as("alice").user, gpu_count=8)
    plan = loop.placement.plan

    def plan_then_stall(snapshot):
        result = plan(snapshot)
        Lease.objects.filter(name=loop.lease_name()).update(expires_at=timezone.now())
        assert leases.try_take(loop.lease_name(), 60) is not None  # another worker's
        return result

    monkeypatch.setattr(loop.placement, "plan", plan_then_stall)
    summary = loop.run_pass()

    assert (summary.placed, summary.skipped) == (0, "another worker took the loop's lease over")
    job.refresh_from_db()
    assert job.state == JobState.QUEUED
    assert broker.named("scheduling.run_jobs") == []


def test_a_pass_makes_an_arrays_tasks_jobs_then_places_them_within_its_cap(api_as, fleet, broker):
    """The pass splits the array first (under the loop's lease), then places what it may
    run: its cap, the one task more waiting with the array's word; a task's end lets the
    next pass make and place the next."""
    alice = api_as("alice")
    stored = submission.submit_array(alice.user, "0-99%2", command=["true"]).array
    summary = loop.run_pass()
    assert (summary.split, summary.placed, summary.waiting) == (3, 2, 1)
    waiting = Job.objects.get(array=stored, state=JobState.QUEUED)
    assert (waiting.array_index, waiting.pending_code) == (2, "array_limit")
    assert waiting.pending_reason == f"array {stored.pk} runs 2 tasks at once, its cap (%2)"
    body = alice.get(f"/api/v1/arrays/{stored.pk}/").json()
    assert body["tasks"] == {"queued": 98, "scheduled": 2} and body["split"] == 3
    first = Job.objects.get(array=stored, array_index=0)
    transitions.transition(first, JobState.CANCELED, actor_name="test")
    summary = loop.run_pass()
    assert (summary.split, summary.placed) == (1, 1)
    assert set(Job.objects.filter(array=stored).values_list("array_index", flat=True)) == {
        0,
        1,
        2,
        3,
    }


def test_a_stopped_scheduler_still_makes_an_arrays_tasks_jobs_to_wait(api_as, fleet, broker):
    """Its queue says why nothing runs, the array's tasks among it, as a job's would."""
    alice = api_as("alice")
    switch.set_scheduler_enabled(False, actor=alice.user)
    stored = submission.submit_array(alice.user, "0-9%2", command=["true"]).array
    summary = loop.run_pass()
    assert (summary.skipped, summary.split, summary.placed) == ("the scheduler is stopped", 3, 0)
    reasons = set(Job.objects.filter(array=stored).values_list("pending_reason", flat=True))
    assert reasons == {loop.STOPPED_REASON}
