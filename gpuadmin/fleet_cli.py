"""The operator's verbs over the HTTP API (``gpuadmin.client``): ``status`` (the fleet at a
glance, as ``sinfo``), ``nodes``, ``gpus``, ``health``, ``watch`` (a live table, as ``watch
nvidia-smi``) and ``drain``/``offline``/``online`` (as ``scontrol update state=...``).
Standard library only until a terminal is drawn (rich). docs/operations/cli.md shows each verb's
output.
"""

from __future__ import annotations

import argparse
import re
import time
from collections.abc import Mapping, Sequence
from typing import Any, TextIO

from gpuadmin.client import GPU_UUID, Api, ApiError, run_verb
from gpuadmin.terminal import (
    Column,
    add_json_flag,
    draws,
    fit_columns,
    print_facts,
    print_json,
    print_rows,
    print_table,
    rich_table,
    table_cells,
)

# The statuses ``status`` always has a column for (the brief's sinfo columns); the others
# (offline, missing, foreign, resetting) get one when a GPU of the fleet has them.
STATUS_COLUMNS = ("free", "busy", "draining", "degraded", "mig", "mps")
NODE_STATES = ("online", "draining", "offline")
GPU_STATES = ("available", "draining", "degraded", "resetting", "offline")
# An NVIDIA GPU's UUID (``nvidia-smi -L``): a drain|offline|online argument shaped so is a GPU.
WATCH_MIN_INTERVAL_S = 0.5
# What of a terminal a watched table leaves to its title and the "more below" line.
WATCH_CHROME_LINES = 3


# --------------------------------------------------------------------------- status, nodes


def cmd_status(api: Api, args: argparse.Namespace, out: TextIO) -> int:
    """Each node's GPUs counted by status as the fleet page counts them, then the totals."""
    fleet = api.call("GET", "/api/v1/fleet/", node=args.node)
    if args.node and not fleet["nodes"]:
        raise ApiError(None, f"no node {args.node!r}")
    if args.json:
        print_json(out, fleet)
        return 0
    total = fleet["total"]
    shown = [
        status
        for status in fleet["statuses"]
        if status in STATUS_COLUMNS or total["counts"].get(status)
    ]
    columns = [
        Column("NODE", lambda node: node["hostname"]),
        Column("STATE", lambda node: node["state"], coloured=True),
        Column("REACHABLE", lambda node: _reachable(node["reachable"])),
        Column("GPUS", lambda node: node["gpus"], align="right"),
        *(_count_column(status) for status in shown),
        Column("MODEL", lambda node: ", ".join(node["gpu_models"])),
    ]
    answering = sum(node["reachable"] for node in fleet["nodes"])
    totals = {
        "hostname": "total",
        "state": "",
        "reachable": f"{answering}/{len(fleet['nodes'])}",  # how many nodes answer
        "gpus": total["gpus"],
        "counts": total["counts"],
        "gpu_models": [],
    }
    rows = [*fleet["nodes"], totals]
    print_table(out, columns, rows)
    counts = ", ".join(f"{total['counts'][status]} {status}" for status in shown)
    hot = f"; {total['hot']} hot" if total["hot"] else ""
    print(f"{total['gpus']} GPUs on {len(fleet['nodes'])} nodes: {counts}{hot}", file=out)
    return 0


def _reachable(value: bool | str) -> str:
    if isinstance(value, str):
        return value
    return "yes" if value else "unreachable"


def _count_column(status: str) -> Column:
    return Column(status.upper(), lambda node: node["counts"].get(status, 0), align="right")


NODE_COLUMNS = (
    Column("NODE", lambda node: node["hostname"]),
    Column("STATE", lambda node: node["state"], coloured=True),
    Column("REACHABLE", lambda node: _reachable(node["reachable"])),
    Column("GPUS", lambda node: node["gpu_count"], align="right"),
    Column("MODEL", lambda node: node["model"]),
    Column("NVML", lambda node: node["nvml_backend"]),
    Column("DRIVER", lambda node: node["driver_version"]),
    Column("HEARTBEAT", lambda node: node["last_heartbeat_at"]),
    Column("REASON", lambda node: node["state_reason"]),
)


def cmd_nodes(api: Api, args: argparse.Namespace, out: TextIO) -> int:
    nodes = api.every("/api/v1/nodes/", state=args.state)
    print_rows(out, args, NODE_COLUMNS, nodes)
    return 0


# --------------------------------------------------------------------------- gpus, watch


def _live(name: str) -> Any:
    return lambda gpu: (gpu["live"] or {}).get(name)


def _live_text(name: str) -> Any:
    return lambda gpu: ((gpu["live"] or {}).get("text") or {}).get(name)


def _holder(live: dict[str, Any]) -> Any:
    """The gpuadmin job holding the GPU, else the work outside gpuadmin that does (a Slurm
    job: ``Slurm job 1234 on hpc``), else None."""
    if live.get("job") is not None:
        return live["job"]
    return live.get("held_by")


# The fleet page's columns (its static table: GPU, model, state; its live one: status,
# utilization, memory, temperature, power, job and user), then the UUID. ``drop``: what a
# narrow terminal leaves out first (``watch`` at 80 columns keeps node to user).
GPU_COLUMNS = (
    Column("NODE", lambda gpu: gpu["node"]),
    Column("GPU", lambda gpu: gpu["index"], align="right"),
    Column("MODEL", lambda gpu: gpu["name"], drop=3),
    Column("STATE", lambda gpu: gpu["state"], coloured=True, drop=2),
    Column("STATUS", _live("status"), coloured=True),
    Column("UTIL", _live_text("utilization"), align="right"),
    Column("MEM GiB", _live_text("memory"), align="right"),
    Column("TEMP", _live_text("temperature"), align="right"),
    Column("POWER", _live_text("power"), align="right"),
    Column("JOB", lambda gpu: _holder(gpu["live"] or {}), align="right"),
    Column("USER", _live("user")),
    Column("UUID", lambda gpu: gpu["uuid"], drop=4),
)


def _gpus(api: Api, args: argparse.Namespace) -> list[dict[str, Any]]:
    free = True if getattr(args, "free", False) else None
    return api.every("/api/v1/gpus/", node=args.node, state=getattr(args, "state", None), free=free)


def cmd_gpus(api: Api, args: argparse.Namespace, out: TextIO) -> int:
    gpus = _gpus(api, args)
    print_rows(out, args, GPU_COLUMNS, gpus)
    return 0


def watch_interval(text: str) -> float:
    """``--interval``'s type: ``2s``, ``500ms``, ``1m`` or seconds (``1.5``), at least 0.5 s."""
    match = re.fullmatch(r"(\d+(?:\.\d+)?)(ms|s|m)?", text.strip())
    if match is None:
        raise argparse.ArgumentTypeError(f"{text!r} is not a duration (2s, 500ms, 1m)")
    seconds = float(match[1]) * {"ms": 0.001, "s": 1, None: 1, "m": 60}[match[2]]
    if seconds < WATCH_MIN_INTERVAL_S:
        raise argparse.ArgumentTypeError(f"{text!r}: at least {WATCH_MIN_INTERVAL_S:g}s")
    return seconds


def cmd_watch(api: Api, args: argparse.Namespace, out: TextIO) -> int:
    """The GPUs table every ``--interval`` until Ctrl-C: redrawn in place on a terminal (the
    alternate screen, as ``watch`` and nvitop; the terminal is restored on the way out), one
    table after another, each under a title line, anywhere else (a log, a pipe)."""
    if not draws(out):
        while True:
            title, gpus = _watch_frame(api, args)
            out.write(title + "\n")
            print_table(out, GPU_COLUMNS, gpus)
            out.write("\n")
            out.flush()
            time.sleep(args.interval)
    from rich.console import Console
    from rich.live import Live

    console = Console(file=out, highlight=False)
    with Live(console=console, screen=True, auto_refresh=False) as live:
        while True:
            try:
                title, gpus = _watch_frame(api, args)
            except ApiError as exc:
                if exc.status is not None:
                    raise
                title, gpus = f"{_clock()}  {exc} (trying again)", []
            live.update(_watch_view(title, gpus, console.width, console.height), refresh=True)
            time.sleep(args.interval)


def _watch_frame(api: Api, args: argparse.Namespace) -> tuple[str, list[dict[str, Any]]]:
    fleet = api.call("GET", "/api/v1/fleet/", node=args.node)
    gpus = _gpus(api, args)
    total = fleet["total"]
    counts = ", ".join(f"{count} {status}" for status, count in total["counts"].items() if count)
    where = f" on {args.node}" if args.node else ""
    title = (
        f"{_clock()}  every {args.interval:g}s{where}: {total['gpus']} GPUs"
        + (f" ({counts})" if counts else "")
        + "  Ctrl-C to quit"
    )
    return title, gpus


def _clock() -> str:
    return time.strftime("%H:%M:%S")


def _watch_view(title: str, gpus: Sequence[Mapping[str, Any]], width: int, height: int) -> Any:
    """The title, and as many GPUs as the terminal holds in the columns its width holds (one
    line each), with how many more there are below."""
    from rich.console import Group
    from rich.text import Text

    room = max(height - WATCH_CHROME_LINES, 1)
    shown, hidden = gpus[:room], len(gpus) - room
    cells = table_cells(GPU_COLUMNS, shown)
    kept = fit_columns(GPU_COLUMNS, cells, width)
    columns = [GPU_COLUMNS[i] for i in kept]
    table = rich_table(columns, [[line[i] for i in kept] for line in cells], fit=True)
    parts: list[Any] = [Text(title, style="bold", no_wrap=True, overflow="ellipsis"), table]
    if hidden > 0:
        parts.append(Text(f"... {hidden} more GPUs (--node N shows one node)", style="dim"))
    return Group(*parts)


# --------------------------------------------------------------------------- health


EVENT_COLUMNS = (
    Column("WHEN", lambda event: event["occurred_at"]),
    Column("NODE", lambda event: event["node"]),
    Column("GPU", lambda event: event["gpu_index"], align="right"),
    Column("WHAT", lambda event: event["what"]),
    Column("SEVERITY", lambda event: event["severity"], coloured=True),
    Column("MESSAGE", lambda event: event["message"]),
    Column("DONE", lambda event: "; ".join(event["outcome"])),
)


def cmd_health(api: Api, args: argparse.Namespace, out: TextIO) -> int:
    """State and reason, open quarantine and live counters of a GPU, a node's GPUs or the
    fleet's GPUs that need a look; then the latest health events."""
    report = api.call("GET", "/api/v1/health/", gpu=args.gpu, node=args.node, events=args.events)
    if args.json:
        print_json(out, report)
        return 0
    if not report["gpus"] and not (args.gpu or args.node):
        print("every GPU is available: none is draining, fenced, offline or missing", file=out)
    for gpu in report["gpus"]:
        reason = f" ({gpu['state_reason']})" if gpu["state_reason"] else ""
        print(
            f"GPU {gpu['index']} of {gpu['node']}: {gpu['state']}{reason}, now {gpu['status']}",
            file=out,
        )
        held = gpu["quarantine"]
        facts: list[tuple[str, object]] = [
            ("uuid", gpu["uuid"]),
            ("model", gpu["model"]),
            ("since", gpu["state_changed_at"]),
            ("error", gpu["error"]),
        ]
        if held:
            facts += [
                ("quarantine", f"{held['state']} since {held['opened_at']}: {held['cause']}"),
                ("waiting for", held["waiting_for"]),
            ]
        facts += [(counter["label"], counter["text"]) for counter in gpu["counters"]]
        print_facts(out, facts)
    print(file=out)
    if report["events"]:
        print(f"latest health events ({len(report['events'])}):", file=out)
        print_table(out, EVENT_COLUMNS, report["events"])
    else:
        print("no health events recorded", file=out)
    return 0


# --------------------------------------------------------------------------- drain, offline, online


# What each verb sets a node to, and a GPU to.
STATE_OF_VERB = {
    "drain": ("draining", "draining"),
    "offline": ("offline", "offline"),
    "online": ("online", "available"),
}


def cmd_state(api: Api, args: argparse.Namespace, out: TextIO) -> int:
    """Drain, take offline or bring online a GPU (a UUID) or a node (a hostname), with a
    reason; then what changed and which jobs it left running or stopped."""
    node_state, gpu_state = STATE_OF_VERB[args.verb]
    is_gpu = GPU_UUID.fullmatch(args.target) is not None
    kind, state = ("gpus", gpu_state) if is_gpu else ("nodes", node_state)
    body: dict[str, Any] = {"state": state, "reason": args.reason}
    if getattr(args, "force", False):
        body["force"] = True
    try:
        result = api.call("POST", f"/api/v1/{kind}/{args.target}/state/", body)
    except ApiError as exc:
        if exc.status == 404:
            what = "GPU" if is_gpu else "node (a GPU is named by its UUID, GPU-...)"
            raise ApiError(404, f"no {what} {args.target!r}") from None
        raise
    if args.json:
        print_json(out, result)
        return 0
    label = f"GPU {result['index']} of {result['node']}" if is_gpu else f"node {args.target}"
    print(f"{label}: {state_change_text(result)}", file=out)
    return 0


def state_change_text(result: Mapping[str, Any]) -> str:
    """``draining (jobs 4 and 5 still running)``, ``offline (job 4 requeued)``, ``already
    online``: a state endpoint's answer in words."""
    change = result["change"]
    said = result["state"] if change["changed"] else f"already {result['state']}"
    notes = []
    if change["running_jobs"]:
        notes.append(f"{_jobs(change['running_jobs'])} still running")
    if change["stopped_jobs"]:
        notes.append(f"{_jobs(change['stopped_jobs'])} requeued")
    return said + (f" ({'; '.join(notes)})" if notes else "")


def _jobs(ids: Sequence[int]) -> str:
    listed = ", ".join(map(str, ids))
    return f"job {listed}" if len(ids) == 1 else f"{len(ids)} jobs: {listed}"


# --------------------------------------------------------------------------- arguments


def add_verbs(verbs: argparse._SubParsersAction) -> None:
    """``status``, ``nodes``, ``gpus``, ``health``, ``watch``, ``drain``, ``offline`` and
    ``online``."""
    status = verbs.add_parser(
        "status", help="the fleet at a glance: each node's GPUs by status, and totals (API)"
    )
    status.add_argument("--node", metavar="NODE", help="this node alone")
    add_json_flag(status)
    status.set_defaults(run=run_verb(cmd_status))

    nodes = verbs.add_parser("nodes", help="the nodes: state, reachability, GPUs, driver (API)")
    nodes.add_argument("--state", choices=NODE_STATES, help="nodes in this state")
    add_json_flag(nodes)
    nodes.set_defaults(run=run_verb(cmd_nodes))

    gpus = verbs.add_parser(
        "gpus", help="the GPUs with their live values and the job on each, as the fleet page"
    )
    gpus.add_argument("--node", metavar="NODE", help="this node's GPUs")
    gpus.add_argument("--state", choices=GPU_STATES, help="GPUs in this state")
    gpus.add_argument("--free", action="store_true", help="GPUs usable now and held by no job")
    add_json_flag(gpus)
    gpus.set_defaults(run=run_verb(cmd_gpus))

    health = verbs.add_parser(
        "health", help="state, quarantine, counters and latest events of a GPU, node or fleet"
    )
    which = health.add_mutually_exclusive_group()
    which.add_argument("--gpu", metavar="UUID", help="this GPU")
    which.add_argument("--node", metavar="NODE", help="this node's GPUs")
    health.add_argument(
        "--events", type=int, default=20, metavar="N", help="latest events shown (default 20)"
    )
    add_json_flag(health)
    health.set_defaults(run=run_verb(cmd_health))

    watch = verbs.add_parser(
        "watch", help="the GPUs table, refreshed in place until Ctrl-C (as watch nvidia-smi)"
    )
    watch.add_argument(
        "--interval",
        type=watch_interval,
        default=2.0,
        metavar="TIME",
        help="between refreshes: 2s (default), 500ms, 1m",
    )
    watch.add_argument("--node", metavar="NODE", help="this node's GPUs")
    watch.set_defaults(run=run_verb(cmd_watch))

    for verb, text in (
        ("drain", "no new work on a GPU or node; running jobs finish (scontrol state=drain)"),
        ("offline", "take a GPU or node out of service now (--force requeues its jobs)"),
        ("online", "bring a GPU or node back into service"),
    ):
        change = verbs.add_parser(verb, help=text)
        change.add_argument("target", metavar="GPU_UUID|NODE", help="a GPU's UUID or a node")
        change.add_argument("--reason", required=True, metavar="TEXT", help="why (audited)")
        if verb == "offline":
            change.add_argument(
                "--force",
                action="store_true",
                help="requeue the jobs running there (without it, refused while any runs)",
            )
        add_json_flag(change)
        change.set_defaults(run=run_verb(cmd_state))
