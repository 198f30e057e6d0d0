"""The scheduler in the back office: roles are edited here (audited); jobs, allocations and
tokens are read here and acted on through the same services as everywhere else."""

from __future__ import annotations

from django import forms
from django.contrib import admin, messages
from django.db import transaction
from django.db.models import QuerySet
from django.http import HttpRequest

from gpuadmin.audit.services import record
from scheduling import admin_services, auth, services
from scheduling.models import Allocation, ApiToken, Job, Membership, SchedulerSettings


class ReadOnlyAdmin(admin.ModelAdmin):
    """Rows that change only through the services (state machine, allocations)."""

    def has_add_permission(self, request: HttpRequest, obj: object = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: object = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: object = None) -> bool:
        return False


@admin.register(Membership)
class MembershipAdmin(admin.ModelAdmin):
    list_display = ("user", "role")
    list_filter = ("role",)
    search_fields = ("user__username",)
    autocomplete_fields = ("user",)

    def save_model(
        self, request: HttpRequest, obj: Membership, form: forms.ModelForm, change: bool
    ):
        before = Membership.objects.filter(pk=obj.pk).values_list("role", flat=True).first()
        with transaction.atomic():
            super().save_model(request, obj, form, change)
            if before != obj.role:
                record(
                    "membership.role_changed",
                    actor=request.user,
                    target=obj,
                    before={"user": obj.user.get_username(), "role": before},
                    after={"user": obj.user.get_username(), "role": obj.role},
                )

    def delete_model(self, request: HttpRequest, obj: Membership) -> None:
        with transaction.atomic():
            record(
                "membership.role_changed",
                actor=request.user,
                target=obj,
                before={"user": obj.user.get_username(), "role": obj.role},
                after={"user": obj.user.get_username(), "role": None},
            )
            super().delete_model(request, obj)


@admin.register(Job)
class JobAdmin(ReadOnlyAdmin):
    list_display = (
        "id",
        "name",
        "owner",
        "state",
        "priority",
        "gpu_count",
        "node_count",
        "queue_position",
        "pending_code",
        "submitted_at",
    )
    list_filter = ("state", "priority", "topology", "pending_code")
    list_select_related = ("owner",)
    search_fields = ("id", "name", "project", "owner__username")
    actions = ["cancel_jobs"]

    @admin.action(description="Cancel selected jobs")
    def cancel_jobs(self, request: HttpRequest, queryset: QuerySet[Job]) -> None:
        canceled = refused = 0
        for job in queryset:
            if not auth.can_act_on(request.user, job):
                refused += 1
                continue
            try:
                services.cancel_job(job, actor=request.user)
                canceled += 1
            except services.IllegalTransition:
                refused += 1
        self.message_user(
            request, f"{canceled} canceled (or being stopped); {refused} refused.", messages.INFO
        )

    def has_change_permission(self, request: HttpRequest, obj: object = None) -> bool:
        return obj is None  # the list (and its actions), never a form that edits a job


@admin.register(Allocation)
class AllocationAdmin(ReadOnlyAdmin):
    list_display = ("id", "job", "gpu", "node", "attempt", "manual", "allocated_at", "released_at")
    list_filter = ("manual", "node")
    list_select_related = ("job", "gpu__node", "node")
    search_fields = ("gpu__uuid", "job__id", "node__hostname")


@admin.register(ApiToken)
class ApiTokenAdmin(ReadOnlyAdmin):
    list_display = ("name", "user", "key_prefix", "created_at", "last_used_at", "revoked_at")
    list_filter = ("revoked_at",)
    list_select_related = ("user",)
    search_fields = ("name", "user__username", "key_prefix")
    actions = ["revoke_tokens"]

    @admin.action(description="Revoke selected tokens")
    def revoke_tokens(self, request: HttpRequest, queryset: QuerySet[ApiToken]) -> None:
        revoked = sum(auth.revoke_token(token, actor=request.user) for token in queryset)
        self.message_user(request, f"{revoked} revoked.", messages.SUCCESS)

    def has_change_permission(self, request: HttpRequest, obj: object = None) -> bool:
        return obj is None


@admin.register(SchedulerSettings)
class SchedulerSettingsAdmin(admin.ModelAdmin):
    """The loop's switch and policy, changed through the audited admin services."""

    list_display = ("__str__", "enabled", "policy", "aging_interval_s", "updated_at")
    fields = ("enabled", "policy", "aging_interval_s")

    def changelist_view(self, request: HttpRequest, extra_context: dict | None = None):
        SchedulerSettings.load()  # the one row exists from the first look
        return super().changelist_view(request, extra_context)

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: object = None) -> bool:
        return False

    def save_model(
        self, request: HttpRequest, obj: SchedulerSettings, form: forms.ModelForm, change: bool
    ):
        admin_services.set_policy(obj.policy, obj.aging_interval_s, actor=request.user)
        admin_services.set_scheduler_enabled(obj.enabled, actor=request.user)
