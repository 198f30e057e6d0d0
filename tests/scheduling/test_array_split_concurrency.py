"""Splitters racing on real PostgreSQL connections (one per thread, all released at once by a
barrier): however many make an array's tasks jobs at the same moment, each index becomes one
job, with one ``job.submitted`` row, and the array's count of them is right."""

from __future__ import annotations

import pytest
from django.db.models import Count

from gpuadmin.audit.models import AuditEvent
from scheduling.checks import arrays_with_wrong_tasks
from scheduling.jobs import arrays, control, submission
from scheduling.models import Job, JobArray, JobState
from tests.scheduling.conftest import add_sim_node
from tests.scheduling.test_reservations_concurrency import at_once

pytestmark = pytest.mark.django_db(transaction=True)

SPLITTERS = 4


@pytest.fixture
def owner(broker, django_user_model):
    add_sim_node("dgx-01")
    return django_user_model.objects.create_user("alice")


def test_concurrent_splitters_never_make_a_task_twice(owner):
    capped = submission.submit_array(owner, "0-999%10", command=["true"]).array
    uncapped = submission.submit_array(owner, "0-1999", command=["true"]).array
    for _ in range(3):  # each round: all splitters at once, then the tasks made end
        results = at_once([arrays.split_due] * SPLITTERS)
        assert not [r for r in results if isinstance(r, Exception)], results
        assert sum(results) == 11 + arrays.SPLIT_CHUNK  # one round's room, made once
        Job.objects.update(state=JobState.COMPLETED)
    twice = Job.objects.values("array", "array_index").annotate(n=Count("pk")).filter(n__gt=1)
    assert not twice.exists()
    assert list(capped.tasks.order_by("array_index").values_list("array_index", flat=True)) == (
        list(range(33))
    )
    assert uncapped.tasks.count() == 3 * arrays.SPLIT_CHUNK
    assert AuditEvent.objects.filter(event_type="job.submitted").count() == Job.objects.count()
    assert dict(JobArray.objects.values_list("pk", "split")) == {
        capped.pk: 33,
        uncapped.pk: 3 * arrays.SPLIT_CHUNK,
    }
    assert arrays_with_wrong_tasks() == []


ROUNDS = 5


def test_a_split_at_the_moment_tasks_are_canceled_never_makes_one_runnable(owner):
    """Each round a splitter and a cancel of every task not ended race: whichever locks the
    array first, no task canceled is a job that may run, and none is made twice."""
    for _ in range(ROUNDS):
        array = submission.submit_array(owner, "0-1999", command=["true"]).array
        results = at_once(
            [
                arrays.split_due,
                lambda array=array: control.cancel_tasks(array, "0-1999", actor=owner),
            ]
        )
        assert not [r for r in results if isinstance(r, Exception)], results
        array.refresh_from_db()
        assert not array.tasks.exclude(state=JobState.CANCELED).exists()
        assert array.split + len(array.canceled_tasks) == 2000
        assert arrays.split_due() == 0
    assert arrays_with_wrong_tasks() == []


@pytest.mark.parametrize("held", [False, True])
def test_a_split_at_the_moment_an_array_is_held_or_released_misses_neither(owner, held):
    """Each round a splitter and a hold (a release of an array submitted held) race: every
    task made, before or after, is in the state the array was left in."""
    control_array = control.release_array if held else control.hold_array
    left = JobState.QUEUED if held else JobState.PENDING
    for _ in range(ROUNDS):
        array = submission.submit_array(owner, "0-1999", command=["true"], hold=held).array
        results = at_once([arrays.split_due, lambda array=array: control_array(array, actor=owner)])
        assert not [r for r in results if isinstance(r, Exception)], results
        assert arrays.split_due() == 0  # the chunk is made, the array's word taken
        assert set(array.tasks.values_list("state", flat=True)) == {left}
    assert arrays_with_wrong_tasks() == []
