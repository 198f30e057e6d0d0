"""The audit log's one FilterSet: ``GET /api/v1/audit/`` (JSON and CSV) and the ``/audit/``
page select the same rows for the same query string."""

from __future__ import annotations

import django_filters
from django import forms
from django.db.models import QuerySet

from gpuadmin.audit.models import AuditEvent
from gpuadmin.filters import SuggestInput, distinct_values

ANY_SUFFIX = ".*"  # ``event_type=job.*``: every job event


class DateTimeInput(forms.DateTimeInput):
    input_type = "datetime-local"


class AuditEventFilterSet(django_filters.FilterSet):
    actor = django_filters.CharFilter(
        field_name="actor_name",
        label="Actor",
        help_text="Username, or the background process (e.g. placement-loop).",
        widget=SuggestInput(lambda: distinct_values(AuditEvent, "actor_name")),
    )
    event_type = django_filters.CharFilter(
        method="filter_event_type",
        label="Action",
        help_text="Event type such as job.canceled; `job.*` for every job event.",
        widget=SuggestInput(lambda: distinct_values(AuditEvent, "event_type")),
    )
    target_type = django_filters.CharFilter(
        method="filter_target_type",
        label="Target type",
        help_text="app_label.model, e.g. scheduling.job, or the model alone (job).",
        widget=SuggestInput(lambda: distinct_values(AuditEvent, "target_type")),
    )
    target_id = django_filters.CharFilter(label="Target id", help_text="The target's key.")
    request_id = django_filters.UUIDFilter(
        label="Request id", help_text="Every row one request, task or command wrote."
    )
    channel = django_filters.CharFilter(
        label="Channel",
        help_text="web, api, or a CLI verb such as cli drain.",
        widget=SuggestInput(lambda: distinct_values(AuditEvent, "channel")),
    )
    since = django_filters.IsoDateTimeFilter(
        field_name="time",
        lookup_expr="gte",
        label="Since",
        help_text="ISO 8601; from this time on (inclusive).",
        widget=DateTimeInput,
    )
    until = django_filters.IsoDateTimeFilter(
        field_name="time",
        lookup_expr="lt",
        label="Until",
        help_text="ISO 8601; before this time (exclusive).",
        widget=DateTimeInput,
    )

    class Meta:
        model = AuditEvent
        fields = ["actor", "event_type", "target_type", "target_id", "request_id", "channel"]

    def filter_event_type(
        self, queryset: QuerySet[AuditEvent], name: str, value: str
    ) -> QuerySet[AuditEvent]:
        if value.endswith(ANY_SUFFIX):
            return queryset.filter(event_type__startswith=value.removesuffix("*"))
        return queryset.filter(event_type=value)

    def filter_target_type(
        self, queryset: QuerySet[AuditEvent], name: str, value: str
    ) -> QuerySet[AuditEvent]:
        if "." in value:
            return queryset.filter(target_type=value)
        return queryset.filter(target_type__endswith=f".{value}")
