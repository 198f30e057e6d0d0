"""What quotas and fair share read from the allocations: GPUs held now (shares as fractions),
GPU-hours inside the period, decayed GPU-seconds, each in a fixed number of queries; the
sentences users see; and the audited quota services."""

from __future__ import annotations

import math
from datetime import datetime, timedelta
from zoneinfo import ZoneInfo

import pytest

from gpuadmin.audit.models import AuditEvent
from inventory.models import Gpu, Pool
from scheduling import placement
from scheduling.models import Allocation, Job, JobState, PoolPolicy, Quota, Reservation
from scheduling.policies import quotas
from tests.scheduling.pages.helpers import add_fleet, person

pytestmark = pytest.mark.django_db

UTC = ZoneInfo("UTC")
# A Wednesday: today began at 00:00, this week on Monday the 16th, this month on the 1st.
NOW = datetime(2026, 11, 18, 12, 0, tzinfo=UTC)


def window(hours: float, *, after: float = 1) -> tuple[datetime, datetime]:
    """A booking's [start, end): ``hours`` long, starting ``after`` hours from ``NOW``."""
    start = NOW + timedelta(hours=after)
    return start, start + timedelta(hours=hours)


H = 3600.0
JOB_FIELDS = ("project", "pool", "mig_profile")


def ago(hours: float) -> datetime:
    return NOW - timedelta(hours=hours)


@pytest.fixture
def gpus(db) -> list[Gpu]:
    (node,) = add_fleet(1)
    return list(node.gpus.order_by("index"))


@pytest.fixture
def a100(db) -> Pool:
    return Pool.objects.create(name="a100")


@pytest.fixture
def alice(db):
    return person("alice")


@pytest.fixture
def bob(db):
    return person("bob")


def held(owner, gpu: Gpu, start: datetime, end: datetime | None, **fields) -> Allocation:
    """``owner``'s job (``project``, ``pool``, ``mig_profile``) holding ``gpu`` (or a share:
    ``kind``, ``mps_percent``) from ``start`` to ``end`` (None: still)."""
    job_fields = {
        name: fields.pop(name) for name in ("project", "pool", "mig_profile") if name in fields
    }
    job = Job.objects.create(
        owner=owner,
        command=["true"],
        state=JobState.RUNNING if end is None else JobState.COMPLETED,
        **job_fields,
    )
    return Allocation.objects.create(
        job=job, gpu=gpu, node=gpu.node, allocated_at=start, released_at=end, **fields
    )


@pytest.fixture
def history(alice, bob, a100, gpus) -> None:
    """Alice and Bob's allocations, by hand (hours inside today / this week / this month)."""
    # Alice for project vision in a100: yesterday 10:00 to today 02:00 (2 / 16 / 16).
    held(alice, gpus[0], ago(26), ago(10), project="vision", pool=a100)
    # ... and since 06:00 today, still (6 / 6 / 6; one GPU now).
    held(alice, gpus[1], ago(6), None, project="vision", pool=a100)
    # Alice alone in a100: a quarter of a GPU by MPS since the 10th at 12:00, still
    # (12 / 60 / 192 hours, a quarter each; 0.25 GPUs now).
    held(alice, gpus[2], ago(8 * 24), None, pool=a100, kind="mps", mps_percent=25)
    # ... and a 3g.40gb MIG device (3 of an A100's 7 slices) from Oct 31 12:00 to Nov 1 12:00:
    # 12 hours of this month.
    start = datetime(2026, 10, 31, 12, tzinfo=UTC)
    held(
        alice,
        gpus[3],
        start,
        start + timedelta(days=1),
        pool=a100,
        kind="mig",
        mig_profile="3g.40gb",
    )
    # Long before this month: nothing.
    held(alice, gpus[4], ago(40 * 24), ago(39 * 24), pool=a100)
    # Bob for vision, in no pool, since 11:00 (1 / 1 / 1; one GPU now).
    held(bob, gpus[5], ago(1), None, project="vision")


def by_holder(limits) -> dict:
    return {(limit.pool, limit.holder): limit for limit in limits}


def test_quota_limits_count_gpus_now_and_gpu_hours_in_each_period(
    history, alice, bob, a100, django_assert_num_queries
):
    Quota.objects.create(user=alice, pool=a100, max_gpus=8, gpu_hours=500, period="month")
    Quota.objects.create(project="vision", pool=a100, max_gpus=16, gpu_hours=100, period="week")
    Quota.objects.create(user=bob, gpu_hours=10, period="day", fairshare_weight=3)
    Quota.objects.create(project="vision", max_gpus=2)  # in no pool

    with django_assert_num_queries(3):  # the quotas, the allocations, the Ray jobs
        limits = by_holder(quotas.quota_limits(NOW))

    mine = limits["a100", ("user", str(alice.pk))]
    assert (mine.max_gpus, mine.gpu_hours) == (8, 500)
    assert mine.gpus_in_use == pytest.approx(1 + 0.25)
    assert mine.gpu_hours_used == pytest.approx(16 + 6 + 192 * 0.25 + 12 * 3 / 7)
    vision = limits["a100", ("project", "vision")]
    assert (vision.gpus_in_use, vision.gpu_hours_used) == (pytest.approx(1), pytest.approx(22))
    bobs = limits[None, ("user", str(bob.pk))]
    assert (bobs.gpus_in_use, bobs.gpu_hours_used, bobs.max_gpus) == (1, pytest.approx(1), None)
    assert bobs.fairshare_weight == 3
    assert limits[None, ("project", "vision")].gpu_hours_used == pytest.approx(1)


def test_borrowed_work_counts_against_no_quota_but_in_fair_share(alice, gpus):
    held(alice, gpus[0], ago(2), None, borrowed=True)
    held(alice, gpus[1], ago(1), None)
    Quota.objects.create(user=alice, max_gpus=1, gpu_hours=10, period="day")
    (limit,) = quotas.quota_limits(NOW)
    assert (limit.gpus_in_use, limit.gpu_hours_used) == (1, pytest.approx(1))
    assert (limit.name, limit.period) == ("alice", "day")
    usage = quotas.fairshare_usage(NOW, {})[None, ("user", str(alice.pk))]
    assert usage > 2.9 * H  # both: 3 GPU-hours, barely decayed


def test_each_attempt_counts_as_it_was_placed_borrowed_or_not(alice, gpus):
    """Two hours within quota, then re-queued and placed again as borrowed: the two hours
    still count (the job's flag is its latest attempt's, not its first's)."""
    first = held(alice, gpus[0], ago(3), ago(1), attempt=1)
    Allocation.objects.create(
        job=first.job,
        gpu=gpus[1],
        node=gpus[1].node,
        allocated_at=ago(1),
        attempt=2,
        borrowed=True,
    )
    Job.objects.filter(pk=first.job_id).update(borrowed=True, attempt=2, state=JobState.RUNNING)
    Quota.objects.create(user=alice, gpu_hours=10, period="day")
    (limit,) = quotas.quota_limits(NOW)
    assert (limit.gpus_in_use, limit.gpu_hours_used) == (0, pytest.approx(2))


def test_the_number_of_queries_does_not_grow_with_the_history(
    history, alice, a100, gpus, django_assert_num_queries
):
    Quota.objects.create(user=alice, pool=a100, max_gpus=8)
    for n in range(30):
        held(alice, gpus[6], ago(100 - n), ago(99.5 - n), pool=a100, project=f"p{n}")
        Quota.objects.create(project=f"p{n}", pool=a100, gpu_hours=10)
    # Each reading of the use also reads the Ray jobs (``registry.gpu_use``), once.
    with django_assert_num_queries(3):
        assert len(quotas.quota_limits(NOW)) == 31
    with django_assert_num_queries(2):
        quotas.fairshare_usage(NOW, {"a100": placement.PoolConfig()})
    with django_assert_num_queries(1):
        quotas.pool_configs()
    with django_assert_num_queries(3):
        assert len(quotas.usage_summary(alice, NOW)) == 31
    with django_assert_num_queries(4):
        assert quotas.quota_allows(alice, "p3", a100, 1, *window(1), now=NOW) is None


def test_the_fair_share_page_reads_a_fixed_number_of_queries(
    history, alice, a100, django_assert_num_queries
):
    Quota.objects.create(user=alice, pool=a100, fairshare_weight=3)
    with django_assert_num_queries(6):
        board = quotas.fairshare_board(a100, alice, NOW)
    assert [(row.name, row.mine, row.standing.weight) for row in board.users] == [
        ("alice", True, 3)
    ]
    assert [row.name for row in board.projects] == ["vision"]
    assert [why.project is not None for why in board.explanations] == [False, True]


def test_periods_begin_at_local_midnight(alice, gpus, settings):
    settings.TIME_ZONE = "Europe/Berlin"
    berlin = ZoneInfo("Europe/Berlin")
    # NOW is 13:00 in Berlin: today began at 23:00 UTC the day before.
    held(
        alice,
        gpus[0],
        datetime(2026, 11, 17, 22, tzinfo=UTC),
        datetime(2026, 11, 17, 23, 30, tzinfo=UTC),
    )
    Quota.objects.create(user=alice, gpu_hours=10, period="day")
    (limit,) = quotas.quota_limits(NOW)
    assert limit.gpu_hours_used == pytest.approx(0.5)
    # The month of March 2026 began in winter time (+01:00), though its last day is in summer.
    starts = quotas.period_starts(datetime(2026, 3, 31, 12, tzinfo=berlin))
    assert starts["month"] == datetime(2026, 2, 28, 23, tzinfo=UTC)
    assert starts["week"] == datetime(2026, 3, 29, 22, tzinfo=UTC)  # Monday 00:00 +02:00
    assert starts["day"] == datetime(2026, 3, 30, 22, tzinfo=UTC)


def test_an_allocation_across_the_month_boundary_counts_its_part_in_this_month(alice, gpus):
    first = datetime(2026, 11, 1, tzinfo=UTC)
    held(alice, gpus[0], first - timedelta(hours=3), first + timedelta(hours=2))
    Quota.objects.create(user=alice, gpu_hours=10, period="month")
    (limit,) = quotas.quota_limits(NOW)
    assert (limit.gpu_hours_used, limit.gpus_in_use) == (pytest.approx(2), 0)


def test_fairshare_usage_is_the_exact_decay_integral_with_each_pools_half_life(
    alice, bob, a100, gpus
):
    h = 3600.0
    configs = {"a100": placement.PoolConfig(fairshare_half_life_s=h)}
    held(alice, gpus[0], ago(2), ago(1), pool=a100, project="vision")  # 1 h, ended 1 h ago
    held(alice, gpus[1], ago(0.5), None, pool=a100)  # running for 30 min
    held(bob, gpus[2], ago(20), None, pool=a100, kind="mps", mps_percent=50)  # 20 half-lives
    held(bob, gpus[3], ago(3), ago(2))  # no pool: the default half-life, 7 days

    usage = quotas.fairshare_usage(NOW, configs)

    per_ln2 = h / math.log(2)
    first = per_ln2 * (2**-1 - 2**-2)
    assert usage["a100", ("project", "vision")] == pytest.approx(first, rel=1e-9)
    assert usage["a100", ("user", str(alice.pk))] == pytest.approx(
        first + per_ln2 * (1 - 2**-0.5), rel=1e-9
    )
    # Only the last 10 half-lives count.
    assert usage["a100", ("user", str(bob.pk))] == pytest.approx(
        0.5 * per_ln2 * (1 - 2**-quotas.FAIRSHARE_HORIZON_HALF_LIVES), rel=1e-9
    )
    week_per_ln2 = 7 * 24 * H / math.log(2)  # 168 hours
    assert usage[None, ("user", str(bob.pk))] == pytest.approx(
        week_per_ln2 * (2 ** (-2 / 168) - 2 ** (-3 / 168)), rel=1e-9
    )


def test_pool_configs_are_the_policy_rows_as_the_engine_reads_them(a100):
    PoolPolicy.default()
    PoolPolicy.objects.create(
        pool=a100,
        policy="las",
        las_thresholds_gpu_s=[60, 600],
        preempt_exempt_s=120,
        qssf_points_per_halving=1000,
        prediction_trust_intervals=30,
    )
    configs = quotas.pool_configs()
    # The rows' defaults are the engine's.
    assert configs[None] == placement.PoolConfig()
    assert (configs["a100"].policy, configs["a100"].las_thresholds_gpu_s) == ("las", (60.0, 600.0))
    assert configs["a100"].preempt_exempt_s == 120.0
    assert configs["a100"].qssf_points_per_halving == 1000.0
    assert configs["a100"].prediction_trust_intervals == 30.0


def test_users_see_their_quotas_and_their_projects_as_sentences(history, alice, bob, a100):
    Quota.objects.create(user=alice, pool=a100, max_gpus=8, gpu_hours=500, period="month")
    Quota.objects.create(project="vision", pool=a100, max_gpus=16, gpu_hours=100, period="week")
    Quota.objects.create(project="other", gpu_hours=1)  # nobody here works on it
    Quota.objects.create(user=bob, max_gpus=1)

    lines = [(use.text, use.over) for use in quotas.usage_summary(alice, NOW)]
    assert lines == [
        ("you use 1.25 of 8 GPUs in pool a100; 75.14 of 500 GPU-hours this month", False),
        ("project vision uses 1 of 16 GPUs in pool a100; 22 of 100 GPU-hours this week", False),
    ]
    bobs = [(use.text, use.over) for use in quotas.usage_summary(bob, NOW)]
    assert bobs == [
        ("project vision uses 1 of 16 GPUs in pool a100; 22 of 100 GPU-hours this week", False),
        ("you use 1 of 1 GPUs in no pool; 1 GPU-hours this month", True),
    ]


def test_quota_allows_says_which_limit_a_request_passes(history, alice, a100):
    Quota.objects.create(user=alice, pool=a100, max_gpus=8, gpu_hours=500, period="month")
    Quota.objects.create(project="vision", pool=a100, gpu_hours=100, period="week")
    assert quotas.quota_allows(alice, "vision", a100, 4, *window(10), now=NOW) is None
    assert quotas.quota_allows(alice, "vision", a100, 10, *window(1), now=NOW) == (
        "user alice may use 8 GPUs at once in pool a100; this asks for 10"
    )
    assert quotas.quota_allows(alice, "vision", a100, 8, *window(10), now=NOW) == (
        "project vision has 78 of 100 GPU-hours left this week in pool a100; this needs 80"
    )
    assert quotas.quota_allows(alice, "", None, 100, *window(100), now=NOW) is None  # no quota


def test_quota_allows_counts_the_holders_reservations_so_split_bookings_fit_as_one(
    history, bob, a100
):
    """Against 4 GPUs at once and 10 GPU-hours, with 4 GPUs booked for two hours: 4 more in
    that window pass the GPUs at once; after it, 3 GPU-hours pass the 2 left."""
    carol = person("carol")  # no history
    Quota.objects.create(user=carol, pool=a100, max_gpus=4, gpu_hours=10, period="month")
    start, end = window(2, after=24)
    for owner, state in ((carol, "approved"), (bob, "approved"), (carol, "canceled")):
        Reservation.objects.create(  # bob's and the canceled one count for none
            owner=owner, pool=a100, gpu_count=4, start=start, end=end, state=state
        )
    assert quotas.quota_allows(carol, "", a100, 4, *window(1, after=25), now=NOW) == (
        "user carol may use 4 GPUs at once in pool a100; this asks for 4 beside 4 it has "
        "reserved then"
    )
    assert quotas.quota_allows(carol, "", a100, 1, *window(3, after=26), now=NOW) == (
        "user carol has 10 of 10 GPU-hours left this month in pool a100; this needs 3 beside 8 "
        "reserved"
    )
    assert quotas.quota_allows(carol, "", a100, 1, *window(2, after=26), now=NOW) is None


def test_quota_services_are_audited_and_name_the_field(alice, a100):
    quota = quotas.create_quota(actor=alice, pool=a100, user=alice, max_gpus=4)
    row = AuditEvent.objects.get(event_type="quota.created")
    assert row.after == {
        "pool": "a100",
        "user": "alice",
        "project": "",
        "max_gpus": 4,
        "gpu_hours": None,
        "period": "month",
        "fairshare_weight": 1,
    }
    quotas.update_quota(quota, actor=alice, max_gpus=6, period="week")
    changed = AuditEvent.objects.get(event_type="quota.changed")
    assert (changed.before, changed.after) == (
        {"max_gpus": 4, "period": "month"},
        {"max_gpus": 6, "period": "week"},
    )
    quotas.update_quota(quota, actor=alice, max_gpus=6)  # no change, no row
    for fields, field in [
        ({"pool": a100, "user": alice}, "user"),  # a second quota of alice's in a100
        ({"pool": a100}, "user"),
        ({"user": alice, "project": "vision"}, "project"),
        ({"project": "x\x00"}, "project"),
        ({"project": "p", "max_gpus": -1}, "max_gpus"),
        ({"project": "p", "gpu_hours": 10**9}, "gpu_hours"),
        ({"project": "p", "fairshare_weight": 0}, "fairshare_weight"),
        ({"project": "p", "period": "year"}, "period"),
    ]:
        with pytest.raises(quotas.QuotaInvalid) as refused:
            quotas.create_quota(actor=alice, **fields)
        assert refused.value.field == field, fields
    quotas.delete_quota(quota, actor=alice)
    assert not Quota.objects.exists()
    kinds = list(AuditEvent.objects.order_by("pk").values_list("event_type", flat=True))
    assert kinds == ["quota.created", "quota.changed", "quota.deleted"]
