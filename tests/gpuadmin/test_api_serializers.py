"""Serializers whose fields are built once per class (gpuadmin.api): each instance must still
own its fields, bound to it, and behave exactly as DRF's own rebuild-everything serializers."""

from __future__ import annotations

import threading
from typing import Any

import pytest
from rest_framework import serializers

from gpuadmin import api
from scheduling.jobs.api.serializers import JobSerializer
from scheduling.models import Job


class Part(api.Serializer):
    size = serializers.IntegerField(min_value=1)
    note = serializers.CharField(required=False)


class Reading(api.Serializer):
    """A method field that reads the context, a list field and a nested list of serializers."""

    viewer = serializers.SerializerMethodField()
    tags = serializers.ListField(child=serializers.CharField(max_length=3))
    labels = serializers.DictField(child=serializers.IntegerField(min_value=0))
    parts = Part(many=True, required=False)

    def get_viewer(self, obj: Any) -> str:
        return self.context["viewer"]


def every_field(serializer: serializers.Serializer) -> list[serializers.Field]:
    """The serializer's fields and, recursively, the sub-fields they own."""
    found = []
    for field in serializer.fields.values():
        found.append(field)
        child = getattr(field, "child", None)
        if isinstance(child, serializers.Serializer):
            found += [child, *every_field(child)]
        elif isinstance(child, serializers.Field):
            found.append(child)
    return found


def test_each_instance_owns_its_fields_and_subfields_bound_to_it() -> None:
    first, second = Reading(context={"viewer": "a"}), Reading(context={"viewer": "b"})
    first_fields, second_fields = every_field(first), every_field(second)
    assert len(first_fields) == len(second_fields) > 4
    assert not {id(f) for f in first_fields} & {id(f) for f in second_fields}
    for field in first_fields:
        assert field.root is first
    for name, field in first.fields.items():
        assert field.parent is first and field.field_name == name
    assert first.fields["tags"].child.parent is first.fields["tags"]
    assert first.fields["parts"].child.parent is first.fields["parts"]
    # The prototypes themselves are never bound to anything.
    assert all(field.parent is None for field in Reading._prototype_fields.values())


def test_fields_are_built_once_per_class(monkeypatch: pytest.MonkeyPatch) -> None:
    Reading(context={}).fields  # noqa: B018 - make sure the prototypes exist
    built = []
    original = serializers.Serializer.get_fields
    monkeypatch.setattr(
        serializers.Serializer, "get_fields", lambda self: built.append(self) or original(self)
    )
    for _ in range(3):
        assert set(Reading(context={}).fields) == {"viewer", "tags", "labels", "parts"}
    assert built == []


def test_method_fields_read_their_own_instances_context_across_threads() -> None:
    """Serializers built in one order and rendered interleaved, in threads: each answers with
    its own context (a shared field would answer with whichever instance bound it last)."""
    readings = [Reading({"tags": [], "labels": {}}, context={"viewer": str(n)}) for n in range(8)]
    answers: dict[int, str] = {}
    start = threading.Barrier(len(readings))

    def render(number: int) -> None:
        start.wait()
        answers[number] = readings[number].data["viewer"]

    threads = [threading.Thread(target=render, args=(n,)) for n in range(len(readings))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert answers == {n: str(n) for n in range(len(readings))}


def test_validation_errors_match_drf_and_name_the_nested_field() -> None:
    bad = {"tags": ["long tag"], "labels": {"a": -1}, "parts": [{"size": 0}]}

    class Plain(Reading):
        def get_fields(self) -> dict[str, serializers.Field]:
            return serializers.Serializer.get_fields(self)

    ours, theirs = Reading(data=bad, context={}), Plain(data=bad, context={})
    assert not ours.is_valid() and not theirs.is_valid()
    assert ours.errors == theirs.errors
    assert set(ours.errors) == {"tags", "labels", "parts"}
    assert "size" in ours.errors["parts"][0]


@pytest.mark.django_db
def test_job_bodies_match_drfs_model_serializer(django_user_model) -> None:
    """The job body built from prototypes is the one DRF's ModelSerializer builds itself."""
    owner = django_user_model.objects.create_user("ada")
    job = Job.objects.create(owner=owner, command=["python", "train.py"], env={"A": "1"})

    class Plain(JobSerializer):
        def get_fields(self) -> dict[str, serializers.Field]:
            return serializers.ModelSerializer.get_fields(self)

    request = type("Request", (), {"user": owner})()
    assert JobSerializer(job, context={"request": request}).data == (
        Plain(job, context={"request": request}).data
    )
