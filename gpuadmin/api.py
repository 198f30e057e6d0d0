"""What every app's API shares."""

from __future__ import annotations

from typing import ClassVar

from rest_framework import serializers
from rest_framework.fields import Field
from rest_framework.pagination import LimitOffsetPagination


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
