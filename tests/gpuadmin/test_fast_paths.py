"""What keeps a request cheap without changing what it does: serializers whose fields are
bound once, and the database health check skipped on a connection in steady use."""

from __future__ import annotations

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.db import connections
from rest_framework import serializers

from gpuadmin import api
from gpuadmin.postgres import base
from scheduling.api.serializers import JobSubmitSerializer


class Point(api.SharedFieldsSerializer):
    x = serializers.IntegerField(min_value=0)
    name = serializers.CharField(required=False)


class NeedsRequest(serializers.CharField):
    def to_internal_value(self, data: object) -> str:
        return f"{data} by {self.context['request']}"


class Signed(api.SharedFieldsSerializer):
    text = NeedsRequest()


def test_shared_fields_are_bound_once_and_validate_each_instance_apart():
    good, bad = Point(data={"x": 1, "name": "a"}), Point(data={"x": -1})
    assert good.fields is bad.fields
    assert good.is_valid() and good.validated_data == {"x": 1, "name": "a"}
    assert not bad.is_valid() and list(bad.errors) == ["x"]
    assert good.errors == {}


@pytest.mark.parametrize(
    "body",
    [
        {"command": ["python", "train.py"], "gpu_count": 2, "env": {"A": "1"}, "pool": ""},
        {"command": 3, "gpu_count": 0, "env": {"A": 1}, "array": 5, "priority": "urgent"},
        {"name": "x" * 201, "dependency": {"kind": "afterok"}, "mps_percent": 101},
        {"command": "true", "use_shell": "maybe", "hold": None, "max_retries": "2"},
    ],
)
def test_job_submissions_validate_as_with_drfs_own_fields(body):
    class Plain(JobSubmitSerializer):
        fields = serializers.Serializer.fields  # DRF's: bound to each instance

    ours, theirs = JobSubmitSerializer(data=body), Plain(data=body)
    assert ours.is_valid() == theirs.is_valid()
    assert ours.errors == theirs.errors
    if not ours.errors:
        assert ours.validated_data == theirs.validated_data
    assert theirs.fields is not Plain(data=body).fields


def test_a_shared_field_cannot_read_a_context():
    with pytest.raises(ImproperlyConfigured, match="no context"):
        Signed(data={"text": "hi"}, context={"request": "alice"}).is_valid()


def test_a_shared_fields_serializer_is_never_partial():
    with pytest.raises(ImproperlyConfigured, match="partially"):
        Point(data={}, partial=True)


@pytest.fixture
def wrapper(db):
    """A connection of its own, outside the test's transaction."""
    connection = connections.create_connection("default")
    connection.ensure_connection()
    yield connection
    connection.close()


def test_a_connection_back_within_fresh_s_is_not_checked(wrapper, monkeypatch):
    checks = []
    monkeypatch.setattr(wrapper, "is_usable", lambda: checks.append(1) or True)
    wrapper.close_if_unusable_or_obsolete()  # the end of a request
    wrapper.close_if_unusable_or_obsolete()  # the start of the next, at once
    wrapper.close_if_health_check_failed()
    assert checks == [] and wrapper.health_check_done


def test_an_idle_connection_is_checked(wrapper, monkeypatch):
    checks = []
    monkeypatch.setattr(wrapper, "is_usable", lambda: checks.append(1) or True)
    wrapper.close_if_unusable_or_obsolete()
    wrapper._recycled_at -= base.FRESH_S  # idle since
    wrapper.close_if_unusable_or_obsolete()
    wrapper.close_if_health_check_failed()
    assert checks == [1]


def test_a_connection_that_saw_an_error_is_checked_at_once(wrapper, monkeypatch):
    checks = []
    monkeypatch.setattr(wrapper, "is_usable", lambda: checks.append(1) or False)
    wrapper.errors_occurred = True
    wrapper.close_if_unusable_or_obsolete()
    assert checks == [1] and wrapper.connection is None
