"""What ``/metrics`` says about the registered Ray clusters, as the poll last read them: whether
each answered, its nodes per state, its GPUs and the GPUs in use, and the jobs submitted to it
through gpuadmin per state (docs/operations/prometheus.md)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator

from django.db.models import Count
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from integrations.ray.models import ClusterState, RayCluster, RayJob


class RayCollector(Collector):
    """Two queries per scrape however many clusters, nodes and jobs (the clusters with their
    nodes, the jobs counted by cluster and state); one when no cluster is registered. The
    clusters are not asked: an unreachable one costs the scrape nothing."""

    def collect(self) -> Iterator[Metric]:
        up = GaugeMetricFamily(
            "gpuadmin_ray_cluster_up",
            "1 when the Ray cluster answered its last read, 0 when it was unreachable or "
            "refused (not yet read: absent).",
            labels=["cluster"],
        )
        nodes = GaugeMetricFamily(
            "gpuadmin_ray_nodes",
            "Ray nodes per cluster and state (ALIVE or DEAD, lower-cased), as last read.",
            labels=["cluster", "state"],
        )
        gpus = GaugeMetricFamily(
            "gpuadmin_ray_gpus",
            "GPUs of the Ray cluster's alive nodes, as last read.",
            labels=["cluster"],
        )
        in_use = GaugeMetricFamily(
            "gpuadmin_ray_gpus_in_use",
            "GPUs the Ray cluster's jobs hold on its alive nodes, as last read.",
            labels=["cluster"],
        )
        jobs = GaugeMetricFamily(
            "gpuadmin_ray_jobs",
            "Jobs submitted to the Ray cluster through gpuadmin, per state (gpuadmin's words: "
            "pending, queued, running, completed, failed, canceled).",
            labels=["cluster", "state"],
        )
        clusters = list(
            RayCluster.objects.values_list("name", "state", "nodes", "gpus", "gpus_in_use")
        )
        for name, state, read_nodes, total, used in clusters:
            if state == ClusterState.NEW:
                continue
            up.add_metric([name], 1 if state == ClusterState.OK else 0)
            counted = Counter(str(node.get("state", "")).lower() for node in read_nodes)
            for node_state, count in sorted(counted.items()):
                nodes.add_metric([name, node_state], count)
            gpus.add_metric([name], total)
            in_use.add_metric([name], used)
        if clusters:
            rows = (
                RayJob.objects.order_by()
                .values_list("cluster__name", "state")
                .annotate(n=Count("pk"))
            )
            for cluster, state, count in sorted(rows):
                jobs.add_metric([cluster, state], count)
        yield from (up, nodes, gpus, in_use, jobs)
