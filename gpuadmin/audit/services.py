"""Writing the audit log."""

from __future__ import annotations

import functools
import json
import uuid
from collections.abc import Iterable, Mapping
from datetime import datetime
from typing import Any

from django.contrib.auth.models import User
from django.core.serializers.json import DjangoJSONEncoder
from django.db import connection, models, transaction
from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.models import NOT_PROVIDED, Field

from gpuadmin import request_id as request_ids
from gpuadmin.audit.models import AuditEvent


class AuditOutsideTransaction(RuntimeError):
    """``record()`` was called without an open transaction."""


def _json_safe(value: Any) -> Any:
    """Dates, decimals and UUIDs become the strings DjangoJSONEncoder writes."""
    if value is None:
        return None
    return json.loads(json.dumps(value, cls=DjangoJSONEncoder))


def changed_values(
    before: Mapping[str, Any], after: Mapping[str, Any]
) -> tuple[dict[str, Any], dict[str, Any]]:
    """The fields whose value differs, before and after (empty when none does): what a
    ``*.changed`` audit row records of an edit."""
    names = [name for name in after if before.get(name) != after[name]]
    return {name: before.get(name) for name in names}, {name: after[name] for name in names}


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
        channel=request_ids.current_channel(),
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


def record_each(
    event_type: str,
    changes: Iterable[tuple[str | int, str, dict[str, Any]]],
    *,
    target_type: str,
    **fields: Any,
) -> int:
    """One ``event_type`` row per object of one kind that a single change touched, each
    given as (target id, its text, its ``after``), the rest (``fields``: actor, before,
    message ...) shared, as ``audit_event()`` fills it in; inside the caller's transaction
    (see ``record()``). One statement with a handful of parameters however many rows, where
    ``record_all()``'s multi-row VALUES takes 11 per row and PostgreSQL at most 65,535: for a
    job array's thousands of tasks. The number of rows written."""
    if not transaction.get_connection().in_atomic_block:
        raise AuditOutsideTransaction(
            f"audit record_each({event_type!r}) must run inside the transaction of the change"
        )
    shared = audit_event(event_type, target_type=target_type, **fields)
    ids: list[str] = []
    texts: list[str] = []
    afters: list[str] = []
    for target_id, text, after in changes:
        ids.append(str(target_id))
        texts.append(text[:200])
        afters.append(json.dumps(after, cls=DjangoJSONEncoder))
    if not ids:
        return 0
    meta = AuditEvent._meta
    quote = connection.ops.quote_name
    columns = [field for field in meta.concrete_fields if not field.primary_key]
    each = {"target_id": "change.id", "object_repr": "change.text", "after": "change.after::jsonb"}
    select = ", ".join(
        each.get(field.column, f"%s::{field.db_type(connection)}") for field in columns
    )
    shared_values = [
        field.get_db_prep_save(getattr(shared, field.attname), connection)
        for field in columns
        if field.column not in each
    ]
    with connection.cursor() as cursor:
        cursor.execute(
            f"INSERT INTO {quote(meta.db_table)} "
            f"({', '.join(quote(field.column) for field in columns)}) "
            f"SELECT {select} FROM unnest(%b::text[], %b::text[], %b::text[]) "
            "WITH ORDINALITY AS change(id, text, after, n) ORDER BY change.n",
            [*shared_values, ids, texts, afters],
        )
        return cursor.rowcount


# Stands for a new row's id in its audit text until the database assigns the id: no stored
# text can hold a NUL, so no object's own text contains the mark.
NEW_ID = "\x00new-id\x00"
# The audit row's columns that ``create_recorded``'s statement fills in from the new row.
FROM_NEW_ROW = ("target_id", "object_repr")


def create_recorded(instance: models.Model, event_type: str, **fields: Any) -> None:
    """INSERT ``instance`` (unsaved; its id comes from the database and is set on it) and its
    ``event_type`` audit row (``fields`` as for ``audit_event()``, ``instance`` the target) in
    ONE statement. A statement is atomic on its own: outside ``transaction.atomic`` both rows
    commit together or neither does, without the BEGIN and COMMIT round trips; inside, it is
    part of the caller's transaction. ``after`` cannot hold the id: the audit row's
    ``target_id`` and ``object_repr`` (``str(instance)``) take it from the INSERT."""
    model = type(instance)
    event = audit_event(event_type, target_type=model._meta.label_lower, **fields)
    instance.pk = NEW_ID
    try:
        text_parts = str(instance).split(NEW_ID)  # the statement joins them with the id
    finally:
        instance.pk = None
    database = transaction.get_connection()  # not the proxy: a lookup per use
    values = _db_values(instance, database)
    # psycopg caches its parsing of a statement only up to 50 parameters, and a job has 53
    # columns: the NULL ones are left out (``_create_recorded_sql``), and the audit row is one
    # parameter (a JSON object of its columns).
    given = tuple(
        value is not None or kept
        for value, kept in zip(values, _kept_when_null(model), strict=True)
    )
    audit_row = {
        field.column: getattr(event, field.attname)
        for field in _columns(AuditEvent)
        if field.attname not in FROM_NEW_ROW
    }
    with database.cursor() as cursor:
        cursor.execute(
            _create_recorded_sql(model, given),
            [
                *(value for value, named in zip(values, given, strict=True) if named),
                text_parts,
                json.dumps(audit_row, default=_json_column),
            ],
        )
        (instance.pk,) = cursor.fetchone()
    instance._state.adding = False
    instance._state.db = database.alias


def _json_column(value: datetime | uuid.UUID) -> str:
    """A timestamp or UUID column's value as JSON text PostgreSQL reads back exactly."""
    return value.isoformat() if isinstance(value, datetime) else str(value)


def _db_values(instance: models.Model, database: BaseDatabaseWrapper) -> list[Any]:
    """What an INSERT of ``instance`` sends for each of ``_columns()``: ``field.get_db_prep_save(
    field.pre_save(instance, add=True))``, with the common cases (``_PLAIN``) taken without
    that call chain (a tenth of a submission's CPU for a job's 44 columns)."""
    values = []
    for field, kind in _plain_kinds(type(instance)):
        if kind is None:
            values.append(field.get_db_prep_save(field.pre_save(instance, add=True), database))
            continue
        value = getattr(instance, field.attname)  # what Field.pre_save() returns
        if value is None:
            values.append(None)
        elif isinstance(kind, str) and type(value) is int:
            # An integer field's get_prep_value() is int(): the backend's adaptation is left.
            values.append(database.ops.adapt_integerfield_value(value, kind))
        elif type(value) is kind:
            values.append(value)  # a str of a text field, a bool of a boolean field: as is
        else:
            values.append(field.get_db_prep_save(value, database))
    return values


# Field classes (exactly these, not subclasses) whose get_db_prep_save() turns None into None
# and a value of the type named into itself: their get_prep_value() is to_python() of it, and
# no backend adapts it. Integer fields (named by their internal type) also turn an int into
# itself, which the backend then adapts (``adapt_integerfield_value``: psycopg's Int2, Int4 or
# Int8). A foreign key's id takes the generic path; None is None.
_PLAIN: dict[type[Field], type | str] = {
    models.CharField: str,
    models.TextField: str,
    models.BooleanField: bool,
    models.ForeignKey: type(None),
    **{
        field: field.__name__
        for field in (
            models.SmallIntegerField,
            models.IntegerField,
            models.BigIntegerField,
            models.PositiveSmallIntegerField,
            models.PositiveIntegerField,
            models.PositiveBigIntegerField,
        )
    },
}


@functools.cache
def _plain_kinds(model: type[models.Model]) -> list[tuple[Field, type | str | None]]:
    """``_columns(model)``, each with its kind in ``_PLAIN`` (None: the generic path); a
    timestamp that is not set on save (``auto_now``) is None as None."""

    def kind(field: Field) -> type | str | None:
        if type(field) is models.DateTimeField and not (field.auto_now or field.auto_now_add):
            return type(None)
        return _PLAIN.get(type(field))

    return [(field, kind(field)) for field in _columns(model)]


@functools.cache
def _columns(model: type[models.Model]) -> list[Field]:
    """The columns of ``model`` an INSERT writes: all but its id."""
    return [field for field in model._meta.concrete_fields if not field.primary_key]


@functools.cache
def _kept_when_null(model: type[models.Model]) -> tuple[bool, ...]:
    """For each of ``_columns(model)``, whether a NULL is written as such: a column left out of
    an INSERT takes its database default (``db_default``), which is NULL only without one."""
    return tuple(field.db_default is not NOT_PROVIDED for field in _columns(model))


@functools.cache
def _create_recorded_sql(model: type[models.Model], given: tuple[bool, ...]) -> str:
    """``create_recorded``'s statement for ``model`` with a value for each of ``_columns()``
    whose flag in ``given`` is set, the others left NULL: the same text for every row with
    the same NULL columns (a job's submission: a handful of shapes), so that a connection
    prepares it once (server-side binding)."""
    columns = [field for field, named in zip(_columns(model), given, strict=True) if named]
    quote = connection.ops.quote_name
    pk, audit_table = quote(model._meta.pk.column), quote(AuditEvent._meta.db_table)
    from_new_row = {
        "target_id": f"new.{pk}::text",
        "object_repr": f"left(array_to_string(%s::text[], new.{pk}::text), 200)",
    }
    audit_columns = _columns(AuditEvent)
    select = ", ".join(
        from_new_row.get(field.attname, f"audit.{quote(field.column)}") for field in audit_columns
    )
    return (
        f"WITH new AS (INSERT INTO {quote(model._meta.db_table)} "
        f"({', '.join(quote(field.column) for field in columns)}) "
        f"VALUES ({', '.join(['%s'] * len(columns))}) RETURNING {pk}), "
        f"recorded AS (INSERT INTO {audit_table} "
        f"({', '.join(quote(field.column) for field in audit_columns)}) "
        f"SELECT {select} FROM new, jsonb_populate_record(NULL::{audit_table}, %s::jsonb) audit) "
        f"SELECT {pk} FROM new"
    )
