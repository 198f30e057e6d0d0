"""The embedded PostgreSQL and Redis: start, reuse, stop, and recovery after a killed run."""

import os
import signal
import stat
import time
from pathlib import Path
from urllib.parse import urlsplit

import psycopg
import pytest
import redis

from gpuadmin.embedded import EmbeddedServices, ensure_service_urls


def wait_gone(pid: int, timeout: float = 10) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.05)
    return False


@pytest.fixture
def services(server_dir):
    started = EmbeddedServices(server_dir / "data")
    yield started
    started.stop(everything=True)


def test_start_gives_working_servers_and_stop_leaves_no_process(services):
    urls = services.start()
    assert services.started == ["postgres", "redis"]
    with psycopg.connect(urls["DATABASE_URL"]) as conn:
        assert conn.execute("SELECT current_database()").fetchone() == ("gpuadmin",)
        assert conn.info.server_version >= 160000
    assert redis.Redis.from_url(urls["REDIS_URL"]).ping() is True
    postgres_pid = int((services.pgdata / "postmaster.pid").read_text().split()[0])
    redis_pid = int((services.redis_dir / "redis.pid").read_text())

    services.stop()

    assert wait_gone(postgres_pid) and wait_gone(redis_pid)
    assert services.status() == {"DATABASE_URL": None, "REDIS_URL": None}


def test_the_embedded_redis_answers_only_with_its_password_which_no_command_line_shows(services):
    """A job on the host (``gpuadmin up``) reaches 127.0.0.1, but not the password: it is in
    the URL the processes get and in a file only their account reads."""
    url = urlsplit(services.start(database=False)["REDIS_URL"])
    assert url.password
    assert redis.Redis.from_url(url.geturl()).ping() is True
    with pytest.raises(redis.exceptions.AuthenticationError):
        redis.Redis(host="127.0.0.1", port=url.port).ping()
    redis_pid = int((services.redis_dir / "redis.pid").read_text())
    assert url.password not in Path(f"/proc/{redis_pid}/cmdline").read_text()
    assert stat.S_IMODE((services.redis_dir / "redis.conf").stat().st_mode) == 0o600


def test_a_second_start_adopts_running_servers_without_owning_them(services):
    first = services.start()
    second = EmbeddedServices(services.data_dir)
    assert second.start() == first
    assert second.started == []
    second.release()  # another user remains: nothing stops
    assert services.status() == first


def test_servers_of_a_killed_run_are_recovered(services):
    services.start()
    redis_pid = int((services.redis_dir / "redis.pid").read_text())
    postgres_pid = int((services.pgdata / "postmaster.pid").read_text().split()[0])
    os.kill(redis_pid, signal.SIGKILL)
    os.kill(postgres_pid, signal.SIGKILL)
    assert wait_gone(redis_pid) and wait_gone(postgres_pid)
    assert (services.redis_dir / "redis.pid").exists()  # stale files a crash leaves behind
    assert (services.pgdata / "postmaster.pid").exists()

    fresh = EmbeddedServices(services.data_dir)
    urls = fresh.start()

    assert fresh.started == ["postgres", "redis"]
    assert redis.Redis.from_url(urls["REDIS_URL"]).ping() is True
    with psycopg.connect(urls["DATABASE_URL"]) as conn:
        assert conn.execute("SELECT 1").fetchone() == (1,)
    fresh.stop()


def test_given_urls_are_used_and_nothing_is_started(monkeypatch, tmp_path):
    monkeypatch.setenv("DATABASE_URL", "postgresql://db.example/x")
    monkeypatch.setenv("REDIS_URL", "redis://cache.example/0")
    assert ensure_service_urls(tmp_path / "data") is None
    assert not (tmp_path / "data").exists()


def run_as_other_process(services: EmbeddedServices, code: str) -> None:
    """Start and release from a child process, as a second `gpuadmin` command would."""
    import subprocess
    import sys

    from tests.conftest import REPO_DIR

    script = (
        "from pathlib import Path; from gpuadmin.embedded import EmbeddedServices; "
        f"s = EmbeddedServices(Path({str(services.data_dir)!r})); {code}"
    )
    subprocess.run([sys.executable, "-c", script], check=True, cwd=REPO_DIR)


def test_servers_stop_when_their_last_user_releases_them(services):
    urls = services.start()
    other = EmbeddedServices(services.data_dir)
    other.start()  # a second command in this process adopts the servers

    run_as_other_process(services, "s.start(); s.release()")  # a third one came and went
    services.release()
    assert services.status() == urls  # `other` still uses them

    other.release()
    assert services.status() == {"DATABASE_URL": None, "REDIS_URL": None}


def test_servers_started_to_keep_running_outlive_their_users(services):
    urls = services.start(keep_running=True)
    run_as_other_process(services, "s.start(); s.release()")
    assert services.status() == urls
