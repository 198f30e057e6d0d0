"""A slurmrestd client on the standard library: one cluster's nodes, partitions and jobs, read
with the newest OpenAPI version both the server and gpuadmin's parsers speak.

    client = SlurmRestClient("http://slurm-head:6820", user="gpuadmin", token=jwt)
    client = SlurmRestClient("/run/slurmrestd/slurmrestd.socket")  # local authentication
    state = client.read_cluster()

slurmrestd authenticates a request either by a JWT (``X-SLURM-USER-NAME`` and
``X-SLURM-USER-TOKEN``: the server runs ``rest_auth/jwt``) or, on its Unix socket only, by the
connecting process's user (``rest_auth/local``: no token is sent).
"""

from __future__ import annotations

import http.client
import json
import re
import socket
from collections.abc import Callable
from typing import Any, TypeVar
from urllib.parse import quote, urlsplit

from integrations.slurm.rest import versions
from integrations.slurm.rest.fields import FieldError, with_held_gpus
from integrations.slurm.rest.model import ClusterState

# Where a server describes itself: its OpenAPI document (v3 since 23.02; 22.05 has both).
OPENAPI_PATHS = ("/openapi/v3", "/openapi")
_SLURM_PATH = re.compile(r"^/slurm/(v\d+\.\d+\.\d+)/")
Item = TypeVar("Item")


class SlurmRestError(Exception):
    """slurmrestd could not be read: unreachable, refusing us, or answering what we cannot use.
    The message names the server and what went wrong."""


class _UnixConnection(http.client.HTTPConnection):
    """HTTP over a Unix socket."""

    def __init__(self, path: str, timeout: float) -> None:
        super().__init__("localhost", timeout=timeout)
        self.socket_path = path

    def connect(self) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(self.timeout)
        self.sock.connect(self.socket_path)


class SlurmRestClient:
    """One slurmrestd: ``address`` is ``http(s)://host:port`` or a Unix socket's path
    (``/run/slurmrestd.sock`` or ``unix:/run/slurmrestd.sock``). With ``token``, requests carry
    a JWT for ``user``; without, the server must authenticate the socket's peer (local mode)."""

    def __init__(
        self, address: str, *, user: str = "", token: str = "", timeout_s: float = 10.0
    ) -> None:
        self.address = address
        self.user = user
        self.token = token
        self.timeout_s = timeout_s
        self._version: str | None = None

    # ------------------------------------------------------------------ reading

    def read_cluster(self) -> ClusterState:
        """The cluster's nodes, partitions and jobs now."""
        version = self.version()
        parser = versions.PARSERS[version]
        nodes = self._items(version, "nodes", parser.node)
        partitions = self._items(version, "partitions", parser.partition)
        jobs = self._items(version, "jobs", parser.job)
        return ClusterState(
            version=version,
            nodes=with_held_gpus(nodes, jobs),
            partitions=partitions,
            jobs=jobs,
        )

    def drain_node(self, name: str, reason: str) -> None:
        """Drain node ``name`` with ``reason`` (the token's user must be a Slurm operator).
        v0.0.38 (Slurm 22.05) cannot update nodes: an error that says so."""
        version = self.version()
        drain = versions.PARSERS[version].drain
        if drain is None:
            raise SlurmRestError(
                f"{self._where()} speaks {version}, which cannot update nodes (Slurm 23.11's "
                f"v0.0.40 can): drain {name} with scontrol update nodename={name} state=DRAIN"
            )
        self._post(f"/slurm/{version}/node/{quote(name, safe='')}", drain(reason))

    def offered_versions(self) -> tuple[str, ...]:
        """The ``/slurm/vX.Y.Z/`` versions the server's OpenAPI document lists, newest first."""
        document: dict[str, Any] | None = None
        for path in OPENAPI_PATHS:
            document = self._ask("GET", path)
            if document is not None:
                break
        if document is None:
            raise SlurmRestError(f"{self._where()} has no OpenAPI document at {OPENAPI_PATHS}")
        paths = document.get("paths")
        if not isinstance(paths, dict):
            raise SlurmRestError(f"{self._where()}'s OpenAPI document lists no paths")
        offered = {match[1] for path in paths if (match := _SLURM_PATH.match(path))}
        return tuple(sorted(offered, key=versions.version_key, reverse=True))

    def version(self) -> str:
        """The newest version both the server and a parser speak (asked once per client)."""
        if self._version is None:
            offered = self.offered_versions()
            chosen = versions.newest_known(offered)
            if chosen is None:
                raise SlurmRestError(
                    f"{self._where()} offers {', '.join(offered) or 'no Slurm API'}; gpuadmin "
                    f"reads {', '.join(versions.PARSERS)}"
                )
            self._version = chosen
        return self._version

    def _items(
        self, version: str, kind: str, parse: Callable[[dict[str, Any]], Item]
    ) -> tuple[Item, ...]:
        path = f"/slurm/{version}/{kind}"
        answer = self._get(path)
        try:
            return tuple(parse(item) for item in answer[kind])
        except (FieldError, KeyError, TypeError, AttributeError, ValueError) as error:
            raise SlurmRestError(
                f"{self._where()}'s answer to GET {path} is not {version}'s shape: "
                f"{type(error).__name__}: {error}"
            ) from error

    # ------------------------------------------------------------------ HTTP

    def _where(self) -> str:
        return f"slurmrestd at {self.address}"

    def _connection(self) -> http.client.HTTPConnection:
        if not self.address.startswith(("http://", "https://")):
            return _UnixConnection(self.address.removeprefix("unix:"), self.timeout_s)
        url = urlsplit(self.address)
        if url.hostname is None:
            raise SlurmRestError(f"{self.address!r} names no host")
        kind = http.client.HTTPSConnection if url.scheme == "https" else http.client.HTTPConnection
        return kind(url.hostname, url.port, timeout=self.timeout_s)

    def _headers(self) -> dict[str, str]:
        headers = {"Accept": "application/json"}
        if self.token:
            headers["X-SLURM-USER-NAME"] = self.user
            headers["X-SLURM-USER-TOKEN"] = self.token
        return headers

    def _get(self, path: str) -> dict[str, Any]:
        return self._found("GET", path, self._ask("GET", path))

    def _post(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        return self._found("POST", path, self._ask("POST", path, body))

    def _found(self, method: str, path: str, answer: dict[str, Any] | None) -> dict[str, Any]:
        if answer is None:
            raise SlurmRestError(f"{self._where()} has no {method} {path} (HTTP 404)")
        return answer

    def _ask(
        self, method: str, path: str, body: dict[str, Any] | None = None
    ) -> dict[str, Any] | None:
        """``method path``'s JSON object; None for a 404. Raises SlurmRestError for anything
        else than a JSON object without errors."""
        headers = self._headers()
        payload = None
        if body is not None:
            payload = json.dumps(body).encode()
            headers["Content-Type"] = "application/json"
        connection = self._connection()
        try:
            connection.request(method, path, body=payload, headers=headers)
            response = connection.getresponse()
            answer_body = response.read()
        except (OSError, http.client.HTTPException) as error:
            raise SlurmRestError(
                f"{self._where()} cannot be reached: {type(error).__name__}: {error}"
            ) from error
        finally:
            connection.close()
        request = f"{method} {path}"
        if response.status == 404:
            return None
        if response.status in (401, 403):
            how = "the token" if self.token else "local authentication (no token)"
            raise SlurmRestError(
                f"{self._where()} refused {how} for {request}: HTTP {response.status} "
                f"{_text(answer_body)}"
            )
        try:
            answer = json.loads(answer_body)
        except ValueError:
            answer = None
        if not isinstance(answer, dict):
            raise SlurmRestError(
                f"{self._where()} answered {request} with HTTP {response.status} and no JSON "
                f"object: {_text(answer_body)}"
            )
        if errors := answer.get("errors"):
            raise SlurmRestError(
                f"{self._where()} answered {request} with HTTP {response.status} and errors: "
                + "; ".join(_error_text(error) for error in errors)
                + _refusal_hint(errors, bool(self.token))
            )
        if response.status != 200:
            raise SlurmRestError(
                f"{self._where()} answered {request} with HTTP {response.status}: "
                f"{_text(answer_body)}"
            )
        return answer


def _text(body: bytes, limit: int = 200) -> str:
    text = body.decode("utf-8", "replace").strip()
    return repr(text[:limit] + ("..." if len(text) > limit else ""))


def _error_text(error: Any) -> str:
    """One entry of slurmrestd's ``errors``: v0.0.38 writes ``error`` and ``errno``, v0.0.40+
    ``description``, ``error``, ``error_number`` and ``source``."""
    if not isinstance(error, dict):
        return str(error)
    words = [str(error[key]) for key in ("description", "error") if error.get(key)]
    number = error.get("error_number", error.get("errno"))
    source = f" in {error['source']}" if error.get("source") else ""
    return f"{': '.join(words) or 'error'} (error {number}{source})"


# What a refused token reads as: slurmctld's SLURM_PROTOCOL_AUTHENTICATION_ERROR (1007), which
# Slurm 22.05's slurmrestd reports as an unspecified error (-1), as it does an unreachable
# slurmctld.
_REFUSAL_HINTS = {
    1007: " (slurmctld refused the token: invalid, expired, or not for this user)",
    -1: " (Slurm 22.05 reports so a token slurmctld refuses, or a slurmctld it cannot reach)",
}


def _refusal_hint(errors: list[Any], sent_token: bool) -> str:
    for error in errors:
        if sent_token and isinstance(error, dict):
            number = error.get("error_number", error.get("errno"))
            if number in _REFUSAL_HINTS:
                return _REFUSAL_HINTS[number]
    return ""
