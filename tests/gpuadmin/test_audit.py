import datetime as dt
import decimal

import pytest
from django.contrib.auth import get_user_model
from django.db import IntegrityError, InternalError, ProgrammingError, connection, transaction
from django.test.utils import CaptureQueriesContext

from gpuadmin.audit.models import AuditEvent
from gpuadmin.audit.services import AuditOutsideTransaction, audit_event, record, record_all

pytestmark = pytest.mark.django_db


@pytest.fixture
def operator():
    return get_user_model().objects.create_user("ops", password="pw-123-xyz")


def test_record_writes_who_what_and_before_after(operator):
    with transaction.atomic():
        event = record(
            "gpu.state_changed",
            actor=operator,
            target=operator,
            before={"state": "idle", "since": dt.datetime(2026, 1, 2, 3, 4, 5, tzinfo=dt.UTC)},
            after={"state": "draining", "power_w": decimal.Decimal("312.5")},
            message="maintenance window",
        )
    stored = AuditEvent.objects.get(pk=event.pk)
    assert stored.event_type == "gpu.state_changed"
    assert stored.actor_id == operator.pk
    assert stored.actor_name == "ops"
    assert stored.target_type == "auth.user"
    assert stored.target_id == str(operator.pk)
    assert stored.object_repr == "ops"
    assert stored.before == {"state": "idle", "since": "2026-01-02T03:04:05Z"}
    assert stored.after == {"state": "draining", "power_w": "312.5"}


def test_background_actor_is_named():
    with transaction.atomic():
        event = record("placement.pass", actor_name="placement-loop", target_type="x", target_id=7)
    assert (event.actor, event.actor_name, event.target_id) == (None, "placement-loop", "7")


def test_record_needs_a_transaction_and_an_actor():
    # pytest-django wraps the test in an atomic block; leave it to test the guard.
    connection.in_atomic_block, saved = False, connection.in_atomic_block
    try:
        with pytest.raises(AuditOutsideTransaction, match="must run inside the transaction"):
            record("gpu.state_changed", actor_name="x")
    finally:
        connection.in_atomic_block = saved
    with transaction.atomic(), pytest.raises(ValueError, match="needs an actor"):
        record("gpu.state_changed")
    assert AuditEvent.objects.count() == 0


def test_rolled_back_change_leaves_no_audit_row(operator):
    with pytest.raises(IntegrityError), transaction.atomic():
        record("user.created", actor=operator, target=operator)
        get_user_model().objects.create_user("ops")  # duplicate username: the change fails
    assert AuditEvent.objects.count() == 0


def _one_event() -> AuditEvent:
    with transaction.atomic():
        return record("node.registered", actor_name="agent", target_type="inventory.node")


@pytest.mark.parametrize(
    "statement",
    [
        "UPDATE audit_auditevent SET actor_name = 'mallory'",
        "DELETE FROM audit_auditevent",
    ],
)
def test_database_refuses_update_and_delete(statement):
    event = _one_event()
    refused = pytest.raises((InternalError, ProgrammingError), match="audit log is append-only")
    with refused, transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(statement)
    assert AuditEvent.objects.get(pk=event.pk).actor_name == "agent"


def test_orm_update_and_delete_are_refused_too():
    event = _one_event()
    with pytest.raises(ProgrammingError, match="UPDATE refused"), transaction.atomic():
        AuditEvent.objects.filter(pk=event.pk).update(message="edited")
    with pytest.raises(ProgrammingError, match="DELETE refused"), transaction.atomic():
        event.delete()
    assert AuditEvent.objects.filter(pk=event.pk, message="").exists()


def test_deleting_a_user_keeps_their_audit_rows(operator):
    with transaction.atomic():
        record("job.submitted", actor=operator, target_type="scheduling.job", target_id=1)
    operator_id = operator.pk
    operator.delete()
    event = AuditEvent.objects.get()
    assert (event.actor_id, event.actor_name) == (operator_id, "ops")


def test_record_all_writes_many_rows_in_one_statement_inside_the_transaction(operator):
    events = [
        audit_event(
            "allocation.created", actor_name="placement-loop", target=operator, after={"n": n}
        )
        for n in range(8)
    ]
    connection.in_atomic_block, saved = False, connection.in_atomic_block  # as above
    try:
        with pytest.raises(AuditOutsideTransaction, match="allocation.created"):
            record_all(events)
    finally:
        connection.in_atomic_block = saved
    with transaction.atomic(), CaptureQueriesContext(connection) as queries:
        written = record_all(events)
    assert [q["sql"].split()[0] for q in queries] == ["INSERT"]
    assert all(event.pk for event in written)
    stored = AuditEvent.objects.filter(event_type="allocation.created").order_by("pk")
    assert [(e.actor_name, e.target_id, e.after) for e in stored] == [
        ("placement-loop", str(operator.pk), {"n": n}) for n in range(8)
    ]
