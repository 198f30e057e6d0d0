"""Reading the audit log: ``/audit/`` and ``GET /api/v1/audit/`` (one FilterSet, JSON pages and
a streamed CSV), who may read it, and the request id in each row and response."""

from __future__ import annotations

import argparse
import csv
import datetime as dt
import io
import json
import uuid
from types import SimpleNamespace

import pytest
from django.contrib.auth.models import User
from django.db import transaction
from django.test import Client, RequestFactory
from rest_framework.test import APIClient

from gpuadmin import request_id
from gpuadmin.access.models import Membership, Role
from gpuadmin.audit.changes import FieldChange, field_changes
from gpuadmin.audit.models import AuditEvent
from gpuadmin.audit.services import record

pytestmark = pytest.mark.django_db

API = "/api/v1/audit/"
T0 = dt.datetime(2026, 3, 1, 12, 0, tzinfo=dt.UTC)


def person(username: str, role: str) -> User:
    if role == Role.ADMIN:
        return User.objects.create_user(username, is_staff=True)
    user = User.objects.create_user(username)
    if role != Role.USER:
        Membership.objects.create(user=user, role=role)
    return user


def api_as(role: str) -> APIClient:
    client = APIClient()
    client.force_login(person(f"{role}-1", role))
    return client


@pytest.fixture
def log() -> list[AuditEvent]:
    """Four rows an hour apart from T0: two job events, a GPU event, a token event."""
    rows = [
        ("job.submitted", "scheduling.job", 7, "alice", None, None, ""),
        (
            "job.canceled",
            "scheduling.job",
            7,
            "bob",
            {"state": "queued"},
            {"state": "canceled"},
            "",
        ),
        ("gpu.state_changed", "inventory.gpu", 3, "placement-loop", None, None, ""),
        ("token.created", "access.apitoken", 1, "alice", None, None, '=HYPERLINK("http://evil")'),
    ]
    return [
        AuditEvent.objects.create(
            time=T0 + dt.timedelta(hours=n),
            event_type=kind,
            actor_name=actor,
            target_type=target_type,
            target_id=str(target_id),
            before=before,
            after=after,
            message=message,
        )
        for n, (kind, target_type, target_id, actor, before, after, message) in enumerate(rows)
    ]


def ids(response) -> list[int]:
    assert response.status_code == 200, response.content
    return [row["id"] for row in response.json()["results"]]


@pytest.mark.parametrize(
    ("query", "expected"),
    [
        ("", [3, 2, 1, 0]),
        ("actor=alice", [3, 0]),
        ("event_type=job.canceled", [1]),
        ("event_type=job.*", [1, 0]),
        ("target_type=scheduling.job&target_id=7", [1, 0]),
        ("target_type=inventory.gpu", [2]),
        ("since=2026-03-01T13:00:00Z", [3, 2, 1]),
        ("until=2026-03-01T14:00:00Z", [1, 0]),
        ("since=2026-03-01T13:00:00Z&until=2026-03-01T14:00:00Z&actor=bob", [1]),
    ],
)
def test_api_filters(log, query, expected):
    response = api_as(Role.OPERATOR).get(f"{API}?{query}")
    assert ids(response) == [log[n].pk for n in expected]
    assert response.json()["count"] == len(expected)


def test_api_row_has_who_what_before_after_and_request_id(log):
    rid = uuid.uuid4()
    with transaction.atomic(), request_id.bound(rid):
        record("job.held", actor_name="alice", target_type="scheduling.job", target_id=9)
    [row] = api_as(Role.ADMIN).get(f"{API}?request_id={rid}").json()["results"]
    assert row["actor"] == "alice"
    assert (row["event_type"], row["target_type"], row["target_id"]) == (
        "job.held",
        "scheduling.job",
        "9",
    )
    assert row["request_id"] == str(rid)
    canceled = api_as(Role.OPERATOR).get(f"{API}?event_type=job.canceled").json()["results"]
    assert (canceled[0]["before"], canceled[0]["after"]) == (
        {"state": "queued"},
        {"state": "canceled"},
    )


@pytest.mark.parametrize(
    ("query", "field"),
    [("since=yesterday", "since"), ("request_id=nope", "request_id"), ("actor=a%00b", "actor")],
)
def test_api_bad_filter_is_a_400_naming_it(log, query, field):
    response = api_as(Role.OPERATOR).get(f"{API}?{query}")
    assert response.status_code == 400
    assert field in response.json()


def test_api_paginates_like_the_other_lists(log):
    body = api_as(Role.OPERATOR).get(f"{API}?limit=2&offset=1").json()
    assert body["count"] == 4
    assert [row["id"] for row in body["results"]] == [log[2].pk, log[1].pk]
    assert "offset=3" in body["next"]


def csv_rows(response) -> list[dict[str, str]]:
    assert response.status_code == 200
    assert response["Content-Type"] == "text/csv; charset=utf-8"
    assert response["Content-Disposition"].startswith('attachment; filename="audit-')
    text = b"".join(response.streaming_content).decode()
    return list(csv.DictReader(io.StringIO(text)))


def test_csv_export_streams_every_filtered_row_with_a_header(log):
    response = api_as(Role.OPERATOR).get(f"{API}?format=csv&event_type=job.*&limit=1")
    assert response.streaming  # a large range is never built in memory
    rows = csv_rows(response)
    assert [row["id"] for row in rows] == [str(log[1].pk), str(log[0].pk)]  # no pagination
    assert list(rows[0]) == [
        "id",
        "time",
        "event_type",
        "actor",
        "actor_id",
        "target_type",
        "target_id",
        "object_repr",
        "before",
        "after",
        "message",
        "request_id",
        "channel",
    ]
    canceled = rows[0]
    assert canceled["time"] == "2026-03-01T13:00:00Z"
    assert (canceled["actor"], canceled["event_type"], canceled["target_id"]) == (
        "bob",
        "job.canceled",
        "7",
    )
    assert json.loads(canceled["before"]) == {"state": "queued"}
    assert json.loads(canceled["after"]) == {"state": "canceled"}


def test_csv_defuses_spreadsheet_formulas(log):
    [row] = csv_rows(api_as(Role.ADMIN).get(f"{API}?format=csv&event_type=token.created"))
    assert row["message"] == '\'=HYPERLINK("http://evil")'


def test_csv_bad_filter_is_a_400_naming_it(log):
    response = api_as(Role.OPERATOR).get(f"{API}?format=csv&since=soon")
    assert response.status_code == 400
    assert response.content.decode().splitlines()[0] == "field,message"
    assert response.content.decode().splitlines()[1].startswith("since,")


@pytest.mark.parametrize(
    ("role", "status"),
    [(None, 401), (Role.VIEWER, 403), (Role.USER, 403), (Role.OPERATOR, 200), (Role.ADMIN, 200)],
)
def test_who_reads_the_api(log, role, status):
    client = api_as(role) if role else APIClient()
    assert client.get(API).status_code == status
    assert client.get(f"{API}{log[0].pk}/").status_code == status
    assert client.get(f"{API}?format=csv").status_code == status


def test_the_api_is_read_only(log):
    client = api_as(Role.ADMIN)
    assert client.post(API, {"event_type": "x"}).status_code == 405
    assert client.delete(f"{API}{log[0].pk}/").status_code == 405


@pytest.mark.parametrize(
    ("role", "status"),
    [(None, 302), (Role.VIEWER, 403), (Role.USER, 403), (Role.OPERATOR, 200), (Role.ADMIN, 200)],
)
def test_who_reads_the_page_and_sees_it_in_the_nav(log, role, status):
    client = Client()
    if role:
        client.force_login(person(f"{role}-1", role))
    assert client.get("/audit/").status_code == status
    if role:
        home = client.get("/").content.decode()
        assert ('href="/audit/"' in home) == (status == 200)


def test_page_filters_with_the_api_filterset_and_links_the_csv(log):
    client = Client()
    client.force_login(person("ops", Role.OPERATOR))
    response = client.get("/audit/?actor=alice&event_type=job.*")
    page = response.content.decode()
    assert f'id="event-{log[0].pk}"' in page
    assert f'id="event-{log[3].pk}"' not in page  # a token event
    assert f'id="event-{log[1].pk}"' not in page  # bob's
    assert 'name="since"' in page and 'type="datetime-local"' in page
    assert "/api/v1/audit/?actor=alice&amp;event_type=job.%2A&amp;format=csv" in page
    bad = client.get("/audit/?since=whenever").content.decode()
    assert 'id="id_since_error"' in bad


def test_the_page_shows_each_change_as_its_fields_old_to_new(log):
    client = Client()
    client.force_login(person("ops", Role.OPERATOR))
    page = client.get("/audit/").content.decode()
    canceled = page[page.index(f'id="event-{log[1].pk}"') :].split("</tr>")[0]
    assert '<span class="field">state</span> <del>queued</del> → <ins>canceled</ins>' in canceled
    assert "{&#x27;" not in page and "{'" not in page  # no Python dict text


@pytest.mark.parametrize(
    ("before", "after", "fields", "more"),
    [
        ({"state": "queued", "pid": None}, {"state": "running", "pid": 7}, 2, 0),
        (None, {"id": 1, "name": "a", "state": "queued", "pid": None, "x": 1, "y": 2}, 4, 1),
        ({"name": "dgx-01", "state": "offline"}, None, 2, 0),
        ({"state": "queued"}, {"state": "queued"}, 0, 0),
    ],
)
def test_field_changes_keep_what_changed_or_what_a_created_row_holds(before, after, fields, more):
    changes = field_changes(before, after)
    assert (len(changes.fields), changes.more) == (fields, more)
    if before is None:
        assert changes.fields[0] == FieldChange("name", None, "a")  # the salient field first
    if after is None:
        assert changes.fields[0] == FieldChange("name", "dgx-01", None)


# --------------------------------------------------------------------------- request ids


def test_every_response_has_a_request_id_and_its_rows_carry_it():
    admin = person("root", Role.ADMIN)
    client = APIClient()
    client.force_login(admin)
    response = client.post("/api/v1/tokens/", {"name": "ci"}, format="json")
    assert response.status_code == 201
    rid = uuid.UUID(response["X-Request-ID"])
    row = AuditEvent.objects.get(event_type="token.created")
    assert (row.request_id, row.actor_id) == (rid, admin.pk)
    again = client.get("/-/health")
    assert uuid.UUID(again["X-Request-ID"]) != rid  # one per request


@pytest.mark.parametrize(
    ("sent", "kept"),
    [
        ("6f1c2b4e-8a9d-4c3e-b2a1-0d9e8f7a6b5c", True),
        ("6f1c2b4e8a9d4c3eb2a10d9e8f7a6b5c", True),  # nginx's $request_id
        ("not-a-uuid", False),
        ("6f1c2b4e-8a9d-4c3e-b2a1-0d9e8f7a6b5c; DROP TABLE", False),
        ("x" * 500, False),
    ],
)
def test_an_incoming_request_id_is_kept_when_it_is_a_uuid(sent, kept):
    user = person("u", Role.USER)
    client = APIClient()
    client.force_login(user)
    response = client.post("/api/v1/tokens/", {"name": "ci"}, format="json", HTTP_X_REQUEST_ID=sent)
    echoed = uuid.UUID(response["X-Request-ID"])
    assert (echoed == uuid.UUID(sent)) if kept else (str(echoed) != sent)
    assert AuditEvent.objects.get(event_type="token.created").request_id == echoed


def test_no_request_id_outside_a_request_task_or_command():
    with transaction.atomic():
        row = record("x.y", actor_name="test")
    assert row.request_id is None


def test_a_task_carries_the_request_id_and_channel_of_what_sent_it():
    rid = uuid.uuid4()
    headers: dict[str, str] = {}
    with request_id.bound(rid, "cli drain"):
        request_id._send_request_id(headers=headers)
    assert headers == {
        request_id.TASK_HEADER: str(rid),
        request_id.TASK_CHANNEL_HEADER: "cli drain",
    }

    def run_task(task_id: str, **request: object) -> tuple[uuid.UUID | None, str]:
        task = SimpleNamespace(request=SimpleNamespace(is_eager=False, **request))
        request_id._bind_task(task_id=task_id, task=task)
        try:
            return request_id.current(), request_id.current_channel()
        finally:
            request_id._unbind_task(task_id=task_id)

    own = str(uuid.uuid4())
    assert run_task(own, **headers) == (rid, "cli drain")  # sent by a CLI verb's request
    assert run_task(own) == (uuid.UUID(own), "")  # beat, an agent: its own id, no channel
    assert (request_id.current(), request_id.current_channel()) == (None, "")  # unbound after


def test_a_request_names_its_channel_in_its_audit_rows():
    """The CLI's verb when its header names one, else api or web; a header claiming anything
    else is not believed."""
    seen = []
    for path, header in (
        ("/api/v1/tokens/", "cli token create"),
        ("/api/v1/tokens/", "admin; DROP"),
        ("/api/v1/tokens/", None),
    ):
        channel = request_id.request_channel(_request(path, header))
        with request_id.bound(channel=channel), transaction.atomic():
            seen.append(record("x.y", actor_name="test").channel)
    assert seen == ["cli token create", "api", "api"]
    assert AuditEvent.objects.filter(channel="cli token create").count() == 1
    assert request_id.request_channel(_request("/jobs/", None)) == "web"


def _request(path: str, channel: str | None):
    headers = {request_id.CHANNEL_HEADER: channel} if channel else {}
    return RequestFactory().get(path, headers=headers)


def test_an_eager_task_runs_under_its_callers_id(settings):
    from celery import shared_task

    seen: list[uuid.UUID | None] = []

    @shared_task(name="tests.audit.seen")
    def seen_task() -> None:
        seen.append(request_id.current())

    rid = uuid.uuid4()
    with request_id.bound(rid):
        seen_task.apply()
    assert seen == [rid]


def test_a_cli_command_runs_under_one_new_id(monkeypatch):
    from gpuadmin import cli

    seen: list[uuid.UUID | None] = []
    monkeypatch.setattr(cli, "_bootstrap_django", lambda **_: None)

    def verb(args: argparse.Namespace) -> int:
        seen.append(request_id.current())
        return 0

    assert cli._with_django(verb)(argparse.Namespace()) == 0
    assert isinstance(seen[0], uuid.UUID)
    assert request_id.current() is None
