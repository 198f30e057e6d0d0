"""The reservation pages: the list with its request form and actions, the pending approvals
for admins, the week calendars of a node and a GPU (bars as spanning cells, HTMX weeks), and
the sections on the node and GPU pages."""

from __future__ import annotations

import re
from datetime import UTC, date, datetime, timedelta

import pytest
from django.utils import timezone

from gpuadmin.access.models import Role
from inventory.models import Gpu, Node
from scheduling.models import Allocation, Job, JobState, PoolPolicy, Reservation
from scheduling.reservations import services as reservations
from scheduling.reservations.pages import Bar, Cell, lane, week_start
from tests.scheduling.conftest import add_sim_node
from tests.scheduling.pages.helpers import person

pytestmark = pytest.mark.django_db


@pytest.fixture
def node(agents) -> Node:
    return add_sim_node("dgx-01")


@pytest.fixture
def root(db):
    return person("root", Role.ADMIN)


def at(hours: float) -> datetime:
    return timezone.localtime().replace(second=0, microsecond=0) + timedelta(hours=hours)


def form(start: datetime, end: datetime, **fields: str) -> dict[str, str]:
    return {
        "gpu_count": "2",
        "start": f"{start:%Y-%m-%dT%H:%M}",
        "end": f"{end:%Y-%m-%dT%H:%M}",
    } | fields


def test_requesting_from_the_page(client, node, alice):
    client.force_login(alice)
    response = client.post("/reservations/", form(at(2), at(4), note="eval"), follow=True)
    (reservation,) = Reservation.objects.all()
    assert response.redirect_chain == [("/reservations/", 302)]
    html = response.content.decode()
    assert f"Reservation {reservation.pk} approved." in html
    assert f'id="reservation-{reservation.pk}"' in html
    assert "dgx-01</a> GPUs 0-1" in html
    assert ">Cancel</button>" in html
    assert (reservation.gpu_count, reservation.note) == (2, "eval")


def test_a_refused_request_shows_on_its_field(client, node, alice):
    client.force_login(alice)
    response = client.post("/reservations/", form(at(4), at(2)))
    assert response.status_code == 200
    assert re.search(r'id="id_end-error">must be after the start<', response.content.decode())
    response = client.post("/reservations/", form(at(2), at(4), gpu_count="9", gpus="GPU-nope"))
    assert "No such GPU: GPU-nope" in response.content.decode()
    # As the API: a count that is not the named GPUs' number is refused, not overridden.
    gpu = Gpu.objects.filter(node=node).order_by("index").first()
    response = client.post("/reservations/", form(at(2), at(4), gpu_count="5", gpus=gpu.uuid))
    assert re.search(
        r'id="id_gpu_count-error">1 GPU named, but gpu_count is 5<', response.content.decode()
    )
    assert not Reservation.objects.exists()
    client.post("/reservations/", form(at(2), at(4), gpu_count="", gpus=f"{gpu.uuid},{gpu.uuid}"))
    assert Reservation.objects.get().gpu_count == 1


def test_booked_gpus_are_said_above_the_form(client, node, alice, bob):
    reservations.request(bob, 8, at(1), at(5))
    client.force_login(alice)
    response = client.post("/reservations/", form(at(2), at(3)))
    assert "no 2 free GPUs in the GPUs in no pool for " in response.content.decode()


def test_admins_see_pending_requests_and_decide(client, node, alice, root):
    PoolPolicy.objects.create(pool=None, reservation_auto_approve=False)
    waiting = reservations.request(alice, 2, at(1), at(2))
    client.force_login(alice)
    html = client.get("/reservations/").content.decode()
    assert "Waiting for your approval" not in html
    assert ">Approve</button>" not in html
    client.force_login(root)
    html = client.get("/reservations/").content.decode()
    assert f'id="pending-{waiting.pk}"' in html
    # A reason too long is refused, as by the API and the admin, not cut short.
    long = client.post(f"/reservations/{waiting.pk}/reject/", {"reason": "x" * 2001}, follow=True)
    assert "reason: at most 2000 characters" in long.content.decode()
    response = client.post(f"/reservations/{waiting.pk}/approve/", follow=True)
    assert f"Reservation {waiting.pk} approved." in response.content.decode()
    waiting.refresh_from_db()
    assert waiting.state == "approved"
    response = client.post(f"/reservations/{waiting.pk}/reject/", {"reason": "x"}, follow=True)
    assert f"reservation {waiting.pk} is approved: it cannot be rejected" in (
        response.content.decode()
    )


def test_release_and_cancel_from_the_list(client, node, alice, bob):
    running = reservations.request(alice, 1, at(-0.05), at(2))
    coming = reservations.request(alice, 1, at(3), at(4))
    client.force_login(bob)
    assert client.post(f"/reservations/{coming.pk}/cancel/").status_code == 403
    client.force_login(alice)
    html = client.get("/reservations/").content.decode()
    assert ">Release now</button>" in html
    client.post(f"/reservations/{running.pk}/release/")
    client.post(f"/reservations/{coming.pk}/cancel/")
    states = dict(Reservation.objects.values_list("pk", "state"))
    assert states == {running.pk: "released", coming.pk: "canceled"}


def test_the_list_filters(client, node, alice, bob):
    mine = reservations.request(alice, 1, at(1), at(2))
    theirs = reservations.request(bob, 1, at(1), at(2))
    client.force_login(alice)
    html = client.get("/reservations/?owner=me").content.decode()
    assert f'id="reservation-{mine.pk}"' in html
    assert f'id="reservation-{theirs.pk}"' not in html


# --------------------------------------------------------------------------- the calendar


def test_a_week_the_clock_changes_keeps_every_bar_at_its_hour(settings):
    """Berlin's clocks go forward on Sunday 2027-03-28 (the week has 167 hours): a booking
    from 10:00 to 11:00 that Sunday is drawn in its 10:00 column, not at 09:00."""
    settings.TIME_ZONE = "Europe/Berlin"
    start = week_start(date(2027, 3, 24))
    # In UTC, as the database gives it (the same zone's datetimes subtract by the clock).
    sunday_10 = timezone.make_aware(datetime(2027, 3, 28, 10)).astimezone(UTC)
    bar = Bar(sunday_10, sunday_10 + timedelta(hours=1), "reserved", "#1", "t")
    cells = lane([bar], start, 7 * 24)
    assert cells[:2] == [Cell(6 * 24 + 10), Cell(1, "reserved", "#1", "t")]


def test_lane_quantizes_bars_to_slots_and_fills_free_time():
    start = datetime(2025, 3, 3, tzinfo=UTC)
    hour = timedelta(hours=1)
    bars = [
        Bar(start + 2.5 * hour, start + 4 * hour, "reserved", "#1", "t1"),
        Bar(start + 3 * hour, start + 6 * hour, "job", "j", "t2"),  # overlaps: starts at 4
        Bar(start - 10 * hour, start + hour, "mine", "#2", "t3"),  # from before the week
        Bar(start + 7 * hour, start + 7 * hour, "job", "k", "t4"),  # instant: one slot
    ]
    assert lane(bars, start, 10) == [
        Cell(1, "mine", "#2", "t3"),
        Cell(1),
        Cell(2, "reserved", "#1", "t1"),
        Cell(2, "job", "j", "t2"),
        Cell(1),
        Cell(1, "job", "k", "t4"),
        Cell(2),
    ]


def within_a_week(hours: float) -> datetime:
    """An hour from now, or the next Monday 01:00 where ``hours`` from then would run past
    Sunday: the calendar shows a week from Monday, so a bar crossing its end would be cut."""
    start = at(1)
    if week_start(start.date()) != week_start((start + timedelta(hours=hours)).date()):
        start = week_start(start.date() + timedelta(days=7)) + timedelta(hours=1)
    return start


def test_the_node_calendar_draws_reservations_and_jobs(client, node, alice, bob):
    start = within_a_week(3)
    reservation = reservations.request(alice, 2, start, start + timedelta(hours=2))
    gpu = Gpu.objects.get(node=node, index=5)
    job = Job.objects.create(
        owner=bob,
        command=["sleep", "1"],
        state=JobState.RUNNING,
        started_at=start - timedelta(minutes=30),
        max_runtime_s=7200,
    )
    Allocation.objects.create(job=job, gpu=gpu, node=node)
    client.force_login(alice)
    response = client.get(f"/nodes/dgx-01/calendar/?week={start.date()}")
    html = response.content.decode()
    assert response.status_code == 200
    assert html.count('class="cal-lane cal-lane-reserved"') == 8
    lanes = re.findall(r'<tbody class="cal-gpu-lanes" data-gpu="([^"]+)">(.*?)</tbody>', html, re.S)
    by_uuid = dict(lanes)
    first = by_uuid[Gpu.objects.get(node=node, index=0).uuid]
    assert re.search(
        rf'colspan="[23]" class="cal-mine" title="Reservation {reservation.pk} of alice', first
    )
    # Two or three hours: too short for its label, it reads its owner (the rest as tooltip).
    assert re.search(
        rf'class="cal-chip cal-short" title="Reservation {reservation.pk} of alice[^"]*">alice</a>',
        first,
    )
    assert re.search(
        rf'colspan="[23]" class="cal-job" title="Job {job.pk} of bob', by_uuid[gpu.uuid]
    )
    for cells in by_uuid.values():  # every lane spans the week
        for row in re.findall(r"<tr.*?</tr>", cells, re.S):
            assert sum(map(int, re.findall(r'colspan="(\d+)"', row))) == 7 * 24
    assert "style=" not in html
    assert not re.search(r"<script(?![^>]*\bsrc=)", html)  # no inline script (CSP)


def test_weeks_change_by_htmx_with_the_table_alone(client, node, alice):
    client.force_login(alice)
    day = timezone.localdate() + timedelta(days=7)
    response = client.get(f"/nodes/dgx-01/calendar/?week={day}", HTTP_HX_REQUEST="true")
    html = response.content.decode()
    assert html.lstrip().startswith('<section id="calendar-week"')
    monday = week_start(day).date()
    assert f"Week of {monday:%a} {monday.day} {monday:%b %Y}" in html
    assert f'hx-get="?week={monday - timedelta(days=7)}"' in html
    assert "HX-Request" in response["Vary"]
    # A day that is not one, or one at the ends of the calendar, is this week.
    this_week = f"Week of {week_start(timezone.localdate()).date():%a}"
    for value in ("someday", "0001-01-01", "9999-12-31"):
        page = client.get(f"/nodes/dgx-01/calendar/?week={value}")
        assert page.status_code == 200 and this_week in page.content.decode()


def test_the_gpu_calendar_and_the_sections_on_the_gpu_and_node_pages(client, node, alice):
    start = within_a_week(1)
    reservation = reservations.request(alice, 1, start, start + timedelta(hours=1))
    gpu = Gpu.objects.get(reservation_holds__reservation=reservation)
    client.force_login(alice)
    html = client.get(f"/gpus/{gpu.uuid}/calendar/?week={start.date()}").content.decode()
    assert html.count('class="cal-lane cal-lane-reserved"') == 1
    assert f'title="Reservation {reservation.pk} of alice' in html
    assert 'class="cal-chip cal-short"' in html
    for page, calendar in (
        (f"/gpus/{gpu.uuid}/", f"/gpus/{gpu.uuid}/calendar/"),
        ("/nodes/dgx-01/", "/nodes/dgx-01/calendar/"),
    ):
        html = client.get(page).content.decode()
        assert f'<a class="muted" href="{calendar}">week calendar</a>' in html
        assert f'#reservation-{reservation.pk}">#{reservation.pk}</a>' in html
    client.logout()  # anonymous people read these pages, not who booked what (as /reservations/)
    for page in (f"/gpus/{gpu.uuid}/", "/nodes/dgx-01/"):
        response = client.get(page)
        assert response.status_code == 200
        assert "reservations-title" not in response.content.decode()
