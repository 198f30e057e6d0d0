"""/orchestrator: the placement loop's switch and policy, audited."""

from __future__ import annotations

import pytest

from gpuadmin.access.models import Role
from gpuadmin.audit.models import AuditEvent
from inventory.models import Pool
from scheduling.loop import passes as loop
from scheduling.models import PoolPolicy, SchedulerSettings
from scheduling.placement.snapshot import DEFAULT_POLICY
from scheduling.policies.api import PoolPolicySerializer
from scheduling.policies.services import POLICY_FIELDS
from tests.scheduling.api.conftest import events, submit

pytestmark = pytest.mark.django_db


def answered(response) -> dict:
    """A PUT's answer (the whole policy) less its time, to compare with what was sent."""
    body = response.json()
    assert set(body) == {"pool", *POLICY_FIELDS, "updated_at"}
    return {name: value for name, value in body.items() if name != "updated_at"}


# The settings a PUT that leaves them out keeps (the defaults), shown in its answer.
DEFAULTS = {
    name: value
    for name, value in PoolPolicySerializer(PoolPolicy()).data.items()
    if name in POLICY_FIELDS
}


@pytest.fixture
def admin(api_as):
    return api_as("ada", Role.ADMIN)


def test_status(admin, fleet):
    submit(admin.user)
    body = admin.get("/orchestrator/status").json()
    assert (body["enabled"], body["policy"], body["aging_interval_s"]) == (True, DEFAULT_POLICY, 60)
    assert body["jobs"] == {"pending": 0, "queued": 1, "scheduled": 0, "running": 0}
    assert (body["gpus_present"], body["gpus_allocated"], body["gpus_free"]) == (16, 0, 16)
    assert body["last_scheduled_at"] is None


def test_stop_and_start_are_audited(admin, db):
    stopped = admin.post("/orchestrator/stop")
    assert (stopped.status_code, stopped.json()["enabled"]) == (200, False)
    assert SchedulerSettings.load().enabled is False
    admin.post("/orchestrator/stop")  # already stopped: no change, no row
    assert admin.post("/orchestrator/start").json()["enabled"] is True
    assert events("scheduling.schedulersettings") == ["scheduler.stopped", "scheduler.started"]
    row = AuditEvent.objects.get(event_type="scheduler.stopped")
    assert (row.actor_name, row.before, row.after) == ("ada", {"enabled": True}, {"enabled": False})


def test_policies(admin, db):
    body = admin.get("/orchestrator/policies").json()
    assert (body["policy"], body["aging_interval_s"]) == (DEFAULT_POLICY, 60)
    assert [(row["pool"], row["policy"]) for row in body["pools"]] == [(None, DEFAULT_POLICY)]
    change = {"policy": "fcfs", "aging_interval_s": 120}
    response = admin.put("/orchestrator/policies", change, format="json")
    assert (response.status_code, answered(response)) == (200, {**DEFAULTS, "pool": None, **change})
    config = PoolPolicy.default()
    assert (config.policy, config.aging_interval_s) == ("fcfs", 120)
    row = AuditEvent.objects.get(event_type="scheduler.policy_changed")
    assert (row.before, row.after) == ({"policy": DEFAULT_POLICY, "aging_interval_s": 60}, change)
    assert row.message == "policy of no pool"
    admin.put("/orchestrator/policies", change, format="json")  # unchanged: no second row
    # ~ names the GPUs in no pool, as in /api/v1/policies/~/
    admin.put("/orchestrator/policies", {**change, "pool": "~"}, format="json")
    assert events("scheduling.poolpolicy") == ["scheduler.policy_changed"]


def test_a_pools_policy_is_set_by_naming_it(admin, db):
    Pool.objects.create(name="a100")
    change = {"pool": "a100", "policy": "fairshare", "aging_interval_s": 60}
    response = admin.put("/orchestrator/policies", change, format="json")
    assert (response.status_code, answered(response)) == (200, {**DEFAULTS, **change})
    body = admin.get("/orchestrator/policies").json()
    assert body["policy"] == DEFAULT_POLICY  # the GPUs in no pool keep theirs
    assert [(row["pool"], row["policy"]) for row in body["pools"]] == [
        (None, DEFAULT_POLICY),
        ("a100", "fairshare"),
    ]
    row = AuditEvent.objects.get(event_type="scheduler.policy_changed")
    assert (row.before, row.after, row.message) == (
        {"policy": DEFAULT_POLICY},
        {"policy": "fairshare"},
        "policy of pool a100",
    )


def test_a_pools_qssf_settings_are_set_with_its_policy(admin, db):
    Pool.objects.create(name="a100")
    change = {
        "pool": "a100",
        "policy": "qssf",
        "aging_interval_s": 60,
        "qssf_points_per_halving": 1000,
        "prediction_trust_intervals": 120,
    }
    response = admin.put("/orchestrator/policies", change, format="json")
    assert (response.status_code, answered(response)) == (200, {**DEFAULTS, **change})
    (row,) = [row for row in admin.get("/orchestrator/policies").json()["pools"] if row["pool"]]
    assert (row["qssf_points_per_halving"], row["prediction_trust_intervals"]) == (1000, 120)
    event = AuditEvent.objects.get(event_type="scheduler.policy_changed")
    assert event.after == {"qssf_points_per_halving": 1000, "prediction_trust_intervals": 120}


def test_every_policy_setting_may_be_put(admin, db):
    """Not only the seed's two: backfill, fair share, LAS, borrowing, preemption, dynamic MIG
    and reservations are set through this route as through /api/v1/policies/<pool>/."""
    Pool.objects.create(name="a100")
    change = {
        "pool": "a100",
        "policy": "las",
        "aging_interval_s": 60,
        "backfill": False,
        "fairshare_half_life_s": 3600,
        "las_thresholds_gpu_s": [100, 1000],
        "allow_borrowing": False,
        "preemption": False,
        "preempt_signal": "SIGUSR1",
        "preempt_grace_s": 120,
        "dynamic_mig": True,
    }
    response = admin.put("/orchestrator/policies", change, format="json")
    assert (response.status_code, answered(response)) == (200, {**DEFAULTS, **change})
    config = PoolPolicy.objects.get(pool__name="a100")
    assert (config.backfill, config.las_thresholds_gpu_s, config.preempt_signal) == (
        False,
        [100, 1000],
        "SIGUSR1",
    )
    event = AuditEvent.objects.get(event_type="scheduler.policy_changed")
    assert set(event.after) == set(change) - {"pool", "aging_interval_s"}


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"policy": "lottery", "aging_interval_s": 60}, "policy"),
        ({"policy": "fcfs", "aging_interval_s": 0}, "aging_interval_s"),
        ({"policy": "fcfs", "aging_interval_s": 10**9}, "aging_interval_s"),
        ({"policy": "fcfs", "aging_interval_s": "soon"}, "aging_interval_s"),
        ({"policy": "fcfs"}, "aging_interval_s"),
        ({"pool": "nowhere", "policy": "fcfs", "aging_interval_s": 60}, "pool"),
        (
            {"policy": "qssf", "aging_interval_s": 60, "qssf_points_per_halving": 0},
            "qssf_points_per_halving",
        ),
        (
            {"policy": "qssf", "aging_interval_s": 60, "qssf_points_per_halving": "steep"},
            "qssf_points_per_halving",
        ),
        (
            {"policy": "qssf", "aging_interval_s": 60, "prediction_trust_intervals": -1},
            "prediction_trust_intervals",
        ),
        ({"policy": "las", "aging_interval_s": 60, "backfill": "maybe"}, "backfill"),
        ({"policy": "las", "aging_interval_s": 60, "preempt_signal": "SIGKILL"}, "preempt_signal"),
        (
            {"policy": "las", "aging_interval_s": 60, "las_thresholds_gpu_s": [10, 5]},
            "las_thresholds_gpu_s",
        ),
    ],
)
def test_bad_policies_name_the_field(admin, db, body, field):
    response = admin.put("/orchestrator/policies", body, format="json")
    assert response.status_code == 400
    assert list(response.json()) == [field]
    assert PoolPolicy.default().policy == DEFAULT_POLICY
    assert not AuditEvent.objects.exists()


def test_waiting_jobs_say_the_scheduler_is_stopped_until_it_starts(admin, fleet):
    """Not "the scheduler has not looked at it yet": a stop wakes a pass that tells every
    queued job so; the pass after the start gives each its own reason again."""
    first = submit(admin.user, gpu_count=8)
    waiting = submit(admin.user, gpu_count=8, dependency=f"afterok:{first.pk}")
    loop.run_pass()
    assert admin.post("/orchestrator/stop").status_code == 200
    late = submit(admin.user, gpu_count=8)  # submitted while stopped
    loop.run_pass()  # what the stop's wake runs
    for job in (waiting, late):
        body = admin.get(f"/api/v1/jobs/{job.pk}/").json()
        assert (body["state"], body["pending_code"], body["pending_reason"]) == (
            "queued",
            "scheduler_stopped",
            "the scheduler is stopped: nothing is placed until an admin starts it again",
        )
        assert (body["queue_position"], body["estimated_start_at"]) == (None, None)
    assert admin.post("/orchestrator/start").status_code == 200
    loop.run_pass()
    body = admin.get(f"/api/v1/jobs/{waiting.pk}/").json()
    assert (body["pending_code"], body["pending_reason"]) == (
        "dependency",
        f"waiting for job {first.pk} to complete (afterok)",
    )
    assert admin.get(f"/api/v1/jobs/{late.pk}/").json()["state"] == "scheduled"
