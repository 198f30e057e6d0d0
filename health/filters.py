"""The alerts' one FilterSet: ``GET /api/v1/alerts/`` and the ``/alerts/`` page select the
same alerts for the same query string."""

from __future__ import annotations

import django_filters
from django import forms

from gpuadmin.filters import ANY_YES_NO, SuggestInput, distinct_values
from health.choices import AlertState, Severity
from health.models import Alert
from inventory.models import Node


class AlertFilterSet(django_filters.FilterSet):
    id = django_filters.NumberFilter(label="Alert", help_text="One alert by its id.")
    state = django_filters.ChoiceFilter(choices=AlertState.choices, label="State")
    severity = django_filters.ChoiceFilter(choices=Severity.choices, label="Severity")
    node = django_filters.CharFilter(
        field_name="node__hostname",
        label="Node",
        help_text="The node's hostname.",
        widget=SuggestInput(lambda: distinct_values(Node, "hostname")),
    )
    gpu = django_filters.CharFilter(field_name="gpu__uuid", label="GPU UUID")
    acknowledged = django_filters.BooleanFilter(
        field_name="acknowledged_at",
        lookup_expr="isnull",
        exclude=True,
        label="Acknowledged",
        widget=forms.Select(choices=ANY_YES_NO),
    )

    class Meta:
        model = Alert
        fields = ["id", "state", "severity", "node", "gpu", "acknowledged"]
