"""Queue order: FCFS, priority with aging, SJF, weighted fair share, least attained service,
QSSF (with attained-service queues for preemptible jobs)."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from scheduling.placement import (
    POLICIES,
    FairShare,
    FairShareTable,
    Fcfs,
    Las,
    Policy,
    PoolConfig,
    PriorityWithAging,
    Qssf,
    QuotaLimit,
    Sjf,
    Standing,
    fairshare_factor,
    plan,
    policy_for,
)
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
    assert sorted(POLICIES) == ["fairshare", "fcfs", "las", "priority", "qssf", "sjf"]


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


def test_sjf_puts_the_shortest_estimate_first_and_an_unknown_runtime_last() -> None:
    jobs = [
        job(1, estimated_duration_s=7200, submitted_at=NOW),
        job(2, max_runtime_s=600, submitted_at=NOW),
        job(3, submitted_at=NOW),
        job(4, estimated_duration_s=60, max_runtime_s=86_400, submitted_at=NOW),
        job(5, estimated_duration_s=30 * 86_400, submitted_at=NOW),
    ]

    # A month counts as a week: 0 points, like an unknown runtime, which goes last.
    assert ids(Sjf().order(jobs, NOW)) == [4, 2, 1, 5, 3]


def test_sjf_aging_lets_a_job_without_estimate_overtake_a_one_minute_job() -> None:
    policy = Sjf()
    unknown = job(1)
    short = job(2, estimated_duration_s=60, submitted_at=NOW)
    # A minute scores log2(10,080) = 13.3 halvings of 1,000 points: 13,299 one-minute intervals.
    assert policy.size_points(short) == pytest.approx(13_299.3, abs=0.1)

    def at(waited: float) -> list[int]:
        return ids(policy.order([replace(unknown, submitted_at=NOW - waited), short], NOW))

    assert at(13_290 * 60.0) == [2, 1]
    assert at(13_300 * 60.0) == [1, 2]


@pytest.mark.parametrize(
    ("usage", "total_usage", "shares", "total_shares", "factor"),
    [
        (0, 100, 1, 4, 1.0),
        (25, 100, 1, 4, 0.5),
        (50, 100, 1, 4, 0.25),
        (50, 100, 2, 4, 0.5),
        (0, 0, 1, 1, 1.0),
        (10, 100, 0, 4, 0.0),
    ],
)
def test_fairshare_factor_is_slurms_classic_two_to_the_minus_usage_over_shares(
    usage: float, total_usage: float, shares: float, total_shares: float, factor: float
) -> None:
    assert fairshare_factor(usage, total_usage, shares, total_shares) == pytest.approx(factor)


def usage(**gpu_seconds: float) -> dict:
    """Fair-share usage of users and projects in no pool: user_7=..., project_x=..."""
    return {(None, tuple(name.split("_", 1))): used for name, used in gpu_seconds.items()}


def test_fairshare_puts_the_least_served_user_first_and_weights_count() -> None:
    jobs = [job(1, owner="7", submitted_at=NOW), job(2, owner="8", submitted_at=NOW)]
    table = FairShareTable(None, usage(user_7=300, user_8=100))

    # Equal shares: user 7 used 75 % of the pool, user 8 25 %.
    assert table.factor("7") == pytest.approx(2**-1.5)
    assert table.factor("8") == pytest.approx(2**-0.5)
    assert ids(FairShare(table).order(jobs, NOW)) == [2, 1]

    # User 7 is entitled to three times as much: both used exactly their share.
    weighted = FairShareTable(
        None, usage(user_7=300, user_8=100), [QuotaLimit(None, ("user", "7"), fairshare_weight=3)]
    )
    assert weighted.factor("7") == weighted.factor("8") == pytest.approx(0.5)
    assert ids(FairShare(weighted).order(jobs, NOW)) == [1, 2]


def test_fairshare_adds_priority_points_and_ages() -> None:
    table = FairShareTable(None, usage(user_7=100, user_8=0))
    heavy_critical = job(1, owner="7", priority="critical", submitted_at=NOW)
    light_normal = job(2, owner="8", priority="normal", submitted_at=NOW)
    policy = FairShare(table, weight=10_000)

    # 3,000 + 10,000 x 2^-2 (user 7 used it all with half the shares) < 1,000 + 10,000.
    assert policy.score(heavy_critical, NOW) == pytest.approx(3000 + 2500)
    assert policy.score(light_normal, NOW) == pytest.approx(11_000)
    assert ids(policy.order([heavy_critical, light_normal], NOW)) == [2, 1]
    older = replace(heavy_critical, submitted_at=NOW - 5600 * 60)
    assert ids(policy.order([older, light_normal], NOW)) == [1, 2]


def test_a_jobs_factor_is_the_mean_of_its_users_and_its_projects() -> None:
    table = FairShareTable(None, usage(user_7=100, user_8=100, project_x=300, project_y=100))

    assert table.factor("7", "x") == pytest.approx((2**-1 + 2**-1.5) / 2)
    assert table.factor("8", "y") == pytest.approx((2**-1 + 2**-0.5) / 2)
    assert table.factor("8") == pytest.approx(0.5)


def test_the_fairshare_explanation_says_why_a_priority_is_what_it_is() -> None:
    table = FairShareTable(
        "a100",
        {
            ("a100", ("user", "7")): 300.0,
            ("a100", ("user", "8")): 100.0,
            (None, ("user", "7")): 9e9,
        },
        [QuotaLimit("a100", ("user", "7"), fairshare_weight=3)],
    )

    explanation = table.explain("7", weight=10_000)

    assert explanation.user == Standing(("user", "7"), 3, 0.75, 300, 0.75, 0.5)
    assert explanation.project is None
    assert explanation.points == pytest.approx(5000)
    assert explanation.sentences() == [
        "user 7: 75% of the shares, 75% of the recent usage, factor 0.50",
        "5,000 fair-share priority points",
    ]
    # A user the pool has never seen: full factor, its share counted with its weight of 1.
    newcomer = table.explain("9")
    assert (newcomer.user.share, newcomer.factor) == (pytest.approx(0.2), 1.0)


def test_las_orders_by_attained_service_queue_then_first_come() -> None:
    policy = Las(thresholds_gpu_s=(3600, 36_000))
    jobs = [
        job(1, attained_service_s=40_000, submitted_at=NOW - 60),
        job(2, attained_service_s=3_600, submitted_at=NOW - 50),
        job(3, attained_service_s=0, submitted_at=NOW - 40),
        job(4, attained_service_s=3_599, submitted_at=NOW - 70),
        job(5, attained_service_s=10_000, submitted_at=NOW - 80),
    ]

    assert [policy.queue(j, NOW) for j in jobs] == [2, 1, 0, 0, 1]
    assert ids(policy.order(jobs, NOW)) == [4, 3, 5, 2, 1]


def test_las_returns_a_starving_job_to_the_top_queue() -> None:
    policy = Las(thresholds_gpu_s=(3600,), starve_multiple=2)
    # 4 GPUs for an hour: 14,400 GPU-seconds, 3,600 s of service; top queue after 7,200 s.
    served = job(1, gpus=4, attained_service_s=14_400, submitted_at=NOW - 7_199)
    newcomer = job(2, submitted_at=NOW - 10)

    assert ids(policy.order([served, newcomer], NOW)) == [2, 1]
    assert ids(policy.order([served, newcomer], NOW + 1)) == [1, 2]


@pytest.mark.parametrize(
    ("config", "expected"),
    [
        (PoolConfig(policy="fcfs"), Fcfs()),
        (PoolConfig(policy="priority", aging_interval_s=5), PriorityWithAging(aging_interval_s=5)),
        (PoolConfig(policy="sjf", aging_interval_s=5), Sjf(aging_interval_s=5)),
        (PoolConfig(policy="las", las_thresholds_gpu_s=()), Las((3600.0, 36_000.0))),
        (PoolConfig(policy="las", las_thresholds_gpu_s=(60, 600)), Las((60, 600))),
        (
            PoolConfig(policy="qssf", aging_interval_s=5),
            Qssf(aging_interval_s=5, las_thresholds_gpu_s=(3600.0, 36_000.0)),
        ),
        (
            PoolConfig(policy="qssf", qssf_points_per_halving=1000, las_thresholds_gpu_s=(60,)),
            Qssf(points_per_halving=1000, las_thresholds_gpu_s=(60,)),
        ),
        # A pool that does not preempt has no queues of attained service.
        (PoolConfig(policy="qssf", preemption=False), Qssf()),
    ],
)
def test_policy_for_builds_the_policy_a_pool_names(config: PoolConfig, expected: Policy) -> None:
    assert policy_for(config, Fleet().snapshot()) == expected


def test_policy_for_gives_fair_share_the_pools_usage_and_weights() -> None:
    snapshot = Fleet().snapshot(
        usage=usage(user_7=100.0), quotas=(QuotaLimit(None, ("user", "7")),)
    )
    policy = policy_for(
        PoolConfig(policy="fairshare", fairshare_weight=500, aging_interval_s=30), snapshot
    )

    assert isinstance(policy, FairShare)
    assert (policy.weight, policy.aging_interval_s) == (500, 30)
    assert policy.shares.factor("7") == 0.5


def test_each_pool_is_ordered_by_its_own_policy() -> None:
    fleet = Fleet()
    fleet.dgx("dgx-01", pool="fifo")
    fleet.dgx("dgx-02", pool="short")
    jobs = [
        job(1, gpus=8, pool="fifo", estimated_duration_s=7200),
        job(2, gpus=8, pool="fifo", estimated_duration_s=60),
        job(3, gpus=8, pool="short", estimated_duration_s=7200),
        job(4, gpus=8, pool="short", estimated_duration_s=60),
    ]
    pools = {"fifo": PoolConfig(policy="fcfs"), "short": PoolConfig(policy="sjf")}

    result = fleet.plan(*jobs, pools=pools)

    assert [p.job_id for p in result.placements] == [1, 4]
    assert [(p.job_id, p.position) for p in result.pending] == [(2, 1), (3, 1)]


def test_fairshare_puts_jobs_past_the_starvation_limit_first_oldest_first() -> None:
    table = FairShareTable(None, usage(user_7=1000, user_8=0))
    policy = FairShare(table, weight=10_000, aging_interval_s=1)
    assert policy.starvation_limit_s == 13_000
    old_heavy = job(1, owner="7", submitted_at=NOW - 13_000)
    older_heavy = job(2, owner="7", priority="low", submitted_at=NOW - 13_001)
    fresh_light = job(3, owner="8", priority="critical", submitted_at=NOW)

    # Two seconds earlier neither has waited that long: by score, job 1 (normal) first.
    assert ids(policy.order([fresh_light, old_heavy, older_heavy], NOW - 2)) == [1, 2, 3]
    assert ids(policy.order([fresh_light, old_heavy, older_heavy], NOW)) == [2, 1, 3]


def test_qssf_puts_the_least_likely_gpu_service_first_and_an_unknown_one_last() -> None:
    jobs = [
        job(1, gpus=8, predicted_runtime_s=HOUR / 2, submitted_at=NOW),  # 4 GPU-hours
        job(2, gpus=1, predicted_runtime_s=HOUR, submitted_at=NOW),  # 1
        job(3, gpus=1, submitted_at=NOW),  # unknown
        job(4, gpus=2, predicted_runtime_s=HOUR, estimated_duration_s=60, submitted_at=NOW),
        job(5, gpus=4, predicted_runtime_s=10 * HOUR, max_runtime_s=HOUR, submitted_at=NOW),
    ]

    # Job 4's estimate wins over its prediction (2 GPU-minutes); job 5's maximum runtime caps
    # its prediction (4 GPU-hours, as job 1, which was submitted first).
    assert ids(Qssf().order(jobs, NOW)) == [4, 2, 1, 5, 3]


def test_qssf_counts_the_priority_and_lets_a_long_job_overtake_by_waiting() -> None:
    policy = Qssf()
    week = job(1, gpus=8, predicted_runtime_s=7 * 24 * HOUR, submitted_at=NOW)
    minute = job(2, predicted_runtime_s=60, submitted_at=NOW)
    # A GPU-minute scores about 16.3 halvings of 250 points more than 8 GPUs for a week
    # (the largest scored service is a week of 64 GPUs: 3 halvings above it).
    gap = policy.size_points(minute) - policy.size_points(week)
    assert gap == pytest.approx(250 * math.log2(7 * 24 * 3600 * 8 / 60))

    assert ids(policy.order([week, minute], NOW)) == [2, 1]
    assert ids(policy.order([week, replace(minute, submitted_at=NOW + gap * 60 - 60)], NOW)) == [
        2,
        1,
    ]
    later = replace(minute, submitted_at=NOW + gap * 60 + 60)
    assert ids(policy.order([week, later], later.submitted_at)) == [1, 2]
    # One priority level is worth 1,000 points: four halvings of the service.
    high = replace(week, priority="critical")
    assert policy.score(high, NOW) - policy.score(week, NOW) == 2000
    assert policy.starvation_limit_s == pytest.approx(
        (3000 + 250 * math.log2(7 * 24 * 3600 * 64 / 60)) * 60
    )


def test_qssf_without_estimates_or_history_orders_as_priority_with_aging() -> None:
    jobs = [
        job(1, priority="low", submitted_at=NOW - 10),
        job(2, priority="high", submitted_at=NOW),
        job(3, submitted_at=NOW - 5),
    ]

    assert ids(Qssf().order(jobs, NOW)) == ids(PriorityWithAging().order(jobs, NOW)) == [2, 3, 1]


def test_qssf_weighs_a_share_by_its_part_of_a_gpu() -> None:
    share = job(1, mps_percent=25, predicted_runtime_s=HOUR, submitted_at=NOW)
    whole = job(2, predicted_runtime_s=HOUR / 2, submitted_at=NOW)

    assert Qssf.service_gpu_s(share) == 900
    assert ids(Qssf().order([whole, share], NOW)) == [1, 2]


@pytest.mark.parametrize(("points", "first"), [(250, 1), (1000, 2)])
def test_a_pools_qssf_points_per_halving_decide_how_long_a_large_job_waits(
    points: float, first: int
) -> None:
    """An 8-GPU hour is 60 times a job of 8 GPU-minutes: 5.9 halvings, 1,477 points at 250
    per halving, 5,907 at 1,000. Having waited 3,000 aging minutes, the large job goes first
    at 250 and still waits at 1,000."""
    fleet = Fleet()
    fleet.dgx("dgx-01")
    config = PoolConfig(policy="qssf", qssf_points_per_halving=points)

    result = fleet.plan(
        job(1, gpus=8, estimated_duration_s=HOUR, submitted_at=NOW - 3000 * 60),
        job(2, gpus=8, estimated_duration_s=60, submitted_at=NOW),
        pools={None: config},
    )

    assert [p.job_id for p in result.placements] == [first]


def test_qssf_rejects_negative_points() -> None:
    with pytest.raises(ValueError, match="points_per_halving"):
        Qssf(points_per_halving=-1)


def test_qssf_puts_preemptible_jobs_in_queues_of_attained_service_then_orders_by_size() -> None:
    """With thresholds (a pool that preempts), a preemptible job's queue comes first: one
    that ran past 3,600 GPU-seconds waits behind every job that did not, however small it is
    predicted to be; inside a queue the likely service orders as before. A job that may not
    be preempted is never put in a lower queue."""
    policy = Qssf(las_thresholds_gpu_s=(3600, 36_000))
    served = {"preemptible": True, "queued_at": NOW - 60}
    jobs = [
        job(1, predicted_runtime_s=60, attained_service_s=4000, submitted_at=NOW - 100, **served),
        job(2, gpus=8, predicted_runtime_s=10 * HOUR, submitted_at=NOW, preemptible=True),
        job(3, predicted_runtime_s=HOUR, submitted_at=NOW, preemptible=True),
        job(4, predicted_runtime_s=60, attained_service_s=40_000, submitted_at=NOW, **served),
        job(5, predicted_runtime_s=2 * HOUR, attained_service_s=40_000, submitted_at=NOW),
        job(6, predicted_runtime_s=30 * HOUR, attained_service_s=5000, submitted_at=NOW, **served),
    ]

    assert [policy.queue(j, NOW) for j in jobs] == [1, 0, 0, 2, 0, 1]
    assert ids(policy.order(jobs, NOW)) == [3, 5, 2, 1, 6, 4]
    # Without thresholds it is QSSF alone.
    assert ids(Qssf().order(jobs, NOW)) == [1, 4, 3, 5, 6, 2]


def test_qssf_returns_a_starving_preemptible_job_to_the_top_queue() -> None:
    """Tiresias' guard: 4 GPUs for an hour (14,400 GPU-seconds, an hour of service) are back
    in the top queue once the job has waited twice that since it was stopped, and then its
    size and age order it among the others as QSSF does."""
    policy = Qssf(las_thresholds_gpu_s=(3600,), starve_multiple=2)
    served = job(
        1,
        gpus=4,
        predicted_runtime_s=2 * HOUR,
        attained_service_s=14_400,
        queued_at=NOW - 7_199,
        submitted_at=NOW - 9_000,
        preemptible=True,
    )
    newcomer = job(2, gpus=4, predicted_runtime_s=2 * HOUR, submitted_at=NOW, preemptible=True)

    assert ids(policy.order([served, newcomer], NOW)) == [2, 1]
    assert ids(policy.order([served, newcomer], NOW + 1)) == [1, 2]


@pytest.mark.parametrize(
    ("options", "error"),
    [
        ({"las_thresholds_gpu_s": (36_000, 3600)}, "increasing"),
        ({"las_thresholds_gpu_s": (0,)}, "positive"),
        ({"starve_multiple": 0}, "starve_multiple"),
    ],
)
def test_qssf_rejects_nonsense_queues(options: dict, error: str) -> None:
    with pytest.raises(ValueError, match=error):
        Qssf(**options)


def test_the_default_pool_runs_a_fresh_job_before_a_preemptible_one_that_ran_long() -> None:
    """The default policy in a pass: the fleet holds one of two 8-GPU jobs; the one predicted
    shorter ran two hours before it was stopped, so the fresh one starts. Where the pool
    does not preempt, or the jobs may not be preempted, QSSF's size order stands."""
    fleet = Fleet()
    fleet.dgx("dgx-01")
    ran = job(
        1,
        gpus=8,
        predicted_runtime_s=HOUR,
        attained_service_s=16 * HOUR,
        queued_at=NOW - 60,
        preemptible=True,
    )
    fresh = job(2, gpus=8, predicted_runtime_s=3 * HOUR, preemptible=True)

    default = {None: PoolConfig()}
    assert [p.job_id for p in fleet.plan(ran, fresh, pools=default).placements] == [2]
    off = {None: PoolConfig(preemption=False)}
    assert [p.job_id for p in fleet.plan(ran, fresh, pools=off).placements] == [1]
    solid = [replace(j, preemptible=False) for j in (ran, fresh)]
    assert [p.job_id for p in fleet.plan(*solid, pools=default).placements] == [1]
