"""The submission fields of pools and sharing: ``pool``, ``mig_profile``, ``mps_percent`` and
``mps_memory_mib``, ``reservation``; every bad value is a 400 naming its field that writes
nothing, through the API, the job service and the form."""

from __future__ import annotations

import json
from datetime import timedelta

import pytest
from django.utils import timezone

from gpuadmin.audit.models import AuditEvent
from inventory.models import Gpu, Node, Pool
from scheduling.jobs import limits, shape, submission
from scheduling.models import Job, JobArray, Reservation, ReservationState
from tests.scheduling.api.conftest import api_as, fleet, make_user  # noqa: F401 - fixtures

pytestmark = pytest.mark.django_db

A100 = "NVIDIA A100-SXM4-80GB"


@pytest.fixture
def alice(api_as, fleet):  # noqa: F811 - the fixture
    return api_as("alice")


@pytest.fixture
def pools(fleet):  # noqa: F811 - the fixture
    """dgx-01 in pool ``a100`` (GPU 7 of it in ``shared``, MPS-shared), dgx-02 in no pool, and
    an empty pool ``empty``."""
    a100, shared = Pool.objects.create(name="a100"), Pool.objects.create(name="shared")
    Pool.objects.create(name="empty")
    Node.objects.filter(hostname="dgx-01").update(pool=a100)
    Gpu.objects.filter(node__hostname="dgx-01", index=7).update(pool=shared, mps_shared=True)
    shape.FleetShape.forget()
    return a100


def post(client, body: dict | str, url: str = "/api/v1/jobs/"):
    if isinstance(body, dict):
        body = json.dumps({"command": "true", **body})
    return client.post(url, body, content_type="application/json")


def assert_refused(response, field: str, message: str = "") -> None:
    assert response.status_code == 400, response.json()
    assert list(response.json()) == [field]
    assert message in response.json()[field][0]
    assert not Job.objects.exists() and not JobArray.objects.exists()
    assert not AuditEvent.objects.filter(event_type="job.submitted").exists()


def reservation(owner, **fields) -> Reservation:
    start = timezone.now() + timedelta(hours=1)
    return Reservation.objects.create(
        owner=owner,
        gpu_count=fields.pop("gpu_count", 4),
        start=fields.pop("start", start),
        end=fields.pop("end", start + timedelta(hours=2)),
        state=fields.pop("state", ReservationState.APPROVED),
        **fields,
    )


# --------------------------------------------------------------------------- pools


def test_a_pool_is_named_and_stored(alice, pools):
    response = post(alice, {"pool": "a100", "gpu_count": 7})
    assert response.status_code == 201, response.json()
    assert response.json()["pool"] == "a100"
    job = Job.objects.get()
    assert job.pool == pools
    after = AuditEvent.objects.get(event_type="job.submitted").after
    assert after["pool"] == "a100"
    assert post(alice, {"gpu_count": 8}).json()["pool"] is None  # dgx-02: in no pool
    assert post(alice, {"gpu_count": 8, "pool": "~"}).json()["pool"] is None  # as in the URLs


@pytest.mark.parametrize(
    ("body", "field", "message"),
    [
        ({"pool": "h100"}, "pool", "no pool 'h100'; the pools are: a100, empty, shared"),
        ({"pool": "empty"}, "pool", "pool empty has no GPUs; these have: a100, shared"),
        # 7 whole GPUs in a100: GPU 7 is in another pool (and MPS-shared)
        ({"pool": "a100", "gpu_count": 8}, "gpu_count", "no node has more than 7 GPUs"),
        ({"pool": "shared"}, "gpu_count", "every GPU in pool shared is MPS-shared"),
        ({"gpu_count": 8, "node_count": 2}, "node_count", "only 1 node has that many"),
        ({"pool": "a100", "gpu_model": "Tesla K80"}, "gpu_model", "pool a100 has: " + A100),
        ({"gpu_model": "Tesla K80"}, "gpu_model", "the GPUs in no pool are: " + A100),
        ({"pool": "\ud800"}, "pool", "Surrogate characters are not allowed"),
        ({"pool": "a\u0000"}, "pool", "Null characters are not allowed."),
        ({"pool": "x" * 65}, "pool", "no more than 64 characters"),
        ({"pool": 5}, "pool", "no pool '5'"),
        ({"pool": ["a100"]}, "pool", "Not a valid string."),
    ],
)
def test_bad_pools_name_the_field(alice, pools, body, field, message):
    assert_refused(post(alice, body), field, message)


def test_a_job_without_a_pool_needs_gpus_in_no_pool(alice, pools):
    Node.objects.filter(hostname="dgx-02").update(pool=pools)
    shape.FleetShape.forget()
    assert_refused(post(alice, {}), "pool", "every GPU is in a pool: name one of a100, shared")


# --------------------------------------------------------------------------- MIG and MPS


def test_a_mig_profile_is_one_device(alice, pools):
    response = post(alice, {"mig_profile": "3g.40gb", "pool": "a100"})
    assert response.status_code == 201, response.json()
    assert (response.json()["mig_profile"], response.json()["gpu_count"]) == ("3g.40gb", 1)
    assert Job.objects.get().mig_profile == "3g.40gb"


def test_an_mps_share(alice, pools):
    body = {"mps_percent": 25, "mps_memory_mib": 8000, "pool": "shared"}
    response = post(alice, body)
    assert response.status_code == 201, response.json()
    job = Job.objects.get()
    assert (job.mps_percent, job.mps_memory_mib, job.pool.name) == (25, 8000, "shared")
    after = AuditEvent.objects.get(event_type="job.submitted").after
    assert (after["mps_percent"], after["mps_memory_mib"]) == (25, 8000)


@pytest.mark.parametrize(
    ("body", "field", "message"),
    [
        (
            {"mig_profile": "9g.999gb"},
            "mig_profile",
            "outside the pools has a '9g.999gb' profile; they have: 1g.10gb",
        ),
        ({"mig_profile": "1g.10gb", "gpu_count": 2}, "gpu_count", "gpu_count must be 1"),
        ({"mig_profile": "1g.10gb", "node_count": 2}, "node_count", "node_count must be 1"),
        (
            {"mig_profile": "1g.10gb", "gpu_model": "H100"},
            "gpu_model",
            "no MIG-capable H100 outside the pools",
        ),
        ({"mig_profile": "1g.10gb", "mps_percent": 10}, "mps_percent", "not both"),
        (
            {"mig_profile": "1g.10gb", "min_gpu_memory_mib": 999_999},
            "min_gpu_memory_mib",
            "a MIG device has its profile's memory",
        ),
        (
            {"mps_percent": 50, "min_gpu_memory_mib": 999_999, "pool": "shared"},
            "min_gpu_memory_mib",
            "give mps_memory_mib",
        ),
        ({"mig_profile": "\u0000"}, "mig_profile", "Null characters are not allowed."),
        ({"mig_profile": "x" * 33}, "mig_profile", "no more than 32 characters"),
        # GPU 7, MIG-capable, is MPS-shared: never in MIG mode
        ({"mig_profile": "1g.10gb", "pool": "shared"}, "mig_profile", "no MIG-capable GPU in"),
        ({"mps_percent": 25}, "mps_percent", "no MPS-shared GPU outside the pools"),
        ({"mps_percent": 25, "pool": "a100"}, "mps_percent", "no MPS-shared GPU in pool a100"),
        ({"mps_percent": 0, "pool": "shared"}, "mps_percent", "greater than or equal to 1"),
        ({"mps_percent": 101, "pool": "shared"}, "mps_percent", "less than or equal to 100"),
        ({"mps_percent": "half", "pool": "shared"}, "mps_percent", "A valid integer"),
        ({"mps_percent": 10**30, "pool": "shared"}, "mps_percent", "less than or equal to 100"),
        ({"mps_percent": 50, "pool": "shared", "gpu_count": 2}, "gpu_count", "must be 1"),
        ({"mps_memory_mib": 4000, "pool": "shared"}, "mps_memory_mib", "give mps_percent"),
        (
            {"mps_percent": 50, "mps_memory_mib": 90_000, "pool": "shared"},
            "mps_memory_mib",
            "90000 MiB, but the largest MPS-shared GPU in pool shared has 80 GiB",
        ),
        (
            {"mps_percent": 50, "mps_memory_mib": 0, "pool": "shared"},
            "mps_memory_mib",
            "greater than or equal to 1",
        ),
    ],
)
def test_bad_sharing_requests_name_the_field(alice, pools, body, field, message):
    assert_refused(post(alice, body), field, message)


@pytest.mark.parametrize("array", ["", "0-99%10"], ids=["job", "array"])
def test_a_topology_no_node_of_the_pool_has_is_refused(alice, pools, array):
    """The API, for a job or an array (checked once for all its tasks), refuses what no NUMA
    node or NVLink domain of the pool could hold: a DGX A100 has 2 GPUs per NUMA node."""
    numa = {"gpu_count": 3, "topology": "numa", "array": array}
    message = "needs 3 GPUs in one NUMA node; the largest NUMA node has 2"
    assert_refused(post(alice, numa), "topology", message)
    # Pool a100's NVLink domain has the 7 GPUs of dgx-01 that are not MPS-shared.
    nvlink = {"gpu_count": 7, "topology": "nvlink", "pool": "a100", "array": array}
    assert post(alice, nvlink).status_code == 201


def test_the_service_refuses_them_whoever_calls_it(alice, pools):
    with pytest.raises(limits.JobRejected) as caught:
        submission.submit_job(alice.user, command="true", mig_profile="1g.10gb", mps_percent=5)
    assert caught.value.field == "mps_percent"
    with pytest.raises(limits.JobRejected) as caught:
        submission.submit_job(alice.user, command="true", mps_percent=500, pool="shared")
    assert caught.value.field == "mps_percent"


# --------------------------------------------------------------------------- reservations


def test_a_job_in_its_owners_reservation_takes_its_pool(alice, pools):
    held = reservation(alice.user, pool=pools)
    response = post(alice, {"reservation": held.pk, "gpu_count": 4, "max_runtime_s": 7200})
    assert response.status_code == 201, response.json()
    assert (response.json()["reservation"], response.json()["pool"]) == (held.pk, "a100")
    requested = reservation(alice.user, state=ReservationState.REQUESTED)
    assert post(alice, {"reservation": requested.pk, "max_runtime_s": 60}).status_code == 201


@pytest.mark.parametrize(
    ("body", "field", "message"),
    [
        ({}, "max_runtime_s", "needs a maximum runtime to run in reservation"),
        ({"max_runtime_s": 7201}, "max_runtime_s", "its maximum runtime runs past the end of"),
        ({"mig_profile": "1g.10gb"}, "reservation", "holds whole GPUs: a MIG device or an MPS"),
    ],
)
def test_a_job_that_could_never_run_in_its_reservation_is_refused(
    alice, pools, body, field, message
):
    """The engine's rule, read at submission: a two-hour window holds whole GPUs, and a job
    in it must be gone by its end (by its maximum runtime)."""
    held = reservation(alice.user, pool=pools)
    assert_refused(post(alice, {"reservation": held.pk, **body}), field, message)


@pytest.mark.parametrize(
    ("fields", "body", "message"),
    [
        ({"owner": "bob"}, {}, "you have no reservation"),
        ({"state": ReservationState.REJECTED}, {}, "is rejected: jobs run only in a requested"),
        ({"state": ReservationState.RELEASED}, {}, "is released"),
        (
            {
                "start": timezone.now() - timedelta(hours=3),
                "end": timezone.now() - timedelta(hours=1),
            },
            {},
            "ended at",
        ),
        ({"gpu_count": 2}, {"gpu_count": 4}, "the job needs 4 GPUs; reservation"),
        ({}, {"pool": "a100"}, "is in no pool, not in pool a100"),
        ({"gpu_model": A100}, {"gpu_model": "NVIDIA H100"}, f"holds {A100} GPUs, not NVIDIA H100"),
    ],
)
def test_bad_reservations_name_the_field(alice, api_as, pools, fields, body, message):  # noqa: F811
    owner = api_as("bob").user if fields.pop("owner", "") else alice.user
    held = reservation(owner, **fields)
    assert_refused(post(alice, {"reservation": held.pk, **body}), "reservation", message)


@pytest.mark.parametrize("value", [0, -1, 2**63, "7; drop table", 1.5, [1], {"id": 1}])
def test_reservation_ids_are_whole_positive_numbers(alice, pools, value):
    assert_refused(post(alice, {"reservation": value}), "reservation")


def test_an_unknown_reservation(alice, pools):
    assert_refused(post(alice, {"reservation": 999_999}), "reservation", "no reservation 999999")


# --------------------------------------------------------------------------- hostile bodies


@pytest.mark.parametrize("url", ["/queue/submit", "/api/v1/jobs/"])
@pytest.mark.parametrize(
    ("body", "field"),
    [
        ('{"command": "true", "array": "\\ud800"}', "array"),
        ('{"command": "true", "array": 5}', "array"),
        ('{"command": "true", "array": ["0-3"]}', "array"),
        ('{"command": "true", "dependency": "\\ud800"}', "dependency"),
        ('{"command": "true", "dependency": "afterok:1\\u0000"}', "dependency"),
        ('{"command": "true", "dependency": true}', "dependency"),
        ('{"command": "true", "mig_profile": "\\ud800"}', "mig_profile"),
        ('{"command": "true", "mps_percent": 1e400}', "mps_percent"),
        ('{"command": "true", "mps_memory_mib": "NaN"}', "mps_memory_mib"),
        ('{"command": "true", "reservation": "\\u0000"}', "reservation"),
    ],
)
def test_hostile_values_are_a_400_naming_the_field(alice, pools, url, body, field):
    assert_refused(post(alice, body, url), field)


# --------------------------------------------------------------------------- the form


FORM = {
    "command": "python train.py",
    "gpu_count": "1",
    "node_count": "1",
    "topology": "any",
    "priority": "normal",
    "max_retries": "0",
}


def test_form_takes_the_new_fields(alice, pools, client):
    client.force_login(alice.user)
    held = reservation(alice.user, pool=pools, gpu_count=8)
    page = client.get("/jobs/new/").content.decode()
    assert 'value="a100"' in page and f'value="{held.pk}"' in page
    first = submission.submit_job(alice.user, command="true")
    body = {
        **FORM,
        "reservation": str(held.pk),
        "max_runtime": "1:00:00",
        "dependency": f"afterok:{first.pk}",
    }
    response = client.post("/jobs/new/", body)
    assert response.status_code == 302
    job = Job.objects.latest("pk")
    assert (job.pool, job.reservation) == (pools, held)
    assert list(job.dependencies.values_list("kind", "on_id")) == [("afterok", first.pk)]
    assert f"#{held.pk}" in client.get(f"/jobs/{job.pk}/").content.decode()
    response = client.post("/jobs/new/", {**FORM, "pool": "a100", "mig_profile": "1g.10gb"})
    assert response.status_code == 302
    job = Job.objects.latest("pk")
    assert (job.pool, job.mig_profile) == (pools, "1g.10gb")
    assert "MIG device 1g.10gb" in client.get(f"/jobs/{job.pk}/").content.decode()
    share = {"pool": "shared", "mps_percent": "25", "mps_memory_mib": "8000"}
    assert client.post("/jobs/new/", {**FORM, **share}).status_code == 302
    job = Job.objects.latest("pk")
    assert (job.pool.name, job.mps_percent, job.mps_memory_mib) == ("shared", 25, 8000)


def test_form_offers_the_mig_profiles_the_pools_have(alice, pools, client):
    """The MIG profile is typed with the fleet's profiles offered, by pool (the service still
    decides: a profile no GPU has is refused on the field)."""
    client.force_login(alice.user)
    page = client.get("/jobs/new/").content.decode()
    assert 'list="suggest-mig_profile"' in page
    where = "A100-SXM4-80GB in pool a100; A100-SXM4-80GB outside the pools"
    for profile in ("1g.10gb", "3g.40gb", "7g.80gb"):
        assert f'<option value="{profile}" label="{where}">' in page
    assert 'value="1g.5gb"' not in page  # the A100 40GB's, which the fleet has not
    response = client.post("/jobs/new/", {**FORM, "mig_profile": "1g.5gb"})
    assert "has a &#x27;1g.5gb&#x27; profile; they have: 1g.10gb" in response.content.decode()


@pytest.mark.parametrize(
    ("fields", "field", "message"),
    [
        ({"pool": "nope"}, "pool", "Select a valid choice."),
        ({"pool": "shared"}, "gpu_count", "every GPU in pool shared is MPS-shared"),
        ({"mps_percent": "101"}, "mps_percent", "less than or equal to 100"),
        ({"mps_percent": "20", "pool": "a100"}, "mps_percent", "no MPS-shared GPU in pool a100"),
        ({"dependency": "afterok:999999"}, "dependency", "no job 999999"),
        ({"reservation": "999999"}, "reservation", "Select a valid choice."),
        (
            {"gpu_count": "4", "topology": "numa"},
            "topology",
            "needs 4 GPUs in one NUMA node; the largest NUMA node has 2",
        ),
    ],
)
def test_form_shows_refusals_on_their_field(alice, pools, client, fields, field, message):
    client.force_login(alice.user)
    response = client.post("/jobs/new/", {**FORM, **fields})
    assert response.status_code == 200
    errors = response.context["form"].errors
    assert list(errors) == [field]
    assert message in errors[field][0]
    assert not Job.objects.exists()
