"""The settings module refuses to start on unsafe or unusable configuration."""

import os
import socket
import subprocess
import sys

import pytest
from django.db import connections

from gpuadmin.env import parse_database_url
from gpuadmin.postgres import base as gpuadmin_postgres
from tests.conftest import REPO_DIR

GOOD_KEY = "k" * 40


def import_settings(
    env: dict[str, str], code: str = "import gpuadmin.settings"
) -> subprocess.CompletedProcess[str]:
    base = {
        "PATH": "/usr/bin:/bin",
        "DATABASE_URL": "postgresql://u@h/db",
        "REDIS_URL": "redis://h",
    }
    return subprocess.run(
        [sys.executable, "-c", code],
        env={**base, **env},
        capture_output=True,
        text=True,
        cwd=REPO_DIR,
    )


def test_production_refuses_the_dev_secret_key():
    from gpuadmin.settings import DEV_SECRET_KEY

    result = import_settings({"DEBUG": "false", "SECRET_KEY": DEV_SECRET_KEY})
    assert result.returncode == 1
    assert "SECRET_KEY is unset or is the development key while DEBUG is off" in result.stderr


def test_production_refuses_a_missing_secret_key():
    result = import_settings({})
    assert result.returncode == 1
    assert "SECRET_KEY is unset" in result.stderr


def test_debug_may_use_the_dev_key_and_a_real_key_works():
    assert import_settings({"DEBUG": "true"}).returncode == 0
    assert import_settings({"SECRET_KEY": GOOD_KEY}).returncode == 0


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"SECRET_KEY": "short"}, "SECRET_KEY must be at least 32 characters"),
        ({"SECRET_KEY": GOOD_KEY, "DEBUG": "perhaps"}, "DEBUG='perhaps' is not a boolean"),
        ({"SECRET_KEY": GOOD_KEY, "GPUADMIN_NVML": "cuda"}, "GPUADMIN_NVML='cuda' must be one of"),
        ({"SECRET_KEY": GOOD_KEY, "DATABASE_URL": ""}, "DATABASE_URL and REDIS_URL must be set"),
        ({"SECRET_KEY": GOOD_KEY, "DATABASE_URL": "sqlite:///x"}, "needs PostgreSQL"),
        (
            {"SECRET_KEY": GOOD_KEY, "GPUADMIN_DEFAULT_UNIX_ACCOUNT": "-oProxy"},
            "GPUADMIN_DEFAULT_UNIX_ACCOUNT='-oProxy' is not a Unix user name",
        ),
    ],
)
def test_bad_settings_fail_loudly(env, message):
    result = import_settings(env)
    assert result.returncode == 1
    assert message in result.stderr


def test_database_settings_come_from_the_url(settings):
    assert parse_database_url(os.environ["DATABASE_URL"])["ENGINE"] == "gpuadmin.postgres"
    # The tests' engine is gpuadmin's with a faster flush (tests/postgres_backend).
    assert isinstance(connections["default"], gpuadmin_postgres.DatabaseWrapper)
    assert settings.CELERY_BROKER_URL.startswith("redis://")
    assert settings.CELERY_RESULT_BACKEND == settings.CELERY_BROKER_URL


def test_a_node_agent_needs_no_secret_key_and_never_holds_the_one_it_is_given():
    show_key = "from gpuadmin import settings; print(settings.SECRET_KEY)"
    alone = import_settings({"GPUADMIN_AGENT": "1", "DATABASE_URL": ""}, show_key)
    assert alone.returncode == 0, alone.stderr
    given = import_settings({"GPUADMIN_AGENT": "1", "SECRET_KEY": GOOD_KEY}, show_key)
    assert given.returncode == 0, given.stderr
    assert GOOD_KEY not in given.stdout
    assert len(given.stdout.strip()) >= 32


@pytest.mark.parametrize(
    ("env", "url"),
    [
        ({}, "http://127.0.0.1:8000"),  # was http://localhost:8000 whatever the bind
        ({"GPUADMIN_BIND": "127.0.0.1:8101"}, "http://127.0.0.1:8101"),
        ({"GPUADMIN_BIND": "0.0.0.0:8000"}, f"http://{socket.gethostname()}:8000"),
        ({"GPUADMIN_BIND": "[::1]:8000"}, "http://[::1]:8000"),
        (
            {"GPUADMIN_BIND": "0.0.0.0:8000", "GPUADMIN_PUBLIC_URL": "https://gpus.example.org"},
            "https://gpus.example.org",
        ),
    ],
)
def test_the_public_url_follows_the_bind_address_unless_set(env, url):
    code = "from gpuadmin import settings; print(settings.GPUADMIN_PUBLIC_URL)"
    result = import_settings({"SECRET_KEY": GOOD_KEY, **env}, code)
    assert (result.returncode, result.stdout.strip()) == (0, url), result.stderr


def test_a_bad_bind_address_fails_loudly():
    result = import_settings({"SECRET_KEY": GOOD_KEY, "GPUADMIN_BIND": "8000"})
    assert result.returncode == 1
    assert "GPUADMIN_BIND='8000' is not HOST:PORT" in result.stderr
