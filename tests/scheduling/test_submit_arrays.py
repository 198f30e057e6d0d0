"""Job arrays (``--array 0-999%50``): the spec's syntax, one bulk submission of every task with
its audit rows, the API and pages that show and cancel an array, the cap the loop reads, and
the index in each task's environment."""

from __future__ import annotations

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from gpuadmin.access.models import Role
from gpuadmin.audit.models import AuditEvent
from scheduling.allocations import manual
from scheduling.jobs import dependencies, limits, submission
from scheduling.jobs.slurm import SpecError, compact_indexes, parse_array
from scheduling.loop import dispatch
from scheduling.models import Job, JobArray, JobState
from tests.scheduling.api.conftest import api_as, fleet, make_user, submit  # noqa: F401 - fixtures

pytestmark = pytest.mark.django_db


@pytest.fixture
def alice(api_as, fleet):  # noqa: F811 - the fixtures
    return api_as("alice")


def array(owner, spec: str = "0-3", **fields) -> submission.SubmittedArray:
    return submission.submit_array(owner, spec, command=fields.pop("command", ["true"]), **fields)


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


def test_an_array_is_one_row_and_a_job_per_task_all_audited(
    alice, django_capture_on_commit_callbacks
):
    with django_capture_on_commit_callbacks(execute=False) as callbacks:
        submitted = array(alice.user, "0-15:4%2", gpu_count=2, name="sweep", project="vision")
    assert [callback.__name__ for callback in callbacks] == ["wake"]  # the loop, once
    stored = JobArray.objects.get()
    assert (stored.spec, stored.size, stored.max_running, stored.owner) == (
        "0-15:4%2",
        4,
        2,
        alice.user,
    )
    tasks = list(Job.objects.order_by("array_index"))
    assert submitted.task_ids == [task.pk for task in tasks]
    assert [task.array_index for task in tasks] == [0, 4, 8, 12]
    for task in tasks:
        assert (task.array_id, task.state, task.gpu_count, task.name, task.project) == (
            stored.pk,
            JobState.QUEUED,
            2,
            "sweep",
            "vision",
        )
        assert task.command == ["true"] and task.submitted_at is not None
    rows = AuditEvent.objects.filter(event_type="job.submitted").order_by("pk")
    assert [(row.target_id, row.actor_name) for row in rows] == [
        (str(task.pk), "alice") for task in tasks
    ]
    assert rows[0].object_repr == f"job {tasks[0].pk} sweep"
    assert rows[1].after == {
        "state": "queued",
        "gpu_count": 2,
        "node_count": 1,
        "priority": "normal",
        "array": stored.pk,
        "array_index": 4,
    }
    assert len({row.request_id for row in rows}) == 1
    assert AuditEvent.objects.get(event_type="array.submitted").target_id == str(stored.pk)


def test_a_held_array_is_pending(alice):
    array(alice.user, "0-2", hold=True)
    assert set(Job.objects.values_list("state", flat=True)) == {JobState.PENDING}


def test_its_cost_does_not_grow_with_its_tasks(alice):
    def statements(spec: str) -> int:
        with CaptureQueriesContext(connection) as captured:
            array(alice.user, spec)
        return len(captured)

    statements("0")  # the fleet's shape is read once and cached
    assert statements("0-1") == statements("0-1999:1") == 6  # 4 INSERTs in a savepoint


def test_the_largest_array_fits_one_insert(alice):
    """10,000 tasks: more values than PostgreSQL takes in one statement's parameters."""
    submitted = array(alice.user, "0-9999%100")
    assert len(submitted.task_ids) == Job.objects.count() == 10_000
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
def test_api_answers_an_array_with_its_id_and_tasks(alice, url):
    response = alice.post(url, {"command": "true", "array": "0-1999%50"}, format="json")
    assert response.status_code == 201, response.json()
    body = response.json()
    stored = JobArray.objects.get()
    assert (body["id"], body["spec"], body["size"], body["max_running"]) == (
        stored.pk,
        "0-1999%50",
        2000,
        50,
    )
    assert body["task_ids"] == list(
        Job.objects.order_by("array_index").values_list("pk", flat=True)
    )


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
    submitted = array(alice.user, "0-4%2")
    Job.objects.filter(pk=submitted.task_ids[0]).update(state=JobState.COMPLETED)
    body = alice.get(f"/api/v1/arrays/{submitted.array.pk}/").json()
    assert (body["owner"], body["spec"], body["size"], body["max_running"]) == (
        "alice",
        "0-4%2",
        5,
        2,
    )
    assert body["tasks"] == {"queued": 4, "completed": 1}
    assert alice.get("/api/v1/arrays/").json()["count"] == 1
    tasks = alice.get(f"/api/v1/jobs/?array={submitted.array.pk}").json()
    assert sorted(job["array_index"] for job in tasks["results"]) == [0, 1, 2, 3, 4]
    bob = api_as("bob")
    assert bob.get(f"/api/v1/arrays/{submitted.array.pk}/").status_code == 404
    assert bob.get("/api/v1/arrays/").json()["count"] == 0
    viewer = api_as("vera", Role.VIEWER)
    assert viewer.get(f"/api/v1/arrays/{submitted.array.pk}/").status_code == 200


def test_cancel_a_whole_array(alice, api_as, fleet):  # noqa: F811
    submitted = array(alice.user, "0-5")
    done, placed, *waiting = submitted.task_ids
    Job.objects.filter(pk=done).update(state=JobState.COMPLETED)
    gpu = fleet[0].gpus.get(index=0)
    manual.allocate_by_hand(Job.objects.get(pk=placed), [gpu.uuid], actor=alice.user)
    assert (
        api_as("vera", Role.VIEWER).post(f"/api/v1/arrays/{submitted.array.pk}/cancel/").status_code
        == 403
    )
    response = alice.post(f"/api/v1/arrays/{submitted.array.pk}/cancel/")
    assert response.status_code == 200
    assert response.json() == {"canceled": waiting, "canceling": [placed]}
    states = dict(Job.objects.values_list("pk", "state"))
    assert [states[pk] for pk in waiting] == [JobState.CANCELED] * 4
    assert (states[done], states[placed]) == (JobState.COMPLETED, JobState.SCHEDULED)
    canceled = AuditEvent.objects.filter(event_type="job.canceled").order_by("target_id")
    assert sorted(int(row.target_id) for row in canceled) == waiting
    assert {(row.actor_name, row.message) for row in canceled} == {
        ("alice", f"array {submitted.array.pk} canceled by alice")
    }
    assert AuditEvent.objects.filter(event_type="job.cancel_requested").count() == 1
    assert Job.objects.get(pk=waiting[0]).finished_at is not None


def test_the_admin_cancels_the_selected_arrays_waiting_tasks(alice, admin_client):
    first, second = array(alice.user, "0-2"), array(alice.user, "0-4%2")
    Job.objects.filter(pk=first.task_ids[0]).update(state=JobState.COMPLETED)
    form = {"action": "cancel_arrays", "_selected_action": [first.array.pk, second.array.pk]}

    response = admin_client.post("/admin/scheduling/jobarray/", form, follow=True)

    said = [str(message) for message in response.context["messages"]]
    assert said == ["7 tasks canceled, 0 being stopped; 0 arrays refused."]
    states = dict(Job.objects.values_list("pk", "state"))
    assert [states[pk] for pk in [*first.task_ids[1:], *second.task_ids]] == [JobState.CANCELED] * 7
    assert states[first.task_ids[0]] == JobState.COMPLETED
    assert AuditEvent.objects.filter(event_type="job.canceled").count() == 7


# --------------------------------------------------------------------------- the loop's view


def test_array_limits_are_the_caps_of_arrays_with_unfinished_tasks(alice):
    capped = array(alice.user, "0-3%2")
    array(alice.user, "0-3")  # no cap
    finished = array(alice.user, "0-1%1")
    Job.objects.filter(array=finished.array).update(state=JobState.COMPLETED)
    with CaptureQueriesContext(connection) as captured:
        assert dependencies.array_limits() == {capped.array.pk: 2}
    assert len(captured) == 1


def test_each_task_learns_its_index_as_slurm_would_tell_it(alice):
    submitted = array(alice.user, "3,5")
    job = submit(alice.user)
    task = Job.objects.get(pk=submitted.task_ids[1])
    env = dispatch.job_spec(task, ["GPU-x"], 0, ["dgx-01"]).env
    index = {"GPUADMIN_ARRAY_JOB_ID", "GPUADMIN_ARRAY_TASK_ID"}
    assert {name: env[name] for name in index} == {
        "GPUADMIN_ARRAY_JOB_ID": str(submitted.array.pk),
        "GPUADMIN_ARRAY_TASK_ID": "5",
    }
    assert (env["SLURM_ARRAY_JOB_ID"], env["SLURM_ARRAY_TASK_ID"]) == (
        str(submitted.array.pk),
        "5",
    )
    assert not index & set(dispatch.job_spec(job, ["GPU-x"], 0, ["dgx-01"]).env)


# --------------------------------------------------------------------------- pages


def test_queue_page_shows_an_arrays_waiting_tasks_as_one_row(alice, client):
    client.force_login(alice.user)
    submitted = array(alice.user, "0-1999%50")
    Job.objects.filter(pk=submitted.task_ids[0]).update(state=JobState.COMPLETED)
    single = submit(alice.user)
    page = client.get("/jobs/").content.decode()
    assert f"{submitted.array.pk}_[1-1999%50]" in page
    assert "1999 tasks" in page
    assert page.count('<tr id="job-') == 3  # the array, the single job, the finished task
    assert f'id="job-{single.pk}"' in page
    tasks = client.get(f"/jobs/?array={submitted.array.pk}").content.decode()
    assert tasks.count('<tr id="job-') == 200 + 1  # a section's rows, and the finished task


def test_job_page_shows_its_array(alice, client):
    client.force_login(alice.user)
    submitted = array(alice.user, "0-1")
    page = client.get(f"/jobs/{submitted.task_ids[1]}/").content.decode()
    assert (
        f'<a href="/jobs/?array={submitted.array.pk}">array {submitted.array.pk}</a>, task 1'
        in page
    )


def test_a_tasks_page_cancels_its_whole_array(alice, client, api_as, django_user_model):  # noqa: F811
    submitted = array(alice.user, "0-3")
    Job.objects.filter(pk=submitted.task_ids[0]).update(state=JobState.COMPLETED)
    cancel = f"/arrays/{submitted.array.pk}/cancel/"
    client.force_login(api_as("vera", Role.VIEWER).user)
    assert cancel not in client.get(f"/jobs/{submitted.task_ids[1]}/").content.decode()
    assert client.post(cancel).status_code == 403
    client.force_login(django_user_model.objects.create_user("bob"))
    assert client.post(cancel).status_code == 404  # not theirs to see
    client.force_login(alice.user)
    assert f'action="{cancel}"' in client.get(f"/jobs/{submitted.task_ids[1]}/").content.decode()

    response = client.post(cancel, follow=True)

    assert response.redirect_chain == [(f"/jobs/?array={submitted.array.pk}", 302)]
    said = [str(message) for message in response.context["messages"]]
    assert said == [
        f"Array {submitted.array.pk}: 3 tasks canceled, 0 being stopped by their agents."
    ]
    states = dict(Job.objects.values_list("pk", "state"))
    assert [states[pk] for pk in submitted.task_ids] == [
        JobState.COMPLETED,
        *[JobState.CANCELED] * 3,
    ]


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
