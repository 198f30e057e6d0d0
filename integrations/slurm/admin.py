"""Registering Slurm clusters (staff, through the admin; audited by ``services``). The token is
write-only: the form never shows it, and leaving it empty keeps the one stored."""

from __future__ import annotations

from typing import Any

from django import forms
from django.contrib import admin
from django.db.models import QuerySet
from django.http import HttpRequest

from gpuadmin.access.permissions import signed_in
from gpuadmin.admin_site import WriteOnlyTokenForm
from integrations.slurm import services
from integrations.slurm.models import AuthKind, SlurmCluster


class SlurmClusterForm(WriteOnlyTokenForm):
    token_help = (
        "Its JWT (scontrol token lifespan=...). Never shown; leave empty to keep the stored one."
    )

    class Meta:
        model = SlurmCluster
        fields = [
            "name",
            "url",
            "unix_socket",
            "auth",
            "user_name",
            "token",
            "poll_interval_s",
            "drain_fenced",
        ]

    def clean(self) -> dict[str, Any]:
        data: dict[str, Any] = super().clean() or {}
        if bool(data.get("url")) == bool(data.get("unix_socket")):
            raise forms.ValidationError("Give its slurmrestd's URL or its Unix socket, not both.")
        if data.get("auth") == AuthKind.JWT and not (data.get("user_name") and data.get("token")):
            raise forms.ValidationError("JWT authentication needs a user name and a token.")
        if data.get("auth") == AuthKind.LOCAL and not data.get("unix_socket"):
            raise forms.ValidationError("Local authentication works only through a Unix socket.")
        return data


@admin.register(SlurmCluster)
class SlurmClusterAdmin(admin.ModelAdmin):
    form = SlurmClusterForm
    list_display = ("name", "address", "auth", "state", "api_version", "last_polled_at")
    list_filter = ("state", "auth")
    search_fields = ("name", "url", "unix_socket")
    readonly_fields = ("state", "last_error", "api_version", "last_polled_at", "last_ok_at")
    fieldsets = (
        (None, {"fields": ("name", "url", "unix_socket")}),
        ("Signing in", {"fields": ("auth", "user_name", "token")}),
        ("Polling", {"fields": ("poll_interval_s", "drain_fenced")}),
        ("Last poll", {"fields": readonly_fields}),
    )

    def save_model(
        self, request: HttpRequest, obj: SlurmCluster, form: forms.ModelForm, change: bool
    ) -> None:
        services.save_cluster(obj, actor=signed_in(request))

    def delete_model(self, request: HttpRequest, obj: SlurmCluster) -> None:
        services.delete_cluster(obj, actor=signed_in(request))

    def delete_queryset(self, request: HttpRequest, queryset: QuerySet[SlurmCluster]) -> None:
        for cluster in queryset:
            services.delete_cluster(cluster, actor=signed_in(request))
