"""Job arrays and dependencies in the back office: read here, canceled through the same
service as the API's (``control.cancel_array``)."""

from __future__ import annotations

from django.contrib import admin, messages
from django.db.models import QuerySet
from django.http import HttpRequest

from gpuadmin.access.permissions import signed_in
from gpuadmin.access.services import can_act_on
from scheduling.jobs import control, queries
from scheduling.models import JobArray, JobDependency
from scheduling.placement.text import plural


class DependencyInline(admin.TabularInline):
    """What a job waits for (on the job's page)."""

    model = JobDependency
    fk_name = "job"
    fields = ("kind", "on", "on_state")
    readonly_fields = fields
    extra = 0
    can_delete = False

    @admin.display(description="its state")
    def on_state(self, dependency: JobDependency) -> str:
        return dependency.on.get_state_display()

    def has_add_permission(self, request: HttpRequest, obj: object = None) -> bool:
        return False


@admin.register(JobArray)
class JobArrayAdmin(admin.ModelAdmin):
    list_display = ("id", "owner", "spec", "size", "max_running", "waiting", "submitted_at")
    search_fields = ("id", "owner__username", "spec")
    actions = ["cancel_arrays"]

    def get_queryset(self, request: HttpRequest) -> QuerySet[JobArray]:
        return queries.with_task_counts(super().get_queryset(request))

    @admin.display(description="tasks waiting")
    def waiting(self, array: JobArray) -> int:
        counts = queries.task_counts(array)
        return sum(counts.get(state, 0) for state in queries.WAITING_STATES)

    @admin.action(description="Cancel the unfinished tasks of the selected arrays")
    def cancel_arrays(self, request: HttpRequest, queryset: QuerySet[JobArray]) -> None:
        canceled = canceling = refused = 0
        for array in queryset:
            if not can_act_on(request.user, array):
                refused += 1
                continue
            outcome = control.cancel_array(array, actor=signed_in(request))
            canceled += len(outcome.canceled) + outcome.unsplit
            canceling += len(outcome.canceling)
        self.message_user(
            request,
            f"{plural(canceled, 'task')} canceled, {canceling} being stopped; "
            f"{plural(refused, 'array')} refused.",
            messages.INFO,
        )

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: object = None) -> bool:
        return obj is None  # the list and its action, never a form

    def has_delete_permission(self, request: HttpRequest, obj: object = None) -> bool:
        return False
