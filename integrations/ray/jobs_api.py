"""A Ray cluster's dashboard HTTP API, read and driven with the standard library: its nodes and
their resources (the state API and the cluster status) and Ray's Jobs REST API (submit, status,
logs, stop). Plain Python: gpuadmin needs neither Django here nor the ``ray`` package.

Errors are of two kinds: ``RayUnreachable`` (no answer: refused connection, timeout, a name
that does not resolve) and ``RayRefused`` (an answer that says no: an HTTP error status).
``ask_all`` asks several questions at once, in a few threads, none waited for past a deadline.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Hashable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass, field
from functools import partial
from typing import Any, Generic, TypeVar

# Questions asked at once by ``ask_all``: a poll of many clusters keeps to a few threads.
MAX_THREADS = 8

Key = TypeVar("Key", bound=Hashable)
Answer = TypeVar("Answer")


class RayError(Exception):
    """A request to the cluster that did not give the answer asked for."""


class RayUnreachable(RayError):
    """The cluster did not answer."""


class RayRefused(RayError):
    """The cluster answered with an error status (``status``)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"HTTP {status}: {message}")
        self.status = status


@dataclass(frozen=True)
class RayNode:
    """One node as the state API lists it, with its GPUs and CPUs in use from the cluster's
    load report (0 when the report does not name it yet)."""

    node_id: str
    address: str
    name: str
    is_head: bool
    state: str  # ALIVE or DEAD
    gpus: float
    gpus_in_use: float
    cpus: float
    cpus_in_use: float


@dataclass(frozen=True)
class ClusterView:
    """The cluster's Ray version and its nodes, alive and dead."""

    ray_version: str
    nodes: list[RayNode] = field(default_factory=list)

    @property
    def alive(self) -> list[RayNode]:
        return [node for node in self.nodes if node.state == "ALIVE"]


@dataclass(frozen=True)
class JobInfo:
    """A submitted job as Ray reports it: ``status`` is one of Ray's words (PENDING, RUNNING,
    SUCCEEDED, FAILED, STOPPED), ``message`` Ray's explanation (for a PENDING job, why it
    waits), times in milliseconds since the epoch (None: not yet)."""

    submission_id: str
    status: str
    message: str
    start_time_ms: int | None
    end_time_ms: int | None

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> JobInfo:
        return cls(
            submission_id=data["submission_id"],
            status=data["status"],
            message=data.get("message") or "",
            start_time_ms=data.get("start_time") or None,
            end_time_ms=data.get("end_time") or None,
        )


@dataclass(frozen=True)
class PollAnswer(Generic[Key]):
    """What one cluster answered to a tick of the poll (``RayJobsClient.poll``)."""

    view: ClusterView | RayError
    jobs: dict[Key, JobInfo | None | RayError]


class RayJobsClient:
    """One cluster's dashboard at ``address`` (``http://host:8265``); ``token``, when given, is
    sent as a bearer token (a proxy in front of the dashboard, or Ray's token authentication)."""

    def __init__(self, address: str, token: str = "", timeout_s: float = 5.0) -> None:
        self.address = address.rstrip("/")
        self.token = token
        self.timeout_s = timeout_s

    def _request(self, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
        headers = {"Accept": "application/json"}
        data = None
        if body is not None:
            data = json.dumps(body).encode()
            headers["Content-Type"] = "application/json"
        if self.token:
            headers["Authorization"] = f"Bearer {self.token}"
        request = urllib.request.Request(
            self.address + path, data=data, headers=headers, method=method
        )
        try:
            with urllib.request.urlopen(request, timeout=self.timeout_s) as response:
                payload = response.read()
        except urllib.error.HTTPError as exc:
            text = exc.read().decode(errors="replace").strip()
            # Ray answers a failed submission with its traceback: its last line says why.
            raise RayRefused(exc.code, text.splitlines()[-1] if text else exc.reason) from None
        except (urllib.error.URLError, OSError) as exc:
            reason = getattr(exc, "reason", exc)
            raise RayUnreachable(f"{self.address} did not answer: {reason}") from None
        try:
            return json.loads(payload) if payload else None
        except ValueError:
            raise RayRefused(200, f"{self.address}{path} did not answer JSON") from None

    def cluster(self) -> ClusterView:
        """The nodes (``/api/v0/nodes``) with their resources in use (``/api/cluster_status``);
        ``RayRefused`` for an answer not shaped as Ray's."""
        try:
            return self._cluster()
        except (KeyError, TypeError, AttributeError, ValueError) as exc:
            message = f"{self.address} did not answer as a Ray dashboard: {exc!r}"
            raise RayRefused(200, message) from None

    def _cluster(self) -> ClusterView:
        version = self._request("GET", "/api/version") or {}
        listed = self._request("GET", "/api/v0/nodes?limit=10000")
        rows = listed["data"]["result"]["result"]
        status = self._request("GET", "/api/cluster_status") or {}
        report = ((status.get("data") or {}).get("clusterStatus") or {}).get(
            "loadMetricsReport"
        ) or {}
        usage: dict[str, dict[str, list[float]]] = report.get("usageByNode") or {}

        def used(node_id: str, resource: str) -> float:
            pair = usage.get(node_id, {}).get(resource)
            return float(pair[0]) if pair else 0.0

        nodes = [
            RayNode(
                node_id=row["node_id"],
                address=row.get("node_ip") or "",
                name=row.get("node_name") or "",
                is_head=bool(row.get("is_head_node")),
                state=row.get("state") or "",
                gpus=float(row.get("resources_total", {}).get("GPU", 0)),
                gpus_in_use=used(row["node_id"], "GPU"),
                cpus=float(row.get("resources_total", {}).get("CPU", 0)),
                cpus_in_use=used(row["node_id"], "CPU"),
            )
            for row in rows
        ]
        nodes.sort(key=lambda node: (not node.is_head, node.state != "ALIVE", node.name))
        return ClusterView(ray_version=version.get("ray_version", ""), nodes=nodes)

    def submit(
        self,
        submission_id: str,
        entrypoint: str,
        *,
        runtime_env: dict[str, Any] | None = None,
        num_gpus: float = 0,
        num_cpus: float = 0,
        metadata: dict[str, str] | None = None,
    ) -> None:
        """Submit under ``submission_id``, which Ray refuses to run twice."""
        body: dict[str, Any] = {"entrypoint": entrypoint, "submission_id": submission_id}
        if runtime_env:
            body["runtime_env"] = runtime_env
        if num_gpus:
            body["entrypoint_num_gpus"] = num_gpus
        if num_cpus:
            body["entrypoint_num_cpus"] = num_cpus
        if metadata:
            body["metadata"] = metadata
        self._request("POST", "/api/jobs/", body)

    def job(self, submission_id: str) -> JobInfo | None:
        """The job's state, or None when the cluster has no job of that id."""
        try:
            data = self._request("GET", f"/api/jobs/{_quoted(submission_id)}")
        except RayRefused as exc:
            if exc.status == 404:
                return None
            raise
        try:
            return JobInfo.from_dict(data)
        except (KeyError, TypeError, AttributeError) as exc:
            message = f"{self.address} did not answer as Ray's Jobs API: {exc!r}"
            raise RayRefused(200, message) from None

    def poll(self, submission_ids: Mapping[Key, str]) -> PollAnswer[Key]:
        """The cluster's view and, when it answered, each job's state (by the caller's key;
        None: no such job; a ``RayError``: not read): what one tick of the poll asks."""
        view = answer_or_error(self.cluster)
        if isinstance(view, RayError):
            return PollAnswer(view, {})
        jobs = {
            key: answer_or_error(partial(self.job, submission_id))
            for key, submission_id in submission_ids.items()
        }
        return PollAnswer(view, jobs)

    def logs(self, submission_id: str) -> str:
        return self._request("GET", f"/api/jobs/{_quoted(submission_id)}/logs")["logs"]

    def stop(self, submission_id: str) -> bool:
        """Ask Ray to stop the job; False when it had already ended."""
        answer = self._request("POST", f"/api/jobs/{_quoted(submission_id)}/stop")
        return bool(answer and answer.get("stopped"))


def _quoted(submission_id: str) -> str:
    return urllib.parse.quote(submission_id, safe="")


def answer_or_error(question: Callable[[], Answer]) -> Answer | RayError:
    """The question's answer, or the ``RayError`` it raised."""
    try:
        return question()
    except RayError as exc:
        return exc


def ask_all(
    questions: Mapping[Key, Callable[[], Answer]],
    *,
    deadline_s: float,
    threads: int = MAX_THREADS,
) -> Iterator[tuple[Key, Answer | RayError]]:
    """Each question's key with its answer (or the ``RayError`` it raised), as they come:
    the questions are asked at once in at most ``threads`` threads, so one that is not
    answered delays no other. Those not answered within ``deadline_s`` come last, as a
    ``RayUnreachable``; their threads are left to end by themselves (their requests' own
    timeouts), not waited for. The questions must not touch the database: they run outside
    the caller's thread (and transaction); the caller stores the answers as they come."""
    if not questions:
        return
    executor = ThreadPoolExecutor(min(threads, len(questions)), thread_name_prefix="ray-ask")
    try:
        waiting = {
            executor.submit(answer_or_error, question): key for key, question in questions.items()
        }
        try:
            for future in as_completed(list(waiting), timeout=deadline_s):
                yield waiting.pop(future), future.result()
        except TimeoutError:
            pass
    finally:
        executor.shutdown(wait=False, cancel_futures=True)
    for key in waiting.values():
        yield key, RayUnreachable(f"no answer within {deadline_s:g} s")
