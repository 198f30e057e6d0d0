"""Every scheduling caller of the one rule (``inventory.usability``) agrees: a GPU that fell off
the bus, a MIG-mode GPU or one running a foreign process is neither schedulable nor free in
``/cluster/gpu-status``, ``/orchestrator/status`` and ``/api/v1/gpus/?free=true``, is
unavailable in the placement loop's snapshot, gets no job from the loop, and is refused (409)
by ``POST /cluster/gpu-allocate``."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from django.utils import timezone
from rest_framework.test import APIClient

from gpuadmin.access.models import Role
from inventory import live
from inventory.models import Gpu, Node
from inventory.nvml.scanner import scan
from inventory.nvml.sim import SimulatedNvml, faults
from inventory.services import apply_discovery
from scheduling.allocations import services as allocation_services
from scheduling.jobs import shape
from scheduling.loop import passes as loop
from scheduling.loop import snapshot as loop_snapshot
from scheduling.models import Allocation, JobState
from tests.inventory.pages import unique_host
from tests.scheduling.pages.helpers import person, submit

pytestmark = pytest.mark.django_db

LOST, BUSY = 5, 3


class SimNode:
    """A discovered, heartbeating simulated node whose agent's samples a test publishes."""

    def __init__(self, model: str) -> None:
        self.host = unique_host()
        self.nvml = SimulatedNvml.from_model(model, node_name=self.host)
        apply_discovery(self.host, scan(self.nvml))
        Node.objects.filter(hostname=self.host).update(last_heartbeat_at=timezone.now())
        shape.FleetShape.forget()
        self.sample()

    def sample(self) -> None:
        live.publish(self.host, scan(self.nvml, include=("facts", "metrics")))

    def uuid(self, index: int) -> str:
        return Gpu.objects.get(node__hostname=self.host, index=index).uuid

    def pk(self, index: int) -> int:
        return Gpu.objects.get(node__hostname=self.host, index=index).pk


@pytest.fixture
def sim_node() -> Iterator[type[SimNode]]:
    made: list[SimNode] = []

    def make(model: str = "dgx-a100-80gb") -> SimNode:
        made.append(SimNode(model))
        return made[-1]

    yield make
    for node in made:
        live.client().delete(live.KEY_PREFIX + node.host)


@pytest.fixture
def operator() -> APIClient:
    client = APIClient()
    client.user = person("olga", Role.OPERATOR)
    client.force_login(client.user)
    return client


def status_rows(client: APIClient, node: SimNode) -> dict[int, dict]:
    body = client.get(f"/cluster/gpu-status?node={node.host}").json()
    return {row["index"]: row for row in body["gpus"]}


def free_indexes(client: APIClient, node: SimNode) -> list[int]:
    rows = client.get(f"/api/v1/gpus/?free=true&node={node.host}").json()["results"]
    return [row["index"] for row in rows]


def gpus_free(client: APIClient) -> int:
    return client.get("/orchestrator/status").json()["gpus_free"]


def unavailable(node: SimNode) -> dict[int, str | None]:
    _, slots = loop_snapshot.take_snapshot()
    return {slot.index: slot.unavailable for slot in slots.values() if slot.node == node.host}


def allocate_by_hand(client: APIClient, gpu_uuids: list[str]):
    job = submit(client.user, gpu_count=len(gpu_uuids))
    response = client.post(
        "/cluster/gpu-allocate", {"job_id": job.pk, "gpu_uuids": gpu_uuids}, format="json"
    )
    return job, response


def test_a_gpu_that_fell_off_the_bus_is_unusable_at_once_everywhere(operator, sim_node, broker):
    node = sim_node()
    faults.fall_off_bus(node.nvml, None, LOST)
    node.sample()  # the agent's next sample; no rescan: the catalog row has no error yet

    lost = status_rows(operator, node)[LOST]
    assert (lost["schedulable"], lost["free"], lost["unusable"]) == (False, False, "error")
    assert "NVML_ERROR_GPU_IS_LOST" in lost["unusable_reason"]
    assert gpus_free(operator) == 7
    assert LOST not in free_indexes(operator, node)
    assert unavailable(node)[LOST] == "error"

    whole_node = submit(operator.user, gpu_count=8)
    loop.run_pass()
    whole_node.refresh_from_db()
    assert whole_node.state == JobState.QUEUED  # 7 usable GPUs: it waits

    job, refused = allocate_by_hand(operator, [node.uuid(LOST)])
    assert refused.status_code == 409
    assert "NVML_ERROR_GPU_IS_LOST" in refused.json()["detail"]
    assert not Allocation.objects.filter(job=job).exists()


def test_a_mig_gpu_is_never_handed_out_whole_nor_counted_free(operator, sim_node, broker):
    node = sim_node("dgx-a100-40gb")  # GPUs 0 and 1 in MIG mode

    job, refused = allocate_by_hand(operator, [node.uuid(0)])

    assert refused.status_code == 400  # not what a whole-GPU job asks for
    assert "is in MIG mode (only its MIG devices can be given)" in refused.json()["gpu_uuids"][0]
    job.refresh_from_db()
    assert job.state == JobState.QUEUED
    rows = status_rows(operator, node)
    assert [(rows[i]["schedulable"], rows[i]["unusable"]) for i in (0, 1)] == [(False, "mig")] * 2
    assert gpus_free(operator) == 6
    assert free_indexes(operator, node) == [2, 3, 4, 5, 6, 7]
    assert [unavailable(node)[i] for i in (0, 1)] == ["mig", "mig"]


def test_a_foreign_process_makes_a_gpu_unusable_but_a_jobs_own_do_not(operator, sim_node, broker):
    node = sim_node()
    held = submit(operator.user, gpu_count=1)
    allocation_services.allocate(held, [node.pk(2)], actor=operator.user)
    faults.start_process(node.nvml, None, 2, 4100, used_mib=1_000, util=50)  # the job's
    faults.start_process(node.nvml, None, BUSY, 4242, used_mib=1_000, util=50)  # nobody's
    node.sample()

    rows = status_rows(operator, node)
    busy = rows[BUSY]
    assert (busy["schedulable"], busy["free"], busy["unusable"]) == (
        False,
        False,
        "foreign-process",
    )
    assert (rows[2]["schedulable"], rows[2]["free"], rows[2]["unusable"]) == (True, False, None)
    assert gpus_free(operator) == 6
    assert free_indexes(operator, node) == [0, 1, 4, 5, 6, 7]
    assert unavailable(node)[BUSY] == "foreign-process"
    assert unavailable(node)[2] is None

    _, refused = allocate_by_hand(operator, [node.uuid(BUSY)])
    assert refused.status_code == 409
    assert "outside any allocation" in refused.json()["detail"]


def test_a_real_node_that_confines_no_job_takes_none_until_an_admin_allows_it(
    operator, sim_node, broker
):
    # Its agent would refuse every job (docs/administration/isolation.md): the loop places
    # none there, every count and the manual allocation agree, until an admin allows them.
    node = sim_node()
    why = "not root, and /sys/fs/cgroup/gpuadmin is not delegated to this agent"
    Node.objects.filter(hostname=node.host).update(
        nvml_backend="real", isolation="none", isolation_reason=why
    )

    rows = status_rows(operator, node)
    assert {(row["schedulable"], row["unusable"]) for row in rows.values()} == {
        (False, "unconfined")
    }
    assert "confines no job" in rows[0]["unusable_reason"]
    assert gpus_free(operator) == 0
    assert free_indexes(operator, node) == []
    assert set(unavailable(node).values()) == {"unconfined"}
    waiting = submit(operator.user, gpu_count=1)
    loop.run_pass()
    waiting.refresh_from_db()
    assert waiting.state == JobState.QUEUED
    _, refused = allocate_by_hand(operator, [node.uuid(0)])
    assert refused.status_code == 409
    assert "confines no job" in refused.json()["detail"]

    Node.objects.filter(hostname=node.host).update(allow_unconfined=True)
    loop.run_pass()
    waiting.refresh_from_db()
    assert waiting.state == JobState.SCHEDULED
