"""The request id that ties audit rows to what caused them.

A web request gets one from ``RequestIdMiddleware`` (the caller's ``X-Request-ID`` when it is a
UUID, else a new one; echoed in the response header); a Celery task carries the id of what sent
it in its ``gpuadmin_request_id`` header, or else runs under its own task id; a CLI verb runs
under one new id. ``gpuadmin.audit.services.record()`` writes ``current()`` into every row.

The channel says through what a change came: the CLI names its verb in ``X-Gpuadmin-Channel``
(``cli drain``), any other request is ``api`` or ``web``; a task carries its sender's, and a
command on the server names itself. ``record()`` writes ``current_channel()`` beside the id.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

from celery import signals
from django.http import HttpRequest, HttpResponse

HEADER = "X-Request-ID"
TASK_HEADER = "gpuadmin_request_id"
CHANNEL_HEADER = "X-Gpuadmin-Channel"
TASK_CHANNEL_HEADER = "gpuadmin_channel"
# A channel the CLI may claim: ``cli`` and its verb's words.
CLI_CHANNEL = re.compile(r"cli( [a-z][a-z-]{0,30}){1,3}")
CHANNEL_LENGTH = 40  # the audit row's column

_current: ContextVar[uuid.UUID | None] = ContextVar("gpuadmin_request_id", default=None)
_channel: ContextVar[str] = ContextVar("gpuadmin_channel", default="")


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


def current_channel() -> str:
    """Through what the running request, task or command came (empty for a background one)."""
    return _channel.get()


def request_channel(request: HttpRequest) -> str:
    """The CLI verb that sent ``request`` (its ``X-Gpuadmin-Channel``), else ``api`` for the API's
    paths (``gpuadmin.api.is_api_path``, from the URLconf) and ``web`` for the pages."""
    # Here, not at the top: the agents and workers load this module for Celery's signals, and
    # need none of the API's (DRF's, drf-spectacular's) modules.
    from gpuadmin.api import is_api_path

    claimed = request.headers.get(CHANNEL_HEADER, "")
    if CLI_CHANNEL.fullmatch(claimed):
        return claimed
    return "api" if is_api_path(request) else "web"


@contextmanager
def bound(request_id: uuid.UUID | None = None, channel: str = "") -> Iterator[uuid.UUID]:
    """Run the block under ``request_id`` (a new one when None) and ``channel``."""
    request_id = request_id or uuid.uuid4()
    token = _current.set(request_id)
    channel_token = _channel.set(channel[:CHANNEL_LENGTH])
    try:
        yield request_id
    finally:
        _channel.reset(channel_token)
        _current.reset(token)


class RequestIdMiddleware:
    """Binds each request to an id: the incoming ``X-Request-ID`` when it is a UUID, else a new
    one; sets ``request.id`` and echoes it in the response's ``X-Request-ID``."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        channel = request_channel(request)
        with bound(parse(request.headers.get(HEADER)), channel) as request_id:
            request.id = request_id  # type: ignore[attr-defined]
            response = self.get_response(request)
        response[HEADER] = str(request_id)
        return response


# --------------------------------------------------------------------------- Celery


@signals.before_task_publish.connect
def _send_request_id(headers: dict[str, Any] | None = None, **_: Any) -> None:
    """A task sent while a request (task, command) runs carries its id and channel."""
    request_id = current()
    if headers is not None and request_id is not None:
        headers.setdefault(TASK_HEADER, str(request_id))
        headers.setdefault(TASK_CHANNEL_HEADER, current_channel())


_task_tokens: dict[str, tuple[Any, Any]] = {}


@signals.task_prerun.connect
def _bind_task(task_id: str, task: Any, **_: Any) -> None:
    """Run the task under the id it was sent with; else under the caller's (an eager task) or
    its own task id (beat, an agent's report)."""
    caller = current() if task.request.is_eager else None
    request_id = parse(getattr(task.request, TASK_HEADER, None)) or caller or parse(task_id)
    channel = getattr(task.request, TASK_CHANNEL_HEADER, None)
    if not isinstance(channel, str):
        channel = current_channel() if task.request.is_eager else ""
    _task_tokens[task_id] = (
        _current.set(request_id),
        _channel.set(channel[:CHANNEL_LENGTH]),
    )


@signals.task_postrun.connect
def _unbind_task(task_id: str, **_: Any) -> None:
    tokens = _task_tokens.pop(task_id, None)
    if tokens is not None:
        _channel.reset(tokens[1])
        _current.reset(tokens[0])
