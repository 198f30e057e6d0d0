"""FilterSets of the Slurm mirror's lists (``/api/v1/slurm/...``)."""

from __future__ import annotations

import django_filters
from django.db.models import QuerySet

from integrations.slurm.models import PollState, SlurmCluster, SlurmJob, SlurmNode


class SlurmClusterFilterSet(django_filters.FilterSet):
    state = django_filters.MultipleChoiceFilter(
        choices=PollState.choices, help_text="How the last poll went; repeat for several."
    )

    class Meta:
        model = SlurmCluster
        fields = ["state"]


class SlurmNodeFilterSet(django_filters.FilterSet):
    cluster = django_filters.CharFilter(field_name="cluster__name", help_text="A cluster's name.")
    state = django_filters.CharFilter(
        method="filter_state",
        help_text="A Slurm state or flag, any case (idle, mixed, drain, down...).",
    )
    node = django_filters.CharFilter(
        field_name="node__hostname", help_text="The catalogued node's hostname."
    )
    partition = django_filters.CharFilter(
        method="filter_partition", help_text="A partition the node is in."
    )

    class Meta:
        model = SlurmNode
        fields = ["cluster", "state", "node", "partition"]

    def filter_state(self, queryset: QuerySet[SlurmNode], name: str, value: str) -> QuerySet:
        return queryset.filter(states__contains=[value.upper()])

    def filter_partition(self, queryset: QuerySet[SlurmNode], name: str, value: str) -> QuerySet:
        return queryset.filter(partitions__contains=[value])


class SlurmJobFilterSet(django_filters.FilterSet):
    cluster = django_filters.CharFilter(field_name="cluster__name", help_text="A cluster's name.")
    state = django_filters.CharFilter(
        method="filter_state", help_text="Slurm's base state, any case (pending, running...)."
    )
    user = django_filters.CharFilter(help_text="The Slurm user's name.")
    partition = django_filters.CharFilter()
    node = django_filters.CharFilter(method="filter_node", help_text="A Slurm node it runs on.")

    class Meta:
        model = SlurmJob
        fields = ["cluster", "state", "user", "partition", "node"]

    def filter_state(self, queryset: QuerySet[SlurmJob], name: str, value: str) -> QuerySet:
        return queryset.filter(state=value.upper())

    def filter_node(self, queryset: QuerySet[SlurmJob], name: str, value: str) -> QuerySet:
        return queryset.filter(nodes__contains=[value])
