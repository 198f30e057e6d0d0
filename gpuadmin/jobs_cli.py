"""``gpuadmin jobs ...``: submit, list, explain, hold, release, cancel and read the log of jobs
through the HTTP API (``gpuadmin.client``), so it works from any machine that reaches the web
server (standard library only, and the pure-Python ``scheduling.jobs.slurm`` for Slurm's request
syntax).
"""

from __future__ import annotations

import argparse
import re
import shlex
import sys
import time
from collections.abc import Callable, Mapping
from typing import Any, TextIO

from gpuadmin.client import Api, ApiError, run_verb
from gpuadmin.english import plural
from gpuadmin.terminal import Column, add_json_flag, print_json, print_table
from inventory.units import memory_text
from scheduling.jobs import slurm

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
# ``jobs cancel``'s argument: a job id, or an array's task (12_5) or tasks (12_[3-7,9]).
JOB_OR_TASKS = re.compile(
    r"(?P<id>[0-9]{1,18})(?:_(?:(?P<index>[0-9]{1,9})|\[(?P<indexes>[^\]]+)\]))?\Z"
)
# How the CLI says a state (``--state`` takes either word).
STATE_WORDS = {"pending": "held"}
ACTIVE_STATES = ("pending", "queued", "scheduled", "running", "preempted")
TERMINAL_STATES = frozenset({"completed", "failed", "canceled"})


# --------------------------------------------------------------------------- verbs


def cmd_submit(api: Api, args: argparse.Namespace, out: TextIO) -> int:
    command = command_words(args.command)
    if not command:
        raise ApiError(None, "no command given: gpuadmin jobs submit [OPTIONS] -- CMD ...")
    env = dict(args.env)
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
        "ray": args.ray or None,
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
    key = args.idempotency_key
    # The draft's form of the header: a Structured Field string, quoted and escaped.
    headers = {"Idempotency-Key": sf_string(key)} if key else None
    submitted = api.call("POST", "/queue/submit", body, headers=headers)
    if "tasks_url" in submitted:  # an array, as the server read --array (a blank one is none)
        cap = submitted["max_running"]
        print(
            f"array {submitted['id']} submitted: {plural(submitted['size'], 'task')}"
            + (f", at most {cap} at once" if cap else "")
            + f" ({submitted['state']})",
            file=out,
        )
        print(f"  gpuadmin jobs array {submitted['id']}   # its tasks by state", file=out)
        print(
            f"  gpuadmin jobs list --array {submitted['id']}   # its tasks, each a job once "
            "the placement loop reaches it",
            file=out,
        )
        return 0
    needs = ", ".join(filter(None, (_needs(submitted), _host(submitted))))
    print(f"job {submitted['id']} submitted: {submitted['state']} ({needs})", file=out)
    print(f"  gpuadmin jobs show {submitted['id']}   # where it runs, or why it waits", file=out)
    return 0


def sf_string(text: str) -> str:
    """``text`` as an RFC 8941 Structured Field string: in quotes, ``"`` and ``\\`` escaped."""
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def idempotency_key(text: str) -> str:
    """``--idempotency-key``: what a Structured Field string can carry (printable ASCII)."""
    if not text or not all(" " <= char <= "~" for char in text):
        raise argparse.ArgumentTypeError("printable ASCII characters only (a UUID, say)")
    return text


def _tasks_listed(array: dict[str, Any]) -> str:
    """What ``jobs list --array`` lists of ``array`` (an ``/api/v1/arrays/`` answer)."""
    unsplit = array["unsplit"]
    if not unsplit or array["canceled_at"]:
        return "the tasks"
    return f"the tasks made jobs so far ({unsplit} to come as the placement loop reaches them)"


def cmd_array(api: Api, args: argparse.Namespace, out: TextIO) -> int:
    """A job array's tasks by state; with ``--cancel``, cancel its unfinished tasks; with
    ``--hold`` or ``--release``, hold its waiting tasks or release its held ones."""
    path = f"/api/v1/arrays/{args.array_id}/"
    if args.cancel:
        return _array_canceled(args.array_id, api.call("POST", path + "cancel/"), args, out)
    verb = "hold" if args.hold else "release" if args.release else ""
    if verb:
        result = api.call("POST", path + f"{verb}/")
        if args.json:
            print_json(out, result)
            return 0
        state = "pending" if args.hold else "queued"
        print(
            f"array {args.array_id} {'held' if args.hold else 'released'}: "
            f"{plural(len(result['jobs']), 'job')} now {state}"
            + (
                f", its {plural(result['unsplit'], 'task')} not made jobs yet to come {state}"
                if result["unsplit"]
                else ""
            ),
            file=out,
        )
        return 0
    array = api.call("GET", path)
    if args.json:
        print_json(out, array)
        return 0
    cap = f", at most {array['max_running']} at once" if array["max_running"] else ""
    print(
        f"array {array['id']} [{array['spec']}] ({array['owner']}): "
        f"{plural(array['size'], 'task')}{cap}",
        file=out,
    )
    for state, count in array["tasks"].items():
        print(f"  {state + ':':<11}{count}", file=out)
    print(f"  gpuadmin jobs list --array {array['id']}   # {_tasks_listed(array)}", file=out)
    return 0


def cmd_list(api: Api, args: argparse.Namespace, out: TextIO) -> int:
    """Jobs as ``squeue`` lists them: an array's tasks in one state on one line
    (``12_[3-999%50]``) unless ``--expand`` (or ``--array``: its tasks) asks for each."""
    states = [_api_state(state) for state in args.state or ()]
    page = api.call(
        "GET",
        "/api/v1/jobs/",
        state=states or (None if args.all else list(ACTIVE_STATES)),
        limit=args.limit,
        array=args.array,
        collapse_arrays=None if args.expand or args.array else "true",
    )
    if args.json:
        print_json(out, page)
        return 0
    print_table(out, LIST_COLUMNS, page["results"])
    if page["count"] > len(page["results"]):
        print(f"({len(page['results'])} of {page['count']}; --limit N for more)", file=out)
    return 0


def cmd_show(api: Api, args: argparse.Namespace, out: TextIO) -> int:
    """The job's state and, for a waiting job, why it waits: the "why is my job pending" answer."""
    job = api.call("GET", f"/api/v1/jobs/{args.job_id}/")
    if args.json:
        print_json(out, job)
        return 0
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
    # The job's placement, start and exit code are its current run's: a requeued job waiting
    # again has none (its earlier runs are listed apart).
    attempts = job.get("attempts") or []
    current = next((attempt for attempt in attempts if attempt["current"]), None)
    previous = [attempt for attempt in attempts if not attempt["current"]]
    # The end of an earlier attempt is its row's, below, not the job's message now.
    said_below = bool(previous) and job["message"] == previous[-1]["reason"]
    if current is not None:
        if job["placement"]:
            facts.append(("placement", job["placement"]["explanation"]))
        held = [a for a in job["allocations"] if a["attempt"] == current["attempt"]]
        gpus = ", ".join(f"{a['node']}/GPU{a['gpu_index']} {a['gpu_uuid']}" for a in held)
        facts.append(("GPUs", f"{gpus} (attempt {current['attempt']})"))
    facts += [
        ("started", current and current["started_at"]),
        ("finished", job["finished_at"]),
        ("exit code", current and current["exit_code"]),
        ("message", "" if said_below else job["message"]),
        ("CPU time", _usage(job, "cpu_seconds", slurm.cpu_time_text)),
        ("peak memory", _usage(job, "max_memory_bytes", slurm.peak_memory_text)),
        (
            "borrowed",
            "yes: over its quota on idle GPUs, reclaimed first" if job["borrowed"] else "",
        ),
        ("preemptible", "yes" if job["preemptible"] else ""),
        ("Ray", job.get("ray_dashboard") or ("application" if job.get("ray") else "")),
        ("preempted by", job["preempted_by"] and f"job {job['preempted_by']}"),
        (
            "preempted",
            f"{plural(job['preemptions'], 'time')}, re-queued each time"
            if job["preemptions"]
            else "",
        ),
        (
            "failed runs",
            f"{job['failures']} (it is run again at most {plural(job['max_retries'], 'time')})"
            if job["failures"]
            else "",
        ),
    ]
    for label, value in facts:
        if value not in (None, ""):
            print(f"  {label + ':':<13}{value}", file=out)
    if previous:
        print("previous attempts:", file=out)
        print_table(out, ATTEMPT_COLUMNS, previous)
    return 0


def _array_canceled(
    array_id: int, result: dict[str, Any], args: argparse.Namespace, out: TextIO
) -> int:
    """Print what cancelling (some tasks of) array ``array_id`` did (JSON with ``--json``)."""
    if args.json:
        print_json(out, result)
        return 0
    canceled = len(result["canceled"]) + result["unsplit"]
    print(
        f"array {array_id}: {plural(canceled, 'task')} canceled"
        f"{slurm.unsplit_text(result['unsplit'])}, {len(result['canceling'])} stopping through "
        "their agents",
        file=out,
    )
    return 0


def job_or_tasks(text: str) -> tuple[int, str | None]:
    """``gpuadmin jobs cancel``'s argument: a job id (``12``: ``(12, None)``), or tasks of
    an array as Slurm names them, ``12_5`` or ``12_[3-7,9]`` (``(12, "3-7,9")``: array 12,
    the indexes as ``POST /api/v1/arrays/<id>/cancel/`` takes them)."""
    match = JOB_OR_TASKS.match(text)
    if match is None:
        raise argparse.ArgumentTypeError(
            f"{text!r}: a job id (12), an array's task (12_5) or tasks (12_[3-7,9])"
        )
    return int(match["id"]), match["index"] or match["indexes"]


def cmd_cancel(api: Api, args: argparse.Namespace, out: TextIO) -> int:
    """Cancel a job, or tasks of an array (``12_5``, ``12_[3-7]``: Slurm's ``scancel``)."""
    job_id, tasks = args.job
    if tasks is not None:
        result = api.call("POST", f"/api/v1/arrays/{job_id}/cancel/", {"tasks": tasks})
        return _array_canceled(job_id, result, args, out)
    result = api.call("POST", f"/api/v1/jobs/{job_id}/cancel/")
    if args.json:
        print_json(out, result)
        return 0
    if result["canceling"]:
        print(
            f"job {job_id}: canceling; its processes get SIGTERM (SIGKILL after the grace) "
            "and its GPUs are released once they are gone",
            file=out,
        )
    else:
        print(f"job {job_id} canceled", file=out)
    return 0


def cmd_kill(api: Api, args: argparse.Namespace, out: TextIO) -> int:
    """The seed's force kill: SIGKILL at once, no grace (a cancel under way is cut short)."""
    result = api.call("POST", f"/api/v1/jobs/{args.job_id}/kill/")
    if result["canceling"]:
        print(
            f"job {args.job_id}: killing; its processes get SIGKILL now and its GPUs are "
            "released once they are gone",
            file=out,
        )
    else:
        print(f"job {args.job_id} canceled (it ran nowhere: nothing to kill)", file=out)
    return 0


def cmd_hold_or_release(api: Api, args: argparse.Namespace, out: TextIO) -> int:
    """``release`` or ``hold`` (``args.action``) a job."""
    job = api.call("POST", f"/api/v1/jobs/{args.job_id}/{args.action}/")
    print(
        f"job {job['id']} {'held' if args.action == 'hold' else 'released'}: {job['state']}",
        file=out,
    )
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
    parts = [f"{plural(job['gpu_count'], 'GPU')} x {plural(job['node_count'], 'node')}"]
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


def state_word(state: str) -> str:
    """A job's state as the CLI says it (a pending job is held: ``--hold``, or Slurm's
    ``scontrol hold``)."""
    return STATE_WORDS.get(state, state)


def _api_state(word: str) -> str:
    return next((state for state, said in STATE_WORDS.items() if said == word), word)


def _list_id(job: Mapping[str, Any]) -> str:
    """``57``, ``57 (12_3)`` for a task of array 12, ``12_[3-999%50]`` for several tasks."""
    tasks = job.get("array_tasks")
    if tasks and tasks["count"] > 1:
        return tasks["label"]
    return str(job["id"]) + (f" ({job['array']}_{job['array_index']})" if job["array"] else "")


def _where_or_why(job: Mapping[str, Any]) -> str:
    tasks = job.get("array_tasks")
    several = f"{tasks['count']} tasks: " if tasks and tasks["count"] > 1 else ""
    return several + _where_or_why_one(job)


def _where_or_why_one(job: Mapping[str, Any]) -> str:
    if job["state"] in ("pending", "queued"):
        position = f"#{job['queue_position']} " if job["queue_position"] else ""
        return position + (job["pending_reason"] or state_word(job["state"]))
    if job["placement"]:
        return ", ".join(
            f"{node}:{','.join(map(str, gpus))}" for node, gpus in job["placement"]["nodes"].items()
        )
    return job["message"] or "-"


def _or_dash(value: object) -> str:
    return "-" if value is None else str(value)


def _attempt_gpus(attempt: Mapping[str, Any]) -> str:
    """``dgx-01:0,1``: where the attempt ran."""
    nodes = attempt["nodes"].items()
    return " ".join(f"{node}:{','.join(map(str, gpus))}" for node, gpus in nodes)


ATTEMPT_COLUMNS = (
    Column("ATTEMPT", lambda attempt: attempt["attempt"], align="right"),
    Column("WHERE", _attempt_gpus),
    Column("STARTED", lambda attempt: attempt["started_at"]),
    Column("ENDED", lambda attempt: attempt["ended_at"]),
    Column("EXIT", lambda attempt: attempt["exit_code"], align="right"),
    Column("HOW IT ENDED", lambda attempt: attempt["how_it_ended"]),
)
LIST_COLUMNS = (
    Column("ID", _list_id),
    Column("STATE", lambda job: state_word(job["state"]), coloured=True),
    Column("PRIORITY", lambda job: job["priority"]),
    Column("GPUS", lambda job: job["gpu_count"] * job["node_count"], align="right"),
    Column("OWNER", lambda job: job["owner"]),
    Column("NAME", lambda job: job["name"]),
    Column("WHERE / WHY", _where_or_why),
)


# --------------------------------------------------------------------------- arguments


def add_verbs(verbs: argparse._SubParsersAction) -> None:
    """The ``jobs`` verb group."""
    jobs = verbs.add_parser(
        "jobs", help="submit, list, show, hold, release, cancel jobs; read their logs (API)"
    )
    actions = jobs.add_subparsers(dest="action", required=True, metavar="ACTION")

    submit = actions.add_parser(
        "submit", help="submit a job: gpuadmin jobs submit [OPTIONS] -- CMD ..."
    )
    submit.add_argument("--gpus", type=int, help="GPUs per node (default 1)")
    submit.add_argument("--nodes", type=int, help="nodes of a multi-node job (default 1)")
    submit.add_argument(
        "--model", help="GPU product name or an unambiguous part of it, e.g. 'H100'"
    )
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
    submit.add_argument("--env", action="append", default=[], type=env_pair, metavar="NAME=VALUE")
    submit.add_argument(
        "--workdir", metavar="PATH", help="absolute working directory (in the image with --image)"
    )
    submit.add_argument("--image", metavar="IMAGE", help="run in this container image")
    submit.add_argument(
        "--ray",
        action="store_true",
        help="run CMD as a Ray application on a Ray cluster of the job's own nodes",
    )
    submit.add_argument("--hold", action="store_true", help="store it held (pending)")
    submit.add_argument("--pool", help="run on this pool's GPUs (default: the GPUs in no pool)")
    submit.add_argument("--mig", metavar="PROFILE", help="one MIG device, e.g. 1g.10gb")
    submit.add_argument("--mps", type=int, metavar="PERCENT", help="an MPS share: %% of the SMs")
    submit.add_argument("--mps-memory", type=int, metavar="MIB", help="its memory limit")
    submit.add_argument("--reservation", type=int, metavar="ID", help="run in your reservation")
    submit.add_argument(
        "--dependency", metavar="SPEC", help="as Slurm's: afterok:12:13,afterany:14,afternotok:15"
    )
    submit.add_argument(
        "--array", metavar="SPEC", help="a job array, as Slurm's: 0-999%%50, 1,3,5-9, 0-15:4"
    )
    submit.add_argument(
        "--idempotency-key",
        type=idempotency_key,
        metavar="KEY",
        help="submit at most once: a resend with the same KEY answers with the job it stored",
    )
    submit.add_argument("--shell", action="store_true", help="run CMD through /bin/sh -c")
    submit.add_argument("command", nargs=argparse.REMAINDER, metavar="-- CMD ...")
    submit.set_defaults(run=run_verb(cmd_submit))

    listing = actions.add_parser("list", help="your jobs (everyone's for viewers and operators)")
    listing.add_argument(
        "--state",
        action="append",
        choices=(*STATES, *STATE_WORDS.values()),
        help="repeatable (held is pending)",
    )
    listing.add_argument("--all", action="store_true", help="finished jobs too")
    listing.add_argument("--limit", type=int, default=100, help="rows (default 100)")
    listing.add_argument("--array", type=int, metavar="ID", help="the tasks of this job array")
    listing.add_argument(
        "--expand",
        action="store_true",
        help="one row per array task (default: an array's tasks in one state on one row)",
    )
    add_json_flag(listing)
    listing.set_defaults(run=run_verb(cmd_list))

    show = actions.add_parser(
        "show", aliases=["describe"], help="a job: where it runs, or why it is pending"
    )
    show.add_argument("job_id", type=int)
    add_json_flag(show)
    show.set_defaults(run=run_verb(cmd_show))

    array = actions.add_parser(
        "array", help="a job array's tasks by state (or --cancel, --hold, --release it)"
    )
    array.add_argument("array_id", type=int)
    acts = array.add_mutually_exclusive_group()
    acts.add_argument("--cancel", action="store_true", help="cancel its unfinished tasks")
    acts.add_argument("--hold", action="store_true", help="hold its waiting tasks (scontrol hold)")
    acts.add_argument(
        "--release", action="store_true", help="release its held tasks (scontrol release)"
    )
    add_json_flag(array)
    array.set_defaults(run=run_verb(cmd_array))

    cancel = actions.add_parser(
        "cancel", help="cancel a job (12), or tasks of an array (12_5, 12_[3-7,9])"
    )
    cancel.add_argument(
        "job", type=job_or_tasks, metavar="JOB", help="12, 12_5 or 12_[3-7,9] (as scancel)"
    )
    add_json_flag(cancel)
    cancel.set_defaults(run=run_verb(cmd_cancel))

    kill = actions.add_parser(
        "kill", help="kill a job: SIGKILL at once, no grace (for one that ignores a cancel)"
    )
    kill.add_argument("job_id", type=int)
    kill.set_defaults(run=run_verb(cmd_kill))

    release = actions.add_parser("release", help="let a held job into the queue")
    release.add_argument("job_id", type=int)
    release.set_defaults(run=run_verb(cmd_hold_or_release))
    hold = actions.add_parser("hold", help="hold a queued job until it is released")
    hold.add_argument("job_id", type=int)
    hold.set_defaults(run=run_verb(cmd_hold_or_release))

    log = actions.add_parser("log", help="a job's log, read through its node's agent")
    log.add_argument("job_id", type=int)
    log.add_argument(
        "--tail", type=_line_count, default=100, help="lines from the end (default 100)"
    )
    log.add_argument("--node", help="node of a multi-node job (default its first)")
    log.add_argument("-f", "--follow", action="store_true", help="print new lines every 2 s")
    log.set_defaults(run=run_verb(cmd_log))


def command_words(words: list[str]) -> list[str]:
    """A command given after ``--`` (``argparse.REMAINDER`` keeps the ``--``)."""
    return words[1:] if words[:1] == ["--"] else words


def env_pair(value: str) -> tuple[str, str]:
    """``NAME=VALUE`` as (name, value): the value may hold ``=`` too."""
    name, equals, given = value.partition("=")
    if not equals:
        raise argparse.ArgumentTypeError(f"expected NAME=VALUE, got {value!r}")
    return name, given


def _memory(value: str) -> int:
    try:
        return slurm.parse_memory(value)
    except slurm.SpecError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _line_count(text: str) -> int:
    count = int(text)
    if count < 0:
        raise argparse.ArgumentTypeError(f"{count}: a number of lines, 0 or more")
    return count
