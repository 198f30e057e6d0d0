"""FilterSets for the job, allocation, reservation and MIG re-layout lists, shared by the API
viewsets and the pages (NetBox's rule: one FilterSet per model, so a query string selects the
same rows on both)."""

from __future__ import annotations

from collections.abc import Iterable

import django_filters
from django.db.models import Q, QuerySet

from gpuadmin.filters import SuggestInput, distinct_values
from inventory.filters import node_hostnames
from scheduling.models import (
    Allocation,
    Job,
    JobState,
    MigRelayout,
    Priority,
    RelayoutState,
    Reservation,
    ReservationGpu,
    ReservationState,
)

ME = "me"  # ``?owner=me``: the requesting user


def _owners() -> Iterable[str]:
    return [ME, *distinct_values(Job, "owner__username")]


class JobFilterSet(django_filters.FilterSet):
    """The jobs of ``/api/v1/jobs/`` and of the queue page, which renders ``form``."""

    state = django_filters.MultipleChoiceFilter(
        label="State", choices=JobState.choices, help_text="Repeat for several states."
    )
    owner = django_filters.CharFilter(
        method="filter_owner",
        label="Owner",
        help_text="Username, or `me` for the requesting user.",
        widget=SuggestInput(_owners),
    )
    project = django_filters.CharFilter(
        label="Project", widget=SuggestInput(lambda: distinct_values(Job, "project"))
    )
    priority = django_filters.ChoiceFilter(
        label="Priority", choices=Priority.choices, empty_label="all"
    )
    node = django_filters.CharFilter(
        method="filter_node",
        label="Node",
        help_text="Hostname of a node the job was placed on (any attempt).",
        widget=SuggestInput(node_hostnames),
    )

    array = django_filters.NumberFilter(
        field_name="array_id", label="Array", help_text="Id of a job array: its tasks."
    )

    class Meta:
        model = Job
        fields = ["state", "owner", "project", "priority", "node", "array"]

    def filter_owner(self, queryset: QuerySet[Job], name: str, value: str) -> QuerySet[Job]:
        user = getattr(self.request, "user", None)
        if value == ME and user is not None and user.is_authenticated:
            return queryset.filter(owner=user)
        return queryset.filter(owner__username=value)

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


class ReservationFilterSet(django_filters.FilterSet):
    """The reservations of ``/api/v1/reservations/`` and of the reservations page."""

    state = django_filters.MultipleChoiceFilter(
        label="State", choices=ReservationState.choices, help_text="Repeat for several states."
    )
    owner = django_filters.CharFilter(
        method="filter_owner",
        label="Owner",
        help_text="Username, or `me` for the requesting user.",
        widget=SuggestInput(lambda: [ME, *distinct_values(Reservation, "owner__username")]),
    )
    pool = django_filters.CharFilter(field_name="pool__name", label="Pool")
    node = django_filters.CharFilter(
        method="filter_node",
        label="Node",
        help_text="Hostname: reservations asking for it or holding GPUs on it.",
        widget=SuggestInput(node_hostnames),
    )
    gpu = django_filters.CharFilter(
        method="filter_gpu", label="GPU", help_text="UUID: reservations naming or holding it."
    )
    since = django_filters.IsoDateTimeFilter(
        field_name="end", lookup_expr="gt", label="Since", help_text="Ending after this time."
    )
    until = django_filters.IsoDateTimeFilter(
        field_name="start", lookup_expr="lt", label="Until", help_text="Starting before it."
    )

    class Meta:
        model = Reservation
        fields = ["state", "owner", "pool", "node", "gpu", "since", "until"]

    def filter_owner(
        self, queryset: QuerySet[Reservation], name: str, value: str
    ) -> QuerySet[Reservation]:
        user = getattr(self.request, "user", None)
        if value == ME and user is not None and user.is_authenticated:
            return queryset.filter(owner=user)
        return queryset.filter(owner__username=value)

    def filter_node(
        self, queryset: QuerySet[Reservation], name: str, value: str
    ) -> QuerySet[Reservation]:
        holding = ReservationGpu.objects.filter(gpu__node__hostname=value).values("reservation_id")
        return queryset.filter(Q(node__hostname=value) | Q(pk__in=holding))

    def filter_gpu(
        self, queryset: QuerySet[Reservation], name: str, value: str
    ) -> QuerySet[Reservation]:
        holding = ReservationGpu.objects.filter(gpu__uuid=value).values("reservation_id")
        named = Reservation.requested_gpus.through.objects.filter(gpu__uuid=value).values(
            "reservation_id"
        )
        return queryset.filter(Q(pk__in=holding) | Q(pk__in=named))


class MigRelayoutFilterSet(django_filters.FilterSet):
    """The re-layouts of ``/api/v1/mig-relayouts/``."""

    state = django_filters.MultipleChoiceFilter(
        label="State", choices=RelayoutState.choices, help_text="Repeat for several states."
    )
    gpu = django_filters.CharFilter(field_name="gpu__uuid", label="GPU", help_text="UUID.")
    node = django_filters.CharFilter(
        field_name="node__hostname", label="Node", help_text="Hostname."
    )

    class Meta:
        model = MigRelayout
        fields = ["state", "gpu", "node"]
