"""The scheduler in the back office: jobs and allocations are read here and acted on through
the same services as everywhere else; the scheduler's settings are changed here (audited)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from django import forms
from django.contrib import admin, messages
from django.db.models import QuerySet
from django.http import HttpRequest

from gpuadmin.access.permissions import signed_in
from gpuadmin.access.services import can_act_on
from scheduling.allocations.accounting import UsageRow
from scheduling.jobs import admin_arrays, control, transitions
from scheduling.loop import switch
from scheduling.models import Allocation, Job, SchedulerSettings, UsageDay


class ReadOnlyAdmin(admin.ModelAdmin):
    """Rows that change only through the services (state machine, allocations)."""

    def has_add_permission(self, request: HttpRequest, obj: object = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: object = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: object = None) -> bool:
        return False


@admin.register(Job)
class JobAdmin(ReadOnlyAdmin):
    list_display = (
        "id",
        "name",
        "owner",
        "project",
        "pool",
        "state",
        "priority",
        "gpu_count",
        "node_count",
        "cpus",
        "host_memory_mib",
        "queue_position",
        "pending_code",
        "preemptible",
        "borrowed",
        "preemptions",
        "preempted_by",
        "submitted_at",
    )
    list_filter = (
        "state",
        "priority",
        "topology",
        "pending_code",
        "pool",
        "preemptible",
        "borrowed",
    )
    list_select_related = ("owner", "pool", "preempted_by")
    search_fields = ("id", "name", "project", "owner__username")
    inlines = (admin_arrays.DependencyInline,)
    actions = ["cancel_jobs"]

    @admin.action(description="Cancel selected jobs")
    def cancel_jobs(self, request: HttpRequest, queryset: QuerySet[Job]) -> None:
        canceled = refused = 0
        for job in queryset:
            if not can_act_on(request.user, job):
                refused += 1
                continue
            try:
                control.cancel_job(job, actor=signed_in(request))
                canceled += 1
            except transitions.IllegalTransition:
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


@admin.register(SchedulerSettings)
class SchedulerSettingsAdmin(admin.ModelAdmin):
    """The loop's switch, changed through ``switch.set_scheduler_enabled`` (audited; each
    pool's policy: ``scheduling.policies.admin``)."""

    list_display = ("__str__", "enabled", "updated_at")
    fields = ("enabled",)

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
        switch.set_scheduler_enabled(obj.enabled, actor=signed_in(request))


def _hours_column(label: str, field: str, figure: str) -> Callable[[Any, UsageDay], str]:
    """A column of ``UsageRow.of``'s ``figure`` for a day row, sorted by its ``field``."""

    @admin.display(description=label, ordering=field)
    def column(model_admin: Any, row: UsageDay) -> str:
        return f"{getattr(UsageRow.of('', vars(row)), figure):.2f}"

    return column


@admin.register(UsageDay)
class UsageDayAdmin(ReadOnlyAdmin):
    """Accounting's day rows (``scheduling.allocations.accounting``), read here as on
    ``/usage/``: the rollup rewrites today's and yesterday's, so nothing is edited by hand."""

    list_display = (
        "day",
        "pool",
        "user",
        "project",
        "allocated_hours",
        "used_hours",
        "idle_held_hours",
        "energy_kwh",
        "cpu_hours",
    )
    list_filter = ("pool", "day")
    list_select_related = ("pool", "user")
    search_fields = ("user__username", "project")
    date_hierarchy = "day"

    allocated_hours = _hours_column("allocated GPU-h", "allocated_gpu_s", "allocated_h")
    used_hours = _hours_column("used GPU-h", "used_gpu_s", "used_h")
    idle_held_hours = _hours_column("idle-held GPU-h", "idle_held_gpu_s", "idle_held_h")
    energy_kwh = _hours_column("energy kWh", "energy_j", "energy_kwh")
    cpu_hours = _hours_column("CPU-h", "cpu_s", "cpu_h")
