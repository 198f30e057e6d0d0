"""The API against its own OpenAPI schema: schemathesis drives the real web server (granian as
`gpuadmin serve` runs it, on this session's PostgreSQL and Redis) as a signed-in user and as an
admin, for a bounded time each. No response may be a server error, and every response must
match the schema. The placement loop and agents do not run."""

from __future__ import annotations

import json
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from django.contrib.auth import get_user_model

from gpuadmin.access.services import create_token
from scheduling.jobs import submission
from tests.conftest import REPO_DIR, session_database_url
from tests.scheduling.conftest import add_sim_node

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]

# Seconds of generated requests per identity (schemathesis fuzzes on until they are spent),
# and the cases both identities' runs must reach together: 1,000 in 2 x 30 s, as many a second
# as 2,000 in 2 x 60 s (every operation is tested by each identity whatever the budget).
FUZZ_S = 30
MIN_CASES = 1000
CHECKS = "not_a_server_error,response_schema_conformance,content_type_conformance"
SCHEMATHESIS = Path(sys.executable).with_name("schemathesis")
# No agent runs here: discovery answers its documented 503, naming why; no model is configured
# either: the assistant answers its documented 503. Nothing else may.
CONFIG = """
[[operations]]
include-path = "/gpu/discover"
checks.not_a_server_error.expected-statuses = ["2xx", "3xx", "4xx", "503"]

[[operations]]
include-path = "/api/v1/assistant/ask/"
checks.not_a_server_error.expected-statuses = ["2xx", "3xx", "4xx", "503"]
"""


@pytest.fixture
def web_server(gpuadmin_env, free_port, tmp_path) -> Iterator[str]:
    """`gpuadmin serve` on this session's test database, once it answers; its base URL."""
    env = {**gpuadmin_env, "DATABASE_URL": session_database_url()}
    log = tmp_path / "web.log"
    server = subprocess.Popen(
        [sys.executable, "-m", "gpuadmin", "serve", "--bind", f"127.0.0.1:{free_port}"],
        env=env,
        cwd=REPO_DIR,
        stdout=log.open("w"),
        stderr=subprocess.STDOUT,
    )
    base_url = f"http://127.0.0.1:{free_port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                urllib.request.urlopen(f"{base_url}/-/health", timeout=5)
                break
            except OSError:
                assert server.poll() is None, log.read_text()
                assert time.monotonic() < deadline, "the web server never answered"
                time.sleep(0.3)
        yield base_url
    finally:
        server.terminate()
        server.wait(timeout=30)


def fuzz(base_url: str, token: str, report: Path) -> dict:
    """One schemathesis run as the token's owner: its JSON report, with its output."""
    config = report.with_suffix(".toml")
    config.write_text(CONFIG)
    argv = [
        str(SCHEMATHESIS), "--config-file", str(config), "run", f"{base_url}/api/schema/",
        "--checks", CHECKS,
        "--header", f"Authorization: Bearer {token}",
        "--max-time", str(FUZZ_S),
        "--workers", "1",  # hypothesis on CPython 3.11 is not thread-safe (ast.parse)
        "--seed", "1",
        "--report", "json", "--report-json-path", str(report),
        # Revoking its own token would leave the rest of the run signed out (tests/gpuadmin/
        # test_permission_matrix.py covers that endpoint).
        "--exclude-path-regex", r"^/api/v1/tokens/\{id\}/$",
    ]  # fmt: skip
    run = subprocess.run(
        argv, capture_output=True, text=True, timeout=FUZZ_S + 120, cwd=report.parent
    )
    assert report.exists(), run.stdout[-5000:] + run.stderr[-5000:]
    return {**json.loads(report.read_text()), "output": run.stdout}


def test_no_request_gets_a_server_error_or_breaks_the_schema(web_server, tmp_path, report_figure):
    users = get_user_model().objects
    people = [users.create_user("fuzz-user"), users.create_user("fuzz-admin", is_staff=True)]
    add_sim_node("fuzz-01")
    for owner in people:  # something to find behind the small ids fuzzers try
        submission.submit_job(owner, command=["sleep", "60"], gpu_count=1)
        submission.submit_job(owner, command=["true"], hold=True)
    reports = {}
    for owner in people:
        _, key = create_token(owner, "schemathesis")
        reports[owner.username] = report = fuzz(web_server, key, tmp_path / f"{owner}.json")
        report_figure(f"schemathesis as {owner}: {report['test_cases']['generated']} cases")
    server_log = (tmp_path / "web.log").read_text()[-10000:]  # tracebacks of any 500
    for report in reports.values():
        assert not report["failures"] + report["errors"], report["output"] + server_log
        assert report["operations"]["tested"] == report["operations"]["selected"]
    assert sum(report["test_cases"]["generated"] for report in reports.values()) >= MIN_CASES


def test_long_urls_reach_the_api_up_to_the_servers_limit(web_server):
    """A long filter URL is answered by the API, in JSON naming the field; past the HTTP
    library's 65,534 bytes, by the server's own 414 (docs/reference/api.md,
    "Limits and headers")."""
    _, key = create_token(get_user_model().objects.create_user("long-urls"), "long-urls")

    def get(length: int) -> tuple[int, bytes]:
        request = urllib.request.Request(
            f"{web_server}/api/v1/jobs/?state={'a' * length}",
            headers={"Authorization": f"Bearer {key}"},
        )
        try:
            with urllib.request.urlopen(request, timeout=30) as response:
                return response.status, response.read()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read()

    status, body = get(60_000)
    assert status == 400 and "state" in json.loads(body), body[:200]
    assert get(70_000)[0] == 414
