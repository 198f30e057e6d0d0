"""``/metrics`` on the Ray clusters, scraped and parsed: the real cluster up with its two nodes,
four GPUs and the GPU its running job holds, an unreachable cluster down, a cluster not read yet
absent, the jobs per cluster and state; in two queries, asking no cluster."""

from __future__ import annotations

import time

import pytest
from django.test import Client
from prometheus_client.parser import text_string_to_metric_families

from integrations.ray import services
from integrations.ray.models import RayCluster, RayJob, RayJobState
from tests.integrations.ray.test_external_cluster import follow_until, person

pytestmark = [pytest.mark.django_db, pytest.mark.integration]


def scrape() -> dict[str, dict[tuple[tuple[str, str], ...], float]]:
    """The ``gpuadmin_ray_*`` samples by name, then by their labels."""
    answer = Client().get("/metrics")
    assert answer.status_code == 200
    found: dict[str, dict[tuple[tuple[str, str], ...], float]] = {}
    for family in text_string_to_metric_families(answer.content.decode()):
        for sample in family.samples:
            if sample.name.startswith("gpuadmin_ray_"):
                labels = tuple(sorted(sample.labels.items()))
                found.setdefault(sample.name, {})[labels] = sample.value
    return found


def test_the_clusters_and_their_jobs_on_metrics(cluster, admin, free_port):
    gone = services.save_cluster(
        RayCluster(name="gone", address=f"http://127.0.0.1:{free_port}"), actor=admin
    )
    owner = person("alice")
    job = services.submit(owner=owner, cluster=cluster, entrypoint="sleep 120", gpus=1)
    services.send(job)
    follow_until(job, lambda job: job.state == RayJobState.RUNNING)
    deadline = time.monotonic() + 30  # Ray's load report catches up within seconds
    while services.read_cluster(cluster).gpus_in_use != 1:
        assert time.monotonic() < deadline, cluster.nodes
        time.sleep(0.5)
    # Registered after the poll above: not read yet.
    RayCluster.objects.create(name="later", address=f"http://127.0.0.1:{free_port}")
    for state in (RayJobState.COMPLETED, RayJobState.COMPLETED, RayJobState.FAILED):
        RayJob.objects.create(
            owner=owner,
            cluster=gone,
            entrypoint="true",
            state=state,
            submission_id=f"x-{state}-{RayJob.objects.count()}",
        )

    metrics = scrape()

    lab, down = (("cluster", "lab"),), (("cluster", "gone"),)
    assert metrics["gpuadmin_ray_cluster_up"] == {lab: 1, down: 0}  # "later": not read yet
    assert metrics["gpuadmin_ray_nodes"] == {(("cluster", "lab"), ("state", "alive")): 2}
    assert metrics["gpuadmin_ray_gpus"] == {lab: 4, down: 0}
    assert metrics["gpuadmin_ray_gpus_in_use"] == {lab: 1, down: 0}
    assert metrics["gpuadmin_ray_jobs"] == {
        (("cluster", "gone"), ("state", "completed")): 2,
        (("cluster", "gone"), ("state", "failed")): 1,
        (("cluster", "lab"), ("state", "running")): 1,
    }
    assert gone.state == "unreachable"
    services.cancel(actor=owner, job=job)
    follow_until(job, lambda job: not job.active)  # its GPU free again for the next tests


def test_the_collector_reads_two_queries_and_asks_no_cluster(
    db, free_port, django_assert_num_queries
):
    from integrations.ray.metrics import RayCollector

    with django_assert_num_queries(1):
        families = list(RayCollector().collect())
    assert [family.samples for family in families] == [[]] * 5
    for name in ("a", "b", "c"):  # nothing listens there: a scrape would wait if it asked
        RayCluster.objects.create(
            name=name, address=f"http://127.0.0.1:{free_port}", state="unreachable"
        )
    started = time.monotonic()
    with django_assert_num_queries(2):
        families = list(RayCollector().collect())
    assert time.monotonic() - started < 1
    assert len(families[0].samples) == 3
