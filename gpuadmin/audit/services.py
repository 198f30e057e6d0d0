"""Writing the audit log."""

from __future__ import annotations

import json
import uuid
from typing import Any

from django.contrib.auth.models import User
from django.core.serializers.json import DjangoJSONEncoder
from django.db import models, transaction

from gpuadmin import request_id as request_ids
from gpuadmin.audit.models import AuditEvent


class AuditOutsideTransaction(RuntimeError):
    """``record()`` was called without an open transaction."""


def _json_safe(value: Any) -> Any:
    """Dates, decimals and UUIDs become the strings DjangoJSONEncoder writes."""
    if value is None:
        return None
    return json.loads(json.dumps(value, cls=DjangoJSONEncoder))


def record(event_type: str, **fields: Any) -> AuditEvent:
    """Write one audit row (``fields`` as for ``audit_event()``) inside the caller's
    transaction.

    The row commits or rolls back with the change it describes, so the log can never claim a
    change that did not happen, nor miss one that did. Calling it outside ``transaction.atomic``
    is a programming error and raises ``AuditOutsideTransaction``.
    """
    [event] = record_all([audit_event(event_type, **fields)])
    return event


def audit_event(
    event_type: str,
    *,
    actor: User | None = None,
    actor_name: str | None = None,
    target: models.Model | None = None,
    target_type: str = "",
    target_id: str | int = "",
    before: dict[str, Any] | None = None,
    after: dict[str, Any] | None = None,
    message: str = "",
    request_id: uuid.UUID | None = None,
) -> AuditEvent:
    """An unsaved audit row, as ``record()`` writes it; ``record_all()`` writes several.
    ``request_id`` defaults to the running request's, task's or command's
    (``gpuadmin.request_id.current()``)."""
    if not actor_name:
        if actor is None:
            raise ValueError("record() needs an actor or an actor_name (e.g. 'placement-loop')")
        actor_name = actor.get_username()
    if target is not None:
        target_type = target_type or target._meta.label_lower
        target_id = target_id or target.pk
    return AuditEvent(
        event_type=event_type,
        actor=actor,
        actor_name=actor_name,
        target_type=target_type,
        target_id=str(target_id),
        object_repr=str(target)[:200] if target is not None else "",
        before=_json_safe(before),
        after=_json_safe(after),
        message=message,
        request_id=request_id or request_ids.current(),
    )


def record_all(events: list[AuditEvent]) -> list[AuditEvent]:
    """Write ``audit_event()`` rows in one statement, inside the caller's transaction (see
    ``record()``): one change that touches many rows, e.g. a gang's GPUs, audits each."""
    if not transaction.get_connection().in_atomic_block:
        kinds = ", ".join(sorted({event.event_type for event in events}))
        raise AuditOutsideTransaction(
            f"audit record({kinds!r}) must run inside the transaction of the change"
        )
    return AuditEvent.objects.bulk_create(events)
