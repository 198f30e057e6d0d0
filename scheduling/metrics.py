"""What ``/metrics`` says about the scheduler: GPUs held per user and project, the jobs not yet
finished per state, and how long the waiting ones have waited (docs/operations/prometheus.md)."""

from __future__ import annotations

from collections.abc import Iterator

from django.db.models import Aggregate, Count, FloatField, Min
from django.db.models.functions import Extract
from django.utils import timezone
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from scheduling.jobs.queries import WAITING_STATES
from scheduling.models import TERMINAL_STATES, Allocation, Job, JobState


class Median(Aggregate):
    """PostgreSQL's ``percentile_cont(0.5)`` over a number."""

    function = "percentile_cont"
    template = "%(function)s(0.5) WITHIN GROUP (ORDER BY %(expressions)s)"
    output_field = FloatField()


class SchedulingCollector(Collector):
    """Three aggregate queries per scrape, however many jobs."""

    def collect(self) -> Iterator[Metric]:
        yield self.allocations()
        yield self.jobs()
        yield from self.waits()

    def allocations(self) -> Metric:
        held = GaugeMetricFamily(
            "gpuadmin_allocated_gpus",
            "GPUs held by active allocations, per job owner and project (a GPU held in MPS "
            "shares or MIG devices counts once for each of them).",
            labels=["user", "project"],
        )
        rows = (
            Allocation.objects.active()
            .order_by()
            .values_list("job__owner__username", "job__project")
            .annotate(n=Count("gpu_id", distinct=True))
        )
        for user, project, count in sorted(rows):
            held.add_metric([user, project], count)
        return held

    def jobs(self) -> Metric:
        jobs = GaugeMetricFamily(
            "gpuadmin_jobs", "Jobs not yet finished, per state.", labels=["state"]
        )
        live_states = [state for state in JobState.values if state not in TERMINAL_STATES]
        counts = dict.fromkeys(live_states, 0)
        counts.update(
            Job.objects.filter(state__in=live_states)
            .order_by()
            .values_list("state")
            .annotate(n=Count("pk"))
        )
        for state, count in counts.items():
            jobs.add_metric([state], count)
        return jobs

    def waits(self) -> Iterator[Metric]:
        """The oldest and the median wait of the held and queued jobs (left out when none
        waits: no wait is not a wait of 0 s)."""
        now = timezone.now()
        waiting = Job.objects.filter(state__in=WAITING_STATES).aggregate(
            oldest=Min("submitted_at"), median=Median(Extract("submitted_at", "epoch"))
        )
        oldest = GaugeMetricFamily(
            "gpuadmin_queue_oldest_wait_seconds",
            "How long the longest-waiting held or queued job has waited.",
        )
        median = GaugeMetricFamily(
            "gpuadmin_queue_median_wait_seconds",
            "The median wait of the held and queued jobs so far.",
        )
        if waiting["oldest"] is not None:
            oldest.add_metric([], (now - waiting["oldest"]).total_seconds())
            median.add_metric([], now.timestamp() - waiting["median"])
        yield oldest
        yield median
