"""Job dependencies (``afterok``, ``afterany``, ``afternotok``): Slurm's syntax and the JSON
list, stored with the job, shown with their state, resolved for the placement loop, and jobs
that can never start canceled, audited."""

from __future__ import annotations

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from gpuadmin.audit.models import AuditEvent
from scheduling.jobs import arrays, control, dependencies, limits, submission
from scheduling.jobs.slurm import SpecError, parse_dependency
from scheduling.loop import passes as loop
from scheduling.models import Job, JobArray, JobDependency, JobState
from tests.scheduling.api.conftest import (  # noqa: F401 - fixtures
    api_as,
    fleet,
    make_user,
    split_all,
    submit,
)

pytestmark = pytest.mark.django_db


@pytest.fixture
def alice(api_as, fleet):  # noqa: F811 - the fixture
    return api_as("alice")


def ended(job: Job, state: str) -> None:
    Job.objects.filter(pk=job.pk).update(state=state, finished_at=timezone.now())


# --------------------------------------------------------------------------- syntax


def test_slurm_syntax():
    assert parse_dependency("afterok:12:13,afterany:14") == [
        ("afterok", 12),
        ("afterok", 13),
        ("afterany", 14),
    ]
    assert parse_dependency(" afternotok:7 ") == [("afternotok", 7)]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("afterok", "is not kind:job[:job...]"),
        ("afterok:", "is not kind:job[:job...]"),
        ("afterok:x", "is not kind:job[:job...]"),
        ("afterok:1?afterany:2", "'?' is not supported"),
        ("afterok:1,,afterany:2", "'' is not kind:job"),
        ("AFTEROK:1", "is not kind:job"),
        ("afterok:1:-2", "is not kind:job"),
    ],
)
def test_bad_slurm_syntax_says_why(text, message):
    with pytest.raises(SpecError) as caught:
        parse_dependency(text)
    assert message in str(caught.value)


def test_text_is_slurms():
    assert dependencies.text([("afterok", 1), ("afterany", 3), ("afterok", 2)]) == (
        "afterok:1:2,afterany:3"
    )


# --------------------------------------------------------------------------- submission


@pytest.mark.parametrize("url", ["/api/v1/jobs/", "/queue/submit"])
def test_dependencies_are_stored_and_shown_with_their_state(alice, url):
    first, second, third = (submit(alice.user) for _ in range(3))
    ended(second, JobState.COMPLETED)
    body = {"command": "true", "dependency": f"afterok:{first.pk}:{second.pk},afterany:{third.pk}"}
    response = alice.post(url, body, format="json")
    assert response.status_code == 201, response.json()
    job = Job.objects.get(pk=response.json()["id"])
    assert sorted(job.dependencies.values_list("kind", "on_id")) == sorted(
        [("afterok", first.pk), ("afterok", second.pk), ("afterany", third.pk)]
    )
    shown = alice.get(f"/api/v1/jobs/{job.pk}/").json()["dependencies"]
    assert sorted(shown, key=lambda d: d["job"]) == [
        {"kind": "afterok", "job": first.pk, "state": "queued", "satisfied": None},
        {"kind": "afterok", "job": second.pk, "state": "completed", "satisfied": True},
        {"kind": "afterany", "job": third.pk, "state": "queued", "satisfied": None},
    ]
    audited = AuditEvent.objects.get(event_type="job.submitted", target_id=str(job.pk))
    assert audited.after["dependency"] == (f"afterok:{first.pk}:{second.pk},afterany:{third.pk}")


def test_json_list_of_dependencies(alice):
    first = submit(alice.user)
    body = {"command": "true", "dependency": [{"kind": "afternotok", "job": first.pk}]}
    response = alice.post("/api/v1/jobs/", body, format="json")
    assert response.status_code == 201, response.json()
    assert response.json()["dependencies"] == [
        {"kind": "afternotok", "job": first.pk, "state": "queued", "satisfied": None}
    ]


@pytest.mark.parametrize("blank", [{}, {"dependency": ""}, {"dependency": " \t"}])
def test_a_job_without_dependencies_shows_none(alice, blank):
    """A blank dependency is none, as the form reads it."""
    response = alice.post("/api/v1/jobs/", {"command": "true", **blank}, format="json")
    assert (response.status_code, response.json()["dependencies"]) == (201, [])


# Why alice (a user) may not depend on a job she does not see: another's, or none at all.
OF_YOURS = " of yours (a user sees only their own jobs)"


@pytest.mark.parametrize(
    ("dependency", "message"),
    [
        ("afterok:{missing}", "afterok:{missing}: no job {missing}" + OF_YOURS),
        ("afterok:{theirs}", "afterok:{theirs}: no job {theirs}" + OF_YOURS),  # bob's
        ("afterok:{mine},afterany:{mine}", "job {mine} is named twice"),
        ("after:{mine}", "'after' is not one of afterok, afterany, afternotok"),
        ("singleton", "is not kind:job"),
        ("afterok:{failed}", "afterok:{failed}: job {failed} failed, so it can never hold"),
        ("afternotok:{completed}", "job {completed} completed, so it can never hold"),
        ("afterok:99999999999999999999", "is not kind:job"),
        ("afterok:1\u0000", "Null characters are not allowed."),
        ([{"kind": "afterok"}], "Expected a string"),
        ([{"kind": "afterok", "job": "12"}], "Expected a string"),
        ([{"kind": "afterok", "job": True}], "Expected a string"),
        ([{"kind": "afterok", "job": 2**63}], "Expected a string"),
        ([{"kind": 1, "job": 1}], "Expected a string"),
        ([[1, 2]], "Expected a string"),
        ({"afterok": 1}, "Expected a string"),
        (12, "Expected a string"),
        ([{"kind": "afterok", "job": n} for n in range(1, 102)], "at most 100 jobs"),
        ("afterok" + ":1" * 1000, "at most 2000 characters"),
    ],
)
def test_bad_dependencies_are_a_400_naming_dependency(alice, api_as, dependency, message):  # noqa: F811
    mine, failed, completed = (submit(alice.user) for _ in range(3))
    ended(failed, JobState.FAILED)
    ended(completed, JobState.COMPLETED)
    theirs = submit(api_as("bob").user)
    names = {
        "mine": mine.pk,
        "failed": failed.pk,
        "completed": completed.pk,
        "theirs": theirs.pk,
        "missing": theirs.pk + 1000,
    }
    if isinstance(dependency, str):
        dependency = dependency.format(**names)
    before = Job.objects.count()
    response = alice.post(
        "/api/v1/jobs/", {"command": "true", "dependency": dependency}, format="json"
    )
    assert response.status_code == 400
    assert list(response.json()) == ["dependency"]
    assert message.format(**names) in response.json()["dependency"][0]
    assert Job.objects.count() == before
    assert not JobDependency.objects.exists()


def test_every_task_of_an_array_depends(alice):
    first = submit(alice.user)
    submitted = submission.submit_array(
        alice.user, "0-2", command=["true"], dependency=f"afterok:{first.pk}"
    )
    assert not JobDependency.objects.exists()  # its tasks are not jobs yet
    arrays.split_due()  # as the placement loop makes them jobs
    tasks = submitted.array.tasks.order_by("pk").values_list("pk", flat=True)
    assert sorted(JobDependency.objects.values_list("job_id", "on_id", "kind")) == [
        (task, first.pk, "afterok") for task in tasks
    ]


def test_an_array_depends_on_at_most_so_many_jobs_in_all(alice):
    """10,000 tasks each on 100 jobs were a million rows that every pass reads."""
    firsts = [submit(alice.user) for _ in range(3)]
    needs = "afterok:" + ":".join(str(job.pk) for job in firsts)
    with pytest.raises(limits.JobRejected) as refused:
        submission.submit_array(alice.user, "0-9999", command=["true"], dependency=needs)
    assert (refused.value.field, refused.value.message) == (
        "dependency",
        "10000 tasks each depending on 3 jobs: at most 20000 dependencies in one array",
    )
    assert not JobDependency.objects.exists()
    two = f"afterok:{firsts[0].pk}:{firsts[1].pk}"
    submission.submit_array(alice.user, "0-9999", command=["true"], dependency=two)
    split_all(JobArray.objects.get())
    assert JobDependency.objects.count() == 20_000


def test_viewers_and_operators_may_depend_on_anyones_job(api_as, fleet):  # noqa: F811
    theirs = submit(api_as("bob").user)
    operator = api_as("olga", "operator")
    body = {"command": "true", "dependency": f"afterany:{theirs.pk}"}
    assert operator.post("/api/v1/jobs/", body, format="json").status_code == 201


def test_job_page_lists_dependencies(alice, client):
    first = submit(alice.user)
    ended(first, JobState.COMPLETED)
    job = submission.submit_job(alice.user, command="true", dependency=f"afterok:{first.pk}")
    client.force_login(alice.user)
    page = client.get(f"/jobs/{job.pk}/").content.decode()
    assert f'afterok <a href="/jobs/{first.pk}/">job {first.pk}</a>' in page
    assert "(completed: holds)" in page


# --------------------------------------------------------------------------- the loop's view


def test_resolve_holds_back_jobs_until_their_dependencies_hold(alice):
    first, second = submit(alice.user), submit(alice.user)
    ok = submission.submit_job(alice.user, command="true", dependency=f"afterok:{first.pk}")
    anyway = submission.submit_job(alice.user, command="true", dependency=f"afterany:{second.pk}")
    both = submission.submit_job(
        alice.user, command="true", dependency=f"afterok:{first.pk},afterany:{second.pk}"
    )
    with CaptureQueriesContext(connection) as captured:
        assert dependencies.resolve() == {
            ok.pk: [("afterok", first.pk)],
            anyway.pk: [("afterany", second.pk)],
            both.pk: [("afterok", first.pk), ("afterany", second.pk)],
        }
    assert len(captured) == 1
    ended(first, JobState.COMPLETED)
    assert dependencies.resolve() == {
        anyway.pk: [("afterany", second.pk)],
        both.pk: [("afterany", second.pk)],
    }
    ended(second, JobState.CANCELED)  # afterany: any end
    assert dependencies.resolve() == {}


def test_a_dependency_that_can_never_hold_cancels_the_job(alice):
    first, second = submit(alice.user), submit(alice.user)
    doomed = submission.submit_job(alice.user, command="true", dependency=f"afterok:{first.pk}")
    spared = submission.submit_job(alice.user, command="true", dependency=f"afternotok:{first.pk}")
    also = submission.submit_job(
        alice.user, command="true", dependency=f"afterany:{second.pk},afternotok:{first.pk}"
    )
    ended(first, JobState.FAILED)
    assert set(dependencies.resolve()) == {also.pk}  # its afterany still pending
    doomed.refresh_from_db()
    assert doomed.state == JobState.CANCELED
    assert doomed.message == f"dependency never satisfied: afterok:{first.pk} failed"
    audited = AuditEvent.objects.get(event_type="job.canceled", target_id=str(doomed.pk))
    assert (audited.actor_name, audited.message, audited.before, audited.after["state"]) == (
        "placement-loop",
        doomed.message,
        {"state": "queued"},
        "canceled",
    )
    assert Job.objects.get(pk=spared.pk).state == JobState.QUEUED  # it may start
    ended(second, JobState.COMPLETED)
    assert dependencies.resolve() == {}


def test_afternotok_on_a_completed_job_cancels(alice):
    first = submit(alice.user)
    job = submission.submit_job(alice.user, command="true", dependency=f"afternotok:{first.pk}")
    ended(first, JobState.COMPLETED)
    assert dependencies.resolve() == {}
    job.refresh_from_db()
    assert (job.state, job.message) == (
        JobState.CANCELED,
        f"dependency never satisfied: afternotok:{first.pk} completed",
    )


def test_held_jobs_are_not_resolved_or_canceled(alice):
    first = submit(alice.user)
    held = submission.submit_job(
        alice.user, command="true", hold=True, dependency=f"afterok:{first.pk}"
    )
    ended(first, JobState.FAILED)
    assert dependencies.resolve() == {}
    assert Job.objects.get(pk=held.pk).state == JobState.PENDING


def test_cancel_waiting_leaves_jobs_that_moved_on(alice):
    waiting, placed = submit(alice.user), submit(alice.user)
    Job.objects.filter(pk=placed.pk).update(state=JobState.SCHEDULED)
    canceled = control.cancel_waiting({waiting.pk: "why", placed.pk: "why"}, actor=alice.user)
    assert canceled == [waiting.pk]
    assert Job.objects.get(pk=placed.pk).state == JobState.SCHEDULED
    assert AuditEvent.objects.filter(event_type="job.canceled").count() == 1


def test_waiting_text_names_what_a_job_waits_for():
    assert dependencies.waiting_text([("afterok", 1)]) == "waiting for job 1 to complete (afterok)"
    assert dependencies.waiting_text([("afterok", 13), ("afterany", 14), ("afterok", 12)]) == (
        "waiting for job 14 to end (afterany) and jobs 12 and 13 to complete (afterok)"
    )
    assert dependencies.waiting_text([("afternotok", 5)]) == (
        "waiting for job 5 to fail or be canceled (afternotok)"
    )


def test_a_job_waiting_on_its_dependency_says_so_everywhere(alice, client):
    """Not "the scheduler has not looked at it yet": the API, the job page and the queue say
    what it waits for, as Slurm's (Dependency) reason."""
    first = submit(alice.user, gpu_count=8)
    job = submission.submit_job(alice.user, command="true", dependency=f"afterok:{first.pk}")
    loop.run_pass()  # places the first; the second waits for it to complete
    words = f"waiting for job {first.pk} to complete (afterok)"
    body = alice.get(f"/api/v1/jobs/{job.pk}/").json()
    assert (body["state"], body["pending_code"], body["pending_reason"]) == (
        "queued",
        "dependency",
        words,
    )
    assert body["queue_position"] is None
    client.force_login(alice.user)
    assert words in client.get(f"/jobs/{job.pk}/").content.decode()
    assert words in client.get("/jobs/").content.decode()
    ended(first, JobState.COMPLETED)
    loop.run_pass()  # its dependency holds: it is placed
    job.refresh_from_db()
    assert (job.state, job.pending_code, job.pending_reason) == (JobState.SCHEDULED, "", "")
