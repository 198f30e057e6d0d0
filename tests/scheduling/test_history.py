"""The history the placement loop predicts runtimes from: only jobs that ran and ended, read
in one query and cached, and the predictions it puts in the snapshot."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from inventory.models import Gpu, Pool
from scheduling.loop import history
from scheduling.loop import snapshot as loop_snapshot
from scheduling.models import Allocation, Job
from tests.scheduling.conftest import add_sim_node

pytestmark = pytest.mark.django_db

HOUR = 3600


@pytest.fixture
def alice(django_user_model):
    return django_user_model.objects.create_user("alice")


def make_job(owner, state: str, *, submitted_ago: float = 0, **fields) -> Job:
    job = Job.objects.create(owner=owner, command=["x"], state=state, **fields)
    Job.objects.filter(pk=job.pk).update(
        submitted_at=timezone.now() - timedelta(seconds=submitted_ago)
    )
    job.refresh_from_db()
    return job


def ran(owner, runtime: float, *, ended_ago: float = 0, state: str = "completed", **fields) -> Job:
    """A job that ran `runtime` seconds and ended `ended_ago` seconds ago."""
    end = timezone.now() - timedelta(seconds=ended_ago)
    start = end - timedelta(seconds=runtime)
    return make_job(
        owner,
        state,
        submitted_ago=ended_ago + runtime + 60,
        started_at=start,
        finished_at=end,
        **fields,
    )


def test_only_runs_that_started_and_ended_are_read(alice):
    training = Pool.objects.create(name="training")
    ran(alice, 600, project="nlp", gpu_count=4, node_count=2, pool=training, name="train")
    ran(alice, 30, state="failed")
    ran(alice, 90, state="canceled")
    make_job(alice, "canceled", finished_at=timezone.now())  # canceled while waiting
    make_job(alice, "running", started_at=timezone.now() - timedelta(hours=5))
    make_job(alice, "queued")
    ran(alice, 45, ended_ago=(history.HISTORY_DAYS + 1) * 24 * HOUR)  # too long ago

    runs = sorted(history.recent_runs(timezone.now()), key=lambda run: run.runtime_s)

    assert [round(run.runtime_s) for run in runs] == [30, 90, 600]
    nlp = runs[-1]
    assert (nlp.owner, nlp.project, nlp.pool, nlp.gpus, nlp.name) == (
        str(alice.pk),
        "nlp",
        "training",
        8,
        "train",
    )


def test_the_snapshot_carries_predictions_made_from_runs_before_each_submission(alice, broker):
    add_sim_node("dgx-01")
    gpu = Gpu.objects.filter(node__hostname="dgx-01").order_by("index")[0]
    for runtime in (1000, 2000, 3000):
        ran(alice, runtime, ended_ago=2 * HOUR, name="train")
    ran(alice, 50, ended_ago=10, name="train")  # ended after the waiting jobs were submitted
    waiting = make_job(alice, "queued", submitted_ago=HOUR, name="train")
    estimated = make_job(alice, "queued", submitted_ago=HOUR, estimated_duration_s=60)
    started = timezone.now() - timedelta(seconds=500)
    running = make_job(alice, "running", submitted_ago=HOUR, started_at=started, name="train")
    Allocation.objects.create(job=running, gpu=gpu, node=gpu.node, attempt=1)
    fresh = make_job(alice, "queued", name="train")

    snapshot, _ = loop_snapshot.take_snapshot()

    queue = {job.id: job for job in snapshot.queue}
    # The mean of the three runs that had ended when it was submitted.
    assert queue[waiting.pk].predicted_runtime_s == 2000
    # The user's estimate wins: no prediction is made.
    assert queue[estimated.pk].predicted_runtime_s is None
    # Submitted now: the fourth run counts (1000, 2000, 3000, 50).
    assert queue[fresh.pk].predicted_runtime_s == 1512.5
    [holder] = snapshot.running
    assert holder.predicted_end == pytest.approx(started.timestamp() + 2000)
    assert holder.expected_end is None


def test_the_history_is_read_once_a_minute_and_predictions_are_kept(alice, monkeypatch):
    ran(alice, 1000, ended_ago=HOUR)
    waiting = make_job(alice, "queued", submitted_ago=60)
    first, _ = loop_snapshot.take_snapshot()
    ran(alice, 9000, ended_ago=10)
    later = make_job(alice, "queued")
    with CaptureQueriesContext(connection) as queries:
        second, _ = loop_snapshot.take_snapshot()
    read_at, cached = history._cached
    monkeypatch.setattr(history, "_cached", (read_at - history.HISTORY_MAX_AGE_S - 1, cached))
    third, _ = loop_snapshot.take_snapshot()

    def predicted(snapshot, job):
        return {j.id: j.predicted_runtime_s for j in snapshot.queue}[job.pk]

    assert predicted(first, waiting) == 1000
    # Within the minute the new run is not read: the later job is predicted from the first
    # run, for now (it was submitted after that reading).
    assert not any("finished_at" in query["sql"] for query in queries.captured_queries)
    assert (predicted(second, waiting), predicted(second, later)) == (1000, 1000)
    # Read again: the later job, submitted after the 9,000 s run ended, sees it; the waiting
    # job keeps the prediction made from what was known when it was submitted.
    assert (predicted(third, waiting), predicted(third, later)) == (1000, 5000)
