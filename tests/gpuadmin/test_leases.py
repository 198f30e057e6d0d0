"""Leases (``gpuadmin.leases``): one holder at a time, a holder that lost its lease writes
nothing more, and the placement loop's lease holds behind a real PgBouncer in transaction
pooling mode, where a session-level advisory lock would not (each statement may run on another
server connection)."""

from __future__ import annotations

import os
import pwd
import shutil
import socket
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest
from django.db import connection, connections
from django.db.backends.base.base import BaseDatabaseWrapper
from django.utils import timezone

from gpuadmin.env import parse_database_url
from gpuadmin.leases import services as leases
from gpuadmin.leases.models import Lease
from gpuadmin.postgres.direct import direct_connection
from scheduling.loop import passes
from tests.conftest import REPO_DIR
from tests.tools import debian_program
from tests.waiting import wait_for_port

pytestmark = pytest.mark.django_db

COUNTERS = 2  # processes counting at once
COUNTS = 10  # each
LATER = timezone.now() + timedelta(days=1)


@pytest.fixture
def other_session() -> Iterator[BaseDatabaseWrapper]:
    """Another process's database session (its own transactions, committed); the rows it
    wrote are deleted afterwards, with the placement loop's lease that the counting processes
    took (committed, given back: later tests of this session start without it)."""
    other = connections.create_connection("default")
    yield other
    with other.cursor() as cursor:
        cursor.execute(
            "DELETE FROM leases_lease WHERE holder IN ('other', 'tests') OR name = %s",
            [passes.lease_name()],
        )
    other.close()


def expire(name: str) -> None:
    Lease.objects.filter(name=name).update(expires_at=timezone.now() - timedelta(hours=1))


def test_a_lease_has_one_holder_until_it_expires_or_is_given_back() -> None:
    first = leases.try_take("role", 60)
    assert first is not None
    assert leases.try_take("role", 60) is None  # held
    leases.give_back(first)
    second = leases.try_take("role", 60)
    assert second is not None and second.token == first.token + 1
    expire("role")  # its holder died: nobody renewed it
    third = leases.try_take("role", 60)
    assert third is not None and third.token == second.token + 1


def test_a_holder_that_lost_its_lease_commits_nothing_more() -> None:
    stalled = leases.try_take("role", 60)
    assert stalled is not None
    with leases.fenced(stalled):  # renewed, and written while held
        Lease.objects.create(name="written-while-held", holder="x", expires_at=LATER)
    expire("role")
    successor = leases.try_take("role", 60)
    assert successor is not None

    with pytest.raises(leases.LeaseLost), leases.fenced(stalled):
        Lease.objects.create(name="written-after", holder="x", expires_at=LATER)

    assert Lease.objects.filter(name="written-while-held").exists()
    assert not Lease.objects.filter(name="written-after").exists()
    leases.give_back(stalled)  # not its own any more: nothing happens
    assert leases.try_take("role", 60) is None
    leases.renew(successor)  # still the successor's


def test_a_lease_held_is_not_locked_by_one_that_tries_to_take_it(
    other_session: BaseDatabaseWrapper,
) -> None:
    """A failed try leaves the row alone: its holder renews it at once, never waiting on the
    transaction that tried."""
    with other_session.cursor() as cursor:
        cursor.execute(leases._TAKE, {"name": "held-elsewhere", "holder": "other", "ttl": 60})
        [(token,)] = cursor.fetchall()
    assert leases.try_take("held-elsewhere", 60) is None  # this test's transaction stays open
    with other_session.cursor() as cursor:
        cursor.execute("SET lock_timeout = '1s'")
        cursor.execute(leases._RENEW, [60, "held-elsewhere", token])
        assert cursor.rowcount == 1


# --------------------------------------------------------------------------- PgBouncer


def _pgbouncer() -> str:
    return debian_program("pgbouncer", "install-pgbouncer")


@pytest.fixture(scope="module")
def pgbouncer(django_db_setup: None, django_db_blocker: object) -> Iterator[str]:
    """A private PgBouncer in transaction pooling mode in front of this session's PostgreSQL,
    with fewer server connections than clients: the DATABASE_URL of the test database
    through it."""
    db = connection.settings_dict
    host, port = db["HOST"] or "127.0.0.1", db["PORT"] or "5432"
    scratch = Path(tempfile.mkdtemp(prefix="gpuadmin-pgbouncer-"))
    scratch.chmod(0o777)  # run as another user when root (pgbouncer refuses root)
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        listen = sock.getsockname()[1]
    (scratch / "users.txt").write_text(f'"{db["USER"]}" "{db["PASSWORD"]}"\n')
    (scratch / "pgbouncer.ini").write_text(
        f"""[databases]
* = host={host} port={port}
[pgbouncer]
listen_addr = 127.0.0.1
listen_port = {listen}
unix_socket_dir =
auth_type = trust
auth_file = {scratch}/users.txt
pool_mode = transaction
default_pool_size = {COUNTERS - 1}
max_client_conn = 50
ignore_startup_parameters = extra_float_digits,options
logfile = {scratch}/pgbouncer.log
pidfile = {scratch}/pgbouncer.pid
"""
    )
    user: list[str] = []
    if os.geteuid() == 0:  # the server's own user can reach its socket directory
        owner = os.stat(host).st_uid if host.startswith("/") else pwd.getpwnam("nobody").pw_uid
        user = ["-u", pwd.getpwuid(owner).pw_name]
    process = subprocess.Popen([_pgbouncer(), *user, str(scratch / "pgbouncer.ini")])
    try:
        wait_for_port(listen, 10, "pgbouncer", process=process, log=scratch / "pgbouncer.log")
        yield f"postgresql://{db['USER']}:{db['PASSWORD']}@127.0.0.1:{listen}/{db['NAME']}"
    finally:
        process.terminate()
        process.wait(timeout=10)
        shutil.rmtree(scratch, ignore_errors=True)


def test_passes_from_two_processes_behind_pgbouncer_never_overlap(
    pgbouncer: str, other_session: BaseDatabaseWrapper
) -> None:
    """Two processes count in one row, each count (read, pause, write) under the placement
    loop's lease and written fenced by it, through PgBouncer's transaction pooling: no count
    is lost, so no two holders ever overlapped."""
    row = f"counter-{uuid.uuid4().hex}"
    with other_session.cursor() as cursor:  # committed: the counters are other sessions
        cursor.execute(
            "INSERT INTO leases_lease (name, holder, token, expires_at) "
            "VALUES (%s, 'tests', 0, now() + interval '1 day')",
            [row],
        )
    env = {
        **os.environ,
        "DATABASE_URL": pgbouncer,
        "DATABASE_PREPARE_THRESHOLD": "0",  # PgBouncer < 1.21 in transaction mode
        "DATABASE_POOL_MODE": "transaction",
        "DJANGO_SETTINGS_MODULE": "gpuadmin.settings",
    }
    counters = [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "tests.gpuadmin.lease_counter",
                "--row",
                row,
                "--times",
                str(COUNTS),
            ],
            env=env,
            cwd=REPO_DIR,
            stderr=subprocess.PIPE,
            text=True,
        )  # fmt: skip
        for _ in range(COUNTERS)
    ]
    errors = [counter.communicate(timeout=120)[1] for counter in counters]
    assert [counter.returncode for counter in counters] == [0] * COUNTERS, errors
    assert Lease.objects.get(name=row).token == COUNTERS * COUNTS


# --------------------------------------------------------------------------- LISTEN


def test_listeners_connect_to_the_direct_url_when_one_is_set(settings) -> None:
    """LISTEN needs a session: behind transaction pooling, the listeners of the gRPC streams
    connect to DATABASE_DIRECT_URL's server, with the rest of the default's settings."""
    assert direct_connection().settings_dict == connection.settings_dict  # unset: DATABASE_URL
    settings.DATABASE_DIRECT = parse_database_url(
        "postgresql://listener:secret@db-primary.example:5433/gpuadmin?sslmode=require"
    )
    direct = direct_connection().settings_dict

    assert (direct["HOST"], direct["PORT"], direct["NAME"], direct["USER"]) == (
        "db-primary.example",
        "5433",
        "gpuadmin",
        "listener",
    )
    assert direct["OPTIONS"] == {**connection.settings_dict["OPTIONS"], "sslmode": "require"}
    assert direct["CONN_MAX_AGE"] == connection.settings_dict["CONN_MAX_AGE"]
