"""Pool policies and quotas in the Django admin: the services' rules on the form's fields, and
every save through the audited services."""

from __future__ import annotations

import pytest

from gpuadmin.audit.models import AuditEvent
from inventory.models import Pool
from scheduling.models import PoolPolicy, Quota
from scheduling.placement.snapshot import DEFAULT_POLICY

pytestmark = pytest.mark.django_db


def policy_form(**changes: str) -> dict[str, str]:
    return {
        "policy": DEFAULT_POLICY,
        "backfill": "on",
        "aging_interval_s": "60",
        "fairshare_half_life_s": "604800",
        "fairshare_weight": "10000",
        "las_thresholds_gpu_s": "",
        "qssf_points_per_halving": "250",
        "prediction_trust_intervals": "360",
        "allow_borrowing": "on",
        "preemption": "on",
        "preempt_exempt_s": "0",
        "las_min_run_s": "600",
        "preempt_signal": "SIGTERM",
        "preempt_grace_s": "30",
        "reservation_auto_approve": "on",
        "reservation_release_after_s": "900",
        **changes,
    }


def test_a_pools_policy_is_added_and_changed_through_the_service(admin_client):
    assert admin_client.get("/admin/scheduling/poolpolicy/").status_code == 200
    default = PoolPolicy.objects.get(pool=None)  # the list's first look made it
    pool = Pool.objects.create(name="a100")
    added = admin_client.post(
        "/admin/scheduling/poolpolicy/add/", policy_form(pool=str(pool.pk), policy="sjf")
    )
    assert added.status_code == 302, added.content.decode()[:2000]
    assert PoolPolicy.objects.get(pool=pool).policy == "sjf"
    url = f"/admin/scheduling/poolpolicy/{default.pk}/change/"
    refused = admin_client.post(url, policy_form(las_thresholds_gpu_s="3600,60"))
    assert refused.status_code == 200
    assert list(refused.context["adminform"].form.errors) == ["las_thresholds_gpu_s"]
    refused = admin_client.post(url, policy_form(qssf_points_per_halving="0"))
    assert list(refused.context["adminform"].form.errors) == ["qssf_points_per_halving"]
    assert admin_client.post(url, policy_form(preempt_grace_s="90")).status_code == 302
    qssf = policy_form(
        preempt_grace_s="90", qssf_points_per_halving="1000", prediction_trust_intervals="60"
    )
    assert admin_client.post(url, qssf).status_code == 302
    rows = AuditEvent.objects.order_by("pk").values_list("event_type", "message", "after")
    assert list(rows) == [
        ("scheduler.policy_changed", "policy of pool a100", {"policy": "sjf"}),
        ("scheduler.policy_changed", "policy of no pool", {"preempt_grace_s": 90}),
        (
            "scheduler.policy_changed",
            "policy of no pool",
            {"qssf_points_per_halving": 1000, "prediction_trust_intervals": 60},
        ),
    ]


def test_a_policy_added_with_every_default_is_a_row_and_no_change(admin_client):
    pool = Pool.objects.create(name="a100")
    added = admin_client.post("/admin/scheduling/poolpolicy/add/", policy_form(pool=str(pool.pk)))
    assert added.status_code == 302, added.content.decode()[:2000]
    assert PoolPolicy.objects.get(pool=pool).policy == DEFAULT_POLICY
    assert not AuditEvent.objects.filter(event_type="scheduler.policy_changed").exists()


def test_a_quota_form_names_the_field_the_service_refuses(admin_client, admin_user):
    form = {"project": "vision", "user": str(admin_user.pk), "period": "month"}
    refused = admin_client.post("/admin/scheduling/quota/add/", {**form, "fairshare_weight": "1"})
    assert refused.status_code == 200
    assert list(refused.context["adminform"].form.errors) == ["project"]
    added = admin_client.post(
        "/admin/scheduling/quota/add/", {**form, "user": "", "fairshare_weight": "2"}
    )
    assert added.status_code == 302
    assert Quota.objects.get().fairshare_weight == 2
    again = admin_client.post(
        "/admin/scheduling/quota/add/", {**form, "user": "", "fairshare_weight": "2"}
    )
    assert "already has a quota in no pool" in again.content.decode()
    assert list(AuditEvent.objects.values_list("event_type", flat=True)) == ["quota.created"]


def test_every_refusal_of_a_quota_form_is_on_its_field(admin_client, client, admin_user):
    """A second quota of a holder is said on the holder's field next to a bad limit (not by
    the table's constraint, fieldless), and not at all when the pool asked for is unknown."""
    Quota.objects.create(project="vision")
    form = {"project": "vision", "period": "month", "fairshare_weight": "1"}
    client.force_login(admin_user)
    in_admin = admin_client.post("/admin/scheduling/quota/add/", {**form, "max_gpus": "100001"})
    on_page = client.post("/quotas/new/", {**form, "max_gpus": "100001"})
    for errors in (in_admin.context["adminform"].form.errors, on_page.context["form"].errors):
        assert sorted(errors) == ["max_gpus", "project"]
        assert errors["project"] == ["already has a quota in no pool"]
    unknown = admin_client.post("/admin/scheduling/quota/add/", {**form, "pool": "999999"})
    assert list(unknown.context["adminform"].form.errors) == ["pool"]
    assert Quota.objects.count() == 1
