"""The request id that ties audit rows to what caused them.

A web request gets one from ``RequestIdMiddleware`` (the caller's ``X-Request-ID`` when it is a
UUID, else a new one; echoed in the response header); a Celery task carries the id of what sent
it in its ``gpuadmin_request_id`` header, or else runs under its own task id; a CLI verb runs
under one new id. ``gpuadmin.audit.services.record()`` writes ``current()`` into every row.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

from celery import signals
from django.http import HttpRequest, HttpResponse

HEADER = "X-Request-ID"
TASK_HEADER = "gpuadmin_request_id"

_current: ContextVar[uuid.UUID | None] = ContextVar("gpuadmin_request_id", default=None)


def current() -> uuid.UUID | None:
    """The id of the request, task or command running now (None outside all three)."""
    return _current.get()


def parse(value: object) -> uuid.UUID | None:
    """``value`` as a UUID (any of its spellings: hyphens or not, braces, ``urn:uuid:``), or
    None when it is not one."""
    if not isinstance(value, str) or len(value) > 45:
        return None
    try:
        return uuid.UUID(value)
    except ValueError:
        return None


@contextmanager
def bound(request_id: uuid.UUID | None = None) -> Iterator[uuid.UUID]:
    """Run the block under ``request_id`` (a new one when None)."""
    request_id = request_id or uuid.uuid4()
    token = _current.set(request_id)
    try:
        yield request_id
    finally:
        _current.reset(token)


class RequestIdMiddleware:
    """Binds each request to an id: the incoming ``X-Request-ID`` when it is a UUID, else a new
    one; sets ``request.id`` and echoes it in the response's ``X-Request-ID``."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        with bound(parse(request.headers.get(HEADER))) as request_id:
            request.id = request_id  # type: ignore[attr-defined]
            response = self.get_response(request)
        response[HEADER] = str(request_id)
        return response


# --------------------------------------------------------------------------- Celery


@signals.before_task_publish.connect
def _send_request_id(headers: dict[str, Any] | None = None, **_: Any) -> None:
    """A task sent while a request (task, command) runs carries its id."""
    request_id = current()
    if headers is not None and request_id is not None:
        headers.setdefault(TASK_HEADER, str(request_id))


_task_tokens: dict[str, Any] = {}


@signals.task_prerun.connect
def _bind_task(task_id: str, task: Any, **_: Any) -> None:
    """Run the task under the id it was sent with; else under the caller's (an eager task) or
    its own task id (beat, an agent's report)."""
    caller = current() if task.request.is_eager else None
    request_id = parse(getattr(task.request, TASK_HEADER, None)) or caller or parse(task_id)
    _task_tokens[task_id] = _current.set(request_id)


@signals.task_postrun.connect
def _unbind_task(task_id: str, **_: Any) -> None:
    token = _task_tokens.pop(task_id, None)
    if token is not None:
        _current.reset(token)
