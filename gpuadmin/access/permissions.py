"""The permission classes every app's API uses, and ``role_required`` for pages."""

from __future__ import annotations

from collections.abc import Callable
from functools import wraps
from typing import Any

from django.contrib.auth.decorators import login_required
from django.contrib.auth.models import AnonymousUser, User
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse
from rest_framework import permissions
from rest_framework.request import Request
from rest_framework.views import APIView

from gpuadmin.access.models import Role
from gpuadmin.access.services import Owned, at_least, can_read_private, private_to, role_of


class RolePermission(permissions.BasePermission):
    """Signed-in people with ``read_role`` read; writes need ``write_role`` (or stronger)."""

    read_role: str = Role.VIEWER
    write_role: str

    def has_permission(self, request: Request, view: APIView) -> bool:
        user = request.user
        if not (user and user.is_authenticated):
            return False
        safe = request.method in permissions.SAFE_METHODS
        return at_least(user, self.read_role if safe else self.write_role)


class CanSubmit(RolePermission):
    write_role = Role.USER


class IsOperatorOrReadOnly(RolePermission):
    write_role = Role.OPERATOR


class IsAdminOrReadOnly(RolePermission):
    write_role = Role.ADMIN


class IsAdminRole(RolePermission):
    """Admins only, even to read (a read that acts, such as a discovery scan)."""

    read_role = write_role = Role.ADMIN


def signed_in(request: HttpRequest | Request) -> User:
    """``request.user`` in a view that requires sign-in (a permission class, ``role_required``,
    the admin site), as the ``User`` it then always is."""
    user = request.user
    if isinstance(user, AnonymousUser):
        raise PermissionDenied("Sign in first.")
    return user


def signed_in_reader(request: HttpRequest | None) -> bool:
    """Whom ``role_required(Role.VIEWER)`` lets in: anyone signed in. A section that a page
    open to everyone (a GPU's, a node's) borrows from a signed-in page shows to them only."""
    return request is not None and request.user.is_authenticated


def check_can_read_private(request: HttpRequest | Request, owned: Owned, what: str) -> None:
    """A 403 (page or API) unless the requester reads what ``owned`` keeps private
    (``can_read_private``); ``what`` names it in the refusal (``log of job 12``)."""
    if not can_read_private(request.user, owned):
        raise PermissionDenied(f"The {what} is private to {private_to()}.")


PageView = Callable[..., HttpResponse]


def role_required(role: str) -> Callable[[PageView], PageView]:
    """A page for ``role`` or stronger: others signed in get 403, anonymous people the login."""

    def decorator(view: PageView) -> PageView:
        @login_required
        @wraps(view)
        def checked(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
            if not at_least(request.user, role):
                you = role_of(request.user)
                raise PermissionDenied(f"This needs the {role} role; you are a {you}.")
            return view(request, *args, **kwargs)

        return checked

    return decorator
