"""The API's body parsers: bounded in size, depth and text (DRF's settings import them, so
this module must not import ``rest_framework.views``)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import IO, TYPE_CHECKING, Any

from django.conf import settings
from django.http import QueryDict
from rest_framework import parsers, status
from rest_framework.exceptions import APIException, ParseError, ValidationError
from rest_framework.utils import json

from gpuadmin.text import unstorable

if TYPE_CHECKING:
    from django.http.request import _ImmutableQueryDict

MAX_JSON_DEPTH = 32


class RequestTooLarge(APIException):
    status_code = status.HTTP_413_REQUEST_ENTITY_TOO_LARGE
    default_code = "request_too_large"

    def __init__(self) -> None:
        limit = settings.DATA_UPLOAD_MAX_MEMORY_SIZE
        super().__init__(f"The request body is larger than the limit of {limit} bytes.")


def read_body(stream: IO[bytes]) -> bytes:
    """The body, read up to ``DATA_UPLOAD_MAX_MEMORY_SIZE`` bytes: ``RequestTooLarge`` beyond
    (DRF's own parsers read it whole, unlike Django's form parsing)."""
    limit = settings.DATA_UPLOAD_MAX_MEMORY_SIZE
    if limit is None:
        return stream.read()
    raw = stream.read(limit + 1)
    if len(raw) > limit:
        raise RequestTooLarge()
    return raw


def encoding(parser_context: Mapping[str, Any] | None) -> str:
    """The body's character set, as DRF's parsers choose it."""
    return (parser_context or {}).get("encoding") or settings.DEFAULT_CHARSET


class FormParser(parsers.FormParser):
    """DRF's, reading at most ``DATA_UPLOAD_MAX_MEMORY_SIZE`` bytes (more is a 413), refusing
    text PostgreSQL cannot store (a 400 naming the field)."""

    def parse(
        self,
        stream: IO[Any],
        media_type: str | None = None,
        parser_context: Mapping[str, Any] | None = None,
    ) -> _ImmutableQueryDict:
        data = QueryDict(read_body(stream), encoding=encoding(parser_context))
        check_form(data)
        return data


class MultiPartParser(parsers.MultiPartParser):
    """DRF's, refusing field text PostgreSQL cannot store (a 400 naming the field)."""

    def parse(
        self,
        stream: IO[Any],
        media_type: str | None = None,
        parser_context: Mapping[str, Any] | None = None,
    ) -> parsers.DataAndFiles:
        parsed = super().parse(stream, media_type, parser_context)
        check_form(parsed.data)
        return parsed


def check_form(data: QueryDict) -> None:
    """``check_json``'s text rule for a form: every name and value as a JSON object's."""
    check_json({name: data.getlist(name) for name in data})


class JSONParser(parsers.JSONParser):
    """DRF's, reading at most ``DATA_UPLOAD_MAX_MEMORY_SIZE`` bytes (more is a 413), refusing
    nesting deeper than ``MAX_JSON_DEPTH`` and text PostgreSQL cannot store (a 400 naming the
    top-level field)."""

    def parse(
        self,
        stream: IO[Any],
        media_type: str | None = None,
        parser_context: Mapping[str, Any] | None = None,
    ) -> Any:
        raw = read_body(stream)
        parse_constant = json.strict_constant if self.strict else None
        try:
            data = json.loads(raw.decode(encoding(parser_context)), parse_constant=parse_constant)
        except RecursionError:
            raise ParseError(f"JSON nested deeper than {MAX_JSON_DEPTH} levels.") from None
        except ValueError as exc:
            raise ParseError(f"JSON parse error - {exc}") from None
        check_json(data)
        return data


def check_json(data: Any) -> None:
    """``ParseError`` for nesting deeper than ``MAX_JSON_DEPTH``; a ``ValidationError`` naming
    the top-level field for a string (or key) PostgreSQL cannot store. Iterative: any depth."""
    top = data.items() if isinstance(data, dict) else [("detail", data)]
    for field, value in top:
        stack: list[tuple[Any, int]] = [(field, 0), (value, 1)]
        while stack:
            item, depth = stack.pop()
            if depth > MAX_JSON_DEPTH:
                raise ParseError(f"JSON nested deeper than {MAX_JSON_DEPTH} levels.")
            if isinstance(item, str):
                problem = unstorable(item)
                if problem is not None:
                    if field == "detail" or unstorable(field):
                        raise ValidationError(problem)
                    raise ValidationError({field: [problem]})
            elif isinstance(item, dict):
                stack.extend((part, depth + 1) for pair in item.items() for part in pair)
            elif isinstance(item, list):
                stack.extend((part, depth + 1) for part in item)
