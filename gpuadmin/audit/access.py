"""Who reads the audit log: operators and admins (it names every user's actions, tokens and
roles); users and viewers see a job's own timeline on its page, and no log."""

from __future__ import annotations

from collections.abc import Callable

from django.contrib.auth.models import AnonymousUser, User
from django.http import HttpRequest

from gpuadmin.access.models import Role
from gpuadmin.access.permissions import RolePermission
from gpuadmin.access.services import at_least

READ_ROLE = Role.OPERATOR


class CanReadAudit(RolePermission):
    read_role = write_role = READ_ROLE


def can_read(user: User | AnonymousUser) -> bool:
    return at_least(user, READ_ROLE)


def nav(request: HttpRequest) -> dict[str, Callable[[], bool]]:
    """Template context: ``can_read_audit``, looked up only when the template asks."""
    return {"can_read_audit": lambda: can_read(request.user)}
