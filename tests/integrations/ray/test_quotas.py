"""Ray jobs under gpuadmin's quotas and fair share: their GPUs count, as allocations do, in
what the quotas read (GPUs held now, GPU-hours this period: the placement loop's and the
pages' ``quota_limits``), in fair share's decayed usage, and a submission is weighed by the
loop's own rule against gpuadmin's jobs and Ray's together. No Ray is needed: the jobs are
rows, as the poll leaves them."""

from __future__ import annotations

import math
from datetime import datetime, timedelta
from zoneinfo import ZoneInfo

import pytest

from integrations.ray import services
from integrations.ray.models import RayCluster, RayJob, RayJobState
from inventory.models import Pool
from scheduling import placement
from scheduling.models import Quota
from scheduling.policies import quotas
from tests.scheduling.pages.helpers import add_fleet, person
from tests.scheduling.test_quotas import held

pytestmark = pytest.mark.django_db

NOW = datetime(2026, 11, 18, 12, 0, tzinfo=ZoneInfo("UTC"))  # a Wednesday, noon
H = 3600.0


def ago(hours: float, now: datetime = NOW) -> datetime:
    return now - timedelta(hours=hours)


@pytest.fixture
def pool(db) -> Pool:
    return Pool.objects.create(name="ray-lab")


@pytest.fixture
def lab(pool, free_port) -> RayCluster:
    return RayCluster.objects.create(name="lab", address=f"http://127.0.0.1:{free_port}", pool=pool)


@pytest.fixture
def alice(db):
    return person("alice")


def ray_job(owner, cluster: RayCluster, gpus: float, state: str, started=None, ended=None):  # noqa: ANN001, ANN201
    return RayJob.objects.create(
        owner=owner,
        cluster=cluster,
        entrypoint="python train.py",
        gpus=gpus,
        state=state,
        started_at=started,
        ended_at=ended,
        submission_id=f"test-{RayJob.objects.count()}",
    )


@pytest.fixture
def history(alice, lab, free_port) -> None:
    """Alice's Ray jobs: 2 GPUs running for an hour, 1 GPU from 3 h to 2 h ago, half a GPU
    not sent yet; and what does not count: a job of no GPUs, one on a cluster in no pool, one
    that ended before it started in Ray (canceled before it was sent)."""
    ray_job(alice, lab, 2, RayJobState.RUNNING, ago(1))
    ray_job(alice, lab, 1, RayJobState.COMPLETED, ago(3), ago(2))
    ray_job(alice, lab, 0.5, RayJobState.PENDING)
    ray_job(alice, lab, 0, RayJobState.RUNNING, ago(5))
    elsewhere = RayCluster.objects.create(name="own", address=f"http://127.0.0.1:{free_port}")
    ray_job(alice, elsewhere, 4, RayJobState.RUNNING, ago(5))
    ray_job(alice, lab, 4, RayJobState.CANCELED, None, ago(1))


def test_ray_jobs_count_in_the_gpus_held_now_and_the_gpu_hours_of_each_period(history, alice, pool):
    Quota.objects.create(user=alice, pool=pool, max_gpus=8, gpu_hours=100, period="day")
    (limit,) = quotas.quota_limits(NOW)
    assert limit.gpus_in_use == pytest.approx(2.5)
    assert limit.gpu_hours_used == pytest.approx(2 * 1 + 1 * 1)
    [use] = quotas.usage_summary(alice, NOW)
    assert use.limit.gpus_in_use == pytest.approx(2.5)


def test_ray_jobs_count_in_fair_share_as_the_decay_integral(history, alice):
    h = 3600.0
    usage = quotas.fairshare_usage(NOW, {"ray-lab": placement.PoolConfig(fairshare_half_life_s=h)})
    per_ln2 = h / math.log(2)
    expected = 2 * per_ln2 * (1 - 2**-1) + per_ln2 * (2**-2 - 2**-3)
    assert usage["ray-lab", ("user", str(alice.pk))] == pytest.approx(expected, rel=1e-9)
    assert [key for key in usage if key[0] != "ray-lab"] == []


def test_a_gpu_hour_budget_used_up_refuses_a_ray_submission(alice, lab, pool):
    ray_job(alice, lab, 4, RayJobState.COMPLETED, ago(1), ago(0.25))  # 3 GPU-hours
    Quota.objects.create(user=alice, pool=pool, gpu_hours=2, period="day")
    assert quotas.quota_refusal(alice, "", pool, 1, now=NOW) == (
        "user alice used 3 of 2 GPU-hours in pool ray-lab today"
    )
    Quota.objects.filter(user=alice).update(gpu_hours=3)  # used, not over: as the loop's rule
    assert quotas.quota_refusal(alice, "", pool, 1, now=NOW) is None


def test_a_submission_counts_gpuadmin_jobs_and_ray_jobs_together(alice, lab, pool):
    (node,) = add_fleet(1)
    gpu = node.gpus.order_by("index")[0]
    now = datetime.now(tz=ZoneInfo("UTC"))
    held(alice, gpu, ago(1, now), None, pool=pool)  # a gpuadmin job on 1 GPU of the pool
    ray_job(alice, lab, 1, RayJobState.QUEUED, ago(0.5, now))
    Quota.objects.create(user=alice, pool=pool, max_gpus=3)
    with pytest.raises(services.RayJobRefused) as refused:
        services.submit(owner=alice, cluster=lab, entrypoint="true", gpus=1.5)
    assert (refused.value.field, refused.value.message) == (
        "gpus",
        "user alice uses 2 of 3 GPUs in pool ray-lab",
    )
    job = services.submit(owner=alice, cluster=lab, entrypoint="true", gpus=1)
    assert job.state == RayJobState.PENDING
    (limit,) = quotas.quota_limits(now)
    assert limit.gpus_in_use == pytest.approx(3)  # what the placement loop now sees


def test_a_job_ray_no_longer_knows_ends_when_gpuadmin_learns_it(alice, lab):
    job = ray_job(alice, lab, 1, RayJobState.RUNNING, ago(1, datetime.now(tz=ZoneInfo("UTC"))))
    services._change(job, RayJobState.FAILED, "forgotten", actor_name="ray-poll")
    job.refresh_from_db()
    assert job.ended_at is not None and job.ended_at > job.started_at
