"""What every app's API shares."""

from __future__ import annotations

import functools
import logging
import re
import sys
from datetime import datetime
from typing import Any, ClassVar

from django.core.exceptions import ImproperlyConfigured, RequestDataTooBig, SuspiciousOperation
from django.core.exceptions import ValidationError as DjangoValidationError
from django.db import InterfaceError, OperationalError
from django.forms.utils import from_current_timezone
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import render
from django.template import loader
from django.urls import URLResolver, get_resolver
from django.utils import timezone
from django.views import defaults
from django.views.decorators.csrf import requires_csrf_token
from drf_spectacular import openapi
from drf_spectacular.extensions import OpenApiSerializerExtension
from rest_framework import serializers, views
from rest_framework.exceptions import (
    APIException,
    NotFound,
    ParseError,
    PermissionDenied,
    ValidationError,
)
from rest_framework.fields import Field, SkipField, empty
from rest_framework.pagination import LimitOffsetPagination
from rest_framework.permissions import AllowAny
from rest_framework.response import Response
from rest_framework.settings import api_settings
from rest_framework.utils.serializer_helpers import BindingDict

from gpuadmin.parsers import RequestTooLarge
from gpuadmin.refusals import FieldRefusal
from gpuadmin.text import is_api_view


class LocalDateTimeField(serializers.DateTimeField):
    """A time; one without an offset is read in the site's time zone as the pages' forms read
    it: a time the clock skips or repeats there (a daylight-saving change) is refused, not
    guessed."""

    def enforce_timezone(self, value: datetime) -> datetime:
        if timezone.is_naive(value):
            try:
                value = from_current_timezone(value)
            except DjangoValidationError as exc:
                raise ValidationError(exc.messages) from None
        return super().enforce_timezone(value)


class Pagination(LimitOffsetPagination):
    """``?limit=`` (default 100, at most 1,000) and ``?offset=`` on every list endpoint."""

    default_limit = 100
    max_limit = 1000


# The attributes through which DRF fields own a bound sub-field (ListField, DictField,
# ListSerializer, ManyRelatedField).
CHILD_ATTRIBUTES = ("child", "child_relation")


def unbound_copy(field: Field) -> Field:
    """A copy of an unbound ``field`` that can be bound to a new parent: shallow (the field's
    validators, choices and messages are never mutated after ``__init__``), with any sub-field
    copied too and re-parented to the copy, so nothing reachable through ``parent`` is shared."""
    duplicate = object.__new__(type(field))  # copy.copy() without its __reduce_ex__ detour
    duplicate.__dict__.update(field.__dict__)
    for attribute in CHILD_ATTRIBUTES:
        child = getattr(field, attribute, None)
        if isinstance(child, Field):
            # The child was bound in its owner's __init__: its name and source stay the same.
            child_copy = unbound_copy(child)
            # A sub-field's parent is its owning field (the stubs allow only serializers).
            child_copy.parent = duplicate  # type: ignore[assignment]
            setattr(duplicate, attribute, child_copy)
    return duplicate


class PrototypeFieldsMixin:
    """Builds a serializer class's fields once and gives each instance copies of them.

    DRF rebuilds every field on every instantiation (a ``ModelSerializer`` introspects its model
    again; a plain one deep-copies its declared fields, each copy re-running ``__init__``): about
    half a millisecond per job body, a quarter of a submission's CPU. The prototypes are never
    bound; an instance binds its own copies as usual. Only for serializers whose fields do not
    depend on the instance (no ``get_fields`` override reading ``context`` or ``instance``).
    """

    _prototype_fields: ClassVar[dict[str, Field]]

    def get_fields(self) -> dict[str, Field]:
        cls = type(self)
        prototypes = cls.__dict__.get("_prototype_fields")
        if prototypes is None:  # two threads may both build them: the same fields either way
            prototypes = super().get_fields()  # type: ignore[misc]
            cls._prototype_fields = prototypes
        return {name: unbound_copy(field) for name, field in prototypes.items()}


class Serializer(PrototypeFieldsMixin, serializers.Serializer):
    """``serializers.Serializer`` with fields built once per class."""


class ModelSerializer(PrototypeFieldsMixin, serializers.ModelSerializer):
    """``serializers.ModelSerializer`` with fields built once per class."""


class NoContext(dict[str, Any]):
    """The context of a ``SharedFieldsSerializer``'s fields: any use of it is an error."""

    def __missing__(self, key: str) -> Any:
        raise ImproperlyConfigured(
            f"a SharedFieldsSerializer's fields have no context (asked for {key!r}): make "
            "the serializer an api.Serializer"
        )

    def get(self, key: str, default: Any = None) -> Any:
        return self[key]


# What a field's absence means in ``SharedFieldsSerializer._plan``: an error (else its default,
# or ``empty``: skipped).
REQUIRED = object()
# get_value() implementations that read ``data.get(field_name, empty)`` from a JSON object (they
# differ only for HTML form input and partial updates).
PLAIN_GET_VALUE = frozenset(
    {Field.get_value, serializers.ListField.get_value, serializers.DictField.get_value}
)
InputField = tuple[str, Field, Any, str | None]


class SharedFieldsSerializer(Serializer):
    """A ``Serializer`` whose fields are bound once per class and shared by its instances.

    Even as copies of prototypes, binding fields to each instance is half the cost of
    validating a job submission. Sharing them is safe for serializers whose fields read nothing
    from the serializer they are bound to: not its ``context`` (an error here: ``NoContext``),
    its instance or validators needing either; and never ``partial`` (refused). Not for nesting
    in another serializer. The serializer's own methods (``validate_<field>``, ``create``,
    ``to_representation``) are the instance's as usual."""

    _shared_fields: ClassVar[BindingDict]

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        if kwargs.get("partial"):
            raise ImproperlyConfigured(f"{type(self).__name__} cannot validate partially")
        super().__init__(*args, **kwargs)

    _input_plan: ClassVar[list[InputField] | None]

    @property
    def fields(self) -> BindingDict:
        cls = type(self)
        shared = cls.__dict__.get("_shared_fields")
        if shared is None:  # two threads may both bind them: equal fields either way
            owner = serializers.Serializer.__new__(cls)
            serializers.Serializer.__init__(owner, context=NoContext())
            shared = BindingDict(owner)
            for name, field in self.get_fields().items():
                shared[name] = field
            cls._shared_fields = shared
        return shared

    def to_internal_value(self, data: Any) -> dict[str, Any]:
        """DRF's ``Serializer.to_internal_value`` without its per-field bookkeeping: the same
        field validation (each given field's ``run_validation`` and ``validate_<name>``), with
        an absent field's outcome (skipped, its default, or required) decided once per class.
        Any error, or input that is not a JSON object, goes through DRF's own loop again,
        which collects every field's errors as usual (so ``validate_<name>`` methods must be
        free of side effects, as they are when DRF validates twice). Absent fields and DRF's
        bookkeeping were two thirds of validating a job submission."""
        plan = self._plan()
        if plan is None or type(data) is not dict:
            return super().to_internal_value(data)
        validated: dict[str, Any] = {}
        for name, field, default, validate in plan:
            value = data.get(name, empty)
            try:
                if value is not empty:
                    value = field.run_validation(value)
                elif default is REQUIRED:
                    return super().to_internal_value(data)  # "This field is required."
                elif default is empty:
                    continue  # DRF skips an absent optional field without a default
                else:
                    value = field.get_default()
                if validate is not None:
                    value = getattr(self, validate)(value)
            except SkipField:
                continue
            except (ValidationError, DjangoValidationError):
                return super().to_internal_value(data)
            validated[name] = value
        return validated

    def _plan(self) -> list[InputField] | None:
        """Per writable field: (name, field, what its absence means, ``validate_<name>``);
        None when a field's value is not simply ``data[name]`` stored as ``name`` (a
        ``source``, or a ``get_value`` of its own), which only DRF's loop handles."""
        cls = type(self)
        if "_input_plan" in cls.__dict__:
            return cls._input_plan
        plan: list[InputField] = []
        for name, field in self.fields.items():
            if field.read_only:
                continue
            if field.source_attrs != [name] or type(field).get_value not in PLAIN_GET_VALUE:
                cls._input_plan = None
                return None
            absent = REQUIRED if field.required else field.default  # `empty`: skipped
            validate = f"validate_{name}" if hasattr(self, f"validate_{name}") else None
            plan.append((name, field, absent, validate))
        cls._input_plan = plan
        return plan


# --------------------------------------------------------------------------- preferences

# RFC 7240's answer to ``Prefer: return=minimal``: the server says it applied the preference.
MINIMAL_APPLIED = {"Preference-Applied": "return=minimal"}


def prefers_minimal(request: HttpRequest) -> bool:
    """Whether the request carries RFC 7240's ``Prefer: return=minimal``: answer a write with
    what the client cannot know (a new job's id, state and time), not the whole object."""
    preferences = request.headers.get("Prefer", "")
    return any(
        preference.split(";")[0].replace(" ", "").lower() == "return=minimal"
        for preference in preferences.split(",")
    )


IDEMPOTENCY_KEY = "Idempotency-Key"


def idempotency_key(request: HttpRequest) -> str:
    """The request's ``Idempotency-Key`` header (draft-ietf-httpapi-idempotency-key-header):
    a Structured Field string, ``"a-uuid"``, whose quotes are taken off (and its ``\\"`` and
    ``\\\\`` escapes undone); a bare token is taken as it is. ``""`` when absent."""
    value = request.headers.get(IDEMPOTENCY_KEY, "").strip()
    if len(value) >= 2 and value[0] == value[-1] == '"':
        value = re.sub(r"\\(.)", r"\1", value[1:-1])
    return value


# --------------------------------------------------------------------------- errors
#
# One error format for every API 4xx: ``{"<field>": ["message", ...]}`` for bad input (a field
# with parts, such as ``env``, nests the same shape per part), ``{"detail": "..."}`` for the
# rest. DRF's own exceptions already answer so; ``exception_handler`` folds in the two other
# shapes DRF can produce (a bare list, ``non_field_errors``) and Django's too-large body.


def error_body(data: Any) -> Any:
    """A ``ValidationError``'s body in the one format: non-field messages under ``detail``."""
    if isinstance(data, list):
        return {"detail": " ".join(str(message) for message in data)}
    if isinstance(data, dict) and api_settings.NON_FIELD_ERRORS_KEY in data:
        messages = data.pop(api_settings.NON_FIELD_ERRORS_KEY)
        data = {"detail": " ".join(str(message) for message in messages), **data}
    return data


class Conflict(APIException):
    """A 409: the request is well formed but the object's current state does not allow it
    (a job's or a GPU's state machine refused)."""

    status_code = 409
    default_detail = "The request conflicts with the object's current state."
    default_code = "conflict"


class DatabaseUnavailable(APIException):
    status_code = 503
    default_detail = "The database cannot be reached right now; retry shortly."
    default_code = "database_unavailable"
    retry_after_s = 5


def exception_handler(exc: Exception, context: dict[str, Any]) -> Response | None:
    """DRF's handler (headers such as ``Retry-After`` kept), with Django's refusals of a body
    (too large: 413; too many fields or files, a malformed multipart form: 400), a database
    that cannot be reached (503 with ``Retry-After``: a restart is not a server bug, and its
    transaction was rolled back), a service's refusal of bad input (``FieldRefusal``: a 400
    naming its field) and every 400 in the one error format."""
    if isinstance(exc, FieldRefusal):
        exc = ValidationError({exc.field: [exc.message]})
    if isinstance(exc, SuspiciousOperation):
        # Logged as Django logs the ones it answers itself.
        logging.getLogger(f"django.security.{type(exc).__name__}").warning("%s", exc)
        exc = RequestTooLarge() if isinstance(exc, RequestDataTooBig) else ParseError(str(exc))
    if isinstance(exc, OperationalError | InterfaceError):
        logging.getLogger("gpuadmin.api").error("database unavailable: %s", exc)
        exc = DatabaseUnavailable()
    response = views.exception_handler(exc, context)
    if response is not None and isinstance(exc, ValidationError):
        response.data = error_body(response.data)
    if response is not None and isinstance(exc, DatabaseUnavailable):
        response["Retry-After"] = str(DatabaseUnavailable.retry_after_s)
    return response


class ErrorSerializer(Serializer):
    """Every 4xx but bad input."""

    detail = serializers.CharField()


class ValidationErrorSerializer(Serializer):
    """A 400: the messages of each field named (a field with parts nests the same shape per
    part), ``detail`` for what concerns no one field. Its schema is ``ValidationErrorSchema``'s."""


class ValidationErrorSchema(OpenApiSerializerExtension):
    target_class = ValidationErrorSerializer

    def map_serializer(self, auto_schema: Any, direction: Any) -> dict[str, Any]:
        messages = {"type": "array", "items": {"type": "string"}}
        return {
            "type": "object",
            "description": "Field name -> messages; `detail` for the rest.",
            "properties": {"detail": {"type": "string"}},
            "additionalProperties": {"oneOf": [messages, {"type": "object"}]},
            "example": {"gpu_count": ["Ensure this value is less than or equal to 64."]},
        }


# Status -> (body, description) of the errors an operation answers without saying so itself.
ERRORS: dict[str, tuple[type[Serializer], str]] = {
    "400": (ValidationErrorSerializer, "Bad input: each field named (`detail` for the rest)."),
    "401": (ErrorSerializer, "Not signed in."),
    "403": (ErrorSerializer, "Not allowed."),
    "404": (ErrorSerializer, "No such object (or not one you may see)."),
    "413": (ErrorSerializer, "The body is larger than DATA_UPLOAD_MAX_MEMORY_SIZE."),
}


class AutoSchema(openapi.AutoSchema):
    """drf-spectacular's, with the errors every operation can answer, in the one format: 400
    (any query parameter or body can be refused), 401 and 403 (all but public views), 404 for a
    path naming an object, 413 for a body. An operation's own ``responses`` win."""

    def _get_response_bodies(self, direction: Any = "response") -> dict[str, Any]:
        responses = super()._get_response_bodies(direction)
        codes = ["400"]
        if not all(isinstance(p, AllowAny) for p in self.view.get_permissions()):
            codes += ["401", "403"]
        if "{" in self.path:
            codes.append("404")
        if self.method in ("POST", "PUT", "PATCH"):
            codes.append("413")
        for code in codes:
            if code not in responses:
                body, description = ERRORS[code]
                response = self._get_response_for_code(body, code, direction=direction)
                responses[code] = {**response, "description": description}
        return responses


@functools.cache
def api_prefixes() -> frozenset[str]:
    """The first path segments of the API's routes (those whose views are DRF's)."""
    prefixes: set[str] = set()

    def walk(patterns: list[Any], prefix: str) -> None:
        for pattern in patterns:
            route = prefix + str(pattern.pattern).lstrip("^")
            if isinstance(pattern, URLResolver):
                walk(pattern.url_patterns, route)
            elif is_api_view(pattern.callback):
                prefixes.add(route.split("/")[0])

    walk(get_resolver().url_patterns, "")
    return frozenset(prefixes)


def is_api_path(request: HttpRequest) -> bool:
    """Whether ``request`` is for one of the API's paths, whose errors are JSON."""
    return request.path.lstrip("/").split("/")[0] in api_prefixes()


def _reason(exception: Exception) -> str:
    """The message a 403 or 404 was raised with (``PermissionDenied("This needs ...")``); ''
    when it has none, as for a URL that no route takes."""
    message = exception.args[0] if exception.args else ""
    return message if isinstance(message, str) else ""


@requires_csrf_token
def not_found(request: HttpRequest, exception: Exception) -> HttpResponse:
    """``handler404``: a URL that no route takes is ``{"detail": "Not found."}`` under the
    API's paths (e.g. ``/queue/abc``), the site's page (``404.html``) elsewhere."""
    if is_api_path(request):
        return JsonResponse({"detail": NotFound.default_detail}, status=404)
    return render(request, "404.html", {"reason": _reason(exception)}, status=404)


@requires_csrf_token
def permission_denied(request: HttpRequest, exception: Exception) -> HttpResponse:
    """``handler403``: JSON under the API's paths, the site's page (``403.html``) saying why
    elsewhere."""
    reason = _reason(exception)
    if is_api_path(request):
        return JsonResponse({"detail": reason or PermissionDenied.default_detail}, status=403)
    return render(request, "403.html", {"reason": reason}, status=403)


def server_error(request: HttpRequest) -> HttpResponse:
    """``handler500``: JSON under the API's paths, ``500.html`` elsewhere, rendered without
    the request's context (no context processor runs), so that it shows while the database
    is down. A database that cannot be reached (the exception being handled: Django calls
    this inside its ``except``) is a 503 with ``Retry-After`` instead, as the API's views
    answer it (``exception_handler``): pages and middleware reach it through here."""
    if isinstance(sys.exc_info()[1], OperationalError | InterfaceError):
        logging.getLogger("gpuadmin.api").error("database unavailable: %s", sys.exc_info()[1])
        if is_api_path(request):
            response: HttpResponse = JsonResponse(
                {"detail": DatabaseUnavailable.default_detail}, status=503
            )
        else:
            response = HttpResponse(loader.get_template("503.html").render(), status=503)
        response["Retry-After"] = str(DatabaseUnavailable.retry_after_s)
        return response
    if is_api_path(request):
        return JsonResponse({"detail": APIException.default_detail}, status=500)
    return defaults.server_error(request)
