"""The alerts' back office: rules are edited here (each change audited), alerts are read and
acknowledged (through ``health.alerts``), webhooks configured, deliveries inspected."""

from __future__ import annotations

from typing import Any

from django import forms
from django.contrib import admin, messages
from django.db import transaction
from django.db.models import QuerySet
from django.forms.models import model_to_dict
from django.http import HttpRequest

from gpuadmin.access.permissions import signed_in
from gpuadmin.audit.services import record
from health import alerts
from health.models import Alert, AlertRule, IdleHeldUsage, Webhook, WebhookDelivery


class AuditedAdmin(admin.ModelAdmin):
    """Saves and deletes write an audit row (``<prefix>.changed`` / ``.deleted``) with the
    before and after, in the same transaction."""

    audit_prefix = ""

    def save_model(
        self, request: HttpRequest, obj: Any, form: forms.ModelForm, change: bool
    ) -> None:
        with transaction.atomic():
            before = model_to_dict(type(obj).objects.get(pk=obj.pk)) if change else None
            super().save_model(request, obj, form, change)
            record(
                f"{self.audit_prefix}.{'changed' if change else 'created'}",
                actor=signed_in(request),
                target=obj,
                before=before,
                after=model_to_dict(obj),
            )

    def delete_model(self, request: HttpRequest, obj: Any) -> None:
        with transaction.atomic():
            record(
                f"{self.audit_prefix}.deleted",
                actor=signed_in(request),
                target=obj,
                before=model_to_dict(obj),
            )
            super().delete_model(request, obj)

    def delete_queryset(self, request: HttpRequest, queryset: QuerySet) -> None:
        for obj in queryset:
            self.delete_model(request, obj)


@admin.register(AlertRule)
class AlertRuleAdmin(AuditedAdmin):
    audit_prefix = "alert_rule"
    list_display = (
        "name",
        "kind",
        "metric",
        "operator",
        "threshold",
        "duration_s",
        "severity",
        "enabled",
    )
    list_filter = ("kind", "severity", "enabled")
    search_fields = ("name", "description")


@admin.register(Webhook)
class WebhookAdmin(AuditedAdmin):
    audit_prefix = "webhook"
    list_display = ("name", "kind", "url", "min_severity", "enabled")
    list_filter = ("kind", "enabled")


@admin.register(Alert)
class AlertAdmin(admin.ModelAdmin):
    list_display = (
        "summary",
        "state",
        "severity",
        "node",
        "gpu",
        "opened_at",
        "resolved_at",
        "acknowledged_by",
    )
    list_filter = ("state", "severity", "rule")
    search_fields = ("summary", "fingerprint", "node__hostname", "gpu__uuid")
    list_select_related = ("node", "gpu", "acknowledged_by")
    date_hierarchy = "opened_at"
    actions = ("acknowledge",)

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False  # alerts open from rules and policies

    def has_change_permission(self, request: HttpRequest, obj: Alert | None = None) -> bool:
        return False  # acknowledge with the action (audited); the rest is history

    def has_delete_permission(self, request: HttpRequest, obj: Alert | None = None) -> bool:
        return False

    @admin.action(description="Acknowledge selected firing alerts")
    def acknowledge(self, request: HttpRequest, queryset: QuerySet[Alert]) -> None:
        done = 0
        for alert in queryset:
            try:
                alerts.acknowledge(alert, signed_in(request), "acknowledged in the admin")
                done += 1
            except alerts.AlertNotFiring:
                pass
        self.message_user(
            request, f"{done} acknowledged; {len(queryset) - done} not firing.", messages.SUCCESS
        )


@admin.register(WebhookDelivery)
class WebhookDeliveryAdmin(admin.ModelAdmin):
    list_display = ("alert", "webhook", "change", "state", "attempts", "created_at", "delivered_at")
    list_filter = ("state", "change", "webhook")
    list_select_related = ("alert", "webhook")

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(
        self, request: HttpRequest, obj: WebhookDelivery | None = None
    ) -> bool:
        return False


@admin.register(IdleHeldUsage)
class IdleHeldUsageAdmin(admin.ModelAdmin):
    list_display = ("user", "day", "gpu_seconds")
    list_filter = ("day",)
    search_fields = ("user__username",)

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: IdleHeldUsage | None = None) -> bool:
        return False
