"""FilterSets for inventory lists, shared by the API viewsets and the HTML list views."""

from __future__ import annotations

import django_filters
from django.db.models import QuerySet

from inventory import live
from inventory.choices import GpuState, NodeState
from inventory.models import Gpu, MigInstance, Node


class NodeFilterSet(django_filters.FilterSet):
    hostname = django_filters.CharFilter(lookup_expr="icontains")
    state = django_filters.ChoiceFilter(choices=NodeState.choices)
    pool = django_filters.CharFilter(field_name="pool__name", help_text="Pool name.")
    pool_id = django_filters.NumberFilter(field_name="pool_id")

    class Meta:
        model = Node
        fields = ["hostname", "state", "pool", "pool_id"]


class GpuFilterSet(django_filters.FilterSet):
    node = django_filters.CharFilter(field_name="node__hostname", help_text="Node hostname.")
    node_id = django_filters.NumberFilter(field_name="node_id")
    model = django_filters.CharFilter(
        field_name="name", lookup_expr="icontains", help_text="GPU model (product name) contains."
    )
    state = django_filters.ChoiceFilter(choices=GpuState.choices)
    pool = django_filters.CharFilter(field_name="pool__name", help_text="Pool name.")
    pool_id = django_filters.NumberFilter(field_name="pool_id")
    mig_enabled = django_filters.BooleanFilter()
    missing = django_filters.BooleanFilter(
        method="filter_missing", help_text="Missing from the last scan of its node."
    )
    busy = django_filters.BooleanFilter(
        method="filter_busy", help_text="Its live sample lists at least one process."
    )
    free = django_filters.BooleanFilter(
        method="filter_free", help_text="Schedulable now (see the README) and not busy."
    )

    class Meta:
        model = Gpu
        fields = ["node", "node_id", "model", "state", "pool", "pool_id", "mig_enabled", "missing"]

    def filter_missing(self, queryset: QuerySet[Gpu], name: str, value: bool | None) -> QuerySet:
        if value is None:
            return queryset
        return queryset.filter(missing_since__isnull=not value)

    def filter_busy(self, queryset: QuerySet[Gpu], name: str, value: bool | None) -> QuerySet:
        if value is None:
            return queryset
        busy = _busy_uuids(queryset)
        return queryset.filter(uuid__in=busy) if value else queryset.exclude(uuid__in=busy)

    def filter_free(self, queryset: QuerySet[Gpu], name: str, value: bool | None) -> QuerySet:
        if value is None:
            return queryset
        free = queryset.schedulable().exclude(uuid__in=_busy_uuids(queryset))
        return free if value else queryset.exclude(pk__in=free.values("pk"))


def _busy_uuids(gpus: QuerySet[Gpu]) -> set[str]:
    hostnames = Node.objects.filter(pk__in=gpus.values("node_id")).values_list(
        "hostname", flat=True
    )
    return live.busy_gpu_uuids(hostnames)


class MigInstanceFilterSet(django_filters.FilterSet):
    gpu = django_filters.CharFilter(field_name="gpu__uuid", help_text="Parent GPU UUID.")
    gpu_id = django_filters.NumberFilter(field_name="gpu_id")
    node = django_filters.CharFilter(field_name="gpu__node__hostname", help_text="Node hostname.")
    node_id = django_filters.NumberFilter(field_name="gpu__node_id")

    class Meta:
        model = MigInstance
        fields = ["gpu", "gpu_id", "node", "node_id"]
