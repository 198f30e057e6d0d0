"""``gpuadmin jobs ...``: submit, list, explain, release, cancel and read the log of jobs
through the HTTP API, so it works from any machine that reaches the web server (standard
library only, and the pure-Python ``scheduling.slurm`` for Slurm's request syntax).

``GPUADMIN_URL`` (default ``http://127.0.0.1:8000``) and ``GPUADMIN_TOKEN`` (an API token:
``gpuadmin token create NAME --user USERNAME`` on the server, or ``POST /api/v1/tokens/``) come
from the environment.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import re
import shlex
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TextIO
from urllib.parse import urlencode

from inventory.units import memory_text
from scheduling import slurm

DEFAULT_URL = "http://127.0.0.1:8000"
FOLLOW_INTERVAL_S = 2.0
FOLLOW_WINDOW = 1000  # lines read per poll while following a log
STATES = (
    "pending",
    "queued",
    "scheduled",
    "running",
    "completed",
    "failed",
    "canceled",
    "preempted",
)
ACTIVE_STATES = ("pending", "queued", "scheduled", "running", "preempted")
TERMINAL_STATES = frozenset({"completed", "failed", "canceled"})


class ApiError(Exception):
    """The server refused the request (``status``), or could not be reached (``None``)."""

    def __init__(self, status: int | None, message: str) -> None:
        super().__init__(message)
        self.status = status


@dataclass(frozen=True)
class Api:
    url: str
    token: str
    timeout_s: float = 30.0

    @classmethod
    def from_env(cls) -> Api:
        return cls(
            os.environ.get("GPUADMIN_URL") or DEFAULT_URL, os.environ.get("GPUADMIN_TOKEN", "")
        )

    def call(self, method: str, path: str, body: Any = None, **params: Any) -> Any:
        """One JSON request; ``ApiError`` with the server's reason on anything but 2xx, and
        for an answer that is not the API's. Redirects are not followed: they would turn a
        POST into a GET and carry the token to wherever they point."""
        if self.token and not TOKEN_TEXT.fullmatch(self.token):
            raise ApiError(None, "GPUADMIN_TOKEN is not a token (printable ASCII, no spaces)")
        query = urlencode({k: v for k, v in params.items() if v is not None}, doseq=True)
        try:
            request = urllib.request.Request(
                self.url.rstrip("/") + path + (f"?{query}" if query else ""),
                data=None if body is None else json.dumps(body).encode(),
                method=method,
                headers={"Accept": "application/json", "Content-Type": "application/json"},
            )
            if self.token:
                request.add_header("Authorization", f"Bearer {self.token}")
            with _OPENER.open(request, timeout=self.timeout_s) as response:
                raw, headers = response.read(), response.headers
        except urllib.error.HTTPError as exc:
            raise ApiError(exc.code, _reason(exc.code, exc.read(), exc.headers)) from None
        except (urllib.error.URLError, OSError, http.client.HTTPException, ValueError) as exc:
            reason = getattr(exc, "reason", None) or exc
            raise ApiError(None, f"cannot reach {self.url}: {_one_line(str(reason))}") from None
        kind = headers.get_content_type()
        if SERVER_HEADER not in headers or (raw and kind != "application/json"):
            raise ApiError(None, f"{self.url} answered {kind}, not as gpuadmin's API: {NOT_API}")
        return json.loads(raw) if raw else None


# An API token as gpuadmin issues them, and what any HTTP header may carry.
TOKEN_TEXT = re.compile(r"[!-~]+")
# Every answer of gpuadmin's server carries it (gpuadmin.request_id.HEADER; this module stays
# free of Django): an answer without it is some other server's.
SERVER_HEADER = "X-Request-ID"
NOT_API = "is GPUADMIN_URL the gpuadmin server's address?"


class _NoRedirects(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args: Any, **kwargs: Any) -> None:
        return None  # the 3xx is raised as an HTTPError, and reported with its Location


_OPENER = urllib.request.build_opener(_NoRedirects)


def _reason(status: int, raw: bytes, headers: Any = None) -> str:
    """The error body as one line: ``detail``, or ``field: message`` for each field (a nested
    field as ``env.A``); a redirect with where it points; anything else its first words."""
    location = headers.get("Location") if headers is not None else None
    if 300 <= status < 400:
        return f"HTTP {status}: redirected to {location or '?'} ({NOT_API})"
    try:
        body = json.loads(raw)
    except ValueError:
        text = re.sub(r"<[^>]*>", " ", raw[:2000].decode(errors="replace"))
        return f"HTTP {status}: {_one_line(text)[:200] or 'no reason given'} ({NOT_API})"
    if isinstance(body, dict) and set(body) == {"detail"}:
        message = _one_line(str(body["detail"]))
    elif isinstance(body, dict):
        message = "; ".join(_field_errors(body))
    else:
        message = _one_line(str(body))
    if status == 401:
        message += " (set GPUADMIN_TOKEN to an API token: gpuadmin token create NAME --user U)"
    return f"HTTP {status}: {message}"


def _field_errors(errors: Any, prefix: str = "") -> list[str]:
    """``field: message`` for each field of a 400's body; a nested field's parts named
    ``field.part`` (``env.A``, ``gpus.0``)."""
    if isinstance(errors, dict):
        return [
            line
            for field, inner in errors.items()
            for line in _field_errors(
                inner, f"{prefix}{field}" if not prefix else f"{prefix}.{field}"
            )
        ]
    if isinstance(errors, list) and all(isinstance(item, str) for item in errors):
        return [f"{prefix}: {_one_line(' '.join(errors))}"]
    return [f"{prefix}: {_one_line(str(errors))}"]


def _one_line(text: str) -> str:
    return " ".join(text.split())


# --------------------------------------------------------------------------- verbs


def cmd_submit(api: Api, args: argparse.Namespace, out: TextIO) -> int:
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        raise ApiError(None, "no command given: gpuadmin jobs submit [OPTIONS] -- CMD ...")
    env = dict(pair.split("=", 1) for pair in args.env)
    options = {
        "name": args.name,
        "project": args.project,
        "gpu_count": args.gpus,
        "node_count": args.nodes,
        "gpu_model": args.model,
        "min_gpu_memory_mib": args.min_memory_mib,
        "topology": args.topology,
        "priority": args.priority,
        "max_runtime_s": args.max_runtime,
        "estimated_duration_s": args.estimated_duration,
        "max_retries": args.retries,
        "preemptible": args.preemptible or None,
        "env": env or None,
        "working_dir": args.workdir,
        "container_image": args.image,
        "hold": args.hold or None,
        "pool": args.pool,
        "mig_profile": args.mig,
        "mps_percent": args.mps,
        "mps_memory_mib": args.mps_memory,
        "cpus": args.cpus,
        "host_memory_mib": args.mem,
        "reservation": args.reservation,
        "dependency": args.dependency,
        "array": args.array,
    }
    body = {
        # With --shell the words are one shell command line (``&&``, ``$VAR`` and all).
        "command": " ".join(command) if args.shell else command,
        "use_shell": args.shell,
        **{name: value for name, value in options.items() if value is not None},
    }
    submitted = api.call("POST", "/queue/submit", body)
    if "task_ids" in submitted:  # an array, as the server read --array (a blank one is none)
        ids = submitted["task_ids"]
        cap = submitted["max_running"]
        print(
            f"array {submitted['id']} submitted: {submitted['size']} tasks, jobs "
            f"{ids[0]}-{ids[-1]}" + (f", at most {cap} at once" if cap else ""),
            file=out,
        )
        print(f"  gpuadmin jobs array {submitted['id']}   # its tasks by state", file=out)
        return 0
    needs = ", ".join(filter(None, (_needs(submitted), _host(submitted))))
    print(f"job {submitted['id']} submitted: {submitted['state']} ({needs})", file=out)
    print(f"  gpuadmin jobs show {submitted['id']}   # where it runs, or why it waits", file=out)
    return 0


def cmd_array(api: Api, args: argparse.Namespace, out: TextIO) -> int:
    """A job array's tasks by state; with ``--cancel``, cancel its unfinished tasks."""
    path = f"/api/v1/arrays/{args.array_id}/"
    if args.cancel:
        result = api.call("POST", path + "cancel/")
        print(
            f"array {args.array_id}: {len(result['canceled'])} tasks canceled, "
            f"{len(result['canceling'])} stopping through their agents",
            file=out,
        )
        return 0
    array = api.call("GET", path)
    cap = f", at most {array['max_running']} at once" if array["max_running"] else ""
    print(
        f"array {array['id']} [{array['spec']}] ({array['owner']}): {array['size']} tasks{cap}",
        file=out,
    )
    for state, count in array["tasks"].items():
        print(f"  {state + ':':<11}{count}", file=out)
    print(f"  gpuadmin jobs list --array {array['id']}   # the tasks", file=out)
    return 0


def cmd_list(api: Api, args: argparse.Namespace, out: TextIO) -> int:
    states = args.state or (None if args.all else list(ACTIVE_STATES))
    page = api.call("GET", "/api/v1/jobs/", state=states, limit=args.limit, array=args.array)
    rows = [("ID", "STATE", "PRIORITY", "GPUS", "OWNER", "NAME", "WHERE / WHY")]
    rows += [
        (
            str(job["id"]) + (f" ({job['array']}_{job['array_index']})" if job["array"] else ""),
            job["state"],
            job["priority"],
            str(job["gpu_count"] * job["node_count"]),
            job["owner"],
            job["name"] or "-",
            _where_or_why(job),
        )
        for job in page["results"]
    ]
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]) - 1)]
    for row in rows:
        padded = [cell.ljust(width) for cell, width in zip(row, widths, strict=False)]
        print("  ".join([*padded, row[-1]]), file=out)
    if page["count"] > len(page["results"]):
        print(f"({len(page['results'])} of {page['count']}; --limit N for more)", file=out)
    return 0


def cmd_show(api: Api, args: argparse.Namespace, out: TextIO) -> int:
    """The job's state and, for a waiting job, why it waits: the "why is my job pending" answer."""
    job = api.call("GET", f"/api/v1/jobs/{args.job_id}/")
    name = f' "{job["name"]}"' if job["name"] else ""
    project = f", project {job['project']}" if job["project"] else ""
    print(
        f"job {job['id']}{name} ({job['owner']}{project}): {job['state']}, "
        f"priority {job['priority']}",
        file=out,
    )
    if job["command"] is None:  # private to its owner (GPUADMIN_PRIVATE_DATA)
        command = "(hidden)"
    else:
        command = job["command"][0] if job["use_shell"] else shlex.join(job["command"])
    facts = [
        ("command", command),
        ("needs", _needs(job)),
        ("host", _host(job)),
        ("pool", job["pool"]),
        ("reservation", job["reservation"]),
        ("array", job["array"] and f"{job['array']}, task {job['array_index']}"),
        ("depends on", ", ".join(_dependency(d) for d in job["dependencies"])),
        ("submitted", job["submitted_at"]),
    ]
    if job["state"] in ("pending", "queued"):
        reason = job["pending_reason"] or (
            "held (submitted with hold): the scheduler leaves it alone"
            if job["state"] == "pending"
            else "the scheduler has not looked at it yet"
        )
        code = f" ({job['pending_code']})" if job["pending_code"] else ""
        facts += [
            ("why pending", reason + code),
            ("position", _or_dash(job["queue_position"])),
            ("est. start", _or_dash(job["estimated_start_at"])),
            ("what if", job["what_if"]),
        ]
    if job["placement"]:
        facts.append(("placement", job["placement"]["explanation"]))
    held = [a for a in job["allocations"] if a["attempt"] == job["attempt"]]
    if held:
        gpus = ", ".join(f"{a['node']}/GPU{a['gpu_index']} {a['gpu_uuid']}" for a in held)
        facts.append(("GPUs", f"{gpus} (attempt {job['attempt']})"))
    facts += [
        ("started", job["started_at"]),
        ("finished", job["finished_at"]),
        ("exit code", job["exit_code"]),
        ("message", job["message"]),
        ("CPU time", _usage(job, "cpu_seconds", slurm.cpu_time_text)),
        ("peak memory", _usage(job, "max_memory_bytes", slurm.peak_memory_text)),
        (
            "borrowed",
            "yes: over its quota on idle GPUs, reclaimed first" if job["borrowed"] else "",
        ),
        ("preemptible", "yes" if job["preemptible"] else ""),
        ("preempted by", job["preempted_by"] and f"job {job['preempted_by']}"),
        (
            "preempted",
            f"{job['preemptions']} times, re-queued each time" if job["preemptions"] else "",
        ),
        (
            "failed runs",
            f"{job['failures']} (it is run again at most {job['max_retries']} times)"
            if job["failures"]
            else "",
        ),
    ]
    for label, value in facts:
        if value not in (None, ""):
            print(f"  {label + ':':<13}{value}", file=out)
    return 0


def cmd_cancel(api: Api, args: argparse.Namespace, out: TextIO) -> int:
    result = api.call("POST", f"/api/v1/jobs/{args.job_id}/cancel/")
    if result["canceling"]:
        print(
            f"job {args.job_id}: canceling; its processes get SIGTERM (SIGKILL after the grace) "
            "and its GPUs are released once they are gone",
            file=out,
        )
    else:
        print(f"job {args.job_id} canceled", file=out)
    return 0


def cmd_release(api: Api, args: argparse.Namespace, out: TextIO) -> int:
    job = api.call("POST", f"/api/v1/jobs/{args.job_id}/release/")
    print(f"job {job['id']} released: {job['state']}", file=out)
    return 0


def cmd_log(api: Api, args: argparse.Namespace, out: TextIO) -> int:
    path = f"/api/v1/jobs/{args.job_id}/log/"
    if not args.follow:
        log = api.call("GET", path, tail=args.tail, node=args.node)
        out.write(log["text"])
        return 0
    shown: list[str] | None = None
    attempt = None
    told = False  # said once why there is no log yet
    while True:
        # The state first: a log read after the job ended holds all of it.
        state = api.call("GET", f"/api/v1/jobs/{args.job_id}/")["state"]
        finished = state in TERMINAL_STATES
        try:
            log = api.call("GET", path, tail=max(args.tail, FOLLOW_WINDOW), node=args.node)
        except ApiError as exc:
            if exc.status not in (404, 503):  # not started yet, or the agent is silent
                raise
            log = None
        if log is None and attempt is None and not told:
            why = "it wrote no log" if finished else "its log shows here once it runs"
            sys.stderr.write(f"job {args.job_id} is {state}: {why}\n")
            told = True
        if log is not None:
            lines = log["text"].splitlines(keepends=True)
            if lines and not lines[-1].endswith("\n") and not finished:
                lines.pop()  # a line still being written
            if log["attempt"] != attempt:
                if attempt is not None:
                    out.write(f"--- attempt {log['attempt']} ---\n")
                attempt, shown = log["attempt"], None
            first = lines[-args.tail :] if args.tail else []
            out.writelines(first if shown is None else new_lines(shown, lines))
            out.flush()
            shown = lines
        if finished:
            return 0
        time.sleep(FOLLOW_INTERVAL_S)


def new_lines(previous: list[str], current: list[str]) -> list[str]:
    """The lines of ``current`` (a log's last lines now) that ``previous`` (its last lines at
    the poll before) did not have: the longest end of ``previous`` that begins ``current`` was
    seen already."""
    for overlap in range(min(len(previous), len(current)), 0, -1):
        if previous[-overlap:] == current[:overlap]:
            return current[overlap:]
    return current


def _dependency(dependency: dict[str, Any]) -> str:
    held = {True: "holds", False: "never holds", None: "pending"}[dependency["satisfied"]]
    return f"{dependency['kind']}:{dependency['job']} ({dependency['state']}, {held})"


def _needs(job: dict[str, Any]) -> str:
    if job.get("mig_profile"):
        return f"MIG device {job['mig_profile']}"
    if job.get("mps_percent") is not None:
        memory = f", {memory_text(job['mps_memory_mib'])}" if job.get("mps_memory_mib") else ""
        return f"MPS share {job['mps_percent']}% of SMs{memory}"
    parts = [f"{job['gpu_count']} GPU(s) x {job['node_count']} node(s)"]
    if job["gpu_model"]:
        parts.append(job["gpu_model"])
    if job["min_gpu_memory_mib"]:
        parts.append(f">= {memory_text(job['min_gpu_memory_mib'])}")
    if job["topology"] != "any":
        parts.append(f"topology {job['topology']}")
    return ", ".join(parts)


def _host(job: dict[str, Any]) -> str:
    """``16 CPUs, 64 GiB RAM per node``, or empty (a server before host requests: none)."""
    return slurm.host_request_text(job.get("cpus", 0), job.get("host_memory_mib", 0))


def _usage(job: dict[str, Any], name: str, text: Callable[[Any], str]) -> str:
    """What its runs used, as sacct shows it, or empty (not measured; an older server)."""
    value = job.get(name)
    return "" if value is None else text(value)


def _where_or_why(job: dict[str, Any]) -> str:
    if job["state"] in ("pending", "queued"):
        position = f"#{job['queue_position']} " if job["queue_position"] else ""
        return position + (job["pending_reason"] or job["state"])
    if job["placement"]:
        return ", ".join(
            f"{node}:{','.join(map(str, gpus))}" for node, gpus in job["placement"]["nodes"].items()
        )
    return job["message"] or "-"


def _or_dash(value: object) -> str:
    return "-" if value is None else str(value)


# --------------------------------------------------------------------------- arguments


def add_verbs(verbs: argparse._SubParsersAction) -> None:
    """The ``jobs`` verb group."""
    jobs = verbs.add_parser(
        "jobs", help="submit, list, show, release, cancel jobs; read their logs (API)"
    )
    actions = jobs.add_subparsers(dest="action", required=True, metavar="ACTION")

    submit = actions.add_parser(
        "submit", help="submit a job: gpuadmin jobs submit [OPTIONS] -- CMD ..."
    )
    submit.add_argument("--gpus", type=int, help="GPUs per node (default 1)")
    submit.add_argument("--nodes", type=int, help="nodes of a multi-node job (default 1)")
    submit.add_argument("--model", help="exact GPU product name, e.g. 'NVIDIA H100 80GB HBM3'")
    submit.add_argument("--min-memory-mib", type=int, help="memory each GPU must have")
    submit.add_argument("--cpus", type=int, metavar="N", help="host CPUs on each node")
    submit.add_argument(
        "--mem",
        type=_memory,
        metavar="SIZE",
        help="host memory on each node, as Slurm's --mem: 64G, 512M, MiB without a unit",
    )
    submit.add_argument("--topology", choices=("any", "numa", "nvlink", "node"))
    submit.add_argument("--priority", choices=("low", "normal", "high", "critical"))
    submit.add_argument("--name")
    submit.add_argument("--project")
    submit.add_argument("--max-runtime", type=int, metavar="SECONDS", help="killed after this")
    submit.add_argument(
        "--estimated-duration",
        type=int,
        metavar="SECONDS",
        help="expected run time: waiting jobs' estimated starts count on it",
    )
    submit.add_argument("--retries", type=int, help="re-runs after a failure (default 0)")
    submit.add_argument(
        "--preemptible", action="store_true", help="mark the job preemptible (the API's flag)"
    )
    submit.add_argument("--env", action="append", default=[], type=_env_pair, metavar="NAME=VALUE")
    submit.add_argument(
        "--workdir", metavar="PATH", help="absolute working directory (in the image with --image)"
    )
    submit.add_argument("--image", metavar="IMAGE", help="run in this container image")
    submit.add_argument("--hold", action="store_true", help="store it held (pending)")
    submit.add_argument("--pool", help="run on this pool's GPUs (default: the GPUs in no pool)")
    submit.add_argument("--mig", metavar="PROFILE", help="one MIG device, e.g. 1g.10gb")
    submit.add_argument("--mps", type=int, metavar="PERCENT", help="an MPS share: % of SMs")
    submit.add_argument("--mps-memory", type=int, metavar="MIB", help="its memory limit")
    submit.add_argument("--reservation", type=int, metavar="ID", help="run in your reservation")
    submit.add_argument(
        "--dependency", metavar="SPEC", help="as Slurm's: afterok:12:13,afterany:14,afternotok:15"
    )
    submit.add_argument(
        "--array", metavar="SPEC", help="a job array, as Slurm's: 0-999%%50, 1,3,5-9, 0-15:4"
    )
    submit.add_argument("--shell", action="store_true", help="run CMD through /bin/sh -c")
    submit.add_argument("command", nargs=argparse.REMAINDER, metavar="-- CMD ...")
    submit.set_defaults(run=_run(cmd_submit))

    listing = actions.add_parser("list", help="your jobs (everyone's for viewers and operators)")
    listing.add_argument("--state", action="append", choices=STATES, help="repeatable")
    listing.add_argument("--all", action="store_true", help="finished jobs too")
    listing.add_argument("--limit", type=int, default=100)
    listing.add_argument("--array", type=int, metavar="ID", help="the tasks of this job array")
    listing.set_defaults(run=_run(cmd_list))

    show = actions.add_parser("show", help="a job: where it runs, or why it is pending")
    show.add_argument("job_id", type=int)
    show.set_defaults(run=_run(cmd_show))

    array = actions.add_parser("array", help="a job array's tasks by state (or --cancel it)")
    array.add_argument("array_id", type=int)
    array.add_argument("--cancel", action="store_true", help="cancel its unfinished tasks")
    array.set_defaults(run=_run(cmd_array))

    cancel = actions.add_parser("cancel", help="cancel a job")
    cancel.add_argument("job_id", type=int)
    cancel.set_defaults(run=_run(cmd_cancel))

    release = actions.add_parser("release", help="let a held job into the queue")
    release.add_argument("job_id", type=int)
    release.set_defaults(run=_run(cmd_release))

    log = actions.add_parser("log", help="a job's log, read through its node's agent")
    log.add_argument("job_id", type=int)
    log.add_argument(
        "--tail", type=_line_count, default=100, help="lines from the end (default 100)"
    )
    log.add_argument("--node", help="node of a multi-node job (default its first)")
    log.add_argument("-f", "--follow", action="store_true", help="print new lines every 2 s")
    log.set_defaults(run=_run(cmd_log))


def _env_pair(value: str) -> str:
    if "=" not in value:
        raise argparse.ArgumentTypeError(f"expected NAME=VALUE, got {value!r}")
    return value


def _memory(value: str) -> int:
    try:
        return slurm.parse_memory(value)
    except slurm.SpecError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


Verb = Callable[[Api, argparse.Namespace, TextIO], int]


def _line_count(text: str) -> int:
    count = int(text)
    if count < 0:
        raise argparse.ArgumentTypeError(f"{count}: a number of lines, 0 or more")
    return count


def _run(verb: Verb) -> Callable[[argparse.Namespace], int]:
    """A verb with the API from the environment; API errors become one line and status 1."""

    def run(args: argparse.Namespace) -> int:
        try:
            return verb(Api.from_env(), args, sys.stdout)
        except ApiError as exc:
            sys.stderr.write(f"gpuadmin jobs {args.action}: {exc}\n")
            return 1
        except KeyboardInterrupt:
            return 130

    return run
