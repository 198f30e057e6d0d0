"""Registering Ray clusters (staff, through the admin; audited by ``services``). The token is
write-only: the form never shows it, and leaving it empty keeps the one stored."""

from __future__ import annotations

from django import forms
from django.contrib import admin
from django.db.models import QuerySet
from django.http import HttpRequest

from gpuadmin.access.permissions import signed_in
from gpuadmin.admin_site import WriteOnlyTokenForm
from integrations.ray import services
from integrations.ray.models import RayCluster, RayJob


class RayClusterForm(WriteOnlyTokenForm):
    address = forms.URLField(
        label="Dashboard address",
        assume_scheme="http",
        help_text="http(s)://host:8265 of its dashboard (the Jobs API).",
    )

    token_help = "Sent as a bearer token. Never shown; leave empty to keep the stored one."

    class Meta:
        model = RayCluster
        fields = ["name", "address", "token", "pool"]


@admin.register(RayCluster)
class RayClusterAdmin(admin.ModelAdmin):
    form = RayClusterForm
    list_display = ("name", "address", "pool", "state", "gpus", "gpus_in_use", "last_read_at")
    list_filter = ("state",)
    search_fields = ("name", "address")
    readonly_fields = (
        "state",
        "last_error",
        "ray_version",
        "gpus",
        "gpus_in_use",
        "last_read_at",
        "last_ok_at",
    )
    fieldsets = (
        (None, {"fields": ("name", "address", "token", "pool")}),
        ("Last read", {"fields": readonly_fields}),
    )

    def save_model(
        self, request: HttpRequest, obj: RayCluster, form: forms.ModelForm, change: bool
    ) -> None:
        services.save_cluster(obj, actor=signed_in(request))

    def delete_model(self, request: HttpRequest, obj: RayCluster) -> None:
        services.delete_cluster(obj, actor=signed_in(request))

    def delete_queryset(self, request: HttpRequest, queryset: QuerySet[RayCluster]) -> None:
        for cluster in queryset:
            services.delete_cluster(cluster, actor=signed_in(request))


@admin.register(RayJob)
class RayJobAdmin(admin.ModelAdmin):
    """Read-only: jobs are submitted and canceled through the API and the CLI (audited)."""

    list_display = ("id", "owner", "cluster", "state", "gpus", "submission_id", "created_at")
    list_filter = ("state", "cluster")
    search_fields = ("submission_id", "owner__username", "entrypoint")

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: object = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: object = None) -> bool:
        return False
