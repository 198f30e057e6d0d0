"""Pool policies and quotas in the back office: the forms check values by the services' rules
(errors on the field they name) and save through the audited services, like the API."""

from __future__ import annotations

from django import forms
from django.contrib import admin
from django.db.models import QuerySet
from django.http import HttpRequest

from gpuadmin.access.permissions import signed_in
from scheduling.models import PoolPolicy, Quota
from scheduling.policies import quotas
from scheduling.policies import services as policy_services
from scheduling.policies.forms import PolicyForm, QuotaForm, policy_values, quota_values


class PoolPolicyForm(PolicyForm):
    class Meta(PolicyForm.Meta):
        fields = ("pool", *policy_services.POLICY_FIELDS)


@admin.register(PoolPolicy)
class PoolPolicyAdmin(admin.ModelAdmin):
    """One policy per pool (empty pool: the GPUs in no pool), changed through
    ``policy_services.set_pool_policy`` (audited, wakes the loop)."""

    form = PoolPolicyForm
    list_display = (
        "__str__",
        "policy",
        "backfill",
        "allow_borrowing",
        "preemption",
        "dynamic_mig",
        "updated_at",
    )
    list_select_related = ("pool",)
    fieldsets = (
        (None, {"fields": ("pool", "policy", "backfill", "aging_interval_s")}),
        (
            "Fair share and least attained service",
            {"fields": ("fairshare_half_life_s", "fairshare_weight", "las_thresholds_gpu_s")},
        ),
        (
            "Shortest service first and predicted runtimes",
            {"fields": ("qssf_points_per_halving", "prediction_trust_intervals")},
        ),
        (
            "Borrowing and preemption",
            {
                "fields": (
                    "allow_borrowing",
                    "preemption",
                    "preempt_exempt_s",
                    "las_min_run_s",
                    "preempt_signal",
                    "preempt_grace_s",
                )
            },
        ),
        (
            "Sharing and reservations",
            {
                "fields": (
                    "dynamic_mig",
                    "reservation_auto_approve",
                    "reservation_release_after_s",
                )
            },
        ),
    )

    def changelist_view(self, request: HttpRequest, extra_context: dict | None = None):
        PoolPolicy.default()  # the no-pool row exists from the first look
        return super().changelist_view(request, extra_context)

    def get_readonly_fields(self, request: HttpRequest, obj: object = None) -> tuple[str, ...]:
        return ("pool",) if obj is not None else ()

    def has_delete_permission(self, request: HttpRequest, obj: object = None) -> bool:
        return False  # a pool without a row has the defaults: edit it back instead

    def save_model(
        self, request: HttpRequest, obj: PoolPolicy, form: forms.ModelForm, change: bool
    ) -> None:
        fields = policy_values(form)
        row = policy_services.set_pool_policy(obj.pool, actor=signed_in(request), **fields)
        if row.pk is None:  # added with every default: the row the admin asked for, unchanged
            row = PoolPolicy.objects.get_or_create(pool=obj.pool)[0]
        obj.pk, obj.updated_at = row.pk, row.updated_at


@admin.register(Quota)
class QuotaAdmin(admin.ModelAdmin):
    """Quotas per user or project and pool, saved through the audited quota services."""

    form = QuotaForm
    list_display = (
        "__str__",
        "pool",
        "max_gpus",
        "gpu_hours",
        "period",
        "fairshare_weight",
        "updated_at",
    )
    list_filter = ("pool", "period")
    list_select_related = ("pool", "user")
    search_fields = ("project", "user__username")
    autocomplete_fields = ("user",)

    def save_model(
        self, request: HttpRequest, obj: Quota, form: forms.ModelForm, change: bool
    ) -> None:
        fields = quota_values(form)
        if change:
            quotas.update_quota(obj, actor=signed_in(request), **fields)
        else:
            obj.pk = quotas.create_quota(actor=signed_in(request), **fields).pk

    def delete_model(self, request: HttpRequest, obj: Quota) -> None:
        quotas.delete_quota(obj, actor=signed_in(request))

    def delete_queryset(self, request: HttpRequest, queryset: QuerySet[Quota]) -> None:
        for quota in queryset.select_related("pool", "user"):
            quotas.delete_quota(quota, actor=signed_in(request))
