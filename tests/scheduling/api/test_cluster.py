"""/cluster: GPU status, and GPUs given and taken by hand through the same integrity rules."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from gpuadmin.access.models import Role
from gpuadmin.audit.models import AuditEvent
from inventory.models import Gpu, Node
from scheduling.agent.wire import JobSpec
from scheduling.jobs import shape
from scheduling.models import Allocation, Job, JobState
from scheduling.sharing import services as sharing
from tests.scheduling.api.conftest import events, submit
from tests.scheduling.conftest import add_sim_node

pytestmark = pytest.mark.django_db


@pytest.fixture
def operator(api_as):
    return api_as("olga", Role.OPERATOR)


def uuids(hostname: str, *indexes: int) -> list[str]:
    return [Gpu.objects.get(node__hostname=hostname, index=i).uuid for i in indexes]


def allocate(client, job: Job, gpu_uuids: list[str]):
    return client.post(
        "/cluster/gpu-allocate", {"job_id": job.pk, "gpu_uuids": gpu_uuids}, format="json"
    )


def test_manual_allocation_schedules_and_dispatches_the_job(
    operator, fleet, broker, django_capture_on_commit_callbacks
):
    job = submit(operator.user, gpu_count=2)
    with django_capture_on_commit_callbacks(execute=True):
        response = allocate(operator, job, uuids("dgx-01", 2, 3))
    assert response.status_code == 201, response.json()
    body = response.json()
    assert (body["state"], body["attempt"]) == ("scheduled", 1)
    assert body["placement"]["topology_class"] == "manual"
    assert body["placement"]["nodes"] == {"dgx-01": [2, 3]}
    assert body["placement"]["explanation"] == "allocated by hand by olga: GPUs 2-3 on dgx-01"
    assert [(a["node"], a["gpu_index"], a["manual"], a["active"]) for a in body["allocations"]] == [
        ("dgx-01", 2, True, True),
        ("dgx-01", 3, True, True),
    ]
    [(sent, queue)] = broker.job_specs()
    assert queue == "node.dgx-01"
    spec = JobSpec.from_dict(sent)
    assert (spec.job_id, list(spec.gpu_uuids)) == (f"{job.pk}.1", uuids("dgx-01", 2, 3))
    assert events(target_id=job.pk) == ["job.submitted", "job.scheduled"]
    assert events("scheduling.allocation") == ["allocation.created"] * 2


def test_one_gpu_on_each_node_is_said_as_one(operator, fleet, broker):
    """Not "GPUs 2 on dgx-01": one GPU is a GPU."""
    job = submit(operator.user, gpu_count=1, node_count=2)
    response = allocate(operator, job, uuids("dgx-01", 2) + uuids("dgx-02", 5))
    assert response.status_code == 201, response.json()
    assert response.json()["placement"]["explanation"] == (
        "allocated by hand by olga: GPU 2 on dgx-01; GPU 5 on dgx-02"
    )


def test_a_gpu_work_outside_gpuadmin_holds_is_not_given_by_hand(operator, fleet):
    """A Slurm job holds it (``Gpu.held_outside``, written by the Slurm mirror's poll)."""
    job = submit(operator.user, gpu_count=1)
    [held] = uuids("dgx-01", 4)
    Gpu.objects.filter(uuid=held).update(held_outside="Slurm job 7 on hpc")
    response = allocate(operator, job, [held])
    assert response.status_code == 409
    assert response.json() == {
        "detail": f"GPUs not usable now: {held} (it is held by Slurm job 7 on hpc)"
    }
    assert not job.allocations.exists()


def test_a_gpu_is_never_given_twice_and_nothing_is_half_written(operator, fleet):
    first, second = submit(operator.user, gpu_count=2), submit(operator.user, gpu_count=2)
    assert allocate(operator, first, uuids("dgx-01", 0, 1)).status_code == 201
    audit_rows = AuditEvent.objects.count()
    taken = uuids("dgx-01", 1)[0]
    response = allocate(operator, second, uuids("dgx-01", 1, 2))  # GPU 1 is first's
    assert response.status_code == 409
    assert response.json() == {"detail": f"GPU {taken} is allocated to job {first.pk}"}
    second.refresh_from_db()
    assert (second.state, second.attempt, second.placement) == (JobState.QUEUED, 0, None)
    assert not Allocation.objects.filter(job=second).exists()
    assert Allocation.objects.active().filter(job=first).count() == 2
    assert AuditEvent.objects.count() == audit_rows
    again = allocate(operator, first, uuids("dgx-02", 0, 1))
    assert again.status_code == 409
    assert again.json() == {
        "detail": f"job {first.pk} is scheduled: only a queued job can be given GPUs"
    }


@pytest.mark.parametrize(
    ("job_fields", "gpus", "message"),
    [
        ({"gpu_count": 2}, [("dgx-01", 0)], "needs 2 GPUs on each of 1 node; got 1 on dgx-01"),
        (
            {"gpu_count": 1},
            [("dgx-01", 0), ("dgx-02", 0)],
            "needs 1 GPU on each of 1 node; got 1 on dgx-01, 1 on dgx-02",  # not "1 GPUs"
        ),
        ({"gpu_count": 2}, [("dgx-01", 0), ("dgx-01", 0)], "named twice: "),
        ({"gpu_count": 1}, [], "no present GPU or MIG device has UUID GPU-nope"),
    ],
)
def test_gpus_that_do_not_fit_the_request_are_a_400(operator, fleet, job_fields, gpus, message):
    job = submit(operator.user, **job_fields)
    named = [uuids(host, index)[0] for host, index in gpus] or ["GPU-nope"]
    response = allocate(operator, job, named)
    assert response.status_code == 400
    assert list(response.json()) == ["gpu_uuids"]
    assert message in response.json()["gpu_uuids"][0]
    assert not Allocation.objects.exists()


def test_bad_allocate_bodies(operator, fleet):
    assert operator.post("/cluster/gpu-allocate", {}, format="json").json() == {
        "job_id": ["This field is required."],
        "gpu_uuids": ["This field is required."],
    }
    response = operator.post(
        "/cluster/gpu-allocate", {"job_id": 999999999, "gpu_uuids": ["x"]}, format="json"
    )
    assert response.status_code == 404
    assert response.json() == {"detail": "No job 999999999."}
    empty = operator.post("/cluster/gpu-allocate", {"job_id": 1, "gpu_uuids": []}, format="json")
    assert list(empty.json()) == ["gpu_uuids"]


def test_gpu_status_shows_allocations(operator, fleet):
    job = submit(operator.user, gpu_count=2)
    allocate(operator, job, uuids("dgx-02", 4, 5))
    Node.objects.filter(hostname="dgx-01").update(last_heartbeat_at=None)
    body = operator.get("/cluster/gpu-status").json()
    assert (body["count"], body["allocated"], body["free"]) == (16, 2, 6)
    rows = {(row["node"], row["index"]): row for row in body["gpus"]}
    held = rows[("dgx-02", 4)]
    assert (held["job_id"], held["job_owner"], held["free"], held["schedulable"]) == (
        job.pk,
        "olga",
        False,
        True,
    )
    assert held["uuid"] == uuids("dgx-02", 4)[0]
    assert held["model"] == "NVIDIA A100-SXM4-80GB"
    assert (rows[("dgx-02", 0)]["free"], rows[("dgx-02", 0)]["job_id"]) == (True, None)
    assert rows[("dgx-01", 0)]["schedulable"] is False  # unreachable node
    one = operator.get("/cluster/gpu-status?node=dgx-02").json()
    assert {row["node"] for row in one["gpus"]} == {"dgx-02"}


def test_an_mps_gpu_with_two_shares_is_one_gpu_in_use_listing_both(operator, fleet):
    """/orchestrator/status and /cluster/gpu-status count a GPU in use once, however many
    shares it has, and gpu-status lists every job on it."""
    whole = submit(operator.user, gpu_count=1)
    assert allocate(operator, whole, uuids("dgx-01", 0)).status_code == 201
    shared = Gpu.objects.get(node__hostname="dgx-02", index=3)
    Gpu.objects.filter(pk=shared.pk).update(mps_shared=True)
    shares = []
    for percent in (30, 50):
        job = Job.objects.create(
            owner=operator.user, command=["x"], state="running", mps_percent=percent
        )
        Allocation.objects.create(
            job=job, gpu=shared, node=shared.node, kind="mps", mps_percent=percent, attempt=1
        )
        shares.append(job)

    status = operator.get("/orchestrator/status").json()
    assert status["gpus_allocated"] == 2
    body = operator.get("/cluster/gpu-status").json()
    assert body["allocated"] == 2
    row = next(row for row in body["gpus"] if (row["node"], row["index"]) == ("dgx-02", 3))
    assert (row["in_use"], row["free"], row["job_id"]) == (True, False, shares[0].pk)
    assert [
        (a["job_id"], a["job_owner"], a["kind"], a["mps_percent"]) for a in row["allocations"]
    ] == [
        (shares[0].pk, "olga", "mps", 30),
        (shares[1].pk, "olga", "mps", 50),
    ]
    row = next(row for row in body["gpus"] if (row["node"], row["index"]) == ("dgx-01", 0))
    assert [(a["job_id"], a["kind"]) for a in row["allocations"]] == [(whole.pk, "gpu")]
    assert sum(row["in_use"] for row in body["gpus"]) == 2


def test_release_cancels_through_the_agent(
    operator, fleet, broker, django_capture_on_commit_callbacks
):
    job = submit(operator.user, gpu_count=2)
    allocate(operator, job, uuids("dgx-01", 0, 1))
    with django_capture_on_commit_callbacks(execute=True):
        response = operator.post("/cluster/gpu-release", {"job_id": job.pk}, format="json")
    assert response.status_code == 202
    body = response.json()
    assert (body["released"], body["releasing"]) == ([], sorted(uuids("dgx-01", 0, 1)))
    assert body["job"]["state"] == "scheduled"  # until the agent reports its processes gone
    [(args, queue)] = broker.named("scheduling.cancel_job")
    assert (args, queue) == ((job.pk, 1, "GPUs released by olga"), "node.dgx-01")
    assert events(target_id=job.pk)[-1] == "job.cancel_requested"


def test_release_on_an_unreachable_node_is_immediate(operator, fleet):
    job = submit(operator.user, gpu_count=1)
    allocate(operator, job, uuids("dgx-01", 0))
    Node.objects.filter(hostname="dgx-01").update(
        last_heartbeat_at=timezone.now() - timedelta(hours=1)
    )
    response = operator.post("/cluster/gpu-release", {"job_id": job.pk}, format="json")
    assert response.status_code == 200
    body = response.json()
    assert (body["released"], body["releasing"]) == (uuids("dgx-01", 0), [])
    assert body["job"]["state"] == "canceled"
    assert body["job"]["allocations"][0]["active"] is False
    assert not Allocation.objects.active().exists()
    assert events(target_id=job.pk)[-1] == "job.canceled"


def test_release_of_a_job_without_gpus_is_a_conflict(operator, fleet):
    job = submit(operator.user)
    response = operator.post("/cluster/gpu-release", {"job_id": job.pk}, format="json")
    assert response.status_code == 409
    assert response.json() == {"detail": f"job {job.pk} holds no GPUs (it is queued)"}
    assert Job.objects.get(pk=job.pk).state == JobState.QUEUED


# ------------------------------------------------- MIG devices and MPS shares by hand


@pytest.fixture
def mig_node(fleet):
    """A DGX A100 40GB: GPU 0 in MIG mode with 2g.10gb devices at 0 and 2 and a 3g.20gb at
    4; GPU 2 not in MIG mode, shared through MPS; GPU 3 neither. dgx-01's GPU 7 (80 GB) is
    MPS-shared too."""
    node = add_sim_node("mig-01", "dgx-a100-40gb")
    Gpu.objects.filter(node=node, index=2).update(mps_shared=True)
    Gpu.objects.filter(node__hostname="dgx-01", index=7).update(mps_shared=True)
    shape.FleetShape.forget()
    return node


def device_of(job: Job) -> tuple[str, str, int, int | None]:
    [row] = Allocation.objects.filter(job=job).select_related("mig_instance")
    profile = row.mig_instance.profile_name if row.mig_instance else ""
    return row.kind, profile, row.gpu.index, row.mps_percent


def test_a_mig_job_gets_a_free_device_of_its_profile_on_the_gpu_named(operator, mig_node):
    gpu = uuids("mig-01", 0)
    first = submit(operator.user, mig_profile="2g.10gb")
    response = allocate(operator, first, gpu)
    assert response.status_code == 201, response.json()
    slots = {
        s.placement_start: s
        for s in sharing.mig_slots([Gpu.objects.get(uuid=gpu[0]).pk])[
            Gpu.objects.get(uuid=gpu[0]).pk
        ]
    }
    assert device_of(first) == ("mig", "2g.10gb", 0, None)
    assert Allocation.objects.get(job=first).device_uuid == slots[0].uuid  # lowest start
    assert response.json()["placement"]["explanation"] == (
        f"allocated by hand by olga: MIG device 2g.10gb ({slots[0].uuid}) of GPU 0 on mig-01"
    )
    second = submit(operator.user, mig_profile="2g.10gb")
    assert allocate(operator, second, gpu).status_code == 201
    assert Allocation.objects.get(job=second).device_uuid == slots[2].uuid

    third = submit(operator.user, mig_profile="2g.10gb")
    taken = allocate(operator, third, gpu)
    assert taken.status_code == 409
    assert taken.json() == {
        "detail": f"every 2g.10gb MIG device of GPU {gpu[0]} is allocated (to jobs {first.pk}, "
        f"{second.pk})"
    }
    named = allocate(operator, third, [slots[2].uuid])
    assert named.status_code == 409
    assert named.json() == {"detail": f"MIG device {slots[2].uuid} is allocated to job {second.pk}"}
    assert not Allocation.objects.filter(job=third).exists()
    assert events("scheduling.allocation") == ["allocation.created"] * 2


def test_a_mig_job_gets_the_mig_device_named(
    operator, mig_node, broker, django_capture_on_commit_callbacks
):
    gpu = Gpu.objects.get(node=mig_node, index=0)
    device = gpu.mig_instances.get(profile_name="3g.20gb")
    job = submit(operator.user, mig_profile="3g.20gb")
    with django_capture_on_commit_callbacks(execute=True):
        response = allocate(operator, job, [device.uuid])
    assert response.status_code == 201, response.json()
    [(sent, queue)] = broker.job_specs()
    assert (queue, list(JobSpec.from_dict(sent).gpu_uuids)) == ("node.mig-01", [device.uuid])
    row = Allocation.objects.get(job=job)
    assert (row.kind, row.mig_instance_id, row.device_uuid, row.manual) == (
        "mig",
        device.pk,
        device.uuid,
        True,
    )
    assert events(target_id=job.pk) == ["job.submitted", "job.scheduled"]


def test_an_mps_job_gets_its_share_of_the_gpu_named_while_it_has_room(operator, mig_node):
    gpu = uuids("mig-01", 2)
    first = submit(operator.user, mps_percent=60, mps_memory_mib=8192)
    response = allocate(operator, first, gpu)
    assert response.status_code == 201, response.json()
    assert device_of(first) == ("mps", "", 2, 60)
    assert Allocation.objects.get(job=first).mps_memory_mib == 8192
    assert response.json()["placement"]["explanation"] == (
        "allocated by hand by olga: an MPS share of 60 % and 8 GiB of GPU 2 on mig-01"
    )
    second = submit(operator.user, mps_percent=30)
    assert allocate(operator, second, gpu).status_code == 201
    assert device_of(second) == ("mps", "", 2, 30)

    third = submit(operator.user, mps_percent=20)
    full = allocate(operator, third, gpu)
    assert full.status_code == 409
    assert full.json() == {
        "detail": f"GPU {gpu[0]} has 10 % of its SMs and 32 GiB free for MPS shares (jobs "
        f"{first.pk}, {second.pk} hold the rest); job {third.pk} asks for an MPS share of 20 %"
    }
    assert not Allocation.objects.filter(job=third).exists()


@pytest.mark.parametrize(
    ("job_fields", "index", "message"),
    [
        (
            {"mig_profile": "2g.10gb"},
            3,
            "is neither in MIG mode nor shared through MPS; job {job} asks for a 2g.10gb MIG "
            "device",
        ),
        (
            {"mig_profile": "2g.10gb"},
            2,
            "is shared through MPS (only shares of it can be given); job {job} asks for a "
            "2g.10gb MIG device",
        ),
        (
            {"mig_profile": "1g.5gb"},
            0,
            "has no 1g.5gb MIG device (its devices: 2g.10gb, 2g.10gb, 3g.20gb); job {job} asks "
            "for a 1g.5gb MIG device",
        ),
        (
            {"mps_percent": 30},
            0,
            "is in MIG mode (only its MIG devices can be given); job {job} asks for an MPS share "
            "of 30 %",
        ),
        (
            {"mps_percent": 30},
            3,
            "is neither in MIG mode nor shared through MPS; job {job} asks for an MPS share of "
            "30 %",
        ),
        (
            {"mps_percent": 30, "mps_memory_mib": 40961},
            2,
            "has 40 GiB; job {job} asks for an MPS share of 30 % and 40961 MiB",
        ),
        (
            {},
            0,
            "is in MIG mode (only its MIG devices can be given); job {job} asks for whole GPUs",
        ),
        (
            {},
            2,
            "is shared through MPS (only shares of it can be given); job {job} asks for whole GPUs",
        ),
    ],
)
def test_a_gpu_of_another_kind_than_the_job_asks_for_is_a_400(
    operator, mig_node, job_fields, index, message
):
    """The README's promise: what does not fit the request is a 400 naming gpu_uuids (the
    MIG and MPS jobs were a 409: 'job 7 asks for a MIG device, not whole GPUs')."""
    job = submit(operator.user, **job_fields)
    [uuid] = uuids("mig-01", index)
    response = allocate(operator, job, [uuid])
    assert response.status_code == 400, response.json()
    assert response.json() == {"gpu_uuids": [f"GPU {uuid} {message.format(job=job.pk)}"]}
    assert not Allocation.objects.exists()
    assert Job.objects.get(pk=job.pk).state == JobState.QUEUED


def test_a_mig_device_that_does_not_fit_the_job_is_a_400(operator, mig_node):
    device = Gpu.objects.get(node=mig_node, index=0).mig_instances.get(profile_name="3g.20gb")
    whole, small = submit(operator.user), submit(operator.user, mig_profile="2g.10gb")
    assert allocate(operator, whole, [device.uuid]).json() == {
        "gpu_uuids": [f"{device.uuid} is a MIG device; job {whole.pk} asks for whole GPUs"]
    }
    assert allocate(operator, small, [device.uuid]).json() == {
        "gpu_uuids": [
            f"MIG device {device.uuid} is a 3g.20gb; job {small.pk} asks for a 2g.10gb MIG device"
        ]
    }
    assert not Allocation.objects.exists()
