"""JSON round trip for the NVML layer's dataclasses (a scan travels over Celery as JSON)."""

from __future__ import annotations

import dataclasses
import types
from typing import Any, Self, Union, get_args, get_origin, get_type_hints


class Record:
    """Base of a frozen dataclass that crosses a process boundary as plain JSON."""

    def to_dict(self) -> dict[str, Any]:
        """Plain dicts, lists and scalars only: `json.dumps` takes it as is."""
        return _jsonable(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Self:
        """Rebuild from `to_dict()` output (also after a JSON round trip); missing keys default,
        unknown keys are ignored."""
        hints = _type_hints(cls)
        return cls(
            **{
                field.name: _revive(hints[field.name], data[field.name])
                for field in dataclasses.fields(cls)  # type: ignore[arg-type]
                if field.name in data
            }
        )


def _jsonable(value: Any) -> Any:
    if isinstance(value, Record):
        return {
            field.name: _jsonable(getattr(value, field.name))
            for field in dataclasses.fields(value)  # type: ignore[arg-type]
        }
    if isinstance(value, tuple | list):
        return [_jsonable(item) for item in value]
    return value


_HINTS: dict[type, dict[str, Any]] = {}


def _type_hints(cls: type) -> dict[str, Any]:
    if cls not in _HINTS:
        _HINTS[cls] = get_type_hints(cls)
    return _HINTS[cls]


def _revive(hint: Any, value: Any) -> Any:
    if value is None:
        return None
    origin = get_origin(hint)
    if origin is Union or origin is types.UnionType:
        (inner,) = (arg for arg in get_args(hint) if arg is not type(None))
        return _revive(inner, value)
    if origin is tuple:
        args = get_args(hint)
        if len(args) == 2 and args[1] is Ellipsis:
            return tuple(_revive(args[0], item) for item in value)
        return tuple(_revive(arg, item) for arg, item in zip(args, value, strict=True))
    if isinstance(hint, type) and issubclass(hint, Record):
        return hint.from_dict(value)
    return value
