"""Recovery policies (edited here, checked against NVIDIA's XID catalog, every change audited)
and the health events they acted on (read-only, with their outcome)."""

from __future__ import annotations

from typing import Any

from django import forms
from django.contrib import admin
from django.db.models import QuerySet
from django.http import HttpRequest

from gpuadmin.access.permissions import signed_in
from health import policies, xids
from health.admin import ReadOnlyAdmin
from health.choices import Action, EventKind
from health.models import HealthEvent, RecoveryPolicy


class RecoveryPolicyForm(forms.ModelForm):
    actions = forms.MultipleChoiceField(
        choices=Action.choices,
        widget=forms.CheckboxSelectMultiple,
        required=False,
        help_text="Applied in the order listed. None: the event is only stored.",
    )

    class Meta:
        model = RecoveryPolicy
        fields = (*policies.POLICY_FIELDS, "description")

    def clean(self) -> dict[str, Any]:
        super().clean()
        data = self.cleaned_data
        kind, xid, bucket = data.get("kind"), data.get("xid"), data.get("resolution")
        if xid is not None:
            if kind != EventKind.XID:
                self.add_error("xid", "Only an XID policy names an XID.")
            elif xids.lookup(xid) is None:
                self.add_error(
                    "xid",
                    f"XID {xid} is not in NVIDIA's XID catalog: the policy with resolution "
                    f"{policies.UNKNOWN_XID} covers XIDs it does not know.",
                )
        if bucket:
            known = xids.immediate_buckets() | {policies.UNKNOWN_XID}
            if kind != EventKind.XID:
                self.add_error("resolution", "Only an XID policy names a resolution bucket.")
            elif xid is not None:
                self.add_error("resolution", "Give an XID or a resolution bucket, not both.")
            elif bucket not in known:
                self.add_error(
                    "resolution",
                    f"{bucket!r} is not a resolution bucket of the catalog: one of "
                    f"{', '.join(sorted(known))}.",
                )
        if data.get("threshold") is not None and kind not in policies.THRESHOLD_UNITS:
            units = ", ".join(f"{k} ({unit})" for k, unit in policies.THRESHOLD_UNITS.items())
            self.add_error("threshold", f"Only these kinds take a threshold: {units}.")
        escalate_to = data.get("escalate_to")
        if escalate_to and escalate_to not in policies.FENCES:
            names = ", ".join(str(action) for action in policies.FENCES)
            self.add_error("escalate_to", f"Escalate to fencing the GPU: one of {names}.")
        return data


@admin.register(RecoveryPolicy)
class RecoveryPolicyAdmin(admin.ModelAdmin):
    form = RecoveryPolicyForm
    list_display = ("name", "kind", "xid", "resolution", "severity", "actions", "enabled")
    list_filter = ("kind", "severity", "enabled", "node_wide")
    search_fields = ("name", "description", "resolution")
    fieldsets = (
        (None, {"fields": ("name", "enabled", "kind", "xid", "resolution", "description")}),
        ("What it does", {"fields": ("severity", "actions", "node_wide", "threshold")}),
        (
            "Repeats and return",
            {
                "fields": (
                    "escalate_after",
                    "escalate_window_s",
                    "escalate_to",
                    "probation_s",
                    "reset_before_probation",
                )
            },
        ),
    )

    def save_model(
        self, request: HttpRequest, obj: RecoveryPolicy, form: forms.ModelForm, change: bool
    ) -> None:
        policies.save_policy(obj, actor=signed_in(request))

    def delete_model(self, request: HttpRequest, obj: RecoveryPolicy) -> None:
        policies.delete_policy(obj, actor=signed_in(request))

    def delete_queryset(self, request: HttpRequest, queryset: QuerySet[RecoveryPolicy]) -> None:
        for policy in queryset:
            policies.delete_policy(policy, actor=signed_in(request))


@admin.register(HealthEvent)
class HealthEventAdmin(ReadOnlyAdmin):
    list_display = ("occurred_at", "kind", "xid", "gpu", "node", "severity", "policy", "handled_at")
    list_filter = ("kind", "severity", "node")
    list_select_related = ("gpu__node", "node", "policy")
    search_fields = ("dedupe_key", "message", "node__hostname", "gpu__uuid")
    date_hierarchy = "occurred_at"
    fields = (
        "node",
        "gpu",
        "kind",
        "xid",
        "gpu_instance_id",
        "severity",
        "message",
        "occurred_at",
        "received_at",
        "dedupe_key",
        "policy",
        "handled_at",
        "outcome",
        "data",
    )
