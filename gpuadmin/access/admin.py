"""Roles are edited here (audited); tokens are read and revoked here, never edited."""

from __future__ import annotations

from django import forms
from django.contrib import admin, messages
from django.db import transaction
from django.db.models import QuerySet
from django.http import HttpRequest

from gpuadmin.access.models import ApiToken, Membership
from gpuadmin.access.permissions import signed_in
from gpuadmin.access.services import revoke_token
from gpuadmin.audit.services import record


@admin.register(Membership)
class MembershipAdmin(admin.ModelAdmin):
    list_display = ("user", "role")
    list_filter = ("role",)
    search_fields = ("user__username",)
    autocomplete_fields = ("user",)

    def save_model(
        self, request: HttpRequest, obj: Membership, form: forms.ModelForm, change: bool
    ) -> None:
        before = Membership.objects.filter(pk=obj.pk).values_list("role", flat=True).first()
        with transaction.atomic():
            super().save_model(request, obj, form, change)
            if before != obj.role:
                record(
                    "membership.role_changed",
                    actor=signed_in(request),
                    target=obj,
                    before={"user": obj.user.get_username(), "role": before},
                    after={"user": obj.user.get_username(), "role": obj.role},
                )

    def delete_model(self, request: HttpRequest, obj: Membership) -> None:
        with transaction.atomic():
            record(
                "membership.role_changed",
                actor=signed_in(request),
                target=obj,
                before={"user": obj.user.get_username(), "role": obj.role},
                after={"user": obj.user.get_username(), "role": None},
            )
            super().delete_model(request, obj)


@admin.register(ApiToken)
class ApiTokenAdmin(admin.ModelAdmin):
    list_display = ("name", "user", "key_prefix", "created_at", "last_used_at", "revoked_at")
    list_filter = ("revoked_at",)
    list_select_related = ("user",)
    search_fields = ("name", "user__username", "key_prefix")
    actions = ["revoke_tokens"]

    @admin.action(description="Revoke selected tokens")
    def revoke_tokens(self, request: HttpRequest, queryset: QuerySet[ApiToken]) -> None:
        revoked = sum(revoke_token(token, actor=signed_in(request)) for token in queryset)
        self.message_user(request, f"{revoked} revoked.", messages.SUCCESS)

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False  # a token's key is shown once, to its owner (API or CLI)

    def has_change_permission(self, request: HttpRequest, obj: object = None) -> bool:
        return obj is None  # the list (and its action), never a form that edits a token

    def has_delete_permission(self, request: HttpRequest, obj: object = None) -> bool:
        return False
