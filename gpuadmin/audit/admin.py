from django.contrib import admin
from django.http import HttpRequest

from gpuadmin.audit.models import AuditEvent


@admin.register(AuditEvent)
class AuditEventAdmin(admin.ModelAdmin):
    """Read-only: the log is append-only, the database refuses edits anyway."""

    list_display = ("time", "event_type", "actor_name", "target_type", "object_repr")
    list_filter = ("event_type", "target_type")
    search_fields = ("object_repr", "actor_name", "target_id", "message")
    date_hierarchy = "time"
    show_full_result_count = False

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: AuditEvent | None = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: AuditEvent | None = None) -> bool:
        return False
