"""The catalog back office: people edit labels, owners, pools, notes and tags; everything NVML
discovered is read-only; state changes go through the audited services."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from django import forms
from django.contrib import admin
from django.db.models import Model, QuerySet
from django.http import HttpRequest
from django.utils.html import format_html

from gpuadmin.access.permissions import signed_in
from gpuadmin.admin_actions import reason_action
from inventory.choices import MAINTENANCE_GPU_STATES, MAINTENANCE_NODE_STATES
from inventory.models import (
    GPU_CATALOG_FIELDS,
    NODE_CATALOG_FIELDS,
    STATE_REASON_CHARS,
    Gpu,
    GpuLink,
    MigInstance,
    Node,
    Pool,
)
from inventory.pages.common import short_gpu_name
from inventory.querysets import GpuQuerySet
from inventory.services import (
    HOST_RESERVED_FIELDS,
    IllegalGpuTransition,
    delete_pool,
    gpu_catalog_errors,
    host_reserved_errors,
    save_pool,
    set_gpu_state,
    set_node_state,
    update_catalog,
)


def state_actions(
    setter: Callable[..., bool], verbs: dict[str, str], noun: str
) -> list[Callable[..., Any]]:
    """One admin action per maintenance state, each asking for a reason and going through the
    audited service; a change the state machine refuses is named in a message."""

    def make(state: str, verb: str) -> Callable[..., Any]:
        def apply(row: Gpu | Node, reason: str, request: HttpRequest) -> str | None:
            try:
                setter(row, state, actor=signed_in(request), reason=reason)
            except IllegalGpuTransition as exc:
                return str(exc)
            return None

        return reason_action(
            f"set_{state}", f"{verb} selected {noun}", apply, max_length=STATE_REASON_CHARS
        )

    return [make(state, verb) for state, verb in verbs.items()]


def mps_action(shared: bool) -> Callable[..., None]:
    """Share the selected GPUs through MPS, or stop: a pool's GPUs at once (filter by pool,
    select all), each change audited ``gpu.catalog_changed`` as an edit of the field is."""
    verb = "Share selected GPUs through MPS" if shared else "Stop sharing selected GPUs (MPS)"

    @admin.action(description=verb)
    def apply(model_admin: admin.ModelAdmin, request: HttpRequest, queryset: QuerySet) -> None:
        actor, change = signed_in(request), {"mps_shared": shared}
        refused = [gpu for gpu in queryset if gpu_catalog_errors(gpu, change)]
        changed = sum(
            update_catalog(gpu, change, actor=actor) for gpu in queryset if gpu not in refused
        )
        said = f"{changed} of {queryset.count()} GPUs changed."
        if refused:
            reason = gpu_catalog_errors(refused[0], change)["mps_shared"]
            said += f" Left as they are: {', '.join(map(str, refused))} ({reason})."
        model_admin.message_user(request, said)

    apply.__name__ = "share_through_mps" if shared else "stop_sharing_through_mps"
    return apply


# Shown, never edited: the state changes through the actions (with a reason).
STATE_FIELDS = ("state", "state_reason", "state_changed_at")


class MissingFilter(admin.SimpleListFilter):
    title = "missing"
    parameter_name = "missing"

    def lookups(self, request: HttpRequest, model_admin: admin.ModelAdmin) -> list[tuple]:
        return [("yes", "Missing"), ("no", "Present")]

    def queryset(self, request: HttpRequest, queryset: QuerySet) -> QuerySet:
        assert isinstance(queryset, GpuQuerySet), "a filter of GpuAdmin"
        if self.value() == "yes":
            return queryset.missing()
        if self.value() == "no":
            return queryset.present()
        return queryset


class ReadOnlyInline(admin.TabularInline):
    extra = 0
    can_delete = False
    show_change_link = True

    def has_add_permission(self, request: HttpRequest, obj: object = None) -> bool:
        return False


class GpuInline(ReadOnlyInline):
    model = Gpu
    fields = ("index", "uuid", "name", "state", "mig_enabled", "label", "missing_since")
    readonly_fields = fields


class MigInstanceInline(ReadOnlyInline):
    model = MigInstance
    fields = (
        "gi_id",
        "ci_id",
        "profile_name",
        "ci_profile_name",
        "placement_start",
        "placement_size",
        "memory_mib",
        "uuid",
    )
    readonly_fields = fields
    show_change_link = False

    def has_change_permission(self, request: HttpRequest, obj: object = None) -> bool:
        return False


class AuditedCatalogAdmin(admin.ModelAdmin):
    """Catalog edits made here write an audit row with the fields' before and after values."""

    def save_model(self, request: HttpRequest, obj: Model, form: forms.ModelForm, change: bool):
        assert isinstance(obj, Gpu | Node), "the catalog admins are GpuAdmin and NodeAdmin"
        changes = {name: form.cleaned_data[name] for name in form.changed_data}
        update_catalog(obj, changes, actor=signed_in(request))


@admin.register(Pool)
class PoolAdmin(admin.ModelAdmin):
    """Pools, saved and deleted through the audited services; one still in use (nodes, GPUs,
    quotas, jobs, reservations, usage) cannot be deleted: the page lists what names it."""

    list_display = ("name", "description")
    search_fields = ("name",)

    def save_model(self, request: HttpRequest, obj: Pool, form: forms.ModelForm, change: bool):
        save_pool(obj, actor=signed_in(request))

    def delete_model(self, request: HttpRequest, obj: Pool) -> None:
        delete_pool(obj, actor=signed_in(request))

    def delete_queryset(self, request: HttpRequest, queryset: QuerySet[Pool]) -> None:
        for pool in queryset:
            delete_pool(pool, actor=signed_in(request))


class CatalogRulesForm(forms.ModelForm):
    """A catalog form that refuses, on the fields they name, what the services' ``rules``
    refuse (as the API's serializers do)."""

    rules: Callable[[Any, Mapping[str, Any]], dict[str, str]]

    def clean(self) -> dict[str, Any]:
        data = super().clean() or {}
        for name, message in type(self).rules(self.instance, data).items():
            self.add_error(name, message)
        return data


class GpuAdminForm(CatalogRulesForm):
    """Refuses a catalog the GPU cannot have."""

    rules = staticmethod(gpu_catalog_errors)


class NodeAdminForm(CatalogRulesForm):
    """Refuses keeping back more of the host than its agent reported."""

    rules = staticmethod(host_reserved_errors)


@admin.register(Node)
class NodeAdmin(AuditedCatalogAdmin):
    form = NodeAdminForm
    list_display = (
        "hostname",
        "model",
        "state",
        "driver_version",
        "label",
        "pool",
        "last_heartbeat_at",
    )
    list_filter = ("state", "model", "pool", "driver_version")
    search_fields = ("hostname", "label", "notes")
    readonly_fields = (*Node.DISCOVERED_FIELDS, *STATE_FIELDS)
    fields = (
        *Node.DISCOVERED_FIELDS,
        *HOST_RESERVED_FIELDS,
        *STATE_FIELDS,
        *NODE_CATALOG_FIELDS,
    )
    inlines = [GpuInline]
    actions = state_actions(set_node_state, MAINTENANCE_NODE_STATES, "nodes")

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False  # nodes register themselves through their agent


def _one_line(text: str) -> str:
    """``text`` that a narrow column does not wrap (non-breaking spaces and hyphens)."""
    return text.replace(" ", "\u00a0").replace("-", "\u2011")


@admin.register(Gpu)
class GpuAdmin(AuditedCatalogAdmin):
    form = GpuAdminForm
    list_display = (
        "node_and_index",
        "short_model",
        "state",
        "mig_enabled",
        "mps_shared",
        "label",
        "pool",
        "missing_since",
        "short_uuid",
    )
    list_filter = ("node", "name", "state", "pool", "mig_enabled", "mps_shared", MissingFilter)
    list_select_related = ("node", "pool")
    ordering = ("node__hostname", "index")
    search_fields = ("uuid", "serial", "node__hostname", "label")
    readonly_fields = (*Gpu.DISCOVERED_FIELDS, *STATE_FIELDS)
    fields = (*Gpu.DISCOVERED_FIELDS, *STATE_FIELDS, *GPU_CATALOG_FIELDS)
    inlines = [MigInstanceInline]
    actions = [
        *state_actions(set_gpu_state, MAINTENANCE_GPU_STATES, "GPUs"),
        mps_action(True),
        mps_action(False),
    ]

    @admin.display(description="GPU", ordering="node__hostname")
    def node_and_index(self, gpu: Gpu) -> str:
        """``dgx-01 GPU 3``: where it is, as the pages name it."""
        return _one_line(f"{gpu.node.hostname} GPU {gpu.index}")

    @admin.display(description="Model", ordering="name")
    def short_model(self, gpu: Gpu) -> str:
        return _one_line(short_gpu_name(gpu.name))

    @admin.display(description="UUID", ordering="uuid")
    def short_uuid(self, gpu: Gpu) -> str:
        """``GPU-302e6c0b…``, the whole UUID as its tooltip (the search box finds a GPU by
        its whole UUID)."""
        return format_html('<span title="{}">{}</span>', gpu.uuid, _one_line(f"{gpu.uuid[:12]}…"))

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False  # GPUs are discovered, never typed in

    def has_delete_permission(self, request: HttpRequest, obj: object = None) -> bool:
        return False  # a GPU that left is marked missing, never deleted


@admin.register(MigInstance)
class MigInstanceAdmin(admin.ModelAdmin):
    list_display = ("gpu", "gi_id", "ci_id", "profile_name", "memory_mib", "uuid")
    list_filter = ("profile_name", "gpu__node")
    list_select_related = ("gpu__node",)
    search_fields = ("uuid", "gpu__uuid")

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: object = None) -> bool:
        return False


@admin.register(GpuLink)
class GpuLinkAdmin(admin.ModelAdmin):
    list_display = ("node", "gpu_a", "gpu_b", "link_type", "nvlink_count")
    list_filter = ("link_type", "node")
    list_select_related = ("node", "gpu_a__node", "gpu_b__node")

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: object = None) -> bool:
        return False
