"""A tool's JSON schema derived from its Python signature, and a model's arguments checked
against it. Plain Python.

A tool is a function whose positional parameters are the caller's (the asking user) and whose
keyword-only parameters, the model's, are typed: ``str``, ``int``,
``float``, ``bool``, ``datetime.date``, a ``Literal`` of strings, an ``Enum`` of strings (Django's
``TextChoices``: its values are the schema's ``enum``), or any of them ``| None``;
``Annotated[T, "what it is"]`` gives the parameter's description, and the docstring's first
paragraph the tool's. A parameter without a default is required.
"""

from __future__ import annotations

import enum
import inspect
import json
import types
import typing
from collections.abc import Callable
from datetime import date
from typing import Any, Literal, Union

JSON_TYPES: dict[type, str] = {str: "string", int: "integer", float: "number", bool: "boolean"}


class ArgumentsInvalid(ValueError):
    """The model's arguments do not fit the tool's schema (said so the model can retry)."""


def _unwrap(hint: Any) -> tuple[Any, str, bool]:
    """(the type, its description, whether None is allowed)."""
    description = ""
    if typing.get_origin(hint) is typing.Annotated:
        hint, *metadata = typing.get_args(hint)
        description = " ".join(text for text in metadata if isinstance(text, str))
    nullable = False
    if typing.get_origin(hint) in (Union, types.UnionType):
        members = [member for member in typing.get_args(hint) if member is not type(None)]
        nullable = len(members) < len(typing.get_args(hint))
        if len(members) != 1:
            raise TypeError(f"a tool parameter of one type (or it | None), not {hint}")
        hint = members[0]
    return hint, description, nullable


def _type_schema(hint: Any) -> dict[str, Any]:
    if typing.get_origin(hint) is Literal:
        choices = list(typing.get_args(hint))
        if not all(isinstance(choice, str) for choice in choices):
            raise TypeError(f"a Literal of strings, not {hint}")
        return {"type": "string", "enum": choices}
    if isinstance(hint, type) and issubclass(hint, enum.Enum):
        return {"type": "string", "enum": [member.value for member in hint]}
    if hint is date:
        return {"type": "string", "format": "date"}
    if hint in JSON_TYPES:
        return {"type": JSON_TYPES[hint]}
    raise TypeError(f"a tool parameter cannot be {hint!r}")


def _parameters(function: Callable[..., Any]) -> dict[str, inspect.Parameter]:
    """The keyword-only parameters: the model's to give (the positional ones are the caller's,
    such as the asking user)."""
    parameters = inspect.signature(function).parameters.values()
    keyword = inspect.Parameter.KEYWORD_ONLY
    return {parameter.name: parameter for parameter in parameters if parameter.kind is keyword}


def describe(function: Callable[..., Any]) -> str:
    """The docstring's first paragraph, on one line."""
    doc = inspect.getdoc(function) or ""
    return " ".join(doc.split("\n\n", 1)[0].split())


def schema_of(function: Callable[..., Any]) -> dict[str, Any]:
    """The JSON schema of ``function``'s keyword arguments (an object, no others allowed)."""
    hints = typing.get_type_hints(function, include_extras=True)
    properties: dict[str, Any] = {}
    required: list[str] = []
    for name, parameter in _parameters(function).items():
        hint, description, nullable = _unwrap(hints[name])
        prop = _type_schema(hint)
        if nullable:
            prop["type"] = [prop["type"], "null"]
            if "enum" in prop:
                prop["enum"] = [*prop["enum"], None]
        if description:
            prop["description"] = description
        if parameter.default is inspect.Parameter.empty:
            required.append(name)
        elif parameter.default is not None:
            prop["default"] = parameter.default
        properties[name] = prop
    schema: dict[str, Any] = {
        "type": "object",
        "properties": properties,
        "additionalProperties": False,
    }
    if required:
        schema["required"] = required
    return schema


def _convert(name: str, value: Any, hint: Any, nullable: bool) -> Any:
    if value is None:
        if nullable:
            return None
        raise ArgumentsInvalid(f"{name}: must not be null")
    if typing.get_origin(hint) is Literal:
        if value not in typing.get_args(hint):
            choices = ", ".join(map(repr, typing.get_args(hint)))
            raise ArgumentsInvalid(f"{name}: {value!r} is not one of {choices}")
        return value
    if isinstance(hint, type) and issubclass(hint, enum.Enum):
        try:
            return hint(value)
        except ValueError:
            choices = ", ".join(str(member.value) for member in hint)
            raise ArgumentsInvalid(f"{name}: {value!r} is not one of {choices}") from None
    if hint is date:
        if isinstance(value, str):
            try:
                return date.fromisoformat(value)
            except ValueError:
                pass
        raise ArgumentsInvalid(f"{name}: a date as YYYY-MM-DD, not {value!r}")
    if hint is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    # bool is an int in Python, not in JSON: true is no job id.
    if isinstance(value, hint) and not (hint is int and isinstance(value, bool)):
        return value
    raise ArgumentsInvalid(f"{name}: a JSON {JSON_TYPES[hint]}, not {json.dumps(value)}")


def bind(function: Callable[..., Any], arguments: str) -> dict[str, Any]:
    """The keyword arguments for ``function`` from the model's JSON text; ``ArgumentsInvalid``
    says what is wrong (not JSON, an unknown or missing name, a wrong type)."""
    try:
        given = json.loads(arguments) if arguments.strip() else {}
    except ValueError as exc:
        raise ArgumentsInvalid(f"the arguments are not JSON: {exc}") from None
    if not isinstance(given, dict):
        raise ArgumentsInvalid("the arguments must be a JSON object")
    parameters = _parameters(function)
    unknown = sorted(set(given) - set(parameters))
    if unknown:
        raise ArgumentsInvalid(
            f"unknown argument {', '.join(unknown)}; it takes {', '.join(parameters) or 'none'}"
        )
    hints = typing.get_type_hints(function, include_extras=True)
    kwargs: dict[str, Any] = {}
    for name, parameter in parameters.items():
        if name not in given:
            if parameter.default is inspect.Parameter.empty:
                raise ArgumentsInvalid(f"{name}: required")
            continue
        hint, _, nullable = _unwrap(hints[name])
        kwargs[name] = _convert(name, given[name], hint, nullable)
    return kwargs
