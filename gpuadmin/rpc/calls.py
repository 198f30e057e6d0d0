"""What every gRPC method shares: who calls (an API token in the call's metadata, checked as the
REST API checks it, and the role the method needs), the request id and channel its audit rows
carry, the database connections kept as a web request keeps them, and refusals answered as
status codes that name the field at fault.

A servicer's method is decorated with ``rpc(role)`` and takes ``(request, call)``: ``call.user``
is the caller. Refusals become status codes:

- ``FieldRefusal`` (a service's refusal of bad input) and the REST serializers'
  ``ValidationError``: ``INVALID_ARGUMENT``, the message beginning with the field
  (``gpu_count: ...``), which the trailing metadata ``gpuadmin-field`` names too;
- Django's and DRF's ``PermissionDenied``: ``PERMISSION_DENIED``;
- ``Refused``: the code it carries (``NOT_FOUND``, ``FAILED_PRECONDITION``,
  ``RESOURCE_EXHAUSTED``...), raised by the servicers for the rest.
"""

from __future__ import annotations

import functools
import inspect
import logging
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any, TypeVar

import grpc
from django.contrib.auth.models import User
from django.core.exceptions import PermissionDenied
from django.db import close_old_connections
from django.db.models import Model, QuerySet
from django_filters import FilterSet
from rest_framework import exceptions as drf

from gpuadmin import request_id
from gpuadmin.access.models import Role
from gpuadmin.access.services import at_least, role_of
from gpuadmin.access.tokens import InvalidToken, authenticate_key
from gpuadmin.refusals import FieldRefusal
from gpuadmin.rpc.events import NotListening

log = logging.getLogger("gpuadmin.rpc")
CHANNEL = "grpc"  # the audit rows' channel
FIELD_KEY = "gpuadmin-field"  # trailing metadata: the field a refusal is about
REQUEST_ID_KEY = "x-request-id"
TOKEN_KEYWORDS = ("bearer", "token")
M = TypeVar("M", bound=Model)


class Refused(Exception):
    """A refusal as a status code: ``message`` for the caller, ``field`` when one is at
    fault, ``metadata`` added to the trailing metadata (``retry-after``)."""

    def __init__(
        self,
        code: grpc.StatusCode,
        message: str,
        *,
        field: str = "",
        metadata: Sequence[tuple[str, str]] = (),
    ) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.field = field
        self.metadata = tuple(metadata)


@dataclass(frozen=True)
class Call:
    """One call: its caller and grpc's context."""

    user: User
    context: grpc.ServicerContext

    def is_active(self) -> bool:
        return bool(self.context.is_active())

    def on_end(self, callback: Callable[[], None]) -> None:
        """Call ``callback`` when the call ends (the client went away, or the server stops)."""
        self.context.add_callback(callback)


def caller(context: grpc.ServicerContext) -> User:
    """The user of the API token in the call's ``authorization`` metadata (``Bearer
    gpa_...``); ``UNAUTHENTICATED`` without one or for a revoked one."""
    metadata = dict(context.invocation_metadata())
    words = str(metadata.get("authorization", "")).split()
    if len(words) != 2 or words[0].lower() not in TOKEN_KEYWORDS:
        raise Refused(
            grpc.StatusCode.UNAUTHENTICATED,
            "Give an API token in the call's authorization metadata: Bearer gpa_... "
            "(gpuadmin token create).",
        )
    try:
        user, _ = authenticate_key(words[1])
    except InvalidToken as exc:
        raise Refused(grpc.StatusCode.UNAUTHENTICATED, str(exc)) from None
    return user


def refusal_of(exc: Exception) -> Refused | None:
    """``exc`` as a ``Refused``, or None for an error that is no refusal (a bug: INTERNAL)."""
    if isinstance(exc, Refused):
        return exc
    if isinstance(exc, FieldRefusal):
        return Refused(grpc.StatusCode.INVALID_ARGUMENT, str(exc), field=exc.field)
    if isinstance(exc, drf.ValidationError):
        field, message = first_error(exc.detail)
        said = f"{field}: {message}" if field else message
        return Refused(grpc.StatusCode.INVALID_ARGUMENT, said, field=field)
    if isinstance(exc, PermissionDenied | drf.PermissionDenied):
        return Refused(grpc.StatusCode.PERMISSION_DENIED, str(exc) or "Not allowed.")
    if isinstance(exc, NotListening):
        return Refused(grpc.StatusCode.UNAVAILABLE, str(exc))
    return None


def filtered(
    filterset_class: type[FilterSet], data: Mapping[str, Any], queryset: QuerySet[M], user: User
) -> QuerySet[M]:
    """``queryset`` filtered by the FilterSet the REST API and the pages use (the fields set
    in ``data``: empty ones are left out), as ``user`` asks (``owner=me``); INVALID_ARGUMENT
    naming the field it refuses."""
    given = {name: value for name, value in data.items() if value not in ("", [], None)}
    filterset = filterset_class(given, queryset, request=SimpleNamespace(user=user))
    if not filterset.is_valid():
        field, errors = next(iter(filterset.errors.items()))
        raise Refused(grpc.StatusCode.INVALID_ARGUMENT, f"{field}: {errors[0]}", field=field)
    return filterset.qs


class Streams:
    """How many streams may be open at once: each holds one of the server's threads while it
    lasts, so that streams never take them all and leave no thread to answer the other calls
    (``limit`` is set when the server is built; None: no limit)."""

    def __init__(self) -> None:
        self.limit: int | None = None
        self._open = 0
        self._lock = threading.Lock()

    @contextmanager
    def held(self) -> Iterator[None]:
        """One stream's place; RESOURCE_EXHAUSTED when all are taken."""
        with self._lock:
            if self.limit is not None and self._open >= self.limit:
                raise Refused(
                    grpc.StatusCode.RESOURCE_EXHAUSTED,
                    f"The server follows {self._open} streams, its most: try again later.",
                    metadata=[("retry-after", "10")],
                )
            self._open += 1
        try:
            yield
        finally:
            with self._lock:
                self._open -= 1


STREAMS = Streams()


def first_error(detail: Any, path: str = "") -> tuple[str, str]:
    """The first (field, message) of a DRF error ``detail`` (nested dicts and lists)."""
    if isinstance(detail, dict):
        for name, inner in detail.items():
            prefix = "" if name == "non_field_errors" else str(name)
            return first_error(inner, f"{path}.{prefix}" if path and prefix else path or prefix)
    if isinstance(detail, list) and detail:
        return first_error(detail[0], path)
    return path, str(detail)


def _abort(context: grpc.ServicerContext, refused: Refused) -> None:
    metadata = list(refused.metadata)
    if refused.field:
        metadata.append((FIELD_KEY, refused.field))
    if metadata:
        context.set_trailing_metadata(metadata)
    context.abort(refused.code, refused.message)


def _begin(context: grpc.ServicerContext, role: str) -> Call:
    """The call of a caller with ``role`` or stronger."""
    user = caller(context)
    if not at_least(user, role):
        raise Refused(
            grpc.StatusCode.PERMISSION_DENIED,
            f"This needs the {role} role; you are a {role_of(user)}.",
        )
    return Call(user, context)


def _bound(context: grpc.ServicerContext) -> AbstractContextManager[Any]:
    """The call's audit rows carry its ``x-request-id`` (a new one when it sends none) and
    the channel ``grpc``."""
    sent = dict(context.invocation_metadata()).get(REQUEST_ID_KEY)
    return request_id.bound(request_id.parse(sent), CHANNEL)


def _fail(context: grpc.ServicerContext, exc: Exception, name: str) -> None:
    refused = refusal_of(exc)
    if refused is None:
        log.exception("%s failed", name)
        refused = Refused(grpc.StatusCode.INTERNAL, "Internal error: see the server's log.")
    _abort(context, refused)


def rpc(role: str = Role.VIEWER) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """A servicer's method ``(self, request, call)`` as grpc calls it, ``(self, request,
    context)``, for callers of ``role`` or stronger (a unary method or a generator, for a
    server stream)."""

    def decorator(method: Callable[..., Any]) -> Callable[..., Any]:
        name = method.__qualname__
        if inspect.isgeneratorfunction(method):

            @functools.wraps(method)
            def streaming(self: Any, request: Any, context: grpc.ServicerContext) -> Iterator[Any]:
                close_old_connections()
                try:
                    with _bound(context), STREAMS.held():
                        yield from method(self, request, _begin(context, role))
                except Exception as exc:
                    if context.is_active():  # else the client went away: no one to tell
                        _fail(context, exc, name)
                finally:
                    close_old_connections()

            return streaming

        @functools.wraps(method)
        def unary(self: Any, request: Any, context: grpc.ServicerContext) -> Any:
            close_old_connections()
            try:
                with _bound(context):
                    return method(self, request, _begin(context, role))
            except Exception as exc:
                _fail(context, exc, name)
            finally:
                close_old_connections()

        return unary

    return decorator
