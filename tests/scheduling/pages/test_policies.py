"""The policies page and its form (admins), the quotas page and its forms (admins), the
fair-share page ("why is my priority what it is") and its API, and the "My usage" panel on
the job pages."""

from __future__ import annotations

import math
import re
from datetime import timedelta

import pytest
from django.utils import timezone
from django.utils.text import capfirst

from gpuadmin.access.models import Role
from gpuadmin.audit.models import AuditEvent
from inventory.models import Pool
from scheduling.models import Allocation, Job, JobState, PoolPolicy, Quota
from scheduling.placement.fairshare import fairshare_factor
from scheduling.placement.snapshot import DEFAULT_POLICY
from tests.gpuadmin.test_permission_matrix import POLICY_FORM
from tests.scheduling.pages.helpers import add_fleet, person, place, submit

pytestmark = pytest.mark.django_db


def decayed(start_h: float, end_h: float, half_life_h: float) -> float:
    """GPU-hours held from ``start_h`` to ``end_h`` hours ago, decayed to now."""
    return half_life_h / math.log(2) * (2 ** (-end_h / half_life_h) - 2 ** (-start_h / half_life_h))


def section(html: str, name: str) -> str:
    return re.search(rf'<section [^>]*aria-labelledby="{name}-title">.*?</section>', html, re.S)[0]


@pytest.fixture
def admin(db):
    return person("ada", Role.ADMIN)


def test_everyone_signed_in_reads_every_pools_policy_and_admins_may_edit(client, alice, admin):
    Pool.objects.create(name="a100")
    PoolPolicy.objects.create(pool=Pool.objects.get(), policy="las", las_thresholds_gpu_s=[60])
    client.force_login(alice)
    html = client.get("/policies/").content.decode()
    assert re.search(rf'<tr id="policy-~" data-policy="{DEFAULT_POLICY}">', html)
    assert re.search(
        r'<tr id="policy-a100" data-policy="las">.*?<td class="num">60</td>', html, re.S
    )
    assert "/policies/~/" not in html  # no edit link for users
    # preempt_exempt_s 0 by default: preemptible work is stopped at once; for less attained
    # service (qssf, las) after the pool's las_min_run_s, 600 s by default.
    assert re.search(
        r'<tr id="policy-~".*?at once; for less attained service after 10 min; SIGTERM, 30 s to '
        "checkpoint",
        html,
        re.S,
    )
    # Each pool's qssf weight and trust in predicted runtimes, as set.
    assert re.search(
        r'<tr id="policy-~".*?250 points per halving.*?under 360 aging intervals', html, re.S
    )
    assert client.get("/policies/~/").status_code == 403
    client.force_login(admin)
    assert 'href="/policies/a100/"' in client.get("/policies/").content.decode()


def test_the_policy_form_labels_and_explains_every_field_in_words(client, admin, admin_client):
    client.force_login(admin)
    form = client.get("/policies/~/").context["form"]
    for name, field in form.fields.items():
        assert field.label and field.label != capfirst(name.replace("_", " ")), name
        assert field.help_text, f"{name} has no help text"
    assert form.fields["las_thresholds_gpu_s"].label == "LAS queue thresholds (GPU-seconds)"
    assert form.fields["dynamic_mig"].label == "Create MIG instances on demand"
    html = client.get("/policies/~/").content.decode()
    assert "Las thresholds gpu s" not in html and "Dynamic mig" not in html
    admin_form = admin_client.get(f"/admin/scheduling/poolpolicy/{PoolPolicy.default().pk}/change/")
    assert "Fair-share half-life (seconds)" in admin_form.content.decode()


def test_an_admin_changes_a_policy_through_the_form_audited(client, admin):
    client.force_login(admin)
    form = client.get("/policies/~/")
    assert form.status_code == 200
    response = client.post("/policies/~/", POLICY_FORM)
    assert response.status_code == 302
    row = PoolPolicy.default()
    assert (row.policy, row.fairshare_half_life_s, row.preemption) == ("fairshare", 3600, False)
    event = AuditEvent.objects.get(event_type="scheduler.policy_changed")
    assert event.after == {
        "policy": "fairshare",
        "fairshare_half_life_s": 3600,
        "fairshare_weight": 100,
        "preemption": False,
        "reservation_auto_approve": False,
    }
    assert client.get("/policies/nowhere/").status_code == 404
    client.post("/policies/~/", {**POLICY_FORM, "dynamic_mig": "on"})  # a box, as every other
    assert PoolPolicy.default().dynamic_mig is True
    changes = AuditEvent.objects.filter(event_type="scheduler.policy_changed").order_by("pk")
    assert changes.last().after == {"dynamic_mig": True}


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"las_thresholds_gpu_s": "600,60"}, "las_thresholds_gpu_s"),
        ({"aging_interval_s": "0"}, "aging_interval_s"),
        ({"aging_interval_s": str(10**8)}, "aging_interval_s"),
        ({"preempt_signal": "SIGKILL"}, "preempt_signal"),
        ({"policy": "lottery"}, "policy"),
        ({"qssf_points_per_halving": "0"}, "qssf_points_per_halving"),
        ({"prediction_trust_intervals": "-1"}, "prediction_trust_intervals"),
        ({"las_min_run_s": str(7 * 24 * 3600 + 1)}, "las_min_run_s"),
    ],
)
def test_a_bad_value_shows_on_its_field(client, admin, change, field):
    client.force_login(admin)
    response = client.post("/policies/~/", {**POLICY_FORM, **change})
    assert response.status_code == 400
    assert list(response.context["form"].errors) == [field]
    assert f'id="id_{field}-error"' in response.content.decode()
    assert not AuditEvent.objects.exists()


def test_the_fair_share_page_explains_each_users_standing(client, alice, bob):
    (node,) = add_fleet(1)
    gpus = list(node.gpus.order_by("index"))
    now = timezone.now()
    for user, gpu, hours in [(alice, gpus[0], 3), (bob, gpus[1], 1)]:
        job = Job.objects.create(
            owner=user, command=["true"], project="vision", state=JobState.COMPLETED
        )
        start = now - timedelta(hours=hours + 1)
        Allocation.objects.create(
            job=job, gpu=gpu, node=node, allocated_at=start, released_at=now - timedelta(hours=1)
        )
    Quota.objects.create(user=bob, max_gpus=4, fairshare_weight=1)
    client.force_login(alice)

    html = client.get("/fairshare/").content.decode()

    assert "count half after 7 days" in html and "0:00:00" not in html
    policies = client.get("/policies/").content.decode()
    assert '<td class="num">7 days</td>' in policies and "604800 s" not in policies
    users = section(html, "users")
    assert users.index(f'data-holder="{bob.pk}"') < users.index(f'data-holder="{alice.pk}"')
    # Alice used 3 of the 4 GPU-hours (decayed by a week's half-life) on half the shares.
    week = 7 * 24.0
    alice_used, bob_used = decayed(4, 1, week), decayed(2, 1, week)
    alice_factor = fairshare_factor(alice_used, alice_used + bob_used, 1, 2)
    mine = re.search(r'<tr class="mine".*?</tr>', users, re.S)[0]
    assert "alice" in mine and f"{alice_factor:.3f}" in mine
    why = section(html, "why")
    assert "number 2</strong> of 2 users" in why
    assert "With project <strong>vision</strong>" in why
    assert "Weighted fair share" not in why  # the pool's policy is the default, qssf
    assert "shortest predicted service first" in why
    assert 'data-holder="vision"' in section(html, "projects")
    assert client.get("/fairshare/?pool=nowhere").status_code == 404

    # The API answers the same standing.
    body = client.get("/api/v1/fairshare/").json()
    assert (body["pool"], body["policy"]) == (None, DEFAULT_POLICY)
    assert body["half_life_s"] == week * 3600
    assert [(row["name"], row["position"], row["mine"]) for row in body["users"]] == [
        ("bob", 1, False),
        ("alice", 2, True),
    ]
    assert body["users"][1]["factor"] == pytest.approx(alice_factor, abs=1e-3)
    assert body["users"][1]["usage_gpu_hours"] == pytest.approx(alice_used, rel=1e-3)
    assert body["users"][0]["weight"] == 1 and body["users"][0]["share"] == 0.5
    assert [row["name"] for row in body["projects"]] == ["vision"]
    assert [why["project"] for why in body["explanations"]] == [None, "vision"]
    with_project = body["explanations"][1]
    assert with_project["user_factor"] == pytest.approx(alice_factor, abs=1e-3)
    assert with_project["factor"] == pytest.approx(
        (with_project["user_factor"] + with_project["project_factor"]) / 2
    )
    assert with_project["sentences"][-1].endswith("fair-share priority points")
    assert client.get("/api/v1/fairshare/?pool=nowhere").status_code == 404


def test_the_fair_share_page_explains_qssf_where_a_pool_uses_it(client, alice):
    a100 = Pool.objects.create(name="a100")
    PoolPolicy.objects.create(
        pool=a100, policy="qssf", aging_interval_s=120, qssf_points_per_halving=1000
    )
    PoolPolicy.objects.create(pool=None, policy="priority")
    client.force_login(alice)

    why = section(client.get("/fairshare/?pool=a100").content.decode(), "why")
    plain = section(client.get("/fairshare/").content.decode(), "why")

    assert "shortest predicted service first" in why
    assert "Under QSSF a waiting job scores" in why
    assert "plus 1000 points (this pool's setting) for each halving" in why
    assert "one point per 120 s waited" in why
    assert "Under QSSF" not in plain


def test_my_usage_shows_on_the_job_pages(client, alice, agents):
    add_fleet(1)
    Quota.objects.create(user=alice, max_gpus=8, gpu_hours=500)
    client.force_login(alice)
    line = "you use 0 of 8 GPUs in no pool; 0 of 500 GPU-hours this month"
    for page in ("/jobs/new/", "/jobs/", "/policies/", "/fairshare/"):
        assert line in section(client.get(page).content.decode(), "my-usage"), page


def test_the_quotas_page_shows_each_visible_quota_with_its_use(client, alice, bob, admin, agents):
    add_fleet(1)
    mine = Quota.objects.create(user=alice, max_gpus=2, gpu_hours=500, period="week")
    theirs = Quota.objects.create(user=bob, max_gpus=8)
    place(submit(alice, gpu_count=2))
    client.force_login(alice)
    html = client.get("/quotas/").content.decode()
    row = re.search(rf'<tr id="quota-{mine.pk}" data-over="true">.*?</tr>', html, re.S)[0]
    assert "user alice" in row and "2 of 2" in row and "of 500 this week" in row
    assert "at quota" in row
    assert f"quota-{theirs.pk}" not in html  # a user sees their own and their projects'
    assert "/quotas/new/" not in html and f"/quotas/{mine.pk}/" not in html
    client.force_login(admin)
    html = client.get("/quotas/").content.decode()
    assert f'<tr id="quota-{theirs.pk}" data-over="false">' in html
    assert 'href="/quotas/new/"' in html and f'action="/quotas/{theirs.pk}/delete/"' in html


def test_an_admin_adds_changes_and_removes_a_quota_through_the_pages_audited(client, admin):
    client.force_login(admin)
    assert client.get("/quotas/new/").status_code == 200
    form = {"project": "vision", "max_gpus": "8", "period": "month", "fairshare_weight": "2"}
    assert client.post("/quotas/new/", form).status_code == 302
    quota = Quota.objects.get()
    assert (quota.project, quota.max_gpus, quota.gpu_hours) == ("vision", 8, None)
    assert client.post(f"/quotas/{quota.pk}/", {**form, "gpu_hours": "500"}).status_code == 302
    quota.refresh_from_db()
    assert quota.gpu_hours == 500
    assert client.post(f"/quotas/{quota.pk}/delete/").status_code == 302
    assert not Quota.objects.exists()
    assert list(
        AuditEvent.objects.filter(target_type="scheduling.quota")
        .order_by("id")
        .values_list("event_type", flat=True)
    ) == ["quota.created", "quota.changed", "quota.deleted"]
    assert client.get(f"/quotas/{quota.pk}/").status_code == 404
    assert client.post(f"/quotas/{quota.pk}/delete/").status_code == 404


@pytest.mark.parametrize(
    ("form", "field"),
    [
        ({"project": "", "max_gpus": "8"}, "user"),  # no holder
        ({"project": "vision", "max_gpus": "-1"}, "max_gpus"),
        ({"project": "vision", "gpu_hours": "10e99"}, "gpu_hours"),
        ({"project": "vision", "period": "decade"}, "period"),
        ({"project": "vision", "fairshare_weight": "0"}, "fairshare_weight"),
        ({"project": "taken"}, "project"),  # one quota per holder and pool
    ],
)
@pytest.mark.parametrize("also", [{}, {"gpu_hours": "lots"}])
def test_a_bad_quota_shows_on_its_field_and_saves_nothing(client, admin, form, field, also):
    """Each error on its field, also beside another field's (no error of the table's own)."""
    Quota.objects.create(project="taken")
    client.force_login(admin)
    body = {"period": "month", "fairshare_weight": "1", **form, **also}
    response = client.post("/quotas/new/", body)
    assert response.status_code == 400
    assert response.context["form"].errors.keys() == {field, *also}
    assert Quota.objects.count() == 1
    assert not AuditEvent.objects.filter(event_type="quota.created").exists()
