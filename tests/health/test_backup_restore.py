"""The restore procedure of docs/administration/backups.md, run for real with pg_dump and
pg_restore on a database that has telemetry partitions, the client programs of the test
server's major version (the docs' rule: Debian's ``pg_dump`` on PATH is a wrapper that picks a
version of its own)."""

from __future__ import annotations

import functools
import re
import shutil
import subprocess
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest
from django.conf import settings
from django.db import connection

from health import telemetry
from tests.conftest import missing

pytestmark = pytest.mark.django_db(transaction=True)

NOW = datetime(2032, 7, 8, 9, 30, tzinfo=UTC)


@functools.cache
def server_major() -> int:
    with connection.cursor() as cursor:
        cursor.execute("SHOW server_version_num")
        return int(cursor.fetchone()[0]) // 10000


def client_major(path: str) -> int | None:
    """The major version ``path --version`` prints (``pg_dump (PostgreSQL) 15.20 ...``)."""
    done = subprocess.run([path, "--version"], capture_output=True, text=True, check=False)
    found = re.search(r"\(PostgreSQL\) (\d+)", done.stdout)
    return int(found[1]) if found else None


@functools.cache
def program(name: str) -> str:
    """PostgreSQL's client program ``name`` of the server's major version: Debian's
    ``/usr/lib/postgresql/<major>/bin/<name>``, else the one on PATH if it is of that version.
    A skip where there is none (a failure under CI)."""
    major = server_major()
    debian = Path(f"/usr/lib/postgresql/{major}/bin/{name}")
    if debian.exists():
        return str(debian)
    on_path = shutil.which(name)
    if on_path and client_major(on_path) == major:
        return on_path
    seen = f"{on_path} is version {client_major(on_path)}" if on_path else f"no {name} on PATH"
    missing(
        f"PostgreSQL {major}'s {name} (the server's major version) is not installed: not at "
        f"{debian}, and {seen} (Debian: apt install postgresql-client-{major})"
    )


def pg(*command: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    """A PostgreSQL client program (of the server's version) against the test server."""
    db = settings.DATABASES["default"]
    where = ["--host", db["HOST"] or "127.0.0.1", "--port", str(db["PORT"] or 5432)]
    where += ["--username", db["USER"]]
    return subprocess.run(
        [program(command[0]), *where, *command[1:]], capture_output=True, text=True, check=check
    )


def query(database: str, sql: str) -> list[str]:
    return pg("psql", "--no-psqlrc", "-At", "-d", database, "-c", sql).stdout.split()


@pytest.fixture
def dump(tmp_path: Path) -> Iterator[Path]:
    """A custom-format dump of the test database holding hourly and daily partitions with a
    row each; the partitions are dropped again afterwards."""
    created = telemetry.ensure_partitions(NOW)
    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO health_gpusample (gpu_id, at) VALUES (7, '2032-07-08 09:10+00')"
        )
        cursor.execute(
            "INSERT INTO health_gpurollup (gpu_id, minute, samples) "
            "VALUES (7, '2032-07-08 09:10+00', 30)"
        )
    path = tmp_path / "gpuadmin.dump"
    # The telemetry tables only (their names match their partitions'): the rest of the schema
    # restores like any table and would only make the test slow.
    pg(
        "pg_dump",
        "--format=custom",
        "--table=health_gpusample*",
        "--table=health_gpurollup*",
        f"--file={path}",
        connection.settings_dict["NAME"],
    )
    yield path
    with connection.cursor() as cursor:
        for name in created:
            cursor.execute(f"DROP TABLE {name}")


@pytest.fixture
def scratch() -> Iterator[str]:
    name = f"restore_{uuid.uuid4().hex[:8]}"
    pg("createdb", name)
    yield name
    pg("dropdb", "--force", name)


def restore(dump: Path, database: str, *flags: str) -> subprocess.CompletedProcess[str]:
    return pg("pg_restore", "--no-owner", *flags, f"--dbname={database}", str(dump), check=False)


def assert_restored(database: str) -> None:
    """Every partition attached under its parent with its primary key, and the rows back."""
    assert set(
        query(
            database,
            "SELECT child.relname FROM pg_inherits JOIN pg_class child ON child.oid = inhrelid "
            "WHERE inhparent = 'health_gpusample'::regclass",
        )
    ) >= {"health_gpusample_default", "health_gpusample_p2032070809"}
    assert query(
        database,
        "SELECT count(*) FROM pg_index JOIN pg_class ON pg_class.oid = indexrelid "
        "WHERE relname LIKE 'health_gpu%pkey' AND NOT indisvalid",
    ) == ["0"]
    assert query(database, "SELECT tableoid::regclass FROM health_gpusample WHERE gpu_id = 7") == [
        "health_gpusample_p2032070809"
    ]
    assert query(database, "SELECT tableoid::regclass FROM health_gpurollup WHERE gpu_id = 7") == [
        "health_gpurollup_p20320708"
    ]


def test_a_restore_into_a_new_database_goes_through_and_one_over_it_with_clean_does_not(
    dump, scratch
):
    # Into a new, empty database: not one error, in one transaction.
    first = restore(dump, scratch, "--exit-on-error", "--single-transaction")
    assert first.returncode == 0, first.stderr
    assert_restored(scratch)

    # Over the restored one, --clean (with or without --if-exists) reports errors: pg_dump
    # writes a DROP CONSTRAINT for each partition's primary key, which is inherited from the
    # parent's and cannot be dropped on its own. Hence the docs: drop and create the
    # database, then restore.
    clean = restore(dump, scratch, "--clean", "--if-exists")
    assert clean.returncode != 0
    assert 'cannot drop inherited constraint "health_gpusample_p2032070809_pkey"' in clean.stderr
