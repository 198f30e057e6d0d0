"""Who may do what: roles, and API tokens for the CLI and automation."""

from __future__ import annotations

from django.contrib.auth.base_user import AbstractBaseUser
from django.db import transaction
from django.utils import timezone
from rest_framework import authentication, exceptions
from rest_framework.request import Request

from gpuadmin.audit.services import record
from scheduling.models import ApiToken, Job, Role

# What each role may do, strongest first.
ROLE_ORDER = (Role.ADMIN, Role.OPERATOR, Role.USER, Role.VIEWER)


def role_of(user: AbstractBaseUser) -> str:
    """Staff are admins; others have their Membership's role, or are users."""
    if not user.is_authenticated:
        return Role.VIEWER
    if user.is_staff or user.is_superuser:
        return Role.ADMIN
    membership = getattr(user, "gpuadmin_role", None)
    return membership.role if membership else Role.USER


def at_least(user: AbstractBaseUser, role: str) -> bool:
    return ROLE_ORDER.index(role_of(user)) <= ROLE_ORDER.index(role)


def can_submit(user: AbstractBaseUser) -> bool:
    return at_least(user, Role.USER)


def can_act_on(user: AbstractBaseUser, job: Job) -> bool:
    """Operators and admins act on anyone's jobs; users on their own; viewers on none."""
    if at_least(user, Role.OPERATOR):
        return True
    return at_least(user, Role.USER) and job.owner_id == user.pk


def create_token(user: AbstractBaseUser, name: str) -> tuple[ApiToken, str]:
    """A new token for ``user``; the key is returned once and only its hash is kept."""
    key = ApiToken.new_key()
    with transaction.atomic():
        token = ApiToken.objects.create(
            user=user, name=name, key_prefix=key[:8], digest=ApiToken.hash(key)
        )
        record("token.created", actor=user, target=token, after={"name": name})
    return token, key


def revoke_token(token: ApiToken, *, actor: AbstractBaseUser) -> bool:
    with transaction.atomic():
        updated = ApiToken.objects.filter(pk=token.pk, revoked_at__isnull=True).update(
            revoked_at=timezone.now()
        )
        if updated:
            record("token.revoked", actor=actor, target=token, before={"name": token.name})
    return bool(updated)


class ApiTokenAuthentication(authentication.BaseAuthentication):
    """``Authorization: Bearer gpa_...`` (or ``Token gpa_...``)."""

    keywords = ("bearer", "token")

    def authenticate(self, request: Request) -> tuple[AbstractBaseUser, ApiToken] | None:
        header = authentication.get_authorization_header(request).split()
        if len(header) != 2 or header[0].decode().lower() not in self.keywords:
            return None
        key = header[1].decode(errors="replace")
        if not key.startswith(ApiToken.PREFIX):
            return None
        try:
            token = ApiToken.objects.select_related("user", "user__gpuadmin_role").get(
                digest=ApiToken.hash(key), revoked_at__isnull=True
            )
        except ApiToken.DoesNotExist:
            token = None
        if token is None or not token.user.is_active:
            raise exceptions.AuthenticationFailed("Invalid or revoked API token.")
        now = timezone.now()
        if token.last_used_at is None or (now - token.last_used_at).total_seconds() > 60:
            ApiToken.objects.filter(pk=token.pk).update(last_used_at=now)
        return token.user, token

    def authenticate_header(self, request: Request) -> str:
        return "Bearer"
