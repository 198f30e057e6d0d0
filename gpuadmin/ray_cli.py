"""``gpuadmin ray ...``: the registered Ray clusters, and jobs submitted to them (submit,
status, logs, cancel) through the HTTP API (``gpuadmin.client``), standard library only.
docs/operations/cli.md shows each verb's output."""

from __future__ import annotations

import argparse
import json
from typing import Any, TextIO

from gpuadmin.client import Api, ApiError, run_verb
from gpuadmin.jobs_cli import command_words, env_pair
from gpuadmin.terminal import Column, add_json_flag, print_facts, print_json, print_rows


def _number(value: float) -> str:
    return f"{value:g}"


CLUSTER_COLUMNS = (
    Column("NAME", lambda cluster: cluster["name"]),
    Column("STATE", lambda cluster: cluster["state"], coloured=True),
    Column(
        "GPUS",
        lambda cluster: f"{_number(cluster['gpus_in_use'])}/{_number(cluster['gpus'])}",
        "right",
    ),
    Column("NODES", lambda cluster: len(cluster["nodes"]), "right"),
    Column("ADDRESS", lambda cluster: cluster["address"]),
    Column("ERROR", lambda cluster: cluster["last_error"], drop=1),
)
JOB_COLUMNS = (
    Column("ID", lambda job: job["id"], "right"),
    Column("CLUSTER", lambda job: job["cluster"]),
    Column("STATE", lambda job: job["state"], coloured=True),
    Column("GPUS", lambda job: _number(job["gpus"]), "right"),
    Column("OWNER", lambda job: job["owner"]),
    Column("ENTRYPOINT", lambda job: job["entrypoint"], drop=2),
    Column("MESSAGE", lambda job: job["message"], drop=1),
)


def cmd_clusters(api: Api, args: argparse.Namespace, out: TextIO) -> int:
    print_rows(out, args, CLUSTER_COLUMNS, api.every("/api/v1/ray/clusters/"))
    return 0


def cmd_submit(api: Api, args: argparse.Namespace, out: TextIO) -> int:
    entrypoint = command_words(args.entrypoint)
    if not entrypoint:
        raise ApiError(None, "no entrypoint given: gpuadmin ray submit --cluster C -- CMD ...")
    runtime_env: dict[str, Any] = args.runtime_env or {}
    if args.env:
        runtime_env.setdefault("env_vars", {}).update(args.env)
    job = api.call(
        "POST",
        "/api/v1/ray/jobs/",
        {
            "cluster": args.cluster,
            # Ray runs the entrypoint with a shell: the words are one command line.
            "entrypoint": " ".join(entrypoint),
            "runtime_env": runtime_env,
            "gpus": args.gpus,
            "cpus": args.cpus,
        },
    )
    if args.json:
        print_json(out, job)
    else:
        print(f"Ray job {job['id']} submitted to {job['cluster']}: {job['state']}", file=out)
        print_facts(out, [("submission id", job["submission_id"]), ("message", job["message"])])
    return 0


def cmd_status(api: Api, args: argparse.Namespace, out: TextIO) -> int:
    """One job's state (and Ray's message), or the jobs the requester sees."""
    if args.job_id is None:
        print_rows(out, args, JOB_COLUMNS, api.every("/api/v1/ray/jobs/"))
        return 0
    job = api.call("GET", f"/api/v1/ray/jobs/{args.job_id}/")
    if args.json:
        print_json(out, job)
        return 0
    print(f"Ray job {job['id']} on {job['cluster']}: {job['state']}", file=out)
    print_facts(
        out,
        [
            ("message", job["message"]),
            ("entrypoint", job["entrypoint"]),
            ("GPUs, CPUs", f"{_number(job['gpus'])}, {_number(job['cpus'])}"),
            ("submission id", job["submission_id"]),
            ("owner", job["owner"]),
            ("submitted", job["created_at"]),
            ("started", job["started_at"]),
            ("ended", job["ended_at"]),
        ],
    )
    return 0


def cmd_logs(api: Api, args: argparse.Namespace, out: TextIO) -> int:
    out.write(api.call("GET", f"/api/v1/ray/jobs/{args.job_id}/logs/")["logs"])
    return 0


def cmd_cancel(api: Api, args: argparse.Namespace, out: TextIO) -> int:
    job = api.call("POST", f"/api/v1/ray/jobs/{args.job_id}/cancel/")
    print(f"Ray job {job['id']}: stop requested ({job['state']})", file=out)
    return 0


def add_verbs(verbs: argparse._SubParsersAction) -> None:
    """The ``ray`` verb group."""
    ray = verbs.add_parser(
        "ray", help="Ray clusters, and jobs on them: submit, status, logs, cancel (API)"
    )
    actions = ray.add_subparsers(dest="action", required=True, metavar="ACTION")

    clusters = actions.add_parser("clusters", help="the registered Ray clusters and their GPUs")
    add_json_flag(clusters)
    clusters.set_defaults(run=run_verb(cmd_clusters))

    submit = actions.add_parser(
        "submit", help="submit a job to a Ray cluster: gpuadmin ray submit --cluster C -- CMD ..."
    )
    submit.add_argument("--cluster", required=True, help="the cluster's name")
    submit.add_argument("--gpus", type=float, default=0, help="GPUs Ray reserves for it")
    submit.add_argument("--cpus", type=float, default=0, help="CPUs Ray reserves for it")
    submit.add_argument(
        "--env", action="append", type=env_pair, metavar="NAME=VALUE", help="repeatable"
    )
    submit.add_argument(
        "--runtime-env", type=_json_object, metavar="JSON", help="Ray's runtime_env, as JSON"
    )
    add_json_flag(submit)
    submit.add_argument("entrypoint", nargs=argparse.REMAINDER, metavar="-- CMD ...")
    submit.set_defaults(run=run_verb(cmd_submit))

    status = actions.add_parser("status", help="a Ray job's state and Ray's message, or your jobs")
    status.add_argument("job_id", type=int, nargs="?", metavar="ID")
    add_json_flag(status)
    status.set_defaults(run=run_verb(cmd_status))

    logs = actions.add_parser("logs", help="a Ray job's output, as Ray keeps it")
    logs.add_argument("job_id", type=int, metavar="ID")
    logs.set_defaults(run=run_verb(cmd_logs))

    cancel = actions.add_parser("cancel", help="ask Ray to stop a job")
    cancel.add_argument("job_id", type=int, metavar="ID")
    cancel.set_defaults(run=run_verb(cmd_cancel))


def _json_object(value: str) -> dict[str, Any]:
    try:
        parsed = json.loads(value)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"not JSON: {exc}") from None
    if not isinstance(parsed, dict):
        raise argparse.ArgumentTypeError('expected a JSON object, such as {"pip": ["torch"]}')
    return parsed
