"""The client's choice of version and its errors, against a small HTTP server that answers
with captured responses of real servers (captures/): what a 22.05 server cannot show."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from integrations.slurm.rest.client import SlurmRestClient, SlurmRestError

CAPTURES = Path(__file__).parent / "captures"

# path -> (status, body); what a test's server answers, anything else a 404
Answers = dict[str, tuple[int, bytes]]
# its base URL, its answers (each test fills them), and each request it got: method, path,
# headers, body
Request = tuple[str, str, dict[str, str], bytes]
Server = tuple[str, Answers, list[Request]]


def openapi(*versions: str) -> tuple[int, bytes]:
    paths = {f"/slurm/{version}/{kind}": {} for version in versions for kind in ("nodes", "jobs")}
    paths["/slurmdb/v0.0.41/jobs"] = {}
    return 200, json.dumps({"openapi": "3.0.2", "paths": paths}).encode()


def captured(version: str, name: str) -> tuple[int, bytes]:
    return 200, (CAPTURES / version / f"{name}.json").read_bytes()


@pytest.fixture
def server() -> Iterator[Server]:
    """An HTTP server on a port of its own that gives the answers tests put in."""
    answers: Answers = {}
    seen: list[Request] = []

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - http.server's names
            length = int(self.headers.get("Content-Length") or 0)
            seen.append((self.command, self.path, dict(self.headers), self.rfile.read(length)))
            status, body = answers.get(f"{self.command} {self.path}", (404, b"Not Found"))
            self.send_response(status)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        do_POST = do_GET  # noqa: N815

        def log_message(self, *args: object) -> None:
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}", answers, seen
    finally:
        httpd.shutdown()
        httpd.server_close()


def test_newest_known_version_is_read_with_a_token(server: Server) -> None:
    url, answers, seen = server
    answers["GET /openapi/v3"] = openapi("v0.0.40", "v0.0.41", "v0.0.99")
    answers["GET /slurm/v0.0.41/nodes"] = captured("v0.0.41", "slurm-node-with-gpus-model-mixed")
    answers["GET /slurm/v0.0.41/partitions"] = captured("v0.0.41", "slurm-partitions")
    answers["GET /slurm/v0.0.41/jobs"] = captured("v0.0.41", "slurm-job-gpus-multi-types")
    client = SlurmRestClient(url, user="alice", token="jwt")
    assert client.offered_versions() == ("v0.0.99", "v0.0.41", "v0.0.40")
    state = client.read_cluster()
    assert state.version == "v0.0.41"
    assert [node.name for node in state.nodes] == ["gpu1"]
    assert [part.name for part in state.partitions] == ["standard", "ia"]
    assert state.jobs[0].gpus == {"ia2": (0, 2)}
    assert all(
        (headers["X-SLURM-USER-NAME"], headers["X-SLURM-USER-TOKEN"]) == ("alice", "jwt")
        for _, _, headers, _ in seen
    )


def test_the_older_openapi_path_is_asked_when_v3_is_missing(server: Server) -> None:
    url, answers, _ = server
    answers["GET /openapi"] = openapi("v0.0.40")
    assert SlurmRestClient(url, user="u", token="t").version() == "v0.0.40"


def test_a_server_without_a_version_we_read(server: Server) -> None:
    url, answers, _ = server
    answers["GET /openapi/v3"] = openapi("v0.0.36", "v0.0.39")
    offers = r"offers v0\.0\.39, v0\.0\.36; gpuadmin reads v0\.0\.38"
    with pytest.raises(SlurmRestError, match=offers):
        SlurmRestClient(url, user="u", token="t").version()


def test_a_refused_token_names_slurms_error(server: Server) -> None:
    url, answers, _ = server
    answers["GET /openapi/v3"] = openapi("v0.0.41")
    answers["GET /slurm/v0.0.41/nodes"] = (500, captured("v0.0.41", "slurm-jwt-invalid-token")[1])
    with pytest.raises(SlurmRestError) as refused:
        SlurmRestClient(url, user="u", token="expired").read_cluster()
    assert str(refused.value) == (
        f"slurmrestd at {url} answered GET /slurm/v0.0.41/nodes with HTTP 500 and errors: "
        "Unable to query jobs: Protocol authentication error (error 1007 in slurm_load_jobs())"
        " (slurmctld refused the token: invalid, expired, or not for this user)"
    )


def test_a_401_is_a_refusal(server: Server) -> None:
    url, answers, _ = server
    answers["GET /openapi/v3"] = (401, b"Authentication failure")
    with pytest.raises(SlurmRestError, match=r"refused the token for GET /openapi/v3: HTTP 401"):
        SlurmRestClient(url, user="u", token="t").version()


def test_an_answer_that_is_no_json(server: Server) -> None:
    url, answers, _ = server
    answers["GET /openapi/v3"] = (200, b"<html>proxy login</html>")
    with pytest.raises(SlurmRestError, match=r"HTTP 200 and no JSON object: '<html>proxy login"):
        SlurmRestClient(url, user="u", token="t").version()


def test_an_answer_of_another_shape(server: Server) -> None:
    url, answers, _ = server
    answers["GET /openapi/v3"] = openapi("v0.0.40")
    answers["GET /slurm/v0.0.40/nodes"] = captured("v0.0.38", "slurm-nodes")  # state is a string
    other_shape = r"GET /slurm/v0\.0\.40/nodes is not v0\.0\.40's shape: FieldError: state is"
    with pytest.raises(SlurmRestError, match=other_shape):
        SlurmRestClient(url, user="u", token="t").read_cluster()


def test_a_missing_endpoint(server: Server) -> None:
    url, answers, _ = server
    answers["GET /openapi/v3"] = openapi("v0.0.41")
    with pytest.raises(SlurmRestError, match=r"has no GET /slurm/v0\.0\.41/nodes \(HTTP 404\)"):
        SlurmRestClient(url, user="u", token="t").read_cluster()


def test_drain_node_posts_the_versions_update(server: Server) -> None:
    url, answers, seen = server
    answers["GET /openapi/v3"] = openapi("v0.0.41")
    answers["POST /slurm/v0.0.41/node/gpu01"] = (200, b'{"errors": [], "warnings": []}')
    SlurmRestClient(url, user="operator", token="t").drain_node("gpu01", "GPU 2 fenced")
    method, path, headers, body = seen[-1]
    assert (method, path, headers["Content-Type"]) == (
        "POST",
        "/slurm/v0.0.41/node/gpu01",
        "application/json",
    )
    assert json.loads(body) == {"state": ["DRAIN"], "reason": "GPU 2 fenced"}
