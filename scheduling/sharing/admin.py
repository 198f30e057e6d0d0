"""MIG re-layouts in the back office: asked for here (a GPU, a layout, wait or preempt) and
canceled while draining, both through ``scheduling.sharing.relayout`` (audited there); the steps are
read-only."""

from __future__ import annotations

from typing import Any

from django import forms
from django.contrib import admin, messages
from django.contrib.auth.models import User
from django.db.models import QuerySet
from django.http import HttpRequest

from gpuadmin.access.permissions import signed_in
from inventory.models import Gpu
from scheduling.models import RELAYOUT_FIELDS, MigRelayout
from scheduling.sharing import relayout


class RelayoutAdminForm(forms.ModelForm):
    """The request: the layout is checked by ``relayout.request`` (its refusals show on the
    field they name)."""

    gpu = forms.ModelChoiceField(
        queryset=Gpu.objects.filter(mig_enabled=True).select_related("node"), label="GPU"
    )
    custom_layout = forms.CharField(
        required=False,
        max_length=relayout.LAYOUT_CHARS,
        help_text="With layout “custom”: e.g. 3g.20gb@4, 2g.10gb, 1g.5gb@6.",
    )

    requester: User  # set per request by MigRelayoutAdmin.get_form

    class Meta:
        model = MigRelayout
        fields = ("gpu", "layout_name", "preempt")
        help_texts = {
            "layout_name": "all-<smallest profile> (e.g. all-1g.10gb), balanced or custom."
        }

    def clean(self) -> dict[str, Any]:
        data = super().clean() or {}
        if self.errors:
            return data
        name = data["layout_name"]
        try:
            self.instance = relayout.request(
                data["gpu"],
                name,
                actor=self.requester,
                layout=relayout.asked_layout(name, data.get("custom_layout", "")),
                preempt=data["preempt"],
            )
        except relayout.RelayoutRefused as exc:
            field = {"layout": "custom_layout"}.get(exc.field, exc.field)
            self.add_error(field if field in self.fields else None, exc.message)
        return data


@admin.register(MigRelayout)
class MigRelayoutAdmin(admin.ModelAdmin):
    list_display = ("id", "gpu", "layout_name", "state", "preempt", "step_deadline", "created_at")
    list_filter = ("state", "node")
    list_select_related = ("gpu__node",)
    actions = ["cancel_relayouts"]
    readonly_fields = RELAYOUT_FIELDS

    def get_form(self, request: HttpRequest, obj: Any = None, change: bool = False, **kwargs: Any):
        if obj is not None:
            return super().get_form(request, obj, change=change, **kwargs)
        requester = signed_in(request)

        class RequestForm(RelayoutAdminForm):
            pass

        RequestForm.requester = requester
        return RequestForm

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> tuple[str, ...]:
        return self.readonly_fields if obj is not None else ()

    def get_fields(self, request: HttpRequest, obj: Any = None) -> tuple[str, ...]:
        if obj is None:
            return ("gpu", "layout_name", "custom_layout", "preempt")
        return self.readonly_fields

    def save_model(self, request: HttpRequest, obj: MigRelayout, form: Any, change: bool) -> None:
        """Made (and audited) by ``relayout.request`` in the form's validation."""

    def has_delete_permission(self, request: HttpRequest, obj: object = None) -> bool:
        return False

    @admin.action(description="Cancel selected re-layouts (those still draining)")
    def cancel_relayouts(self, request: HttpRequest, queryset: QuerySet[MigRelayout]) -> None:
        for item in queryset.select_related("gpu"):
            try:
                relayout.cancel(item, actor=signed_in(request))
            except relayout.RelayoutRefused as exc:
                self.message_user(request, f"Re-layout {item.pk}: {exc.message}", messages.ERROR)
            else:
                self.message_user(request, f"Re-layout {item.pk} canceled.")
