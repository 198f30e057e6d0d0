"""``/api/v1/reservations/``: requesting (400s name the field, 409 when the GPUs are booked),
the filters, and who may approve, reject, cancel and release."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

import pytest
from django.utils import timezone
from rest_framework.test import APIClient

from gpuadmin.access.models import Membership, Role
from inventory.models import Gpu, Node, Pool
from scheduling.models import PoolPolicy, Reservation, ReservationState
from scheduling.reservations import services as reservations
from tests.scheduling.conftest import add_sim_node

pytestmark = pytest.mark.django_db

URL = "/api/v1/reservations/"


@pytest.fixture
def fleet(broker) -> None:
    add_sim_node("dgx-01")
    add_sim_node("dgx-02")


@pytest.fixture
def people(django_user_model) -> dict[str, Any]:
    found = {
        "alice": django_user_model.objects.create_user("alice"),
        "bob": django_user_model.objects.create_user("bob"),
        "root": django_user_model.objects.create_user("root", is_staff=True),
    }
    for role in (Role.VIEWER, Role.OPERATOR):
        found[role] = django_user_model.objects.create_user(role)
        Membership.objects.create(user=found[role], role=role)
    return found


def client(user: Any) -> APIClient:
    api = APIClient()
    api.force_authenticate(user)
    return api


def at(hours: float) -> datetime:
    return timezone.now().replace(microsecond=0) + timedelta(hours=hours)


def body(**fields: Any) -> dict[str, Any]:
    return {"gpu_count": 2, "start": at(1).isoformat(), "end": at(3).isoformat(), **fields}


def test_a_request_is_approved_within_quota_and_shows_its_gpus(fleet, people):
    response = client(people["alice"]).post(URL, body(project="llm", note="eval"), format="json")
    assert response.status_code == 201, response.content
    data = response.json()
    assert data["owner"] == "alice"
    assert data["state"] == "approved"
    assert data["project"] == "llm"
    expected = list(
        Gpu.objects.filter(node__hostname="dgx-01", index__in=[0, 1])
        .order_by("index")
        .values_list("uuid", flat=True)
    )
    assert data["gpus"] == expected
    assert data["requested_gpus"] == []
    got = client(people["bob"]).get(f"{URL}{data['id']}/").json()
    assert got == data


def test_named_gpus_default_the_count(fleet, people):
    uuids = list(Gpu.objects.filter(node__hostname="dgx-02").values_list("uuid", flat=True)[:3])
    payload = {"start": at(1).isoformat(), "end": at(2).isoformat(), "gpus": uuids}
    data = client(people["alice"]).post(URL, payload, format="json").json()
    assert (data["gpu_count"], sorted(data["requested_gpus"])) == (3, sorted(uuids))
    assert sorted(data["gpus"]) == sorted(uuids)
    twice = {**payload, "gpus": [uuids[0], uuids[0]], "start": at(3).isoformat()}
    data = client(people["alice"]).post(URL, twice | {"end": at(4).isoformat()}, format="json")
    assert (data.status_code, data.json()["gpu_count"]) == (201, 1)  # a GPU named twice is one


@pytest.mark.parametrize("start", ["2027-03-28T02:30:00", "2027-10-31T02:30:00"])
def test_a_local_time_the_clock_skips_or_repeats_is_refused(fleet, people, settings, start):
    """As the page's form reads it: not guessed one way, as DRF alone would."""
    settings.TIME_ZONE = "Europe/Berlin"
    payload = {"gpu_count": 1, "start": start, "end": "2027-11-01T10:00:00"}
    response = client(people["alice"]).post(URL, payload, format="json")
    assert response.status_code == 400
    assert response.json()["start"] == [
        f"{start.replace('T', ' ')} couldn’t be interpreted in time zone Europe/Berlin; it may "
        "be ambiguous or it may not exist."
    ]


@pytest.mark.parametrize(
    ("fields", "errors"),
    [
        ({"end": at(0.5).isoformat()}, {"end": ["must be after the start"]}),
        ({"start": at(-2).isoformat()}, {"start": ["is in the past"]}),
        ({"gpu_count": 0}, {"gpu_count": ["Ensure this value is greater than or equal to 1."]}),
        ({"gpu_count": 40}, {"gpu_count": ["40 GPUs, but the GPUs in no pool has 16 GPUs"]}),
        ({"pool": "nope"}, {"pool": ["Object with name=nope does not exist."]}),
        ({"node": "nope"}, {"node": ["Object with hostname=nope does not exist."]}),
        ({"gpus": ["GPU-nope"]}, {"gpus": {"0": ["Object with uuid=GPU-nope does not exist."]}}),
        ({"start": "soon"}, {"start": ["Datetime has wrong format."]}),
    ],
)
def test_a_bad_request_is_a_400_naming_the_field(fleet, people, fields, errors):
    response = client(people["alice"]).post(URL, body(**fields), format="json")
    assert response.status_code == 400
    got = response.json()
    assert set(got) == set(errors)
    for field, expected in errors.items():
        if isinstance(expected, list):
            assert [message.split(" Use one of")[0] for message in got[field]] == expected
        else:
            assert got[field] == expected
    assert not Reservation.objects.exists()


def test_booked_gpus_are_a_409(fleet, people):
    assert client(people["alice"]).post(URL, body(gpu_count=16), format="json").status_code == 201
    response = client(people["bob"]).post(URL, body(gpu_count=1), format="json")
    assert response.status_code == 409
    assert response.json()["detail"].startswith("no 1 free GPU in the GPUs in no pool for ")


def test_viewers_cannot_request(fleet, people):
    response = client(people[Role.VIEWER]).post(URL, body(), format="json")
    assert response.status_code == 403
    assert not Reservation.objects.exists()


def test_filters(fleet, people):
    mine = reservations.request(people["alice"], 2, at(1), at(2))
    dgx02 = Node.objects.get(hostname="dgx-02")
    later = reservations.request(people["bob"], 1, at(30), at(31), node=dgx02)
    PoolPolicy.objects.create(pool=None, reservation_auto_approve=False)
    waiting = reservations.request(people["bob"], 1, at(5), at(6))
    api = client(people["alice"])

    def ids(query: str) -> list[int]:
        response = api.get(f"{URL}?{query}")
        assert response.status_code == 200, response.content
        return sorted(row["id"] for row in response.json()["results"])

    assert ids("owner=me") == [mine.pk]
    assert ids("owner=bob") == [later.pk, waiting.pk]
    assert ids("state=requested") == [waiting.pk]
    assert ids("state=approved&state=requested") == [mine.pk, later.pk, waiting.pk]
    gpu = Gpu.objects.filter(reservation_holds__reservation=later).get()
    assert ids(f"gpu={gpu.uuid}") == [later.pk]
    assert ids("node=dgx-01") == [mine.pk]
    assert ids("node=dgx-02") == [later.pk]
    since, until = at(4).isoformat(), at(10).isoformat()
    assert ids(f"since={since.replace('+', '%2B')}&until={until.replace('+', '%2B')}") == [
        waiting.pk
    ]
    assert api.get(f"{URL}?since=yesterday").status_code == 400


def test_only_admins_approve_and_reject(fleet, people):
    PoolPolicy.objects.create(pool=None, reservation_auto_approve=False)
    first = reservations.request(people["alice"], 2, at(1), at(2))
    second = reservations.request(people["alice"], 2, at(1), at(2))
    for who in ("alice", Role.OPERATOR):
        assert client(people[who]).post(f"{URL}{first.pk}/approve/").status_code == 403
    response = client(people["root"]).post(f"{URL}{first.pk}/approve/")
    assert response.status_code == 200
    assert (response.json()["state"], response.json()["decided_by"]) == ("approved", "root")
    assert client(people["root"]).post(f"{URL}{first.pk}/approve/").status_code == 409
    response = client(people["root"]).post(
        f"{URL}{second.pk}/reject/", {"reason": "no"}, format="json"
    )
    assert (response.json()["state"], response.json()["message"]) == ("rejected", "no")


def test_the_owner_operators_and_admins_cancel_others_do_not(fleet, people):
    reservation = reservations.request(people["alice"], 1, at(1), at(2))
    assert client(people["bob"]).post(f"{URL}{reservation.pk}/cancel/").status_code == 403
    assert client(people[Role.VIEWER]).post(f"{URL}{reservation.pk}/cancel/").status_code == 403
    response = client(people["alice"]).post(f"{URL}{reservation.pk}/cancel/")
    assert (response.status_code, response.json()["state"]) == (200, "canceled")
    assert response.json()["gpus"] == []
    other = reservations.request(people["alice"], 1, at(1), at(2))
    response = client(people[Role.OPERATOR]).post(f"{URL}{other.pk}/cancel/")
    assert response.json()["message"] == f"canceled by {Role.OPERATOR}"


def test_release_before_the_start_is_a_409(fleet, people):
    reservation = reservations.request(people["alice"], 1, at(1), at(2))
    response = client(people["alice"]).post(f"{URL}{reservation.pk}/release/")
    assert response.status_code == 409
    assert response.json()["detail"] == (
        f"reservation {reservation.pk} is not running now: cancel it instead"
    )
    reservation.refresh_from_db()
    assert reservation.state == ReservationState.APPROVED


def test_a_reason_that_cannot_be_stored_is_a_400(fleet, people):
    reservation = reservations.request(people["alice"], 1, at(1), at(2))
    response = client(people["alice"]).post(
        f"{URL}{reservation.pk}/cancel/", {"reason": "a\x00"}, format="json"
    )
    assert response.status_code == 400
    assert list(response.json()) == ["reason"]


def test_a_pool_by_name(fleet, people):
    pool = Pool.objects.create(name="research")
    Gpu.objects.filter(node__hostname="dgx-02", index__lt=2).update(pool=pool)
    response = client(people["alice"]).post(URL, body(pool="research"), format="json")
    assert response.status_code == 201
    assert response.json()["pool"] == "research"
    response = client(people["alice"]).post(URL, body(pool="research", gpu_count=3), format="json")
    assert response.json() == {"gpu_count": ["3 GPUs, but pool research has 2 GPUs"]}
    # ~ names the GPUs in no pool, as in the URLs
    response = client(people["alice"]).post(URL, body(pool="~"), format="json")
    assert (response.status_code, response.json()["pool"]) == (201, None)
