"""Job arrays (``--array 0-999%50``): the spec's syntax, the submission as one row, its tasks made
jobs as the loop reaches them (in bulk, with their audit rows, within the array's cap or in
chunks), the API and pages that show and cancel an array, the cap the loop reads, and the
index in each task's environment."""

from __future__ import annotations

import pytest
from django.db import connection
from django.db.models import ProtectedError
from django.test.utils import CaptureQueriesContext

from gpuadmin.access.models import Role
from gpuadmin.audit.models import AuditEvent
from inventory.models import Pool
from inventory.services import delete_pool
from scheduling import checks
from scheduling.allocations import manual
from scheduling.jobs import arrays, control, dependencies, limits, submission
from scheduling.jobs.slurm import SpecError, compact_indexes, parse_array
from scheduling.loop import dispatch
from scheduling.models import Job, JobArray, JobState
from tests.scheduling.api.conftest import (  # noqa: F401 - fixtures
    api_as,
    fleet,
    make_user,
    split_all,
    submit,
)

pytestmark = pytest.mark.django_db


@pytest.fixture
def alice(api_as, fleet):  # noqa: F811 - the fixtures
    return api_as("alice")


def array(owner, spec: str = "0-3", **fields) -> JobArray:
    """An array submitted, not split yet."""
    command = fields.pop("command", ["true"])
    return submission.submit_array(owner, spec, command=command, **fields).array


def split(owner, spec: str = "0-3", **fields) -> tuple[JobArray, list[int]]:
    """An array submitted and split once as a placement pass would: its tasks made jobs so
    far, by index."""
    submitted = array(owner, spec, **fields)
    arrays.split_due()
    submitted.refresh_from_db()
    return submitted, list(submitted.tasks.order_by("array_index").values_list("pk", flat=True))


# --------------------------------------------------------------------------- the spec


@pytest.mark.parametrize(
    ("spec", "indexes", "cap"),
    [
        ("0-3", (0, 1, 2, 3), None),
        ("0-999%50", tuple(range(1000)), 50),
        ("1,3,5-9", (1, 3, 5, 6, 7, 8, 9), None),
        ("0-15:4", (0, 4, 8, 12), None),
        (" 7 ", (7,), None),
        ("5-9,0-6%2", tuple(range(10)), 2),  # overlaps count once, as in Slurm
    ],
)
def test_array_specs(spec, indexes, cap):
    parsed = parse_array(spec, max_tasks=10_000, max_index=9_999_999)
    assert (parsed.indexes, parsed.max_running) == (indexes, cap)


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("", "empty"),
        ("9-3", "'9-3': the range ends before it starts"),
        ("0-9:0", "the step must be at least 1"),
        ("0-9%0", "the %N cap must be at least 1"),
        ("0-9%x", "the cap is % and a whole number"),
        ("0-9%5%5", "the cap is % and a whole number"),
        ("1,,2", "'' is not an index"),
        ("a-b", "'a-b' is not an index"),
        ("-1", "'-1' is not an index"),
        ("1.5", "'1.5' is not an index"),
        ("٣", "'٣' is not an index"),  # a digit, but not an ASCII one
        ("1234567890", "at most 9 digits"),
        ("0-10000", "more than 10000 tasks"),
        ("0-9999999", "more than 10000 tasks"),  # counted, never listed
        ("5-20000000", "indexes go up to 9999999"),
    ],
)
def test_bad_array_specs_say_why(spec, message):
    with pytest.raises(SpecError) as caught:
        parse_array(spec, max_tasks=10_000, max_index=9_999_999)
    assert message in str(caught.value)


def test_compact_indexes():
    assert compact_indexes([12, 0, 1, 2, 3, 7, 9, 10, 11]) == "0-3,7,9-12"
    assert compact_indexes([5]) == "5"
    assert compact_indexes([]) == ""


# --------------------------------------------------------------------------- submission


def test_an_array_is_one_row_until_the_loop_makes_its_tasks_jobs_all_audited(
    alice, django_capture_on_commit_callbacks
):
    with django_capture_on_commit_callbacks(execute=False) as callbacks:
        stored = array(alice.user, "0-15:4%2", gpu_count=2, name="sweep", project="vision")
    assert [callback.__name__ for callback in callbacks] == ["wake"]  # the loop, once
    stored = JobArray.objects.get()
    assert (stored.spec, stored.size, stored.max_running, stored.owner, stored.split) == (
        "0-15:4%2",
        4,
        2,
        alice.user,
        0,
    )
    assert not Job.objects.exists()  # as Slurm keeps a pending array: one record
    submitted = AuditEvent.objects.get(event_type="array.submitted")
    assert (submitted.target_id, submitted.actor_name) == (str(stored.pk), "alice")
    assert submitted.after == {"size": 4, "max_running": 2, "state": "queued"}

    assert arrays.split_due() == 3  # its cap, and one more to wait with the array's word
    tasks = list(Job.objects.order_by("array_index"))
    assert [task.array_index for task in tasks] == [0, 4, 8]
    stored.refresh_from_db()
    assert stored.split == 3
    for task in tasks:
        assert (task.array_id, task.state, task.gpu_count, task.name, task.project) == (
            stored.pk,
            JobState.QUEUED,
            2,
            "sweep",
            "vision",
        )
        assert task.command == ["true"] and task.submitted_at == stored.submitted_at
    rows = AuditEvent.objects.filter(event_type="job.submitted").order_by("pk")
    assert [(row.target_id, row.actor_name) for row in rows] == [
        (str(task.pk), "alice") for task in tasks
    ]
    assert rows[0].object_repr == f"job {tasks[0].pk} sweep"
    assert rows[0].message == f"made a job of array {stored.pk} by the placement loop"
    assert rows[1].after == {
        "state": "queued",
        "gpu_count": 2,
        "node_count": 1,
        "priority": "normal",
        "array": stored.pk,
        "array_index": 4,
    }
    assert arrays.split_due() == 0  # nothing ended: no room


def test_a_capped_array_makes_its_next_task_a_job_as_one_ends(alice):
    stored, made = split(alice.user, "0-9%2")
    assert len(made) == 3
    Job.objects.filter(pk=made[0]).update(state=JobState.RUNNING)
    assert arrays.split_due() == 0  # two unfinished of three made: still its cap and one
    Job.objects.filter(pk__in=made[:2]).update(state=JobState.COMPLETED)
    assert arrays.split_due() == 2
    assert list(stored.tasks.order_by("array_index").values_list("array_index", flat=True)) == [
        0,
        1,
        2,
        3,
        4,
    ]
    Job.objects.filter(array=stored).update(state=JobState.FAILED)
    assert arrays.split_due() == 3
    Job.objects.filter(array=stored).update(state=JobState.CANCELED)
    assert arrays.split_due() == 2  # its last two
    assert arrays.split_due() == 0 and not arrays.unsplit_arrays().exists()
    assert stored.tasks.count() == AuditEvent.objects.filter(event_type="job.submitted").count()


def test_an_uncapped_array_is_made_jobs_a_chunk_at_a_time(alice):
    stored = array(alice.user, "0-1199")
    assert arrays.split_due() == arrays.SPLIT_CHUNK == 500
    assert arrays.split_due() == 0  # a chunk waits already
    placed = stored.tasks.order_by("array_index")[:200].values_list("pk", flat=True)
    Job.objects.filter(pk__in=list(placed)).update(state=JobState.RUNNING)
    assert arrays.split_due() == 200  # as many as the loop took from the chunk
    Job.objects.filter(array=stored).update(state=JobState.RUNNING)
    assert arrays.split_due() == 500
    assert arrays.split_due() == 0
    Job.objects.filter(array=stored).update(state=JobState.COMPLETED)
    assert arrays.split_due() == 0  # all 1200 are jobs
    indexes = list(stored.tasks.order_by("array_index").values_list("array_index", flat=True))
    assert indexes == list(range(1200))


def test_a_held_array_is_made_pending_tasks(alice):
    stored, made = split(alice.user, "0-2", hold=True)
    assert stored.held and len(made) == 3
    assert set(Job.objects.values_list("state", flat=True)) == {JobState.PENDING}
    control.release_job(Job.objects.get(pk=made[0]), actor=alice.user)
    assert Job.objects.get(pk=made[0]).state == JobState.QUEUED
    body = alice.get(f"/api/v1/arrays/{stored.pk}/").json()
    assert body["tasks"] == {"pending": 2, "queued": 1}
    held = array(alice.user, "0-99%5", hold=True)
    assert alice.get(f"/api/v1/arrays/{held.pk}/").json()["tasks"] == {"pending": 100}
    arrays.split_due()
    assert set(held.tasks.values_list("state", flat=True)) == {JobState.PENDING}
    assert alice.get(f"/api/v1/arrays/{held.pk}/").json()["tasks"] == {"pending": 100}


def test_its_tasks_depend_as_the_array_does(alice):
    first = submit(alice.user)
    stored, made = split(alice.user, "0-2", dependency=f"afterok:{first.pk}")
    assert stored.dependency == f"afterok:{first.pk}"
    assert set(Job.objects.filter(pk__in=made).values_list("dependencies__on", flat=True)) == {
        first.pk
    }
    after = AuditEvent.objects.filter(event_type="job.submitted", target_id=str(made[0])).get()
    assert after.after["dependency"] == f"afterok:{first.pk}"


def test_what_its_tasks_will_name_cannot_be_deleted_while_it_waits(alice, fleet):  # noqa: F811
    """Its pool and reservation are the array's own foreign keys, as a job's: a pool named
    by an array with tasks still to make is kept, as one named by a job is."""
    pool = Pool.objects.create(name="spare")
    stored = array(alice.user, "0-9")
    JobArray.objects.filter(pk=stored.pk).update(pool=pool)
    with pytest.raises(ProtectedError):
        delete_pool(pool, actor=alice.user)
    arrays.split_due()
    assert set(stored.tasks.values_list("pool", flat=True)) == {pool.pk}


def test_its_cost_does_not_grow_with_its_tasks(alice):
    def statements(spec: str) -> int:
        with CaptureQueriesContext(connection) as captured:
            array(alice.user, spec)
        return len(captured)

    statements("0")  # the fleet's shape is read once and cached
    assert statements("0-1") == statements("0-1999:1") == 1  # the array and its audit row


def test_the_largest_array_fits_one_insert(alice):
    """10,000 tasks made jobs at once: more values than PostgreSQL takes in one statement's
    parameters."""
    stored = array(alice.user, "0-9999%100")
    with CaptureQueriesContext(connection) as captured:
        split_all(stored)
    # the array locked (in a savepoint here), the jobs, their audit rows, the array's count
    assert len([q for q in captured if "SAVEPOINT" not in q["sql"]]) == 5
    assert Job.objects.count() == 10_000
    assert AuditEvent.objects.filter(event_type="job.submitted").count() == 10_000


def test_an_array_is_checked_as_a_job_is(alice):
    with pytest.raises(limits.JobRejected) as caught:
        array(alice.user, "0-3", gpu_count=9)
    assert caught.value.field == "gpu_count"
    with pytest.raises(limits.JobRejected) as caught:
        array(alice.user, "0-3%0")
    assert caught.value.field == "array"
    assert not JobArray.objects.exists() and not Job.objects.exists()


# --------------------------------------------------------------------------- API


@pytest.mark.parametrize("url", ["/api/v1/jobs/", "/queue/submit"])
def test_api_answers_an_array_with_its_id_and_where_its_tasks_are(alice, url):
    response = alice.post(url, {"command": "true", "array": "0-1999%50"}, format="json")
    assert response.status_code == 201, response.json()
    body = response.json()
    stored = JobArray.objects.get()
    assert body == {
        "id": stored.pk,
        "spec": "0-1999%50",
        "size": 2000,
        "max_running": 50,
        "state": "queued",
        "submitted_at": body["submitted_at"],
        "tasks_url": f"/api/v1/jobs/?array={stored.pk}",
    }


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("0-10000", "more than 10000 tasks; submit several arrays"),
        ("0-99999999999999999999", "is not an index"),
        ("0-9%20000", "a %N cap of at most 10000"),
        ("9-0", "the range ends before it starts"),
        ("0-9;rm -rf /", "is not an index"),
        ("\u0000", "Null characters are not allowed."),
        ("x" * 201, "Ensure this field has no more than 200 characters."),
    ],
)
def test_api_refuses_a_bad_array_naming_it(alice, spec, message):
    response = alice.post("/api/v1/jobs/", {"command": "true", "array": spec}, format="json")
    assert response.status_code == 400
    assert list(response.json()) == ["array"]
    assert message in response.json()["array"][0]
    assert not Job.objects.exists() and not JobArray.objects.exists()
    assert not AuditEvent.objects.filter(target_type__startswith="scheduling.").exists()


def test_api_shows_an_array_with_its_tasks_by_state(alice, api_as):  # noqa: F811
    stored, made = split(alice.user, "0-4%2")
    Job.objects.filter(pk=made[0]).update(state=JobState.COMPLETED)
    body = alice.get(f"/api/v1/arrays/{stored.pk}/").json()
    assert (body["owner"], body["spec"], body["size"], body["max_running"], body["split"]) == (
        "alice",
        "0-4%2",
        5,
        2,
        3,
    )
    assert body["tasks"] == {"queued": 4, "completed": 1}  # 2 not made jobs yet among them
    assert alice.get("/api/v1/arrays/").json()["count"] == 1
    tasks = alice.get(f"/api/v1/jobs/?array={stored.pk}").json()
    assert sorted(job["array_index"] for job in tasks["results"]) == [0, 1, 2]
    bob = api_as("bob")
    assert bob.get(f"/api/v1/arrays/{stored.pk}/").status_code == 404
    assert bob.get("/api/v1/arrays/").json()["count"] == 0
    viewer = api_as("vera", Role.VIEWER)
    assert viewer.get(f"/api/v1/arrays/{stored.pk}/").status_code == 200


def test_the_collapsed_list_counts_the_tasks_not_made_jobs_with_the_waiting_ones(alice):
    stored, made = split(alice.user, "0-99%5")
    Job.objects.filter(pk__in=made[:5]).update(state=JobState.COMPLETED)
    page = alice.get("/api/v1/jobs/", {"collapse_arrays": "true"}).json()
    rows = {row["state"]: row["array_tasks"] for row in page["results"]}
    assert rows["queued"] == {
        "label": f"{stored.pk}_[5-99%5]",
        "indexes": "5-99",
        "count": 95,
    }
    assert rows["completed"]["count"] == 5


def test_cancel_a_whole_array(alice, api_as, fleet):  # noqa: F811
    stored, made = split(alice.user, "0-5")
    done, placed, *waiting = made
    Job.objects.filter(pk=done).update(state=JobState.COMPLETED)
    gpu = fleet[0].gpus.get(index=0)
    manual.allocate_by_hand(Job.objects.get(pk=placed), [gpu.uuid], actor=alice.user)
    assert (
        api_as("vera", Role.VIEWER).post(f"/api/v1/arrays/{stored.pk}/cancel/").status_code == 403
    )
    response = alice.post(f"/api/v1/arrays/{stored.pk}/cancel/")
    assert response.status_code == 200
    assert response.json() == {"canceled": waiting, "canceling": [placed], "unsplit": 0}
    states = dict(Job.objects.values_list("pk", "state"))
    assert [states[pk] for pk in waiting] == [JobState.CANCELED] * 4
    assert (states[done], states[placed]) == (JobState.COMPLETED, JobState.SCHEDULED)
    canceled = AuditEvent.objects.filter(event_type="job.canceled").order_by("target_id")
    assert sorted(int(row.target_id) for row in canceled) == waiting
    assert {(row.actor_name, row.message) for row in canceled} == {
        ("alice", f"array {stored.pk} canceled by alice")
    }
    assert AuditEvent.objects.filter(event_type="job.cancel_requested").count() == 1
    assert Job.objects.get(pk=waiting[0]).finished_at is not None
    assert not AuditEvent.objects.filter(event_type="array.canceled").exists()  # all were jobs


def test_cancel_an_array_before_the_loop_reaches_its_tasks(alice):
    stored, made = split(alice.user, "0-9%2")
    response = alice.post(f"/api/v1/arrays/{stored.pk}/cancel/")
    assert response.json() == {"canceled": made, "canceling": [], "unsplit": 7}
    row = AuditEvent.objects.get(event_type="array.canceled")
    assert (row.target_id, row.actor_name, row.before, row.after) == (
        str(stored.pk),
        "alice",
        {"state": "queued", "unsplit": 7},
        {"state": "canceled"},
    )
    assert arrays.split_due() == 0 and Job.objects.count() == 3  # never made
    assert alice.get(f"/api/v1/arrays/{stored.pk}/").json()["tasks"] == {"canceled": 10}
    again = alice.post(f"/api/v1/arrays/{stored.pk}/cancel/").json()
    assert again == {"canceled": [], "canceling": [], "unsplit": 0}
    assert AuditEvent.objects.filter(event_type="array.canceled").count() == 1


def indexes_of(stored: JobArray, **filters) -> list[int]:
    return list(
        stored.tasks.filter(**filters).order_by("array_index").values_list("array_index", flat=True)
    )


def test_cancel_some_tasks_made_jobs_or_not(alice, api_as, fleet):  # noqa: F811
    stored, made = split(alice.user, "0-9%2")  # indexes 0-2 jobs, 3-9 not yet
    gpu = fleet[0].gpus.get(index=0)
    manual.allocate_by_hand(Job.objects.get(pk=made[1]), [gpu.uuid], actor=alice.user)

    response = alice.post(f"/api/v1/arrays/{stored.pk}/cancel/", {"tasks": "1-2,5,7-8"})

    assert response.status_code == 200
    assert response.json() == {"canceled": [made[2]], "canceling": [made[1]], "unsplit": 3}
    body = alice.get(f"/api/v1/arrays/{stored.pk}/").json()
    assert body["tasks"] == {"queued": 5, "scheduled": 1, "canceled": 4}  # 2 + 3 canceled
    assert (body["canceled_tasks"], body["unsplit"], body["split"]) == ("5,7-8", 4, 3)
    message = f"array {stored.pk} tasks [1-2,5,7-8] canceled by alice"
    row = AuditEvent.objects.get(event_type="array.tasks_canceled")
    assert (row.target_id, row.before, row.after, row.message) == (
        str(stored.pk),
        {"state": "queued"},
        {"state": "canceled", "tasks": "5,7-8"},
        message,
    )
    assert AuditEvent.objects.get(event_type="job.canceled").target_id == str(made[2])
    assert AuditEvent.objects.get(event_type="job.cancel_requested").message == message
    # The loop makes the others, in order, around the canceled ones, and never those.
    Job.objects.filter(pk__in=made).update(state=JobState.COMPLETED)
    assert arrays.split_due() == 3
    assert indexes_of(stored, state=JobState.QUEUED) == [3, 4, 6]
    Job.objects.filter(array=stored).update(state=JobState.COMPLETED)
    assert arrays.split_due() == 1
    assert indexes_of(stored, state=JobState.QUEUED) == [9]
    assert not arrays.unsplit_arrays().exists()  # none left to make: not split again
    assert indexes_of(stored) == [0, 1, 2, 3, 4, 6, 9]
    assert checks.arrays_with_wrong_tasks() == []
    # The whole array's cancel counts only the tasks still to make.
    other, _ = split(alice.user, "0-9%2")
    alice.post(f"/api/v1/arrays/{other.pk}/cancel/", {"tasks": "9"})
    assert alice.post(f"/api/v1/arrays/{other.pk}/cancel/").json()["unsplit"] == 6
    assert alice.get(f"/api/v1/arrays/{other.pk}/").json()["tasks"] == {"canceled": 10}
    page = alice.get("/api/v1/jobs/", {"collapse_arrays": "true", "state": "canceled"}).json()
    labels = {row["array_tasks"]["label"] for row in page["results"] if row["array_tasks"]}
    assert f"{other.pk}_[0-9%2]" in labels


def test_cancelling_tasks_again_or_ended_ones_does_nothing(alice):
    stored, made = split(alice.user, "0-5%1")
    Job.objects.filter(pk=made[0]).update(state=JobState.COMPLETED)
    assert alice.post(f"/api/v1/arrays/{stored.pk}/cancel/", {"tasks": "0,3"}).json() == {
        "canceled": [],
        "canceling": [],
        "unsplit": 1,
    }
    again = alice.post(f"/api/v1/arrays/{stored.pk}/cancel/", {"tasks": "0,3"}).json()
    assert again == {"canceled": [], "canceling": [], "unsplit": 0}
    assert AuditEvent.objects.filter(event_type="array.tasks_canceled").count() == 1
    stored.refresh_from_db()
    assert stored.canceled_tasks == [3]


@pytest.mark.parametrize(
    ("tasks", "said"),
    [
        ("x", "'x' is not an index"),
        ("", "This field may not be blank."),
        ("0-3%2", "no %N cap here"),
        ("8-12,15", "has no task 10-12,15"),
        ("3-1", "the range ends before it starts"),
    ],
)
def test_tasks_outside_the_array_or_not_indexes_are_refused(alice, tasks, said):
    stored = array(alice.user, "0-9")
    response = alice.post(f"/api/v1/arrays/{stored.pk}/cancel/", {"tasks": tasks})
    assert response.status_code == 400
    assert list(response.json()) == ["tasks"]
    assert said in response.json()["tasks"][0]
    stored.refresh_from_db()
    assert (stored.canceled_tasks, stored.canceled_at) == ([], None)
    assert not AuditEvent.objects.filter(target_type="scheduling.jobarray").exclude(
        event_type="array.submitted"
    )


@pytest.mark.parametrize("verb", ["cancel", "hold", "release"])
def test_only_who_may_act_on_an_array_controls_it(alice, api_as, verb):  # noqa: F811
    stored = array(alice.user, "0-3", hold=verb == "release")
    path = f"/api/v1/arrays/{stored.pk}/{verb}/"
    assert api_as("vera", Role.VIEWER).post(path, {"tasks": "1"}).status_code == 403
    assert api_as("bob").post(path, {"tasks": "1"}).status_code == 404
    stored.refresh_from_db()
    assert (stored.held, stored.canceled_tasks, stored.canceled_at) == (verb == "release", [], None)
    assert api_as("olga", Role.OPERATOR).post(path, {"tasks": "1"}).status_code == 200


def test_hold_then_release_a_whole_array(alice, fleet):  # noqa: F811
    stored, made = split(alice.user, "0-9%2")  # indexes 0-2 jobs, 3-9 not yet
    gpu = fleet[0].gpus.get(index=0)
    manual.allocate_by_hand(Job.objects.get(pk=made[0]), [gpu.uuid], actor=alice.user)

    response = alice.post(f"/api/v1/arrays/{stored.pk}/hold/")

    assert (response.status_code, response.json()) == (200, {"jobs": made[1:], "unsplit": 7})
    body = alice.get(f"/api/v1/arrays/{stored.pk}/").json()
    assert (body["held"], body["tasks"]) == (True, {"scheduled": 1, "pending": 9})
    message = f"array {stored.pk} held by alice"
    row = AuditEvent.objects.get(event_type="array.held")
    assert (row.before, row.after, row.message) == (
        {"held": False},
        {"held": True, "tasks": "3-9"},
        message,
    )
    pending = AuditEvent.objects.filter(event_type="job.pending").order_by("target_id")
    assert [(int(r.target_id), r.before, r.after, r.message) for r in pending] == [
        (pk, {"state": "queued"}, {"state": "pending"}, message) for pk in made[1:]
    ]
    refused = alice.post(f"/api/v1/arrays/{stored.pk}/hold/")
    assert refused.status_code == 409
    assert refused.json()["detail"] == f"array {stored.pk} has no queued task to hold"
    Job.objects.filter(pk=made[0]).update(state=JobState.COMPLETED)
    assert arrays.split_due() == 1
    assert indexes_of(stored, state=JobState.PENDING) == [1, 2, 3]  # made held

    response = alice.post(f"/api/v1/arrays/{stored.pk}/release/")

    jobs = list(stored.tasks.filter(array_index__in=[1, 2, 3]).order_by("pk"))
    assert response.json() == {"jobs": [job.pk for job in jobs], "unsplit": 6}
    assert {job.state for job in jobs} == {JobState.QUEUED}
    assert alice.get(f"/api/v1/arrays/{stored.pk}/").json()["tasks"] == {
        "completed": 1,
        "queued": 9,
    }
    released = AuditEvent.objects.get(event_type="array.released")
    assert (released.before, released.after) == ({"held": True}, {"held": False, "tasks": "4-9"})
    assert AuditEvent.objects.filter(event_type="job.queued").count() == 3
    refused = alice.post(f"/api/v1/arrays/{stored.pk}/release/")
    assert refused.status_code == 409
    assert refused.json()["detail"] == f"array {stored.pk} has no held task to release"
    Job.objects.filter(array=stored).update(state=JobState.COMPLETED)
    arrays.split_due()
    assert indexes_of(stored, state=JobState.QUEUED) == [4, 5, 6]  # made queued again


def test_release_an_array_submitted_held_and_its_tasks_released_one_by_one(alice):
    stored, made = split(alice.user, "0-4%1", hold=True)
    control.release_job(Job.objects.get(pk=made[0]), actor=alice.user)
    assert alice.post(f"/api/v1/arrays/{stored.pk}/release/").json() == {
        "jobs": [made[1]],
        "unsplit": 3,
    }
    # A job released alone is held again with its array.
    assert alice.post(f"/api/v1/arrays/{stored.pk}/hold/").json() == {
        "jobs": made,
        "unsplit": 3,
    }


def test_a_canceled_array_is_neither_held_nor_released(alice):
    stored = array(alice.user, "0-3")
    control.cancel_array(stored, actor=alice.user)
    for verb in ("hold", "release"):
        response = alice.post(f"/api/v1/arrays/{stored.pk}/{verb}/")
        assert response.status_code == 409
        assert response.json()["detail"] == f"array {stored.pk} is canceled: nothing to {verb}"
    assert not AuditEvent.objects.filter(event_type__in=["array.held", "array.released"])


def test_the_admin_cancels_the_selected_arrays_waiting_tasks(alice, admin_client):
    (first, first_ids), (second, second_ids) = split(alice.user, "0-2"), split(alice.user, "0-4%2")
    Job.objects.filter(pk=first_ids[0]).update(state=JobState.COMPLETED)
    form = {"action": "cancel_arrays", "_selected_action": [first.pk, second.pk]}

    response = admin_client.post("/admin/scheduling/jobarray/", form, follow=True)

    said = [str(message) for message in response.context["messages"]]
    assert said == ["7 tasks canceled, 0 being stopped; 0 arrays refused."]  # 2 not jobs yet
    states = dict(Job.objects.values_list("pk", "state"))
    assert [states[pk] for pk in [*first_ids[1:], *second_ids]] == [JobState.CANCELED] * 5
    assert states[first_ids[0]] == JobState.COMPLETED
    assert AuditEvent.objects.filter(event_type="job.canceled").count() == 5
    assert AuditEvent.objects.get(event_type="array.canceled").target_id == str(second.pk)


# --------------------------------------------------------------------------- the loop's view


def test_array_limits_are_the_caps_of_arrays_with_unfinished_tasks(alice):
    capped = array(alice.user, "0-3%2")
    array(alice.user, "0-3")  # no cap
    finished = array(alice.user, "0-1%1")
    arrays.split_due()
    Job.objects.filter(array=finished).update(state=JobState.COMPLETED)
    with CaptureQueriesContext(connection) as captured:
        assert dependencies.array_limits() == {capped.pk: 2}
    assert len(captured) == 1


def test_each_task_learns_its_index_as_slurm_would_tell_it(alice):
    stored, made = split(alice.user, "3,5")
    job = submit(alice.user)
    task = Job.objects.get(pk=made[1])
    env = dispatch.job_spec(task, ["GPU-x"], 0, ["dgx-01"]).env
    index = {"GPUADMIN_ARRAY_JOB_ID", "GPUADMIN_ARRAY_TASK_ID"}
    assert {name: env[name] for name in index} == {
        "GPUADMIN_ARRAY_JOB_ID": str(stored.pk),
        "GPUADMIN_ARRAY_TASK_ID": "5",
    }
    assert (env["SLURM_ARRAY_JOB_ID"], env["SLURM_ARRAY_TASK_ID"]) == (str(stored.pk), "5")
    assert not index & set(dispatch.job_spec(job, ["GPU-x"], 0, ["dgx-01"]).env)


# --------------------------------------------------------------------------- pages


def test_queue_page_shows_an_arrays_waiting_tasks_as_one_row(alice, client):
    client.force_login(alice.user)
    stored, made = split(alice.user, "0-1999%50")
    Job.objects.filter(pk=made[0]).update(state=JobState.COMPLETED)
    single = submit(alice.user)
    page = client.get("/jobs/").content.decode()
    assert f"{stored.pk}_[1-1999%50]" in page  # its 50 waiting jobs, and 1949 not jobs yet
    assert "1999 tasks" in page
    assert page.count('<tr id="job-') == 3  # the array, the single job, the finished task
    assert f'id="job-{single.pk}"' in page
    tasks = client.get(f"/jobs/?array={stored.pk}").content.decode()
    assert tasks.count('<tr id="job-') == 50 + 1  # its jobs: 50 waiting, the finished task


def test_job_page_shows_its_array(alice, client):
    client.force_login(alice.user)
    stored, made = split(alice.user, "0-1")
    page = client.get(f"/jobs/{made[1]}/").content.decode()
    assert f'<a href="/jobs/?array={stored.pk}">array {stored.pk}</a>, task 1' in page


def test_a_tasks_page_cancels_its_whole_array(alice, client, api_as, django_user_model):  # noqa: F811
    stored, made = split(alice.user, "0-3%1")  # 2 jobs, 2 tasks not jobs yet
    Job.objects.filter(pk=made[0]).update(state=JobState.COMPLETED)
    cancel = f"/arrays/{stored.pk}/cancel/"
    client.force_login(api_as("vera", Role.VIEWER).user)
    assert cancel not in client.get(f"/jobs/{made[1]}/").content.decode()
    assert client.post(cancel).status_code == 403
    client.force_login(django_user_model.objects.create_user("bob"))
    assert client.post(cancel).status_code == 404  # not theirs to see
    client.force_login(alice.user)
    assert f'action="{cancel}"' in client.get(f"/jobs/{made[1]}/").content.decode()

    response = client.post(cancel, follow=True)

    assert response.redirect_chain == [(f"/jobs/?array={stored.pk}", 302)]
    said = [str(message) for message in response.context["messages"]]
    assert said == [
        f"Array {stored.pk}: 3 tasks canceled (2 of them not made jobs yet), 0 being stopped "
        "by their agents."
    ]
    states = dict(Job.objects.values_list("pk", "state"))
    assert [states[pk] for pk in made] == [JobState.COMPLETED, JobState.CANCELED]


def test_form_submits_an_array(alice, client):
    client.force_login(alice.user)
    response = client.post("/jobs/new/", {**FORM, "array": "0-9%3"})
    stored = JobArray.objects.get()
    assert response.status_code == 302
    assert response["Location"] == f"/jobs/?array={stored.pk}"
    assert (stored.size, stored.max_running) == (10, 3)
    response = client.post("/jobs/new/", {**FORM, "array": "0-9%"})
    assert response.status_code == 200
    assert "the cap is % and a whole number" in response.content.decode()


FORM = {
    "command": "python train.py",
    "gpu_count": "1",
    "node_count": "1",
    "topology": "any",
    "priority": "normal",
    "max_retries": "0",
}
