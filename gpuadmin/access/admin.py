"""Roles and Unix accounts are edited here (audited); tokens are read and revoked here, never
edited."""

from __future__ import annotations

from django import forms
from django.contrib import admin, messages
from django.contrib.auth.admin import UserAdmin
from django.contrib.auth.models import User
from django.db import transaction
from django.db.models import QuerySet
from django.http import HttpRequest

from gpuadmin.access.models import ApiToken, Membership, NodeCredential, UnixAccount
from gpuadmin.access.nodes import revoke_credential
from gpuadmin.access.permissions import signed_in
from gpuadmin.access.services import reset_unix_account, revoke_token, set_unix_account
from gpuadmin.audit.services import changed_values, record


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

    def delete_queryset(self, request: HttpRequest, queryset: QuerySet[Membership]) -> None:
        for membership in queryset.select_related("user"):
            self.delete_model(request, membership)


@admin.register(UnixAccount)
class UnixAccountAdmin(admin.ModelAdmin):
    """Whose account a person's jobs run as on the nodes; without a row,
    ``GPUADMIN_DEFAULT_UNIX_ACCOUNT`` or their user name."""

    list_display = ("user", "username", "allow_root")
    list_filter = ("allow_root",)
    search_fields = ("user__username", "username")
    autocomplete_fields = ("user",)

    def get_readonly_fields(
        self, request: HttpRequest, obj: UnixAccount | None = None
    ) -> tuple[str, ...]:
        return ("user",) if obj else ()  # one row per person: add another person's instead

    def save_model(
        self, request: HttpRequest, obj: UnixAccount, form: forms.ModelForm, change: bool
    ) -> None:
        saved = set_unix_account(
            obj.user, username=obj.username, allow_root=obj.allow_root, actor=signed_in(request)
        )
        obj.pk = saved.pk

    def delete_model(self, request: HttpRequest, obj: UnixAccount) -> None:
        reset_unix_account(obj.user, actor=signed_in(request))

    def delete_queryset(self, request: HttpRequest, queryset: QuerySet[UnixAccount]) -> None:
        for account in queryset.select_related("user"):
            reset_unix_account(account.user, actor=signed_in(request))


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


@admin.register(NodeCredential)
class NodeCredentialAdmin(admin.ModelAdmin):
    """Read and revoked here; issued by ``gpuadmin node credential create`` (its token is
    printed once)."""

    list_display = ("node", "pk", "created_at", "revoked_at")
    list_filter = ("revoked_at",)
    search_fields = ("node",)
    actions = ["revoke_credentials"]

    @admin.action(description="Revoke selected node credentials")
    def revoke_credentials(self, request: HttpRequest, queryset: QuerySet[NodeCredential]) -> None:
        actor = signed_in(request)
        revoked = sum(revoke_credential(item, actor=actor) for item in queryset)
        self.message_user(request, f"{revoked} revoked.", messages.SUCCESS)

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: object = None) -> bool:
        return obj is None

    def has_delete_permission(self, request: HttpRequest, obj: object = None) -> bool:
        return False


# What makes a person who they are to gpuadmin: staff and superusers are admins (``role_of``).
USER_ACCESS_FIELDS = ("username", "is_active", "is_staff", "is_superuser")


def _user_facts(user: User) -> dict[str, object]:
    return {name: getattr(user, name) for name in USER_ACCESS_FIELDS}


admin.site.unregister(User)


@admin.register(User)
class AuditedUserAdmin(UserAdmin):
    """Django's user pages, with who may sign in and who is an admin audited (``user.created``,
    ``user.changed`` with the fields before and after, ``user.deleted``)."""

    def save_model(self, request: HttpRequest, obj: User, form: forms.ModelForm, change: bool):
        stored = User.objects.filter(pk=obj.pk).first() if obj.pk else None
        with transaction.atomic():
            super().save_model(request, obj, form, change)
            after = _user_facts(obj)
            if stored is None:
                record("user.created", actor=signed_in(request), target=obj, after=after)
                return
            old, new = changed_values(_user_facts(stored), after)
            if new:
                record("user.changed", actor=signed_in(request), target=obj, before=old, after=new)

    def delete_model(self, request: HttpRequest, obj: User) -> None:
        with transaction.atomic():
            record("user.deleted", actor=signed_in(request), target=obj, before=_user_facts(obj))
            super().delete_model(request, obj)

    def delete_queryset(self, request: HttpRequest, queryset: QuerySet[User]) -> None:
        for user in queryset:
            self.delete_model(request, user)
