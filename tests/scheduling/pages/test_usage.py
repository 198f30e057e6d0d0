"""Accounting: GPU-hours per user, project and pool from allocations and telemetry rollups,
the usage page with its budgets, its CSV export and its API (``/api/v1/usage/``)."""

from __future__ import annotations

import csv
import io
import re
from datetime import date, datetime, timedelta

import pytest
from django.db import connection
from django.utils import timezone
from rest_framework.test import APIClient

from gpuadmin.access.models import Role
from inventory.models import Gpu, MigInstance, Pool
from scheduling.allocations import accounting
from scheduling.models import Allocation, Job, JobState, Quota, QuotaPeriod, UsageDay
from scheduling.policies import quotas
from tests.scheduling.pages.helpers import add_fleet, person

DAY = date(2026, 11, 2)


def at(hour: float, day: date = DAY) -> datetime:
    start, _ = accounting.day_bounds(day)
    return start + timedelta(hours=hour)


def finished_job(owner, *, project: str = "", pool: Pool | None = None) -> Job:
    return Job.objects.create(
        owner=owner, command=["true"], state=JobState.COMPLETED, project=project, pool=pool
    )


def held(job: Job, gpu: Gpu, start: datetime, end: datetime | None, **share) -> Allocation:
    return Allocation.objects.create(
        job=job, gpu=gpu, node=gpu.node, allocated_at=start, released_at=end, **share
    )


def rollups(gpu: Gpu, start: datetime, minutes: int, utilization: float, energy_mj: int) -> None:
    """One telemetry rollup row per minute, as health.maintain_telemetry writes them."""
    with connection.cursor() as cursor:
        cursor.executemany(
            "INSERT INTO health_gpurollup (gpu_id, minute, samples, utilization_avg, energy_mj)"
            " VALUES (%s, %s, 30, %s, %s)",
            [
                (gpu.pk, start + timedelta(minutes=n), utilization, energy_mj)
                for n in range(minutes)
            ],
        )


@pytest.fixture
def gpus(db) -> list[Gpu]:
    (node,) = add_fleet(1)
    return list(node.gpus.order_by("index"))


def test_a_whole_gpu_counts_allocated_used_idle_and_energy(alice, gpus):
    pool = Pool.objects.create(name="a100")
    job = finished_job(alice, project="vision", pool=pool)
    held(job, gpus[0], at(1), at(3))  # two hours
    rollups(gpus[0], at(1), 60, utilization=50, energy_mj=6_000_000)  # 6 kJ a minute
    rollups(gpus[0], at(2), 60, utilization=2, energy_mj=1_000_000)  # idle (under 5 %)
    rollups(gpus[0], at(4), 30, utilization=90, energy_mj=9_000_000)  # after the release

    assert accounting.roll_up(DAY, now=at(30)) == 1

    row = UsageDay.objects.get()
    assert (row.day, row.pool, row.user, row.project) == (DAY, pool, alice, "vision")
    assert row.allocated_gpu_s == pytest.approx(2 * 3600)
    assert row.used_gpu_s == pytest.approx(60 * 60 * 0.5 + 60 * 60 * 0.02)
    assert row.idle_held_gpu_s == pytest.approx(3600)
    assert row.energy_j == pytest.approx(60 * 6000 + 60 * 1000)
    assert row.mig_slice_s == row.mps_gpu_s == 0


def test_an_allocation_across_midnight_counts_on_each_day_and_a_running_one_until_now(alice, gpus):
    job = finished_job(alice)
    held(job, gpus[0], at(22), at(26))  # 2 h on DAY, 2 h the day after
    held(finished_job(alice), gpus[1], at(23), None)  # still held

    accounting.roll_up(DAY, now=at(25))
    accounting.roll_up(DAY + timedelta(days=1), now=at(25))

    by_day = dict(UsageDay.objects.values_list("day", "allocated_gpu_s"))
    assert by_day[DAY] == pytest.approx(2 * 3600 + 3600)
    assert by_day[DAY + timedelta(days=1)] == pytest.approx(3600 + 3600)  # both until now


def test_shares_count_as_their_fraction_of_a_gpu(alice, gpus):
    mps_gpu, mig_gpu = gpus[0], gpus[1]
    held(finished_job(alice), mps_gpu, at(0), at(10), kind="mps", mps_percent=25)
    rollups(mps_gpu, at(0), 600, utilization=80, energy_mj=4_000_000)
    device = MigInstance.objects.create(
        gpu=mig_gpu,
        gi_id=1,
        ci_id=0,
        profile_name="3g.40gb",
        profile_id=9,
        ci_profile_name="3g.40gb",
        placement_start=0,
        placement_size=4,
        memory_mib=40_192,
        sm_count=42,
    )
    held(finished_job(alice), mig_gpu, at(0), at(7), kind="mig", mig_instance=device)
    rollups(mig_gpu, at(0), 420, utilization=100, energy_mj=5_000_000)  # not the device's

    accounting.roll_up(DAY, now=at(30))

    row = UsageDay.objects.get()
    assert row.allocated_gpu_s == pytest.approx(10 * 3600 * 0.25 + 7 * 3600 * 3 / 7)
    assert row.mps_gpu_s == pytest.approx(10 * 3600 * 0.25)
    assert row.mig_slice_s == pytest.approx(7 * 3600 * 3)
    # Only the MPS share's part of its GPU's utilization and energy; none of the MIG GPU's.
    assert row.used_gpu_s == pytest.approx(600 * 60 * 0.8 * 0.25)
    assert row.energy_j == pytest.approx(600 * 4000 * 0.25)


def test_cpu_hours_count_the_jobs_that_ended_that_day_beside_their_gpu_hours(
    client, alice, bob, gpus
):
    """A job's CPU time (all its runs', from their cgroups) counts whole on the day it ended, as
    sacct's TotalCPU; a job still running or ended another day adds none."""
    ended = finished_job(alice, project="vision")
    Job.objects.filter(pk=ended.pk).update(finished_at=at(3), cpu_seconds=5400.0)
    held(ended, gpus[0], at(1), at(3))
    later = finished_job(alice, project="vision")  # ended the next day
    next_day = DAY + timedelta(days=1)
    Job.objects.filter(pk=later.pk).update(finished_at=at(1, next_day), cpu_seconds=7200.0)
    held(later, gpus[1], at(23), at(1, next_day))
    running = Job.objects.create(owner=bob, command=["true"], state=JobState.RUNNING)
    held(running, gpus[2], at(2), None)
    unmeasured = finished_job(bob)
    Job.objects.filter(pk=unmeasured.pk).update(finished_at=at(4))

    accounting.roll_up(DAY, now=at(30))

    mine = UsageDay.objects.get(user=alice)
    assert (mine.allocated_gpu_s, mine.cpu_s) == (pytest.approx(3 * 3600), 5400.0)
    assert UsageDay.objects.get(user=bob).cpu_s == 0
    client.force_login(alice)
    query = {"start": "2026-11-01", "end": "2026-11-02"}
    page = client.get("/usage/", query).content.decode()
    assert '<th title="CPU time of the jobs that ended in the period' in page
    alice_row = r'<tr data-name="alice">.*<td class="num">0.00</td><td class="num">1.5</td></tr>'
    assert re.search(alice_row, page)
    rows = csv.DictReader(io.StringIO(client.get("/usage.csv", query).content.decode()))
    assert {row["user"]: float(row["cpu_hours"]) for row in rows} == {"alice": 1.5, "bob": 0}
    api = APIClient()
    api.force_authenticate(bob)
    body = api.get("/api/v1/usage/", query).json()
    assert {r["name"]: r["cpu_hours"] for r in body["rows"]} == {"alice": 1.5, "bob": 0.0}
    assert body["total"]["cpu_hours"] == pytest.approx(1.5)


def test_a_day_is_recomputed_whole(alice, bob, gpus):
    job = finished_job(alice)
    allocation = held(job, gpus[0], at(1), at(2))
    accounting.roll_up(DAY, now=at(30))
    Allocation.objects.filter(pk=allocation.pk).update(released_at=at(5))
    held(finished_job(bob, project="nlp"), gpus[1], at(1), at(2))

    assert accounting.roll_up(DAY, now=at(30)) == 2

    rows = {(row.user.username, row.project): row.allocated_gpu_s for row in UsageDay.objects.all()}
    assert rows == {("alice", ""): pytest.approx(4 * 3600), ("bob", "nlp"): pytest.approx(3600)}


def test_the_usage_page_shows_everyone_per_user_or_project_with_a_bar_a_day(
    client, alice, bob, gpus
):
    held(finished_job(alice, project="vision"), gpus[0], at(1), at(4))
    held(finished_job(bob, project="nlp"), gpus[1], at(1), at(2))
    accounting.roll_up(DAY, now=at(30))
    period = {"start": "2026-11-01", "end": "2026-11-30"}

    client.force_login(bob)
    page = client.get("/usage/", period).content.decode()
    assert 'data-name="alice"' in page and 'data-name="bob"' in page
    assert page.count('<rect class="allocated"') == 30  # a bar a day
    by_project = client.get("/usage/", {**period, "group": "project"}).content.decode()
    assert 'data-name="vision"' in by_project and 'data-name="nlp"' in by_project


def test_with_no_usage_yet_the_page_says_so_instead_of_a_peak_over_an_empty_chart(
    client, alice, gpus
):
    client.force_login(alice)
    page = client.get("/usage/", {"start": "2026-11-01", "end": "2026-11-30"}).content.decode()
    assert "Peak" not in page and '<svg class="usage-chart"' not in page
    assert "No GPU time allocated in this period yet" in page


def test_the_admin_reads_the_day_rows_in_hours_and_edits_none(admin_client, alice, gpus):
    held(finished_job(alice, project="vision"), gpus[0], at(1), at(4))
    accounting.roll_up(DAY, now=at(30))
    listed = admin_client.get("/admin/scheduling/usageday/?q=vision")
    assert listed.status_code == 200
    [row] = listed.context["cl"].result_list
    assert listed.context["cl"].model_admin.allocated_hours(row) == "3.00"
    assert str(row) == "alice on 2026-11-02, project vision: 3.0 GPU-h"  # never "user 3"
    change = admin_client.get(f"/admin/scheduling/usageday/{row.pk}/change/").content.decode()
    assert "alice on 2026-11-02" in change
    assert admin_client.get("/admin/scheduling/usageday/add/").status_code == 403
    assert admin_client.post(f"/admin/scheduling/usageday/{row.pk}/delete/").status_code == 403


def test_the_csv_export_lists_each_day_and_holder_in_hours(client, alice, gpus):
    pool = Pool.objects.create(name="h100")
    held(finished_job(alice, project="vision", pool=pool), gpus[0], at(1), at(4))
    accounting.roll_up(DAY, now=at(30))
    client.force_login(alice)

    response = client.get("/usage.csv", {"start": "2026-11-01", "end": "2026-11-30"})

    assert response["Content-Type"] == "text/csv"
    rows = list(csv.DictReader(io.StringIO(response.content.decode())))
    assert [(r["day"], r["pool"], r["user"], r["project"]) for r in rows] == [
        ("2026-11-02", "h100", "alice", "vision")
    ]
    assert float(rows[0]["allocated_gpu_hours"]) == pytest.approx(3)


def test_the_csv_export_quotes_names_a_spreadsheet_would_run(client, alice, gpus):
    """Anyone names their project: one that reads as a formula is written inert."""
    held(finished_job(alice, project='=HYPERLINK("http://x","a")'), gpus[0], at(1), at(4))
    accounting.roll_up(DAY, now=at(30))
    client.force_login(alice)
    text = client.get("/usage.csv", {"start": "2026-11-01", "end": "2026-11-30"}).content.decode()
    [row] = csv.DictReader(io.StringIO(text))
    assert row["project"] == '\'=HYPERLINK("http://x","a")'


BAD_PERIODS = [
    ({"start": "2026-13-01"}, "start"),
    ({"start": "0001-01-01", "end": "2026-01-31"}, "start"),  # no month before it
    ({"end": "9999-12-31"}, "end"),
    ({"start": "2026-11-30", "end": "2026-11-01"}, "start"),
    ({"start": "2020-01-01", "end": "2026-11-01"}, "start"),
    ({"end": "yesterday"}, "end"),
    ({"start": "20261101"}, "start"),  # one way of writing a day, on the page and the API
    ({"start": "11/01/2026"}, "start"),
    ({"group": "node"}, "group"),
]


@pytest.mark.parametrize(("query", "field"), BAD_PERIODS)
def test_a_bad_period_is_refused_naming_the_field(client, alice, query, field):
    client.force_login(alice)

    csv_response = client.get("/usage.csv", query)
    page = client.get("/usage/", query)
    api = APIClient()
    api.force_authenticate(alice)
    answer = api.get("/api/v1/usage/", query)

    assert csv_response.status_code == 400 and field in csv_response.content.decode()
    assert page.status_code == 400
    assert answer.status_code == 400 and list(answer.json()) == [field]


def test_the_api_answers_what_the_page_shows(client, alice, bob, gpus):
    held(finished_job(alice, project="vision"), gpus[0], at(1), at(4))
    held(finished_job(bob, project="nlp"), gpus[1], at(1), at(2))
    rollups(gpus[0], at(1), 180, utilization=50, energy_mj=6_000_000)
    accounting.roll_up(DAY, now=at(30))
    api = APIClient()
    api.force_authenticate(bob)

    body = api.get("/api/v1/usage/", {"start": "2026-11-01", "end": "2026-11-30"}).json()

    assert (body["start"], body["end"], body["group"]) == ("2026-11-01", "2026-11-30", "user")
    assert [row["name"] for row in body["rows"]] == ["alice", "bob"]  # most allocated first
    alice_row = body["rows"][0]
    assert alice_row["allocated_gpu_hours"] == pytest.approx(3)
    assert alice_row["used_gpu_hours"] == pytest.approx(1.5)
    assert alice_row["used_share"] == pytest.approx(0.5)
    assert alice_row["energy_kwh"] == pytest.approx(180 * 6000 / 3.6e6)
    assert body["total"]["allocated_gpu_hours"] == pytest.approx(4)
    assert len(body["days"]) == 30
    assert body["days"][1] == {
        "day": "2026-11-02",
        "allocated_gpu_hours": pytest.approx(4),
        "used_gpu_hours": pytest.approx(1.5),
    }
    per_project = api.get("/api/v1/usage/", {"start": "2026-11-01", "group": "project"}).json()
    assert {row["name"] for row in per_project["rows"]} == {"vision", "nlp"}
    # By default: this month so far, per user.
    today = timezone.localdate()
    default = api.get("/api/v1/usage/").json()
    assert (default["start"], default["end"]) == (str(today.replace(day=1)), str(today))
    assert APIClient().get("/api/v1/usage/").status_code in (401, 403)


def test_budgets_count_each_quotas_period_as_the_scheduler_does(alice, bob, gpus):
    """GPU-hours per period, used since the period began; the fullest first; a user reads
    their own and their projects' budgets, staff everyone's."""
    now = at(12)
    held(finished_job(alice, project="vision"), gpus[0], at(1), at(3))  # 2 h today
    held(finished_job(bob), gpus[1], at(23, DAY - timedelta(days=1)), at(2))  # 2 h today
    Quota.objects.create(user=alice, gpu_hours=10, period=QuotaPeriod.MONTH)
    Quota.objects.create(project="vision", gpu_hours=4, period=QuotaPeriod.DAY)
    Quota.objects.create(user=bob, max_gpus=2, gpu_hours=1, period=QuotaPeriod.DAY)
    Quota.objects.create(user=bob, pool=Pool.objects.create(name="a100"), max_gpus=8)

    mine = quotas.budgets(alice, now)

    assert [(use.who, use.period_words) for use in mine] == [
        ("project vision", "today"),
        ("you", "this month"),
    ]
    vision, own = mine
    assert (vision.limit.gpu_hours_used, vision.limit.gpu_hours_left) == (
        pytest.approx(2),
        pytest.approx(2),
    )
    assert vision.hours_share == pytest.approx(0.5) and not vision.over
    assert (own.limit.gpu_hours_used, own.hours_share) == (pytest.approx(2), pytest.approx(0.2))
    everyone = quotas.budgets(person("ops", Role.OPERATOR), now)
    assert [use.who for use in everyone] == ["user bob", "project vision", "user alice"]
    assert everyone[0].over and everyone[0].limit.gpu_hours_left == 0  # 2 of 1 GPU-hour today
    assert quotas.budgets(bob, now)[0].who == "you"


def test_the_usage_page_shows_the_budgets_its_reader_may_see(client, alice, bob, gpus):
    Quota.objects.create(user=alice, gpu_hours=500)
    Quota.objects.create(user=bob, gpu_hours=0, period=QuotaPeriod.WEEK)
    client.force_login(bob)

    page = client.get("/usage/").content.decode()

    budgets = page[page.index('aria-labelledby="budgets-title"') : page.index("usage-table-title")]
    assert "<td>you</td>" in budgets and "this week" in budgets and "at quota" in budgets
    assert "alice" not in budgets
    client.force_login(alice)
    assert "this month" in client.get("/usage/").content.decode()
    body = client.get("/api/v1/usage/").json()
    assert [(b["holder"], b["gpu_hours"], b["period"]) for b in body["budgets"]] == [
        ("you", 500, "month")
    ]


def test_beat_keeps_today_and_yesterday_current(alice, gpus):
    # A fixed noon: at the clock's own time the hold ends before midnight for an hour a day.
    now = at(12)
    held(finished_job(alice), gpus[0], now - timedelta(hours=40), now - timedelta(hours=1))

    accounting.roll_up_recent(now)

    days = set(UsageDay.objects.values_list("day", flat=True))
    assert days == {DAY, DAY - timedelta(days=1)}, "the day before yesterday is left as it was"
