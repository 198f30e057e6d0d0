"""What ``/metrics`` says about the mirrored Slurm clusters: whether each answered its last poll,
its nodes per state, its jobs per state and the GPUs its jobs hold
(docs/operations/prometheus.md)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Iterator

from django.db.models import Count
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from integrations.slurm.models import PollState, SlurmCluster, SlurmJob, SlurmJobGpu, SlurmNode


def _node_states() -> Iterable[tuple[tuple[str, str], int]]:
    """(cluster, state) -> nodes, each of a node's states and flags counted."""
    counted: Counter[tuple[str, str]] = Counter()
    for cluster, states in SlurmNode.objects.values_list("cluster__name", "states"):
        counted.update((cluster, state.lower()) for state in states)
    return sorted(counted.items())


def _jobs() -> Iterable[tuple[tuple[str, str], int]]:
    rows = SlurmJob.objects.order_by().values_list("cluster__name", "state").annotate(n=Count("pk"))
    return sorted(((cluster, state.lower()), count) for cluster, state, count in rows)


def _gpus() -> Iterable[tuple[tuple[str, str], int]]:
    rows = (
        SlurmJobGpu.objects.order_by()
        .values_list("job__cluster__name", "job__user")
        .annotate(n=Count("pk"))
    )
    return sorted(((cluster, user), count) for cluster, user, count in rows)


class SlurmCollector(Collector):
    """Four queries per scrape however many clusters, nodes and jobs; one when no cluster is
    registered (the other series are then empty)."""

    def collect(self) -> Iterator[Metric]:
        up = GaugeMetricFamily(
            "gpuadmin_slurm_cluster_up",
            "1 when the Slurm cluster's last poll was answered, 0 when it was unreachable or "
            "refused (not yet polled: absent).",
            labels=["cluster"],
        )
        clusters = list(SlurmCluster.objects.values_list("name", "state"))
        for name, state in clusters:
            if state != PollState.NEW:
                up.add_metric([name], 1 if state == PollState.OK else 0)
        yield up
        series = (
            (
                "gpuadmin_slurm_nodes",
                "Slurm nodes per cluster and state (each of a node's states and flags: a "
                "drained mixed node counts in mixed and in drain).",
                ["cluster", "state"],
                _node_states,
            ),
            (
                "gpuadmin_slurm_jobs",
                "Jobs in Slurm's queue per cluster and state.",
                ["cluster", "state"],
                _jobs,
            ),
            (
                "gpuadmin_slurm_allocated_gpus",
                "GPUs held by Slurm jobs per cluster and user.",
                ["cluster", "user"],
                _gpus,
            ),
        )
        for name, help_text, labels, read in series:
            family = GaugeMetricFamily(name, help_text, labels=labels)
            for values, count in read() if clusters else ():
                family.add_metric(list(values), count)
            yield family
