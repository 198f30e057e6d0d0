"""Runtime prediction from finished jobs: the fallbacks, the cap by the maximum runtime, the
user's estimate first, and predicted ends that grow when a job outlives them."""

from __future__ import annotations

import math
import statistics

import pytest

from scheduling.placement import Completed, History, RunningJob
from scheduling.placement.predict import RECENT_OWN, Predictor, grown, release_at
from tests.scheduling.placement.builders import NOW, job

HOUR = 3600.0


def done(
    runtime: float,
    *,
    owner: str = "ann",
    project: str = "vision",
    pool: str | None = "a100",
    gpus: int = 1,
    name: str = "",
    ended: float = NOW,
) -> Completed:
    return Completed(owner, project, pool, gpus, runtime, ended, name)


def predict(history: History, **fields: object) -> float | None:
    asked: dict = {"owner": "ann", "project": "vision", "pool": "a100", "gpus": 1, "name": ""}
    asked.update(fields)
    return history.runtime(**asked)


def test_the_most_similar_jobs_decide_and_each_level_falls_back_to_the_next() -> None:
    history = History(
        [
            done(100, name="train"),
            done(300, name="train"),
            done(1000, name="eval"),
            done(5000, owner="bob", gpus=1),
            done(7000, owner="bob", gpus=4),
            done(9000, owner="cyd", project="speech", gpus=8),
        ]
    )

    # Same owner, name and GPU count: the mean of their runtimes.
    assert predict(history, name="train") == 200
    # A name never seen: the owner's jobs of that GPU count (100, 300, 1000).
    assert predict(history, name="sweep") == pytest.approx(1400 / 3)
    # An owner with no 1-GPU history: the project's 1-GPU jobs (100, 300, 1000, 5000).
    assert predict(history, owner="dan") == 1600
    # A project with no 4-GPU history of its own: the pool's 4-GPU jobs.
    assert predict(history, owner="eve", project="nlp", gpus=4) == 7000
    # No job of the pool had 2 GPUs: the pool's jobs of any size (100 ... 9,000).
    assert predict(history, gpus=2) == pytest.approx(22_400 / 6)
    # Another pool's jobs say nothing about this one.
    assert predict(history, pool="h100") is None
    assert predict(History()) is None


def test_only_the_last_runs_count() -> None:
    history = History([done(50_000, ended=NOW - 100)])
    runs = [600.0 + n for n in range(RECENT_OWN)]
    for n, runtime in enumerate(runs):
        history.add(done(runtime, ended=NOW + n))

    # The old 50,000 s run fell out of the owner's window.
    assert predict(history) == statistics.fmean(runs)
    history.add(done(1, ended=NOW + RECENT_OWN))
    assert predict(history) == statistics.fmean(runs[1:] + [1.0])
    assert history.size == RECENT_OWN + 2


def test_history_is_learned_in_order_of_end() -> None:
    early, late = done(100, ended=NOW), done(200, ended=NOW + 1)
    history = History([late] + [done(300, ended=NOW - n) for n in range(1, RECENT_OWN)] + [early])

    # The window keeps the last RECENT_OWN runs by end: the oldest 300 s run is out of it.
    assert predict(history) == (300 * (RECENT_OWN - 2) + 100 + 200) / RECENT_OWN
    assert history.latest == NOW + 1
    with pytest.raises(ValueError, match="in order of end"):
        history.add(done(1, ended=NOW))


def test_a_prediction_uses_only_runs_that_ended_before_the_job_was_submitted() -> None:
    history = History([done(100, ended=NOW - 10), done(300, ended=NOW), done(900, ended=NOW + 5)])

    assert predict(history, before=NOW - 10) is None  # nothing had ended before it
    assert predict(history, before=NOW - 9) == 100
    assert predict(history, before=NOW) == 100  # one that ended at that very moment: not yet
    assert predict(history, before=NOW + 5) == 200
    assert predict(history, before=NOW + 1) == 200
    assert predict(history) == pytest.approx(1300 / 3)


def ask(predictor: Predictor, job_id: int, submitted_at: float) -> float | None:
    return predictor.runtime(
        job_id,
        owner="ann",
        project="vision",
        pool="a100",
        gpus=1,
        name="",
        submitted_at=submitted_at,
    )


def test_a_predictor_keeps_a_jobs_prediction_from_what_was_known_at_its_submission() -> None:
    history = History([done(100, ended=NOW - 10)])
    predictor = Predictor(history, read_at=NOW)

    assert ask(predictor, 1, NOW - 5) == 100
    # Submitted before any run ended: the whole history, afresh, until a reading has one.
    assert ask(predictor, 2, NOW - 20) == 100
    # Submitted after this reading: predicted again from the next one.
    assert ask(predictor, 3, NOW + 30) == 100
    assert (predictor.is_final(1), predictor.is_final(2), predictor.is_final(3)) == (
        True,
        False,
        False,
    )
    history.add(done(500, ended=NOW + 20))
    assert ask(predictor, 2, NOW - 20) == 300

    renewed = predictor.renewed(History([done(100, ended=NOW - 10), done(700, ended=NOW + 20)]))
    assert ask(renewed, 1, NOW - 5) == 100  # kept
    assert ask(renewed, 3, NOW + 30) == 400  # now known for good
    assert renewed.is_final(3)
    # A job nobody asked about since the last reading (it ended) is not carried to the next.
    assert renewed.renewed(History()).by_job.keys() == {1, 3}
    assert renewed.renewed(History()).renewed(History()).by_job == {}


def test_the_users_estimate_wins_and_a_prediction_never_passes_the_maximum_runtime() -> None:
    assert job(1, predicted_runtime_s=HOUR).likely_runtime_s == HOUR
    assert job(1, predicted_runtime_s=HOUR, estimated_duration_s=60).likely_runtime_s == 60
    assert job(1, predicted_runtime_s=HOUR, max_runtime_s=600).likely_runtime_s == 600
    assert job(1, predicted_runtime_s=60, max_runtime_s=600).likely_runtime_s == 60
    assert job(1, max_runtime_s=600).likely_runtime_s == 600
    assert job(1).likely_runtime_s is None
    # The user's own figures are what quotas and SJF read: a prediction changes neither.
    assert job(1, predicted_runtime_s=HOUR).expected_runtime_s is None


def test_a_prediction_that_has_passed_doubles_until_it_lies_ahead() -> None:
    start = NOW - 1000

    assert grown(start, 1500, NOW) == start + 1500
    # Outlived at 1,000 s: 2 x 400 = 800 has passed too, 4 x 400 = 1,600 lies ahead.
    assert grown(start, 400, NOW) == start + 1600
    # Exactly at its end it is not taken to end now.
    assert grown(start, 1000, NOW) == start + 2000
    assert grown(start, 0, NOW) > NOW


def test_a_running_jobs_release_is_its_prediction_grown_and_capped_by_its_end() -> None:
    started = NOW - 1000
    running = RunningJob(1, (1,), started)

    assert release_at(running, NOW) == math.inf
    assert release_at(RunningJob(1, (1,), started, expected_end=NOW + 5), NOW) == NOW + 5
    predicted = RunningJob(1, (1,), started, predicted_end=started + 400)
    assert release_at(predicted, NOW) == started + 1600
    assert release_at(predicted, started + 100) == started + 400
    # Its maximum runtime ends it before the grown prediction would.
    capped = RunningJob(1, (1,), started, expected_end=NOW + 100, predicted_end=started + 400)
    assert release_at(capped, NOW) == NOW + 100


@pytest.mark.parametrize("runtime", [0.0, -5.0])
def test_a_run_that_took_no_time_predicts_a_second(runtime: float) -> None:
    assert predict(History([done(runtime)])) == 1.0
