"""``gpuadmin reserve|quota|alerts|audit|login|logout`` against a live server, each person with
their own API token (or, for ``login``, their password)."""

from __future__ import annotations

import io
import json
import stat
import time
import uuid
from collections.abc import Iterator
from datetime import datetime, timedelta
from zoneinfo import ZoneInfo

import pytest
from django.utils import timezone

from gpuadmin import cli, throttling
from gpuadmin.access.models import ApiToken, Role
from gpuadmin.access.services import create_token
from gpuadmin.audit.models import AuditEvent
from gpuadmin.client import Api, ApiError, Credentials
from gpuadmin.ops_cli import changes
from health.alerts import open_alert
from health.choices import AlertState
from health.models import Alert
from inventory.choices import GpuState
from inventory.models import Gpu
from inventory.services import set_gpu_state
from scheduling.loop import dispatch
from scheduling.models import Quota, Reservation

pytestmark = pytest.mark.django_db(transaction=True)
PASSWORD = "correct horse battery"
LOCAL_ZONE = "Europe/Berlin"  # the terminal's zone, not the server's (UTC)


@pytest.fixture
def local_zone(monkeypatch) -> Iterator[ZoneInfo]:
    """The process's local time zone (what the CLI prints and reads times in) for one test."""
    monkeypatch.setenv("TZ", LOCAL_ZONE)
    time.tzset()
    yield ZoneInfo(LOCAL_ZONE)
    monkeypatch.undo()
    time.tzset()


@pytest.fixture
def gpuadmin(live_server, capsys, monkeypatch, tmp_path):
    """``gpuadmin(user, *argv)`` -> (status, stdout, stderr): the verb run by ``user`` through
    the live server, with an API token of theirs; ``gpuadmin(None, ...)`` without one."""
    monkeypatch.setattr(dispatch, "wake", lambda: None)  # no placement pass on the shared Redis
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    monkeypatch.setenv("GPUADMIN_URL", live_server.url)
    tokens: dict[str, str] = {}

    def run(user, *argv: str) -> tuple[int, str, str]:
        if user is None:
            monkeypatch.delenv("GPUADMIN_TOKEN", raising=False)
        else:
            if user.username not in tokens:
                tokens[user.username] = create_token(user, "tests")[1]
            monkeypatch.setenv("GPUADMIN_TOKEN", tokens[user.username])
        status = cli.main(list(argv))
        out, err = capsys.readouterr()
        return status, out, err

    return run


def channels(event_type: str) -> list[str]:
    rows = AuditEvent.objects.filter(event_type=event_type).order_by("pk")
    return list(rows.values_list("channel", flat=True))


VERBS = (
    ("reserve", "create"),
    ("reserve", "list"),
    ("reserve", "cancel"),
    ("quota", "show"),
    ("quota", "set"),
    ("alerts",),
    ("alerts", "ack"),
    ("audit",),
    ("login",),
    ("logout",),
)


@pytest.mark.parametrize("verb", VERBS, ids=" ".join)
def test_help(verb, capsys):
    with pytest.raises(SystemExit) as exited:
        cli.main([*verb, "--help"])
    assert exited.value.code == 0
    assert capsys.readouterr().out.startswith(f"usage: gpuadmin {' '.join(verb)} ")


# --------------------------------------------------------------------------- reserve


def test_reserve_create_list_cancel(gpuadmin, make_user, fleet, local_zone):
    alice, bob = make_user("alice"), make_user("bob")
    day = (timezone.now() + timedelta(days=2)).astimezone(local_zone).date()
    status, out, err = gpuadmin(
        alice,
        *("reserve", "create", "--gpus", "2", "--node", "dgx-01"),
        *("--start", f"{day}T09:00", "--duration", "2h", "--note", "paper deadline"),
    )
    assert (status, err) == (0, "")
    reservation = Reservation.objects.get()
    # A time without an offset is the terminal's local time.
    start = datetime(day.year, day.month, day.day, 9, tzinfo=local_zone)
    assert (reservation.start, reservation.end) == (start, start + timedelta(hours=2))
    assert (reservation.gpu_count, reservation.node.hostname, reservation.note) == (
        2,
        "dgx-01",
        "paper deadline",
    )
    held = reservation.holds.order_by("gpu__index").values_list("gpu__uuid", flat=True)
    assert out.splitlines() == [
        f"reservation {reservation.pk} approved: 2 GPUs (dgx-01), {day} 09:00 to 11:00",
        f"  GPUs:    {', '.join(held)}",
        "  message: approved automatically: within quota",
    ]

    status, out, _ = gpuadmin(bob, "reserve", "list")
    assert out.splitlines()[0].split() == [
        *("ID", "STATE", "OWNER", "GPUS", "WHERE", "START", "END", "NOTE"),
    ]
    assert out.splitlines()[1].split() == [
        *(str(reservation.pk), "approved", "alice", "2", "dgx-01"),
        *(str(day), "09:00", str(day), "11:00", "paper", "deadline", "|"),
        *("approved", "automatically:", "within", "quota"),
    ]
    status, out, _ = gpuadmin(bob, "reserve", "list", "--mine", "--json")
    assert (status, json.loads(out)) == (0, [])

    # Bob may not cancel Alice's reservation: the API's refusal, exit status 1.
    status, out, err = gpuadmin(bob, "reserve", "cancel", str(reservation.pk))
    assert (status, out, err) == (
        1,
        "",
        f"gpuadmin reserve cancel: HTTP 403: A user cannot act on reservation {reservation.pk}.\n",
    )
    status, out, _ = gpuadmin(alice, "reserve", "cancel", str(reservation.pk), "--json")
    assert (status, json.loads(out)["state"]) == (0, "canceled")
    assert len(gpuadmin(alice, "reserve", "list")[1].splitlines()) == 1  # the header alone
    status, out, _ = gpuadmin(alice, "reserve", "list", "--state", "canceled")
    assert out.splitlines()[1].split()[:2] == [str(reservation.pk), "canceled"]
    assert channels("reservation.requested") == ["cli reserve create"]
    assert channels("reservation.canceled") == ["cli reserve cancel"]


def test_reserve_takes_relative_times_and_names_refused_fields(gpuadmin, make_user, fleet):
    alice = make_user("alice")
    before = timezone.now()
    status, _, err = gpuadmin(alice, "reserve", "create", "--start", "+1h", "--end", "now+3h")
    assert (status, err) == (0, "")
    reservation = Reservation.objects.get()
    assert before + timedelta(hours=1) <= reservation.start <= timezone.now() + timedelta(hours=1)
    assert reservation.end - reservation.start == timedelta(hours=2)

    status, _, err = gpuadmin(alice, "reserve", "create", "--node", "nowhere", "--duration", "1h")
    assert (status, err) == (
        1,
        "gpuadmin reserve create: HTTP 400: node: Object with hostname=nowhere does not exist.\n",
    )
    status, _, err = gpuadmin(alice, "reserve", "create", "--start", "2h", "--end", "1h")
    assert (status, err) == (1, "gpuadmin reserve create: HTTP 400: end: must be after the start\n")
    status, _, err = gpuadmin(
        alice, "reserve", "create", "--start", "9999-12-31T23:00+00:00", "--duration", "2h"
    )
    assert (status, err) == (1, "gpuadmin reserve create: the end would be past the year 9999\n")
    for duration in ("soon", "999999w"):
        with pytest.raises(SystemExit) as exited:  # a usage error: argparse's status 2
            cli.main(["reserve", "create", "--duration", duration])
        assert exited.value.code == 2


# --------------------------------------------------------------------------- quota


def test_quota_set_and_show(gpuadmin, make_user, fleet):
    root, alice = make_user("root", Role.ADMIN), make_user("alice")
    status, out, err = gpuadmin(
        root,
        *("quota", "set", "--user", "alice", "--max-gpus", "4"),
        *("--gpu-hours", "100", "--period", "week"),
    )
    assert (status, err) == (0, "")
    quota = Quota.objects.get()
    assert out.splitlines() == [
        f"quota {quota.pk} added: user alice in no pool",
        "  GPUs at once:      0 / 4",
        "  GPU-hours a week:  0 / 100",
        "  fair-share weight: 1",
    ]
    # Set again: the same quota changes, the limits not given keep their values.
    status, out, _ = gpuadmin(root, "quota", "set", "--user", "alice", "--max-gpus", "none")
    assert out.splitlines()[0] == f"quota {quota.pk} changed: user alice in no pool"
    quota.refresh_from_db()
    assert (quota.max_gpus, quota.gpu_hours, quota.period) == (None, 100, "week")

    status, out, _ = gpuadmin(alice, "quota", "show")
    assert (status, out) == (
        0,
        f"quota {quota.pk}: you use 0 GPUs in no pool; 0 of 100 GPU-hours this week\n",
    )
    status, out, _ = gpuadmin(root, "quota", "show", "--user", "alice")
    assert out.splitlines()[1].split() == [
        *(str(quota.pk), "user", "alice", "-", "0", "/", "-", "0", "/", "100", "week", "1"),
    ]
    assert gpuadmin(root, "quota", "show", "--user", "bob", "--json")[1] == "[]\n"
    status, out, _ = gpuadmin(root, "quota", "show", "--all", "--json")
    assert [row["id"] for row in json.loads(out)] == [quota.pk]

    status, out, err = gpuadmin(alice, "quota", "set", "--user", "alice", "--max-gpus", "99")
    assert (status, out) == (1, "")
    assert err.startswith("gpuadmin quota set: HTTP 403: ")
    assert channels("quota.created") == ["cli quota set"]
    assert channels("quota.changed") == ["cli quota set"]


# --------------------------------------------------------------------------- alerts


def test_alerts_list_and_ack(gpuadmin, make_user, fleet):
    olga, alice = make_user("olga", Role.OPERATOR), make_user("alice")
    gpu = Gpu.objects.get(node__hostname="dgx-01", index=3)
    hot = open_alert(fingerprint="t:hot", severity="critical", summary="GPU 3 at 92 C", gpu=gpu)
    old = open_alert(fingerprint="t:old", severity="warning", summary="fan", node=gpu.node)
    Alert.objects.filter(pk=old.pk).update(state=AlertState.RESOLVED)

    status, out, _ = gpuadmin(alice, "alerts")
    lines = out.splitlines()
    assert lines[0].split() == ["ID", "STATE", "SEVERITY", "WHERE", "OPENED", "ACKNOWLEDGED"] + [
        "SUMMARY"
    ]
    assert [line.split()[:4] for line in lines[1:]] == [
        [str(hot.pk), "firing", "critical", "dgx-01/GPU3"],
        [str(old.pk), "resolved", "warning", "dgx-01"],
    ]
    status, out, _ = gpuadmin(alice, "alerts", "--firing", "--json")
    assert [alert["id"] for alert in json.loads(out)] == [hot.pk]

    status, _, err = gpuadmin(alice, "alerts", "ack", str(hot.pk), "--comment", "mine")
    assert status == 1 and err.startswith("gpuadmin alerts ack: HTTP 403: ")
    status, out, _ = gpuadmin(olga, "alerts", "ack", str(hot.pk), "--comment", "fan replaced")
    assert (status, out) == (0, f"alert {hot.pk} acknowledged by olga: GPU 3 at 92 C\n")
    hot.refresh_from_db()
    assert (hot.acknowledged_by, hot.ack_comment) == (olga, "fan replaced")
    assert channels("alert.acknowledged") == ["cli alerts ack"]
    status, _, err = gpuadmin(olga, "alerts", "ack", str(old.pk))
    assert (status, err) == (
        1,
        f"gpuadmin alerts ack: HTTP 409: alert {old.pk} is resolved: only a firing one can be "
        "acknowledged\n",
    )
    status, out, _ = gpuadmin(alice, "alerts", "--firing", "--unacknowledged")
    assert len(out.splitlines()) == 1


# --------------------------------------------------------------------------- audit


def test_audit_filters_and_changes(gpuadmin, make_user, fleet):
    olga, alice = make_user("olga", Role.OPERATOR), make_user("alice")
    gpu = Gpu.objects.get(node__hostname="dgx-02", index=5)
    set_gpu_state(gpu, GpuState.DRAINING, actor=olga, reason="fan noise")
    gpuadmin(alice, "reserve", "create", "--node", "dgx-01", "--duration", "1h")

    status, out, _ = gpuadmin(olga, "audit", "--target", gpu.uuid)
    header, changed, appeared = out.splitlines()  # newest first
    assert header.split() == [
        *("TIME", "ACTOR", "CHANNEL", "EVENT", "TARGET", "CHANGES", "MESSAGE"),
    ]
    assert changed.split()[2:5] == ["olga", "-", "gpu.state_changed"]
    assert f"  {gpu}  state: available→draining  " in changed
    assert changed.endswith("  fan noise")
    assert appeared.split()[2:5] == ["discovery", "-", "gpu.appeared"]
    assert f"  {gpu}  name=NVIDIA A100-SXM4-80GB, index=5, " in appeared
    # The same rows however the target is named.
    for target in (f"gpu:{gpu.uuid}", f"inventory.gpu:{gpu.uuid}"):
        assert gpuadmin(olga, "audit", "--target", target)[1] == out
    status, out, _ = gpuadmin(olga, "audit", "--target", "dgx-02", "--json")
    assert {(row["target_type"], row["target_id"]) for row in json.loads(out)} == {
        ("inventory.node", str(gpu.node_id))
    }
    status, out, _ = gpuadmin(olga, "audit", "--target", "job:1", "--json")
    assert (status, out) == (0, "[]\n")

    status, out, _ = gpuadmin(olga, "audit", "--since", "1h", "--channel", "cli reserve create")
    assert [row.split()[2:7] for row in out.splitlines()[1:]] == [
        ["alice", "cli", "reserve", "create", "reservation.approved"],
        ["alice", "cli", "reserve", "create", "reservation.requested"],
    ]
    mine = ("--actor", "alice", "--event", "reservation.*")
    status, out, _ = gpuadmin(olga, "audit", "--since", "2026-01-01", *mine, "--json")
    assert [row["event_type"] for row in json.loads(out)] == [
        "reservation.approved",
        "reservation.requested",
    ]
    assert gpuadmin(olga, "audit", "--since=+1h", *mine)[1].count("\n") == 1  # the header
    assert gpuadmin(olga, "audit", "--until", "1h", *mine)[1].count("\n") == 1

    status, out, err = gpuadmin(alice, "audit")
    assert (status, out) == (1, "")
    assert err.startswith("gpuadmin audit: HTTP 403: ")
    status, _, err = gpuadmin(olga, "audit", "--target", "no-such-node")
    assert (status, err) == (1, "gpuadmin audit: HTTP 404: No Node matches the given query.\n")


def test_changes_are_one_compact_line():
    assert changes({"state": "available", "pid": None}, {"state": "draining", "pid": None}) == (
        "state: available→draining"
    )
    assert changes(None, {"name": "laptop", "gpus": [1, 2]}) == "name=laptop, gpus=[1, 2]"
    assert changes({"name": "laptop"}, None) == "name: laptop→-"
    assert changes({"n": 1}, {"n": 2, "m": True}) == "n: 1→2, m=true"


# --------------------------------------------------------------------------- login


@pytest.fixture
def alice_with_password(django_user_model):
    return django_user_model.objects.create_user("alice", password=PASSWORD)


def login(gpuadmin, monkeypatch, typed: str, *argv: str) -> tuple[int, str, str]:
    monkeypatch.setattr("sys.stdin", io.StringIO(typed))
    return gpuadmin(None, "login", *argv)


def test_login_keeps_a_token_the_verbs_use_and_logout_revokes_it(
    gpuadmin, monkeypatch, live_server, alice_with_password, tmp_path, fleet
):
    status, out, err = login(
        gpuadmin, monkeypatch, f"{PASSWORD}\n", "--username", "alice", "--password-stdin"
    )
    assert (status, err) == (0, "")
    token = ApiToken.objects.get(user=alice_with_password)
    path = tmp_path / "config" / "gpuadmin" / "credentials"
    assert out == f"logged in to {live_server.url} as alice: API token {token.pk} kept in {path}\n"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    saved = Credentials.load()
    assert (saved.url, saved.username, saved.token_id) == (live_server.url, "alice", token.pk)
    assert ApiToken.hash(saved.token) == token.digest
    created = AuditEvent.objects.get(event_type="token.created")
    assert (created.actor_name, created.channel) == ("alice", "cli login")

    # Neither GPUADMIN_URL nor GPUADMIN_TOKEN: the verbs use what login kept.
    monkeypatch.delenv("GPUADMIN_URL")
    status, _, err = gpuadmin(None, "reserve", "create", "--duration", "1h")
    assert (status, err) == (0, "")
    assert Reservation.objects.get().owner == alice_with_password
    # The kept token goes to its own server only.
    monkeypatch.setenv("GPUADMIN_URL", "http://127.0.0.1:9")
    assert Api.from_env().token == ""
    monkeypatch.delenv("GPUADMIN_URL")

    status, out, err = gpuadmin(None, "logout")
    assert (status, out, err) == (
        0,
        f"logged out of {live_server.url}: API token {token.pk} revoked\n",
        "",
    )
    assert not path.exists()
    token.refresh_from_db()
    assert token.revoked_at is not None
    assert channels("token.revoked") == ["cli logout"]
    with pytest.raises(ApiError) as refused:
        Api(live_server.url, saved.token).call("GET", "/api/v1/reservations/")
    assert refused.value.status == 401
    monkeypatch.setenv("GPUADMIN_URL", live_server.url)
    status, _, err = gpuadmin(None, "reserve", "list")  # nobody logged in: no token at all
    assert status == 1 and "HTTP 401" in err and "gpuadmin login" in err
    assert gpuadmin(None, "logout")[:2] == (0, f"not logged in (no {path})\n")


def test_login_asks_for_what_it_is_not_given(
    gpuadmin, monkeypatch, live_server, alice_with_password
):
    monkeypatch.delenv("GPUADMIN_URL")
    monkeypatch.setattr("getpass.getpass", lambda prompt: PASSWORD)
    status, out, err = login(gpuadmin, monkeypatch, f"{live_server.url}\nalice\n")
    assert status == 0, err
    assert err == "Server [http://127.0.0.1:8000]: User name: "
    assert Credentials.load().url == live_server.url
    first = ApiToken.objects.get()
    # Logging in again replaces the kept token, and revokes the one it replaces.
    status, _, err = login(gpuadmin, monkeypatch, "alice\n")
    assert (status, err) == (0, "User name: ")
    first.refresh_from_db()
    assert first.revoked_at is not None
    assert Credentials.load().token_id != first.pk


def test_login_with_a_wrong_password(gpuadmin, monkeypatch, live_server, alice_with_password):
    status, out, err = login(
        gpuadmin, monkeypatch, "guess\n", "--username", "alice", "--password-stdin"
    )
    assert (status, out, err) == (
        1,
        "",
        f"gpuadmin login: wrong user name or password for {live_server.url}\n",
    )
    assert not ApiToken.objects.exists()
    assert Credentials.load() is None
    status, _, err = login(gpuadmin, monkeypatch, "x\n", "--password-stdin")
    assert (status, err) == (2, "gpuadmin login: --password-stdin needs --username\n")


def test_login_is_limited_as_token_creation_is(
    gpuadmin, monkeypatch, settings, live_server, alice_with_password
):
    # A window of its own, whatever earlier runs counted in the shared Redis.
    hour = 1_000_000 + uuid.uuid4().int % 10**6
    monkeypatch.setattr(throttling.time, "time", lambda: hour * 3600 + 1800.0)
    settings.GPUADMIN_TOKEN_RATE = (1, 3600)
    argv = ("--username", "alice", "--password-stdin")
    assert login(gpuadmin, monkeypatch, f"{PASSWORD}\n", *argv)[0] == 0
    status, _, err = login(gpuadmin, monkeypatch, f"{PASSWORD}\n", *argv)
    assert (status, err) == (
        1,
        "gpuadmin login: HTTP 429: Request was throttled. Expected available in 1800 seconds.\n",
    )
