"""Splitters racing on real PostgreSQL connections (one per thread, all released at once by a
barrier): however many make an array's tasks jobs at the same moment, each index becomes one
job, with one ``job.submitted`` row, and the array's count of them is right."""

from __future__ import annotations

import pytest
from django.db.models import Count

from gpuadmin.audit.models import AuditEvent
from scheduling.checks import arrays_with_wrong_tasks
from scheduling.jobs import arrays, submission
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
