"""FilterSets for the job and allocation lists."""

from __future__ import annotations

import django_filters
from django.db.models import QuerySet

from scheduling.models import Allocation, Job, JobState, Priority


class JobFilterSet(django_filters.FilterSet):
    state = django_filters.MultipleChoiceFilter(
        choices=JobState.choices, help_text="Repeat for several states."
    )
    owner = django_filters.CharFilter(field_name="owner__username", help_text="Username.")
    project = django_filters.CharFilter()
    priority = django_filters.ChoiceFilter(choices=Priority.choices)
    node = django_filters.CharFilter(
        method="filter_node", help_text="Hostname of a node the job was placed on (any attempt)."
    )

    class Meta:
        model = Job
        fields = ["state", "owner", "project", "priority", "node"]

    def filter_node(self, queryset: QuerySet[Job], name: str, value: str) -> QuerySet[Job]:
        placed = Allocation.objects.filter(node__hostname=value).values("job_id")
        return queryset.filter(pk__in=placed)


class AllocationFilterSet(django_filters.FilterSet):
    job = django_filters.NumberFilter(field_name="job_id", help_text="Job id.")
    gpu = django_filters.CharFilter(field_name="gpu__uuid", help_text="GPU UUID.")
    node = django_filters.CharFilter(field_name="node__hostname", help_text="Node hostname.")
    active = django_filters.BooleanFilter(
        field_name="released_at", lookup_expr="isnull", help_text="Not released yet."
    )
    manual = django_filters.BooleanFilter()

    class Meta:
        model = Allocation
        fields = ["job", "gpu", "node", "active", "manual"]
