"""FilterSets for inventory lists, shared by the API viewsets and the HTML list views."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import django_filters
from django import forms
from django.db.models import QuerySet

from gpuadmin.filters import ANY_YES_NO, SuggestInput, distinct_values
from inventory import live
from inventory.choices import GpuState, NodeState
from inventory.models import Gpu, MigInstance, Node, Pool
from inventory.occupancy import Occupancy
from inventory.querysets import GpuQuerySet, pool_is


class NodeFilterSet(django_filters.FilterSet):
    hostname = django_filters.CharFilter(lookup_expr="icontains")
    state = django_filters.ChoiceFilter(choices=NodeState.choices)
    pool = django_filters.CharFilter(field_name="pool__name", help_text="Pool name.")
    pool_id = django_filters.NumberFilter(field_name="pool_id")

    class Meta:
        model = Node
        fields = ["hostname", "state", "pool", "pool_id"]


def node_hostnames() -> Iterable[str]:
    """Every node's hostname, in order: the suggestions of a ``node`` filter."""
    return Node.objects.order_by("hostname").values_list("hostname", flat=True)


def _pools() -> Iterable[str]:
    return Pool.objects.values_list("name", flat=True)


class GpuFilterSet(django_filters.FilterSet):
    """The GPUs of the API's list and of the fleet dashboard, which renders ``form``'s visible
    fields (the others ride along hidden, so a page URL filters as the API does)."""

    node = django_filters.CharFilter(
        field_name="node__hostname",
        label="Node",
        help_text="Node hostname.",
        widget=SuggestInput(node_hostnames),
    )
    node_id = django_filters.NumberFilter(field_name="node_id", widget=forms.HiddenInput)
    model = django_filters.CharFilter(
        field_name="name",
        lookup_expr="icontains",
        label="Model",
        help_text="GPU model (product name) contains.",
        widget=SuggestInput(lambda: distinct_values(Gpu, "name")),
    )
    state = django_filters.ChoiceFilter(label="State", choices=GpuState.choices, empty_label="all")
    pool = django_filters.CharFilter(
        method="filter_pool",
        label="Pool",
        help_text="Pool name: the GPU's pool, or its node's when the GPU has none.",
        widget=SuggestInput(_pools),
    )
    pool_id = django_filters.NumberFilter(
        method="filter_pool", help_text="Pool id, as `pool`.", widget=forms.HiddenInput
    )
    mig_enabled = django_filters.BooleanFilter(widget=forms.HiddenInput)
    missing = django_filters.BooleanFilter(
        method="filter_missing",
        help_text="Missing from the last scan of its node.",
        widget=forms.HiddenInput,
    )
    busy = django_filters.BooleanFilter(
        method="filter_busy",
        help_text="Its live sample lists at least one process.",
        widget=forms.HiddenInput,
    )
    free = django_filters.BooleanFilter(
        method="filter_free",
        label="Free",
        help_text="Usable now (the one rule, see docs/users/why-a-job-waits.md: schedulable, and a "
        "live sample without NVML error or process) and held by no job.",
        widget=forms.Select(choices=ANY_YES_NO),
    )

    class Meta:
        model = Gpu
        fields = ["node", "node_id", "model", "state", "pool", "pool_id", "mig_enabled", "missing"]

    @property
    def active(self) -> bool:
        """Whether the query filters at all (the page then shows only nodes with a GPU)."""
        return any(self.data.get(name) for name in self.filters)

    def filter_pool(self, queryset: QuerySet[Gpu], name: str, value: Any) -> QuerySet:
        if value in (None, ""):
            return queryset
        return queryset.filter(pool_is(**{"name" if name == "pool" else "pk": value}))

    def filter_missing(self, queryset: QuerySet[Gpu], name: str, value: bool | None) -> QuerySet:
        if value is None:
            return queryset
        return queryset.filter(missing_since__isnull=not value)

    def filter_busy(self, queryset: QuerySet[Gpu], name: str, value: bool | None) -> QuerySet:
        if value is None:
            return queryset
        busy = _busy_uuids(queryset)
        return queryset.filter(uuid__in=busy) if value else queryset.exclude(uuid__in=busy)

    def filter_free(self, queryset: GpuQuerySet, name: str, value: bool | None) -> QuerySet:
        if value is None:
            return queryset
        candidates = list(queryset.schedulable().values_list("pk", flat=True))
        occupancy = Occupancy(candidates)
        free = queryset.free(held=[pk for pk in candidates if occupancy.get(pk)])
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
