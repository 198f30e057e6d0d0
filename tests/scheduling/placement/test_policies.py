"""Queue order: first come first served, or priority with aging."""

from __future__ import annotations

import pytest

from scheduling.placement import POLICIES, Fcfs, PriorityWithAging, plan
from tests.scheduling.placement.builders import NOW, Fleet, job, pending, placed

HOUR = 3600.0


def ids(jobs: list) -> list[int]:
    return [j.id for j in jobs]


def test_fcfs_orders_by_submission_then_id() -> None:
    jobs = [
        job(3, submitted_at=NOW - 10),
        job(1, submitted_at=NOW - 5),
        job(2, submitted_at=NOW - 10),
    ]

    assert ids(Fcfs().order(jobs, NOW)) == [2, 3, 1]


def test_priority_puts_higher_priorities_first_and_ties_in_submission_order() -> None:
    jobs = [
        job(1, priority="low", submitted_at=NOW - 60),
        job(2, priority="critical", submitted_at=NOW - 60),
        job(3, priority="normal", submitted_at=NOW - 60),
        job(4, priority="high", submitted_at=NOW - 60),
        job(5, priority="normal", submitted_at=NOW - 60),
    ]

    assert ids(PriorityWithAging().order(jobs, NOW)) == [2, 4, 3, 5, 1]


def test_aging_lets_a_low_job_overtake_once_it_has_waited_long_enough() -> None:
    low = job(1, priority="low", submitted_at=NOW - 17 * HOUR)
    normal = job(2, priority="normal", submitted_at=NOW - 30)
    policy = PriorityWithAging()

    # 17 h = 1020 one-minute intervals: more than the 1000 points between low and normal.
    assert policy.score(low, NOW) == pytest.approx(1020)
    assert ids(policy.order([normal, low], NOW)) == [1, 2]
    assert ids(policy.order([normal, low], NOW - 2 * HOUR)) == [2, 1]


def test_capped_aging_never_lets_a_low_job_overtake() -> None:
    low = job(1, priority="low", submitted_at=NOW - 100 * HOUR)
    normal = job(2, priority="normal", submitted_at=NOW)
    policy = PriorityWithAging(max_age_points=500)

    assert policy.score(low, NOW) == 500
    assert ids(policy.order([low, normal], NOW)) == [2, 1]


def test_weights_and_interval_are_configurable() -> None:
    policy = PriorityWithAging(
        priority_points={"low": 0, "normal": 10, "high": 20, "critical": 30},
        aging_interval_s=HOUR,
    )

    assert policy.score(job(1, priority="high", submitted_at=NOW - 2 * HOUR), NOW) == 22


def test_aged_low_job_gets_the_last_free_node_in_a_pass() -> None:
    fleet = Fleet()
    fleet.dgx("dgx-01")
    low = job(1, gpus=8, priority="low", submitted_at=NOW - 20 * HOUR)
    normal = job(2, gpus=8, priority="normal", submitted_at=NOW - 60)

    result = plan(fleet.snapshot(normal, low), PriorityWithAging())

    assert placed(result, 1).nodes == ("dgx-01",)
    assert pending(result, 2).position == 1


def test_policies_are_registered_by_name() -> None:
    assert isinstance(POLICIES["fcfs"](), Fcfs)
    assert POLICIES["priority"](aging_interval_s=120).aging_interval_s == 120


@pytest.mark.parametrize(
    ("_case", "options", "error"),
    [
        ("missing priority", {"priority_points": {"low": 0}}, "lacks critical, high, normal"),
        ("zero interval", {"aging_interval_s": 0}, "must be positive"),
    ],
)
def test_priority_with_aging_rejects_nonsense(_case: str, options: dict, error: str) -> None:
    with pytest.raises(ValueError, match=error):
        PriorityWithAging(**options)
