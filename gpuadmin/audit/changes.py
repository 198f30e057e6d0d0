"""An audit row's before and after as people read them on ``/audit/``: the fields that
changed, old → new; for a row created or deleted, its first fields that hold a value."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

SALIENT_FIELDS = 4  # of a created or deleted row's fields, the ones shown
# Which of a created or deleted row's fields say most about it, first (PostgreSQL's jsonb
# keeps the keys in its own order, not the row's).
_SALIENT_FIRST = (
    "name",
    "username",
    "hostname",
    "uuid",
    "index",
    "state",
    "owner",
    "user",
    "project",
    "pool",
    "node",
    "gpu",
    "job",
    "severity",
    "summary",
)
LONGEST_VALUE = 80  # characters of one value; the rest is cut (the API and CSV hold all)


@dataclass(frozen=True)
class FieldChange:
    """One field: ``before`` None when the row had no such field (created), ``after`` None
    when it has none now (deleted)."""

    name: str
    before: str | None
    after: str | None


@dataclass(frozen=True)
class Changes:
    fields: list[FieldChange]
    more: int = 0  # fields of a created or deleted row left out


def value_text(value: Any) -> str:
    """``–`` for none, ``yes``/``no``, lists and mappings inline, long text cut."""
    if value is None or value == "":
        return "–"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, list | tuple):
        text = ", ".join(value_text(item) for item in value) or "none"
    elif isinstance(value, Mapping):
        text = ", ".join(f"{key} {value_text(item)}" for key, item in value.items()) or "none"
    else:
        text = str(value)
    return text if len(text) <= LONGEST_VALUE else text[: LONGEST_VALUE - 1] + "…"


def _has_value(value: Any) -> bool:
    return value not in (None, "", [], {})


def field_changes(before: Mapping[str, Any] | None, after: Mapping[str, Any] | None) -> Changes:
    """What the row says changed, field by field, in the order the row lists them."""
    if before is None or after is None:
        side = after if before is None else before
        held = sorted(
            ((name, value) for name, value in (side or {}).items() if _has_value(value)),
            key=lambda item: (
                _SALIENT_FIRST.index(item[0]) if item[0] in _SALIENT_FIRST else len(_SALIENT_FIRST)
            ),
        )
        shown = [
            FieldChange(
                name,
                None if before is None else value_text(value),
                None if after is None else value_text(value),
            )
            for name, value in held[:SALIENT_FIELDS]
        ]
        return Changes(shown, more=len(held) - len(shown))
    names = [*after, *(name for name in before if name not in after)]
    return Changes(
        [
            FieldChange(name, value_text(before.get(name)), value_text(after.get(name)))
            for name in names
            if before.get(name) != after.get(name)
        ]
    )
