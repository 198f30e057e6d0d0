"""/api/v1/policies/ and /api/v1/quotas/: every pool's policy and every quota with its use,
changed by admins through the audited services; a bad value is a 400 naming its field."""

from __future__ import annotations

import pytest

from gpuadmin.access.models import Role
from gpuadmin.audit.models import AuditEvent
from inventory.models import Pool
from scheduling.models import Allocation, Job, JobState, PoolPolicy, Quota
from scheduling.placement.snapshot import DEFAULT_POLICY
from scheduling.policies import quotas
from tests.scheduling.api.conftest import events
from tests.scheduling.pages.helpers import add_fleet

pytestmark = pytest.mark.django_db


@pytest.fixture
def admin(api_as):
    return api_as("ada", Role.ADMIN)


@pytest.fixture
def alice(api_as):
    return api_as("alice")


@pytest.fixture
def a100(db) -> Pool:
    return Pool.objects.create(name="a100")


def test_every_pool_has_a_policy_the_defaults_until_changed(admin, a100):
    listed = admin.get("/api/v1/policies/").json()
    assert [(row["pool"], row["policy"], row["updated_at"]) for row in listed] == [
        (None, DEFAULT_POLICY, None),
        ("a100", DEFAULT_POLICY, None),
    ]
    one = admin.get("/api/v1/policies/a100/").json()
    assert (one["fairshare_half_life_s"], one["las_thresholds_gpu_s"]) == (7 * 24 * 3600, [])
    missing = admin.get("/api/v1/policies/nowhere/")
    assert (missing.status_code, missing.json()) == (404, {"detail": "No pool nowhere."})
    assert not PoolPolicy.objects.filter(pool=a100).exists()  # reading writes nothing


def test_admins_change_a_pools_policy_audited_field_by_field(admin, a100):
    change = {"policy": "las", "las_thresholds_gpu_s": [600, 6000], "preempt_signal": "SIGUSR1"}
    response = admin.patch("/api/v1/policies/a100/", change, format="json")
    assert response.status_code == 200, response.json()
    assert {name: response.json()[name] for name in change} == change
    row = PoolPolicy.objects.get(pool=a100)
    assert (row.policy, row.las_thresholds_gpu_s, row.preempt_signal) == (
        "las",
        [600, 6000],
        "SIGUSR1",
    )
    event = AuditEvent.objects.get(event_type="scheduler.policy_changed")
    assert event.before == {
        "policy": DEFAULT_POLICY,
        "las_thresholds_gpu_s": [],
        "preempt_signal": "SIGTERM",
    }
    assert (event.after, event.message, event.actor_name) == (change, "policy of pool a100", "ada")
    admin.patch("/api/v1/policies/a100/", change, format="json")  # the same: no second row
    # The GPUs in no pool are "~"; PUT wants every field.
    full = {**admin.get("/api/v1/policies/~/").json(), "backfill": False}
    assert admin.put("/api/v1/policies/~/", full, format="json").json()["backfill"] is False
    assert admin.put("/api/v1/policies/~/", {"backfill": True}, format="json").status_code == 400
    assert events("scheduling.poolpolicy") == ["scheduler.policy_changed"] * 2


def test_the_attained_service_exemption_is_the_pools_600_s_by_default(admin, a100):
    """``las_min_run_s``: 600 s until changed (the engine's default too), then what the pool
    says, as the engine reads it."""
    assert admin.get("/api/v1/policies/a100/").json()["las_min_run_s"] == 600
    assert quotas.config_of(quotas.policy_of(a100)).las_min_run_s == 600.0
    response = admin.patch("/api/v1/policies/a100/", {"las_min_run_s": 1800}, format="json")
    assert (response.status_code, response.json()["las_min_run_s"]) == (200, 1800)
    assert quotas.pool_configs()["a100"].las_min_run_s == 1800.0
    event = AuditEvent.objects.get(event_type="scheduler.policy_changed")
    assert (event.before, event.after) == ({"las_min_run_s": 600}, {"las_min_run_s": 1800})
    zero = admin.patch("/api/v1/policies/a100/", {"las_min_run_s": 0}, format="json")
    assert zero.status_code == 200  # attained service may stop a run at once


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"policy": "lottery"}, "policy"),
        ({"aging_interval_s": 0}, "aging_interval_s"),
        ({"fairshare_half_life_s": 59}, "fairshare_half_life_s"),
        ({"fairshare_weight": -1}, "fairshare_weight"),
        ({"las_thresholds_gpu_s": [600, 60]}, "las_thresholds_gpu_s"),
        ({"las_thresholds_gpu_s": [600, 600]}, "las_thresholds_gpu_s"),
        ({"las_thresholds_gpu_s": [0]}, "las_thresholds_gpu_s"),
        ({"las_thresholds_gpu_s": "600"}, "las_thresholds_gpu_s"),
        ({"las_thresholds_gpu_s": list(range(1, 11))}, "las_thresholds_gpu_s"),
        ({"preempt_signal": "SIGKILL"}, "preempt_signal"),
        ({"preempt_grace_s": 3601}, "preempt_grace_s"),
        ({"preempt_exempt_s": -1}, "preempt_exempt_s"),
        ({"preempt_exempt_s": 7 * 24 * 3600 + 1}, "preempt_exempt_s"),
        ({"las_min_run_s": -1}, "las_min_run_s"),
        ({"las_min_run_s": 7 * 24 * 3600 + 1}, "las_min_run_s"),
        ({"las_min_run_s": "ten minutes"}, "las_min_run_s"),
        ({"reservation_release_after_s": -5}, "reservation_release_after_s"),
        ({"backfill": "maybe"}, "backfill"),
        ({"qssf_points_per_halving": 0}, "qssf_points_per_halving"),
        ({"qssf_points_per_halving": 100_001}, "qssf_points_per_halving"),
        ({"prediction_trust_intervals": -1}, "prediction_trust_intervals"),
        ({"prediction_trust_intervals": 1.5}, "prediction_trust_intervals"),
    ],
)
def test_a_bad_policy_value_is_a_400_naming_it(admin, change, field):
    response = admin.patch("/api/v1/policies/~/", change, format="json")
    assert response.status_code == 400
    assert list(response.json()) == [field]
    assert not AuditEvent.objects.exists()


def test_users_read_policies_and_only_admins_change_them(alice):
    assert alice.get("/api/v1/policies/~/").status_code == 200
    assert alice.patch("/api/v1/policies/~/", {"backfill": False}, format="json").status_code == 403


def test_admins_keep_quotas_audited(admin, alice, a100):
    body = {"pool": "a100", "user": "alice", "max_gpus": 8, "gpu_hours": 500}
    created = admin.post("/api/v1/quotas/", body, format="json")
    assert created.status_code == 201, created.json()
    quota = created.json()
    assert {name: quota[name] for name in body} == body
    assert (quota["project"], quota["period"], quota["fairshare_weight"]) == ("", "month", 1)
    assert (quota["gpus_in_use"], quota["gpu_hours_used"]) == (0, 0)
    url = f"/api/v1/quotas/{quota['id']}/"
    assert admin.patch(url, {"period": "week"}, format="json").json()["period"] == "week"
    event = AuditEvent.objects.get(event_type="quota.changed")
    assert (event.before, event.after) == ({"period": "month"}, {"period": "week"})
    assert admin.delete(url).status_code == 204
    assert events("scheduling.quota") == ["quota.created", "quota.changed", "quota.deleted"]


@pytest.mark.parametrize("body", [{}, {"unknown": 1}, {"policy": DEFAULT_POLICY}])
def test_a_change_that_changes_nothing_writes_nothing(admin, alice, a100, body):
    """No row is made for a pool still on the defaults, no quota's updated_at moves, and
    nothing is audited."""
    response = admin.patch("/api/v1/policies/a100/", body, format="json")
    assert (response.status_code, response.json()["updated_at"]) == (200, None)
    assert not PoolPolicy.objects.filter(pool=a100).exists()
    quota = admin.post("/api/v1/quotas/", {"pool": "a100", "user": "alice"}, format="json")
    stamp = Quota.objects.get().updated_at
    unchanged = {key: value for key, value in body.items() if key != "policy"}
    response = admin.patch(f"/api/v1/quotas/{quota.json()['id']}/", unchanged, format="json")
    assert response.status_code == 200
    assert Quota.objects.get().updated_at == stamp
    assert events("scheduling.poolpolicy") == []
    assert events("scheduling.quota") == ["quota.created"]


def test_a_quota_of_the_gpus_in_no_pool_is_named_by_tilde(admin, alice):
    created = admin.post("/api/v1/quotas/", {"project": "p", "pool": "~"}, format="json")
    assert (created.status_code, created.json()["pool"]) == (201, None)


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"max_gpus": 4}, "user"),  # neither a user nor a project
        ({"user": "alice", "project": "vision"}, "project"),
        ({"user": "nobody"}, "user"),
        ({"pool": "nowhere", "project": "vision"}, "pool"),
        ({"project": "vision", "max_gpus": -1}, "max_gpus"),
        ({"project": "vision", "gpu_hours": 10**9}, "gpu_hours"),
        ({"project": "vision", "fairshare_weight": 0}, "fairshare_weight"),
        ({"project": "vision", "period": "year"}, "period"),
        ({"project": "x" * 101}, "project"),
        ({"project": "nul\x00"}, "project"),
        ({"project": "taken"}, "project"),  # a second quota of the project in no pool
    ],
)
def test_a_bad_quota_is_a_400_naming_the_field(admin, alice, body, field):
    Quota.objects.create(project="taken", max_gpus=1)
    response = admin.post("/api/v1/quotas/", body, format="json")
    assert response.status_code == 400
    assert list(response.json()) == [field]
    assert Quota.objects.count() == 1
    assert not AuditEvent.objects.exists()


def test_users_read_their_own_and_their_projects_quotas_with_their_use(api_as, alice, a100):
    viewer = api_as("vera", Role.VIEWER)
    bob = api_as("bob")
    (node,) = add_fleet(1)
    job = Job.objects.create(
        owner=alice.user, command=["true"], project="vision", pool=a100, state=JobState.RUNNING
    )
    Allocation.objects.create(job=job, gpu=node.gpus.get(index=0), node=node)
    mine = Quota.objects.create(user=alice.user, pool=a100, max_gpus=8)
    project = Quota.objects.create(project="vision", pool=a100, max_gpus=16)
    bobs = Quota.objects.create(user=bob.user, max_gpus=1)

    listed = alice.get("/api/v1/quotas/").json()["results"]
    assert [(row["id"], row["gpus_in_use"]) for row in listed] == [(mine.pk, 1), (project.pk, 1)]
    assert alice.get(f"/api/v1/quotas/{bobs.pk}/").status_code == 404
    assert alice.get(f"/api/v1/quotas/{mine.pk}/").json()["gpus_in_use"] == 1
    assert viewer.get("/api/v1/quotas/").json()["count"] == 3
    assert alice.post("/api/v1/quotas/", {"project": "x"}, format="json").status_code == 403
    lines = alice.get("/api/v1/quotas/mine/").json()
    assert [(line["holder"], line["text"]) for line in lines] == [
        ("you", "you use 1 of 8 GPUs in pool a100; 0 GPU-hours this month"),
        ("project vision", "project vision uses 1 of 16 GPUs in pool a100; 0 GPU-hours this month"),
    ]
