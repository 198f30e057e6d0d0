"""What keeps a request cheap without changing what it does: serializers whose fields are
bound once and whose input skips DRF's per-field bookkeeping, a new row's column values
without Django's call chain for plain values, and the database health check skipped on a
connection in steady use."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.db import connection, connections
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from rest_framework import serializers

from gpuadmin import api
from gpuadmin.audit import services as audit_services
from gpuadmin.audit.models import AuditEvent
from gpuadmin.postgres import base
from scheduling.jobs.api.serializers import JobSubmitSerializer
from scheduling.models import Job, JobState


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
    assert_validates_as_drf(body)
    assert Plain(data=body).fields is not Plain(data=body).fields


class Plain(JobSubmitSerializer):
    """DRF's own: fields bound to each instance, its own loop over them."""

    fields = serializers.Serializer.fields
    to_internal_value = serializers.Serializer.to_internal_value


def assert_validates_as_drf(body: Any) -> None:
    ours, theirs = JobSubmitSerializer(data=body), Plain(data=body)
    assert ours.is_valid() == theirs.is_valid()
    assert ours.errors == theirs.errors
    if not ours.errors:
        assert ours.validated_data == theirs.validated_data


SUBMIT_FIELDS = list(JobSubmitSerializer().fields)
VALUES = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**64), max_value=2**64),
    st.sampled_from([0, 1, 2, 8, 100, 65535, 2**31]),
    st.text(max_size=12),
    st.sampled_from(["", " ", "true", "high", "any", "a100", "1g.10gb", "afterok:1", "0-3%2"]),
    st.lists(st.text(max_size=5), max_size=3),
    st.dictionaries(st.text(max_size=5), st.one_of(st.text(max_size=5), st.integers()), max_size=3),
    st.floats(allow_nan=False),
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.dictionaries(st.sampled_from([*SUBMIT_FIELDS, "unknown"]), VALUES, max_size=8))
def test_any_submission_validates_as_with_drfs_own_loop(body):
    assert_validates_as_drf({"command": "true", **body})
    assert_validates_as_drf(body)  # the command absent: required


@pytest.mark.parametrize("body", [[], "text", 3, None, [{"command": "true"}]])
def test_input_that_is_not_an_object_is_refused_as_drf_refuses_it(body):
    assert_validates_as_drf(body)
    serializer = JobSubmitSerializer(data=body)
    assert not serializer.is_valid() and "non_field_errors" in serializer.errors


def test_an_absent_field_is_skipped_defaulted_or_required_as_declared():
    serializer = JobSubmitSerializer(data={"command": "true", "pool": ""})
    assert serializer.is_valid(), serializer.errors
    data = serializer.validated_data
    assert data["gpu_count"] == 1 and data["hold"] is False  # defaults
    assert "name" not in data and "reservation" not in data  # optional, no default: absent
    assert data["pool"] is None  # validate_pool ran
    assert JobSubmitSerializer(data={}).is_valid() is False


def test_a_field_with_a_source_of_its_own_takes_drfs_loop():
    class Renamed(api.SharedFieldsSerializer):
        title = serializers.CharField(source="name")

    serializer = Renamed(data={"title": "a"})
    assert serializer.is_valid() and serializer.validated_data == {"name": "a"}
    assert Renamed._input_plan is None


@pytest.mark.django_db
def test_a_row_written_with_its_audit_row_is_the_row_django_writes(monkeypatch):
    moment = datetime(2026, 11, 25, 9, 0, 0, 123456, tzinfo=UTC)
    monkeypatch.setattr("django.utils.timezone.now", lambda: moment)
    owner = User.objects.create_user("rowcheck")
    fields: dict[str, Any] = {
        "owner": owner,
        "command": ["python", "x.py", 'it\'s "quoted"', "ünï"],
        "name": "n",
        "use_shell": True,
        "env": {"A": "1", "B": ""},
        "gpu_count": 2,
        "max_runtime_s": None,
        "estimated_duration_s": 60,
        "exit_code": -9,
        "placement": {"nodes": {"a": [0, 1]}, "score": [1.5]},
        "scheduled_at": moment,
        "state": JobState.QUEUED,
    }
    ours = Job(**fields)
    audit_services.create_recorded(ours, "job.submitted", actor=owner, after={})
    djangos = Job.objects.create(**fields)
    stored = {
        row["id"]: {k: v for k, v in row.items() if k != "id"} for row in Job.objects.values()
    }
    assert stored[ours.pk] == stored[djangos.pk]
    assert stored[ours.pk]["submitted_at"] == moment == ours.submitted_at
    assert stored[ours.pk]["command"] == fields["command"] and stored[ours.pk]["pool_id"] is None
    event = AuditEvent.objects.get(event_type="job.submitted")
    assert (event.target_id, event.actor_id) == (str(ours.pk), owner.pk)


@pytest.mark.django_db
def test_a_jobs_row_and_audit_row_are_one_statement_psycopg_parses_once():
    """A submission's statement leaves its NULL columns out: within psycopg's limits for
    caching its parsing of a statement (at most 50 parameters), where all of a job's 53
    columns were not."""
    from psycopg._queries import MAX_CACHED_STATEMENT_LENGTH, MAX_CACHED_STATEMENT_PARAMS

    owner = User.objects.create_user("parsed")
    sent: list[tuple[str, int]] = []

    def record(execute, sql, params, many, context):  # noqa: ANN001, ANN202
        sent.append((sql, len(params)))
        return execute(sql, params, many, context)

    for name in ("a", "b"):
        job = Job(owner=owner, command=["python", "x.py"], name=name, state=JobState.QUEUED)
        with connection.execute_wrapper(record):
            audit_services.create_recorded(job, "job.submitted", actor=owner, after={})
    (first_sql, parameters), (second_sql, _) = sent
    assert first_sql == second_sql  # one text: prepared once
    assert parameters <= MAX_CACHED_STATEMENT_PARAMS
    assert len(first_sql.encode()) <= MAX_CACHED_STATEMENT_LENGTH
    stored = Job.objects.get(pk=job.pk)
    assert (stored.pool_id, stored.started_at, stored.array_index) == (None, None, None)


@pytest.fixture
def wrapper(db):
    """A connection of its own, outside the test's transaction."""
    connection = connections.create_connection("default")
    connection.ensure_connection()
    yield connection
    connection.close()


def counting(checks: list[int], usable: bool) -> Callable[[], bool]:
    """An ``is_usable`` that counts its calls in ``checks``."""

    def is_usable() -> bool:
        checks.append(1)
        return usable

    return is_usable


def test_a_connection_back_within_fresh_s_is_not_checked(wrapper, monkeypatch):
    checks: list[int] = []
    monkeypatch.setattr(wrapper, "is_usable", counting(checks, True))
    wrapper.close_if_unusable_or_obsolete()  # the end of a request
    wrapper.close_if_unusable_or_obsolete()  # the start of the next, at once
    wrapper.close_if_health_check_failed()
    assert checks == [] and wrapper.health_check_done


def test_an_idle_connection_is_checked(wrapper, monkeypatch):
    checks: list[int] = []
    monkeypatch.setattr(wrapper, "is_usable", counting(checks, True))
    wrapper.close_if_unusable_or_obsolete()
    wrapper._recycled_at -= base.FRESH_S  # idle since
    wrapper.close_if_unusable_or_obsolete()
    wrapper.close_if_health_check_failed()
    assert checks == [1]


def test_a_connection_that_saw_an_error_is_checked_at_once(wrapper, monkeypatch):
    checks: list[int] = []
    monkeypatch.setattr(wrapper, "is_usable", counting(checks, False))
    wrapper.errors_occurred = True
    wrapper.close_if_unusable_or_obsolete()
    assert checks == [1] and wrapper.connection is None


@pytest.mark.django_db
def test_a_new_rows_column_values_are_djangos(monkeypatch):
    moment = datetime(2026, 11, 25, 9, 0, tzinfo=UTC)
    monkeypatch.setattr("django.utils.timezone.now", lambda: moment)
    job = Job(
        owner_id=7,
        command=["python", "x.py"],
        name="n",
        use_shell=True,
        env={"A": "1"},
        gpu_count=2,
        estimated_duration_s=60,
        exit_code=-9,
        placement={"nodes": {}},
        scheduled_at=moment,
    )
    job.min_gpu_memory_mib = "512"  # not an int: Django's own path makes it one
    job.borrowed = 1  # type: ignore[assignment]  # not a bool: the same
    columns = audit_services._columns(Job)
    djangos = [f.get_db_prep_save(f.pre_save(job, add=True), connection) for f in columns]
    ours = audit_services._db_values(job, connection)

    def typed(values: list[Any]) -> list[tuple[type, Any]]:
        return [(type(v), getattr(v, "obj", v)) for v in values]  # psycopg's Jsonb wraps obj

    assert typed(ours) == typed(djangos)
    assert {type(v).__name__ for v in ours} >= {"Int2", "Int4", "bool", "str", "NoneType"}


@pytest.mark.django_db
def test_messages_are_set_up_for_pages_and_left_alone_by_api_requests(client):
    from django.contrib.messages import constants
    from django.contrib.messages.storage.base import Message
    from django.contrib.messages.storage.cookie import CookieStorage
    from django.test import RequestFactory

    client.force_login(User.objects.create_user("mia"))
    pending = CookieStorage(RequestFactory().get("/"))
    client.cookies[pending.cookie_name] = pending._encode([Message(constants.INFO, "Saved.")])

    answer = client.get("/api/v1/jobs/")
    assert answer.status_code == 200
    assert not hasattr(answer.wsgi_request, "_messages")  # no storage built for it
    assert pending.cookie_name not in answer.cookies  # the pending message left as it was
    page = client.get("/")
    assert hasattr(page.wsgi_request, "_messages")
    assert '<li class="message info">Saved.</li>' in page.content.decode()
    assert page.cookies[pending.cookie_name].value == ""  # shown once, then cleared
