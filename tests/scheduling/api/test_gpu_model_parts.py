"""A GPU model is given by any unambiguous part of its name, as the GPU filter matches it
(``H100`` is ``NVIDIA H100 80GB HBM3``), wherever a model is given: a job (API, CLI) and a
reservation; an ambiguous part is a 400 naming the field and listing the candidates."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from inventory.services import resolve_gpu_model
from scheduling.models import Job, Reservation
from tests.scheduling.conftest import add_sim_node

pytestmark = pytest.mark.django_db

A100S = "NVIDIA A100-SXM4-40GB, NVIDIA A100-SXM4-80GB"


@pytest.fixture
def mixed_fleet(broker) -> None:
    add_sim_node("dgx-01")  # A100 80GB
    add_sim_node("dgx-02", "dgx-a100-40gb")
    add_sim_node("dgx-h100-01", "dgx-h100")


@pytest.fixture
def alice(api_as):
    return api_as("alice")


@pytest.mark.parametrize(
    ("given", "full"),
    [
        ("H100", "NVIDIA H100 80GB HBM3"),
        ("h100", "NVIDIA H100 80GB HBM3"),
        ("A100-SXM4-80", "NVIDIA A100-SXM4-80GB"),
        ("nvidia a100-sxm4-40gb", "NVIDIA A100-SXM4-40GB"),
    ],
)
def test_a_job_takes_an_unambiguous_part_of_a_model_name(alice, mixed_fleet, given, full):
    response = alice.post("/api/v1/jobs/", {"command": "true", "gpu_model": given}, format="json")
    assert response.status_code == 201, response.json()
    assert response.json()["gpu_model"] == full
    assert Job.objects.get().gpu_model == full


def test_an_ambiguous_part_is_a_400_listing_the_candidates(alice, mixed_fleet):
    response = alice.post("/api/v1/jobs/", {"command": "true", "gpu_model": "A100"}, format="json")
    assert (response.status_code, response.json()) == (
        400,
        {"gpu_model": [f"'A100' matches {A100S}"]},
    )
    assert not Job.objects.exists()


def test_a_model_the_fleet_lacks_is_refused_as_before(alice, mixed_fleet):
    response = alice.post("/api/v1/jobs/", {"command": "true", "gpu_model": "V100"}, format="json")
    assert response.status_code == 400
    assert response.json()["gpu_model"][0].startswith("no GPU model 'V100'; the fleet has: ")


def test_a_reservation_takes_a_part_of_a_model_name(alice, mixed_fleet):
    start = timezone.now().replace(microsecond=0) + timedelta(hours=1)
    end = start + timedelta(hours=2)
    window = {"gpu_count": 1, "start": start.isoformat(), "end": end.isoformat()}
    response = alice.post("/api/v1/reservations/", {**window, "gpu_model": "h100"}, format="json")
    assert response.status_code == 201, response.json()
    assert Reservation.objects.get().gpu_model == "NVIDIA H100 80GB HBM3"
    response = alice.post("/api/v1/reservations/", {**window, "gpu_model": "a100"}, format="json")
    assert (response.status_code, response.json()) == (
        400,
        {"gpu_model": [f"'a100' matches {A100S}"]},
    )


def test_the_resolver():
    names = ["NVIDIA A100-SXM4-40GB", "NVIDIA A100-SXM4-80GB", "NVIDIA A100 80GB PCIe"]
    assert resolve_gpu_model("", names) == ""
    assert resolve_gpu_model("PCIe", names) == "NVIDIA A100 80GB PCIe"
    assert resolve_gpu_model("B200", names) == "B200"  # none: the caller refuses it
    assert resolve_gpu_model("nvidia a100 80gb pcie", names) == "NVIDIA A100 80GB PCIe"
