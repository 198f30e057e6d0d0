"""FilterSets for inventory lists, shared by the API viewsets and the HTML list views."""

from __future__ import annotations

import django_filters
from django.db.models import QuerySet

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
    name = django_filters.CharFilter(lookup_expr="icontains", help_text="GPU product name.")
    state = django_filters.ChoiceFilter(choices=GpuState.choices)
    pool = django_filters.CharFilter(field_name="pool__name", help_text="Pool name.")
    pool_id = django_filters.NumberFilter(field_name="pool_id")
    mig_enabled = django_filters.BooleanFilter()
    missing = django_filters.BooleanFilter(
        method="filter_missing", help_text="Missing from the last scan of its node."
    )

    class Meta:
        model = Gpu
        fields = ["node", "node_id", "name", "state", "pool", "pool_id", "mig_enabled", "missing"]

    def filter_missing(self, queryset: QuerySet[Gpu], name: str, value: bool | None) -> QuerySet:
        if value is None:
            return queryset
        return queryset.filter(missing_since__isnull=not value)


class MigInstanceFilterSet(django_filters.FilterSet):
    gpu = django_filters.CharFilter(field_name="gpu__uuid", help_text="Parent GPU UUID.")
    gpu_id = django_filters.NumberFilter(field_name="gpu_id")
    node = django_filters.CharFilter(field_name="gpu__node__hostname", help_text="Node hostname.")
    node_id = django_filters.NumberFilter(field_name="gpu__node_id")

    class Meta:
        model = MigInstance
        fields = ["gpu", "gpu_id", "node", "node_id"]
