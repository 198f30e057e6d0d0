"""A Ray application's central side (``scheduling.jobs.ray``): what a submission may ask of Ray,
each node's part of its cluster as dispatch sends it, the head's ports per node and attempt,
and its token. The cluster itself runs in tests/integration/test_ray_jobs.py."""

from __future__ import annotations

import importlib.util

import pytest
from django.utils import timezone

from inventory.models import Node
from scheduling.agent.wire import FinalState, JobFinished, JobSpec, RayPart, executor_id
from scheduling.jobs import ray, reports, submission
from scheduling.jobs.limits import JobRejected
from scheduling.loop import passes as loop
from scheduling.models import Allocation, Job, JobState
from tests.scheduling.conftest import add_sim_node

pytestmark = pytest.mark.django_db


@pytest.fixture
def nodes() -> list[Node]:
    nodes = [add_sim_node("dgx-01"), add_sim_node("dgx-02")]
    Node.objects.filter(hostname="dgx-01").update(address="10.0.0.1")
    return nodes


def test_each_node_gets_its_part_of_the_cluster(
    nodes, django_user_model, broker, django_capture_on_commit_callbacks, settings
) -> None:
    settings.GPUADMIN_RAY_HEAD_PORT = 31000
    owner = django_user_model.objects.create_user("rosa")
    job = submission.submit_job(
        owner, command=["python", "app.py"], gpu_count=8, node_count=2, ray=True
    )
    with django_capture_on_commit_callbacks(execute=True):
        loop.run_pass()
    job.refresh_from_db()
    assert job.ray_port == 31000
    specs = [JobSpec.from_dict(spec) for spec, _ in broker.job_specs()]
    # The head is on the first node by hostname, reached at its address; the other node has
    # no address, so its hostname stands for it.
    assert [spec.ray for spec in specs] == [
        RayPart(head_address="10.0.0.1", port=31000, node_address="10.0.0.1", nodes=2, head=True),
        RayPart(head_address="10.0.0.1", port=31000, node_address="dgx-02", nodes=2, head=False),
    ]
    for spec in specs:
        assert spec.env["RAY_AUTH_MODE"] == "token"
        assert spec.env["RAY_AUTH_TOKEN"] == ray.token(job)
        assert JobSpec.from_dict(spec.to_dict()) == spec


def test_heads_on_one_node_never_share_a_port(
    nodes, django_user_model, broker, django_capture_on_commit_callbacks, settings
) -> None:
    settings.GPUADMIN_RAY_HEAD_PORT, settings.GPUADMIN_RAY_HEADS_PER_NODE = 31000, 2
    owner = django_user_model.objects.create_user("rosa")
    for _ in range(4):  # two on each node
        submission.submit_job(owner, command=["python", "app.py"], gpu_count=4, ray=True)
    with django_capture_on_commit_callbacks(execute=True):
        loop.run_pass()
    on = {
        node.hostname: list(
            Job.objects.filter(allocations__node=node, allocations__released_at__isnull=True)
            .distinct()
            .order_by("pk")
        )
        for node in nodes
    }
    for jobs in on.values():
        assert sorted(job.ray_port for job in jobs) == [31000, 31003]
    # Asked again in the same attempt (a resend), a job keeps its slot; a node's slots all
    # taken, another head cannot start there.
    first = min(on["dgx-01"], key=lambda job: job.ray_port)
    assert ray.head_port(first, nodes[0]) == 31000
    with pytest.raises(ValueError, match="dgx-01 holds 2 Ray heads already"):
        ray.head_port(on["dgx-02"][0], nodes[0])


def test_a_new_attempt_has_a_new_token(django_user_model) -> None:
    owner = django_user_model.objects.create_user("rosa")
    job = Job(pk=7, owner=owner, attempt=1, ray=True)
    first = ray.token(job)
    job.attempt = 2
    assert ray.token(job) != first and len(first) == 64


@pytest.mark.parametrize(
    "fields, why",
    [
        ({"container_image": "nvcr.io/nvidia/pytorch:24.05-py3"}, "runs on the host"),
        ({"mps_percent": 50}, "not MPS"),
    ],
)
def test_a_ray_application_that_could_not_run_is_refused(
    nodes, django_user_model, fields, why
) -> None:
    owner = django_user_model.objects.create_user("rosa")
    with pytest.raises(JobRejected, match=why) as refused:
        submission.submit_job(owner, command=["python", "app.py"], ray=True, **fields)
    assert refused.value.field == "ray"


def test_without_ray_installed_the_option_is_refused(nodes, django_user_model, monkeypatch) -> None:
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "ray" else real(name, *a)
    )
    owner = django_user_model.objects.create_user("rosa")
    with pytest.raises(JobRejected, match=r"pip install 'gpuadmin\[ray\]'"):
        submission.submit_job(owner, command=["python", "app.py"], ray=True)


def test_a_ray_worker_that_ends_first_ends_the_attempt_never_as_a_success(
    nodes, django_user_model, broker, django_capture_on_commit_callbacks
) -> None:
    """A Ray application's status is its entrypoint's (on the head, dgx-01): its worker on
    dgx-02 leaving the cluster, even with status 0, fails the attempt (re-queued while retries
    are left), and the head's part is stopped; the job keeps every GPU until it is gone."""
    owner = django_user_model.objects.create_user("rosa")
    job = submission.submit_job(
        owner, command=["python", "app.py"], gpu_count=8, node_count=2, ray=True
    )
    loop.run_pass()
    job.refresh_from_db()
    now = timezone.now()
    worker = JobFinished(executor_id(job.pk, 1), FinalState.COMPLETED, 0, now, "", 1.0)
    with django_capture_on_commit_callbacks(execute=True):
        assert reports.job_events([worker], sender="dgx-02").reached == {}
    said = "stopped: its part on dgx-02 ended (completed)"
    assert broker.named("scheduling.cancel_job") == [((job.pk, 1, said), "node.dgx-01")]
    assert Allocation.objects.active().filter(job=job).count() == 16
    head = JobFinished(executor_id(job.pk, 1), FinalState.CANCELED, -15, now, "canceled", 1.0)
    assert reports.job_events([head], sender="dgx-01").reached == {job.pk: JobState.FAILED}
    job.refresh_from_db()
    assert (job.exit_code, job.message) == (
        0,
        "its Ray worker on dgx-02 ended before the entrypoint",
    )
    assert not Allocation.objects.active().filter(job=job).exists()
