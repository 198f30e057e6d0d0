"""Role lookups, creating and revoking API tokens, and people's Unix accounts (audited)."""

from __future__ import annotations

from typing import Any, Protocol, TypeVar

from django.conf import settings
from django.contrib.auth.models import AnonymousUser, User
from django.db import models, transaction
from django.db.models import QuerySet
from django.utils import timezone

from gpuadmin.access.models import ApiToken, Role, UnixAccount
from gpuadmin.access.tokens import forget_cached_tokens
from gpuadmin.audit.services import record

# What each role may do, strongest first.
ROLE_ORDER = (Role.ADMIN, Role.OPERATOR, Role.USER, Role.VIEWER)


class Owned(Protocol):
    """Anything a person owns (a job, a reservation)."""

    @property
    def owner_id(self) -> int | None: ...


def role_of(user: User | AnonymousUser) -> str:
    """Staff are admins; others have their Membership's role, or are users."""
    if not user.is_authenticated:
        return Role.VIEWER
    if user.is_staff or user.is_superuser:
        return Role.ADMIN
    membership = getattr(user, "gpuadmin_role", None)
    return membership.role if membership else Role.USER


def at_least(user: User | AnonymousUser, role: str) -> bool:
    if role == Role.VIEWER:
        return True  # everyone reads: no need to look the role up
    return ROLE_ORDER.index(role_of(user)) <= ROLE_ORDER.index(role)


def is_admin(user: User | AnonymousUser) -> bool:
    return at_least(user, Role.ADMIN)


def can_submit(user: User | AnonymousUser) -> bool:
    return at_least(user, Role.USER)


def can_act_on(user: User | AnonymousUser, owned: Owned) -> bool:
    """Operators and admins act on anyone's things; users on their own; viewers on none."""
    if at_least(user, Role.OPERATOR):
        return True
    return can_submit(user) and owned.owner_id == user.pk


def sees_only_own(user: User | AnonymousUser) -> bool:
    """Who sees whose jobs: users their own only; viewers, operators and admins everyone's
    (what a job keeps private aside: ``can_read_private``)."""
    return role_of(user) == Role.USER


Row = TypeVar("Row", bound=models.Model)


def visible_to(
    user: User | AnonymousUser, rows: QuerySet[Row], owner: str = "owner_id"
) -> QuerySet[Row]:
    """The ``rows`` (jobs of any kind, arrays, their allocations: whose owner is the field
    ``owner``) that ``user`` sees, by ``sees_only_own``."""
    return rows.filter(**{owner: user.pk}) if sees_only_own(user) else rows


def can_read_private(user: User | AnonymousUser, owned: Owned) -> bool:
    """Whether ``user`` reads what a job keeps private (its log, environment values and
    command line): its owner and admins, and whom ``GPUADMIN_PRIVATE_DATA`` adds (operators,
    or everyone signed in), as Slurm's PrivateData=jobs."""
    if not user.is_authenticated:
        return False
    if owned.owner_id == user.pk:
        return True
    readers = settings.GPUADMIN_PRIVATE_DATA
    if readers == "everyone":
        return True
    return at_least(user, Role.OPERATOR if readers == "operators" else Role.ADMIN)


def private_to() -> str:
    """Who reads a job's private data, in words (``can_read_private``'s rule)."""
    return {
        "owner": "its owner and admins",
        "operators": "its owner, operators and admins",
        "everyone": "everyone signed in",
    }[settings.GPUADMIN_PRIVATE_DATA]


def create_token(user: User, name: str, *, actor_name: str = "") -> tuple[ApiToken, str]:
    """A new token for ``user``; the key is returned once and only its hash is kept. The audit
    row names ``user`` as who acted, or ``actor_name`` (the CLI) when given."""
    key = ApiToken.new_key()
    with transaction.atomic():
        token = ApiToken.objects.create(
            user=user, name=name, key_prefix=key[:8], digest=ApiToken.hash(key)
        )
        record(
            "token.created",
            actor=None if actor_name else user,
            actor_name=actor_name,
            target=token,
            after={"name": name},
        )
    return token, key


def revoke_token(token: ApiToken, *, actor: User) -> bool:
    with transaction.atomic():
        updated = ApiToken.objects.filter(pk=token.pk, revoked_at__isnull=True).update(
            revoked_at=timezone.now()
        )
        if updated:
            record("token.revoked", actor=actor, target=token, before={"name": token.name})
            forget_cached_tokens()
    return bool(updated)


def unix_account_of(user: User) -> UnixAccount:
    """The Unix account ``user``'s jobs run as: the one an admin set, or (unsaved)
    ``GPUADMIN_DEFAULT_UNIX_ACCOUNT``, else their user name, with root refused."""
    try:
        return user.unix_account  # loaded with the user by select_related("unix_account")
    except UnixAccount.DoesNotExist:
        return _default_account(user)


def set_unix_account(user: User, *, username: str, allow_root: bool, actor: User) -> UnixAccount:
    """Set the Unix account ``user``'s jobs run as (``ValidationError`` naming the field for a
    name that is not a Unix user name); audited when it changes."""
    with transaction.atomic():
        account = UnixAccount.objects.select_for_update().filter(user=user).first()
        before = _said(account or _default_account(user))
        account = account or UnixAccount(user=user)
        account.username, account.allow_root = username, allow_root
        account.full_clean()
        account.save()
        if _said(account) != before:
            who = {"user": user.get_username()}
            record(
                "unix_account.changed",
                actor=actor,
                target=account,
                before={**who, **before},
                after={**who, **_said(account)},
            )
    return account


def reset_unix_account(user: User, *, actor: User) -> None:
    """Back to the default (``GPUADMIN_DEFAULT_UNIX_ACCOUNT`` or their user name, root
    refused); audited."""
    with transaction.atomic():
        account = UnixAccount.objects.select_for_update().filter(user=user).first()
        if account is None:
            return
        who = {"user": user.get_username()}
        record(
            "unix_account.changed",
            actor=actor,
            target=account,
            before={**who, **_said(account)},
            after={**who, **_said(_default_account(user))},
        )
        account.delete()


def _default_account(user: User) -> UnixAccount:
    # Not through ``user.unix_account``: an unsaved form's instance may sit in its cache.
    name = settings.GPUADMIN_DEFAULT_UNIX_ACCOUNT or user.get_username()
    return UnixAccount(username=name, allow_root=False)


def _said(account: UnixAccount) -> dict[str, Any]:
    return {"username": account.username, "allow_root": account.allow_root}
