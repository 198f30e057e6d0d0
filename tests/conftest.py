"""Fixtures shared by every suite."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import urllib.error
import urllib.request
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import NoReturn

import pytest

REPO_DIR = Path(__file__).resolve().parent.parent
# The application's packages (what the settings, command and architecture tests read).
APP_PACKAGES = ("gpuadmin", "inventory", "health", "scheduling", "integrations", "assistant")
SHARED_DIR = REPO_DIR.parent / "shared"


def pytest_unconfigure(config: pytest.Config) -> None:
    """Release the embedded servers tests/settings.py used (none when URLs were given)."""
    settings_module = sys.modules.get("tests.settings")
    services = getattr(settings_module, "EMBEDDED_SERVICES", None)
    if services is not None:
        services.release()
    if not hasattr(config, "workerinput"):  # the controller, once every worker has ended
        from scheduling.agent.isolation.cgroups import host_cgroups, remove_tree

        if root := os.environ.get("GPUADMIN_CGROUP_ROOT"):
            remove_tree(host_cgroups("auto", root))


# Session fixtures that start a whole system: under ``--dist loadgroup`` (the Makefile's) the
# tests that use one run in one test process, which starts it once, not once per process.
SESSION_SYSTEMS = {
    "ray_cluster": "ray",
    "slurm_cluster": "slurm",
    "sentinel_redis": "sentinel",
    "built_docs": "docs",
}


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist reads the groups
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        fixtures = getattr(item, "fixturenames", ())
        for fixture, group in SESSION_SYSTEMS.items():
            if fixture in fixtures:
                item.add_marker(pytest.mark.xdist_group(group))


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """The figures tests reported (``report_figure``), after the run's summary."""
    figures = [
        f"{report.nodeid}: {value}"
        for outcome in ("passed", "failed")
        for report in terminalreporter.stats.get(outcome, [])
        for name, value in getattr(report, "user_properties", ())
        if name == "figure"
    ]
    if figures:
        terminalreporter.write_sep("=", "figures")
        for line in figures:
            terminalreporter.write_line(line)


@pytest.fixture
def report_figure(request: pytest.FixtureRequest) -> Callable[[str], None]:
    """Show a line (counts, timings) in the run's "figures" section, passed or failed: under
    pytest-xdist a worker's own output never reaches the terminal, its reports do."""

    def report(line: str) -> None:
        request.node.user_properties.append(("figure", line))

    return report


@pytest.fixture(autouse=True)
def fresh_fleet_shape() -> None:
    """Submissions check the fleet's shape, and placement passes read fair-share usage and
    the history of finished jobs, through short caches; each test builds its own."""
    from scheduling.jobs.shape import FleetShape
    from scheduling.loop import history
    from scheduling.loop import snapshot as loop_snapshot

    FleetShape.forget()
    loop_snapshot.forget_usage()
    history.forget()


@pytest.fixture(autouse=True)
def no_cached_tokens() -> None:
    """API tokens resolved and node credentials loaded by an earlier test are not trusted by
    this one."""
    from gpuadmin.access.nodes import ORDER_KEYS
    from gpuadmin.access.tokens import TOKENS

    TOKENS.clear()
    ORDER_KEYS.clear()


@pytest.fixture(autouse=True)
def nodes_have_credentials() -> Iterator[None]:
    """Every node added to the catalog has a credential, as a registered one does (its agent
    registers through signed reports), so that orders can be signed for it; a test of a node
    without one revokes it (``revoke_credentials``)."""
    from django.db.models.signals import post_save

    from gpuadmin.access.models import NodeCredential
    from inventory.models import Node

    def issue(sender: type, instance: Node, created: bool, **kwargs: object) -> None:
        if created and not NodeCredential.objects.filter(node=instance.hostname).exists():
            NodeCredential.objects.create(node=instance.hostname, salt=NodeCredential.new_salt())

    post_save.connect(issue, sender=Node, dispatch_uid="tests.nodes_have_credentials")
    yield
    post_save.disconnect(sender=Node, dispatch_uid="tests.nodes_have_credentials")


def missing(message: str) -> NoReturn:
    """A real part the tests need is missing (``message`` says which and how to get it): a
    failure under CI, whose setup must install it, else a skip."""
    if os.environ.get("CI"):
        pytest.fail(message)
    pytest.skip(message)


def unused_port() -> int:
    """A TCP port of 127.0.0.1 nothing listens on now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture
def free_port() -> int:
    return unused_port()


@pytest.fixture
def server_dir() -> Iterator[Path]:
    """A scratch directory for embedded servers, outside pytest's tmp_path.

    As root, the embedded PostgreSQL runs as the `pgserver` user, which must traverse every
    parent directory; pytest resets its own base directory to mode 0700 whenever a session
    starts, which would lock a running server out of its data.
    """
    path = Path(tempfile.mkdtemp(prefix="gpuadmin-test-"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def session_database_url() -> str:
    """DATABASE_URL of the database this test session runs on (for child processes)."""
    from django.db import connection

    db = connection.settings_dict
    credentials = f"{db['USER']}:{db['PASSWORD']}"
    if db["HOST"].startswith("/"):
        return f"postgresql://{credentials}@/{db['NAME']}?host={db['HOST']}"
    port = f":{db['PORT']}" if db["PORT"] else ""
    return f"postgresql://{credentials}@{db['HOST'] or 'localhost'}{port}/{db['NAME']}"


def agent_env(env: dict[str, str], hostname: str) -> dict[str, str]:
    """``env`` as a node agent of ``hostname`` gets it: its node credential (issued in this
    session's database), and no database of its own."""
    from gpuadmin.access.nodes import node_token

    agent = {name: value for name, value in env.items() if name != "DATABASE_URL"}
    agent["GPUADMIN_NODE_TOKEN"] = node_token(hostname, actor_name="tests")
    return agent


def forget_wakes() -> None:
    """Drop the loop's marks of a pass asked for and of a woken pass running, whose passes
    will never run here: left in place, a wake mark holds every wake back until it expires
    (``dispatch.WAKE_TTL_S``)."""
    from inventory import live
    from scheduling.loop import dispatch

    live.client().delete(dispatch.wake_key(), dispatch.running_key())


def drain_central_queue() -> Counter[str]:
    """Empty this session's central queue of what earlier tests sent with no worker to take
    it (placement passes, reports): a central worker started now would run those tasks
    against this test's database. Returns how many of each task were dropped. The loop's
    wake marks go with them (``forget_wakes``): a dropped pass never clears its own."""
    from celery import current_app
    from django.conf import settings

    from inventory import live

    queue = settings.GPUADMIN_CENTRAL_QUEUE
    dropped = Counter(
        json.loads(message)["headers"]["task"] for message in live.client().lrange(queue, 0, -1)
    )
    with current_app.connection_for_write() as connection:
        connection.default_channel.queue_purge(queue)
    forget_wakes()
    return dropped


@pytest.fixture
def gpuadmin_env(tmp_path: Path) -> dict[str, str]:
    """Environment for a `gpuadmin` child process sharing this session's servers, whose
    central queue holds nothing from earlier tests."""
    if dropped := drain_central_queue():
        # Shown when a test fails.
        print(f"central queue: dropped {dropped.total()} tasks of earlier tests: {dropped}")  # noqa: T201
    return child_env(tmp_path / "data")


def child_env(data_dir: Path) -> dict[str, str]:
    """Environment for a `gpuadmin` child process sharing this session's servers, its data
    in ``data_dir`` (``gpuadmin_env``'s, for a process that outlives one test)."""
    from django.conf import settings

    env = dict(os.environ)
    env.update(
        {
            "DATABASE_URL": os.environ["DATABASE_URL"],
            "REDIS_URL": settings.REDIS_URL,
            "GPUADMIN_DATA_DIR": str(data_dir),
            "DJANGO_SETTINGS_MODULE": "gpuadmin.settings",
            "PYTHONUNBUFFERED": "1",
        }
    )
    return env


@pytest.fixture
def run_gpuadmin(gpuadmin_env: dict[str, str]) -> Iterator[object]:
    """Run `gpuadmin ARGS...` to completion and return the CompletedProcess."""

    def run(*args: str, env: dict[str, str] | None = None, timeout: float = 120):
        return subprocess.run(
            [sys.executable, "-m", "gpuadmin", *args],
            env=env or gpuadmin_env,
            capture_output=True,
            text=True,
            timeout=timeout,
            cwd=REPO_DIR,
        )

    yield run


@pytest.fixture(scope="session")
def built_docs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The documentation site built now from docs/ as `make docs` builds it, into a folder of
    the session's own; a skip (a failure under CI) when the site's toolchain is missing."""
    mkdocs = REPO_DIR / os.environ.get("DOCS_VENV", ".venv-docs") / "bin" / "mkdocs"
    if not mkdocs.exists():
        missing(f"{mkdocs} is missing: `make docs` installs it")
    site = tmp_path_factory.mktemp("docs") / "site"
    subprocess.run(
        [str(mkdocs), "build", "--strict", "--quiet", "--site-dir", str(site)],
        cwd=REPO_DIR,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
        check=True,
        timeout=300,
    )
    return site


@pytest.fixture
def docs_server(
    built_docs: Path, gpuadmin_env: dict[str, str], free_port: int, tmp_path: Path
) -> Iterator[str]:
    """`gpuadmin serve` (granian, one worker) serving ``built_docs`` under /docs/; its base
    URL."""
    from tests.waiting import wait_for

    bind = f"127.0.0.1:{free_port}"
    log = tmp_path / "serve.log"
    with log.open("wb") as output:
        process = subprocess.Popen(
            [sys.executable, "-m", "gpuadmin", "serve", "--bind", bind, "--workers", "1"],
            env={**gpuadmin_env, "GPUADMIN_DOCS_DIR": str(built_docs)},
            cwd=REPO_DIR,
            stdout=output,
            stderr=subprocess.STDOUT,
        )

    def answers() -> bool:
        assert process.poll() is None, f"gpuadmin serve exited:\n{log.read_text()}"
        try:
            urllib.request.urlopen(f"http://{bind}/docs/", timeout=2).close()
        except urllib.error.HTTPError:
            return True  # it answered
        except OSError:
            return False
        return True

    try:
        wait_for(answers, 60, "gpuadmin serve to answer")
        yield f"http://{bind}"
    finally:
        process.terminate()
        process.wait(timeout=30)
