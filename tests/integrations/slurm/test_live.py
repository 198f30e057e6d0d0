"""The client against a real Slurm 22.05 (conftest.py): a job holding 2 GPUs, a drained node,
partitions, the API version chosen, and the errors a refused token or an absent server give."""

from __future__ import annotations

import re
import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from slurm import GPUS, NODE, PARTITION, SlurmCluster  # bench/slurm.py (see __init__.py)

from integrations.slurm.rest.client import SlurmRestClient, SlurmRestError
from integrations.slurm.rest.model import ClusterState, SlurmJob
from tests.waiting import wait_for

pytestmark = pytest.mark.integration

WAIT_S = 60


@pytest.fixture(params=["jwt", "local"])
def client(request: pytest.FixtureRequest, slurm_cluster: SlurmCluster) -> SlurmRestClient:
    """A client of each authentication: JWT over TCP, local over the Unix socket."""
    if request.param == "jwt":
        url = f"http://127.0.0.1:{slurm_cluster.rest_port}"
        return SlurmRestClient(url, user="nobody", token=slurm_cluster.token())
    return SlurmRestClient(slurm_cluster.socket)


def scontrol(cluster: SlurmCluster, *args: str) -> str:
    done = subprocess.run(
        ["scontrol", *args], env=cluster.env, capture_output=True, text=True, check=True
    )
    return done.stdout


@pytest.fixture
def two_gpu_job(slurm_cluster: SlurmCluster) -> Iterator[int]:
    """``sbatch --gres=gpu:2 --wrap 'sleep 60'``, running; canceled at the end."""
    job_id = int(
        slurm_cluster.client().sbatch(["-D", "/tmp", "--gres=gpu:2", "--wrap", "sleep 60"])
    )
    try:
        wait_for(
            lambda: "JobState=RUNNING" in scontrol(slurm_cluster, "show", "job", str(job_id)),
            WAIT_S,
            f"job {job_id} to run",
        )
        yield job_id
    finally:
        subprocess.run(["scancel", str(job_id)], env=slurm_cluster.env, check=True)


def job_of(state: ClusterState, job_id: int) -> SlurmJob:
    (job,) = [job for job in state.jobs if job.job_id == job_id]
    return job


def test_the_newest_version_read_is_chosen(client: SlurmRestClient) -> None:
    assert client.offered_versions() == ("v0.0.38", "v0.0.37")
    assert client.read_cluster().version == "v0.0.38"


def test_a_socket_may_be_named_as_a_unix_url(slurm_cluster: SlurmCluster) -> None:
    assert SlurmRestClient(f"unix:{slurm_cluster.socket}").version() == "v0.0.38"


def test_a_job_holding_two_gpus_shows_its_node_and_indexes(
    client: SlurmRestClient, slurm_cluster: SlurmCluster, two_gpu_job: int
) -> None:
    # Slurm's own word on the job's GPUs: "GRES=gpu:2(IDX:0-1)" in scontrol's detailed view.
    detail = scontrol(slurm_cluster, "show", "job", "-d", str(two_gpu_job))
    held = re.search(r"GRES=gpu:2\(IDX:(\d+)-(\d+)\)", detail)
    assert held is not None, detail
    first, last = int(held[1]), int(held[2])
    state = client.read_cluster()
    job = job_of(state, two_gpu_job)
    assert (job.state, job.partition, job.user, job.name) == ("RUNNING", PARTITION, "root", "wrap")
    assert job.nodes == (NODE,)
    assert job.gpus == {NODE: tuple(range(first, last + 1))}
    assert len(job.gpus[NODE]) == 2
    assert job.gpus_requested == 2
    assert job.cpus >= 1 and job.start_time is not None and job.submit_time is not None
    (node,) = state.nodes
    assert node.gpus == GPUS
    assert set(job.gpus[NODE]) <= set(node.gpus_used)


def test_a_drained_node_shows_drain_and_its_reason(
    client: SlurmRestClient, slurm_cluster: SlurmCluster
) -> None:
    reason = "GPU 3 fell off the bus"
    scontrol(slurm_cluster, "update", f"nodename={NODE}", "state=drain", f"reason={reason}")
    try:
        (node,) = client.read_cluster().nodes
        assert node.name == NODE
        assert "DRAIN" in node.states
        assert node.states[0] in ("IDLE", "MIXED", "ALLOCATED")
        assert (node.reason, node.reason_set_by) == (reason, "root")
        assert node.reason_changed_at is not None
    finally:
        scontrol(slurm_cluster, "update", f"nodename={NODE}", "state=resume")
    (node,) = client.read_cluster().nodes
    assert "DRAIN" not in node.states and node.reason == ""


def test_partitions(client: SlurmRestClient) -> None:
    (partition,) = client.read_cluster().partitions
    assert (partition.name, partition.nodes, partition.state) == (PARTITION, (NODE,), "UP")
    assert (partition.total_nodes, partition.total_cpus) == (1, 8)


def test_22_05_cannot_drain_through_slurmrestd(client: SlurmRestClient) -> None:
    with pytest.raises(SlurmRestError, match="speaks v0.0.38, which cannot update nodes"):
        client.drain_node(NODE, "fenced")


def test_a_bad_token_is_refused_clearly(slurm_cluster: SlurmCluster) -> None:
    url = f"http://127.0.0.1:{slurm_cluster.rest_port}"
    with pytest.raises(SlurmRestError) as refused:
        SlurmRestClient(url, user="nobody", token="not-a-token").read_cluster()
    message = str(refused.value)
    assert message.startswith(f"slurmrestd at {url} answered GET /slurm/v0.0.38/nodes")
    assert "Unspecified error (error -1)" in message and "token" in message


def test_no_token_over_tcp_is_refused(slurm_cluster: SlurmCluster) -> None:
    url = f"http://127.0.0.1:{slurm_cluster.rest_port}"
    with pytest.raises(SlurmRestError, match=r"refused local authentication \(no token\).*401"):
        SlurmRestClient(url).read_cluster()


def test_an_absent_server_is_unreachable(tmp_path: Path) -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]  # nothing listens there once closed
    with pytest.raises(SlurmRestError, match="cannot be reached: ConnectionRefusedError"):
        SlurmRestClient(f"http://127.0.0.1:{port}", user="u", token="t").read_cluster()
    with pytest.raises(SlurmRestError, match="cannot be reached: FileNotFoundError"):
        SlurmRestClient(str(tmp_path / "absent.sock")).read_cluster()


def test_a_silent_server_times_out() -> None:
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen()  # connections wait in the backlog, never answered
        url = f"http://127.0.0.1:{silent.getsockname()[1]}"
        with pytest.raises(SlurmRestError, match="cannot be reached: TimeoutError"):
            SlurmRestClient(url, user="u", token="t", timeout_s=0.5).read_cluster()
