"""The ``gpuadmin`` console command: the whole stack, its processes, and the NVML tools.

Verbs that need Django (``up``, ``serve``, ``worker``, ``beat``, ``agent``, ``manage``) first
make sure ``DATABASE_URL``/``REDIS_URL`` point somewhere: when they are unset, private embedded
servers are started under the data directory and stopped again when the verb that started them
exits. ``scan`` and ``sim`` need no database.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import secrets
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from contextlib import suppress
from pathlib import Path
from typing import TYPE_CHECKING

from gpuadmin import ask_cli, fleet_cli, jobs_cli, ops_cli, ray_cli
from gpuadmin.client import verb_name
from gpuadmin.demo_isolation import (
    JOB_ACCOUNT,
    PRIVATE_FILE_MODE,
    AccountError,
    ensure_account,
    protect_data_dir,
)
from gpuadmin.embedded import EmbeddedServices, data_dir_from_env, ensure_service_urls
from gpuadmin.env import (
    DEFAULT_BIND,
    env_int,
    export_public_url,
    node_environment,
    split_bind,
)
from gpuadmin.supervisor import CrashLoop, Supervisor

if TYPE_CHECKING:
    from inventory.nvml.scanner import NodeScan

CHILD_STOP_GRACE_S = 10.0
# How long the web server lets requests in flight finish when it stops, within `up`'s grace.
WEB_STOP_GRACE_S = 8
GRPC_BIND = "127.0.0.1:50051"  # gRPC's customary port
# How long `up` keeps the central worker, once the agents are gone, to record their jobs' ends.
JOB_REPORT_WAIT_S = 15.0
AGENT_LOG = logging.getLogger("gpuadmin.agent")
CLI_ACTOR = "cli"  # who the audit log says acted, for a verb run on the server


# Environment and Django bootstrap ----------------------------------------------------------


def _ensure_secret_key(data_dir: Path) -> None:
    """Outside DEBUG, a missing SECRET_KEY becomes a random key kept in the data directory."""
    if os.environ.get("SECRET_KEY") or os.environ.get("SECRET_KEY_FILE"):
        return
    key_file = data_dir / "secret_key"
    if not key_file.exists():
        data_dir.mkdir(parents=True, exist_ok=True)
        key_file.touch(mode=0o600)
        key_file.write_text(secrets.token_urlsafe(50))
    os.environ["SECRET_KEY_FILE"] = str(key_file)


def _bootstrap_django(*, database: bool = True) -> EmbeddedServices | None:
    """Fill the environment, start embedded services when needed (no database and no secret
    key for an agent), and set Django up."""
    data_dir = data_dir_from_env()
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "gpuadmin.settings")
    if database:
        _ensure_secret_key(data_dir)
    services = ensure_service_urls(data_dir, database=database)
    import django

    django.setup()
    return services


def _with_django(
    run: Callable[[argparse.Namespace], int], *, database: bool = True
) -> Callable[[argparse.Namespace], int]:
    """Run a verb with Django set up under a new request id, stopping any embedded servers it
    had to start."""

    def wrapper(args: argparse.Namespace) -> int:
        services = _bootstrap_django(database=database)
        from gpuadmin import request_id

        try:
            # The audit rows of one command share an id, and name the verb as their channel.
            with request_id.bound(channel=f"cli {verb_name(args)}"):
                return run(args)
        finally:
            if services is not None:
                services.release()

    return wrapper


def _stop_on_signals(*, stopping: bool = False) -> None:
    """SIGTERM unwinds like Ctrl-C (SIGINT), so ``finally`` blocks stop what we started; once
    ``stopping``, both are ignored so that a second one cannot cut the orderly stop short."""

    def handler(signum: int, frame: object) -> None:
        if stopping:
            print(f"{signal.Signals(signum).name}: already stopping", flush=True)
            return
        raise KeyboardInterrupt

    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, handler)


# Verbs ---------------------------------------------------------------------------------------


@_with_django
def cmd_manage(args: argparse.Namespace) -> int:
    from django.core.management import execute_from_command_line

    execute_from_command_line(["gpuadmin manage", *args.rest])
    return 0


def bind_address(bind: str) -> tuple[str, int]:
    """``HOST:PORT`` (``[::1]:8000`` for IPv6) as the address and port to listen on."""
    address = split_bind(bind)
    if address is None:
        raise argparse.ArgumentTypeError(f"{bind!r} is not HOST:PORT (e.g. 127.0.0.1:8000)")
    return address


def positive_int(text: str) -> int:
    """An argument that is a whole number of at least 1."""
    if not (text.isdecimal() and int(text) >= 1):
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number of at least 1")
    return int(text)


def bind_argument(bind: str) -> str:
    """``--bind``'s type: ``HOST:PORT``, refused at once when it is not one."""
    bind_address(bind)
    return bind


@_with_django
def cmd_serve(args: argparse.Namespace) -> int:
    from granian import Granian
    from granian.constants import Interfaces

    host, port = bind_address(args.bind)
    # granian: HTTP parsing and the WSGI environ in Rust, the application in each worker's
    # blocking threads (which overlap each request's database and Redis waits). URLs of up
    # to 65,534 bytes (its HTTP library's limit) reach the API, which answers in JSON.
    Granian(
        "gpuadmin.wsgi:application",
        address=host,
        port=port,
        interface=Interfaces.WSGI,
        websockets=False,
        workers=args.workers,
        blocking_threads=args.threads,
        log_access=True,
        respawn_failed_workers=True,  # a worker that dies (OOM killer) is started again
        respawn_interval=1.0,
        workers_kill_timeout=WEB_STOP_GRACE_S,  # requests in flight finish first
    ).serve()
    return 0


@_with_django
def cmd_grpc(args: argparse.Namespace) -> int:
    from gpuadmin.rpc import server

    _stop_on_signals()
    try:
        tls = server.Tls.read(args.tls_cert, args.tls_key) if args.tls_cert else None
        server.serve(args.bind, threads=args.threads, tls=tls)
    except server.CannotListen as exc:
        print(f"gpuadmin grpc: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        pass
    return 0


def _celery(argv: list[str]) -> int:
    from gpuadmin.celery import app

    try:
        app.start(argv)
    except SystemExit as exc:
        return int(exc.code or 0)
    return 0


@_with_django
def cmd_worker(args: argparse.Namespace) -> int:
    from django.conf import settings

    return _celery(
        [
            "worker",
            "-Q",
            args.queues or settings.GPUADMIN_CENTRAL_QUEUE,
            "-n",
            "central@%h",
            "-c",
            str(args.concurrency),
            "-l",
            "INFO",
        ]  # fmt: skip
    )


@_with_django
def cmd_beat(args: argparse.Namespace) -> int:
    schedule = data_dir_from_env() / "celerybeat-schedule"
    schedule.parent.mkdir(parents=True, exist_ok=True)
    return _celery(["beat", "-l", "INFO", "-s", str(schedule)])


def cmd_agent(args: argparse.Namespace) -> int:
    """A node agent: scan this node through NVML, then serve the node's Celery queue. It has
    no database (only the broker) and signs its reports with the node's credential."""
    os.environ["GPUADMIN_NODE_NAME"] = args.node
    os.environ["GPUADMIN_AGENT"] = "1"
    if args.token_file:
        os.environ["GPUADMIN_NODE_TOKEN_FILE"] = args.token_file
    if args.jobs_as_agent:
        os.environ["GPUADMIN_JOBS_AS_OWNER"] = "off"
    if args.sim:
        os.environ["GPUADMIN_NVML"] = "sim"
        os.environ["GPUADMIN_SIM_MODEL"] = args.sim

    def run(_: argparse.Namespace) -> int:
        from django.conf import settings

        from gpuadmin.access.node_orders import node_queue, serve_orders_only
        from gpuadmin.access.node_signing import parse_token, send_as_node
        from gpuadmin.celery import app
        from health import agent as health_agent
        from inventory.agent import AgentLoop, node_backend, scan_this_node
        from scheduling.agent.jobs import executor, flush_reports, isolation_report, stop_jobs

        try:
            parse_token(settings.GPUADMIN_NODE_TOKEN)
        except ValueError as exc:
            print(
                f"gpuadmin agent: GPUADMIN_NODE_TOKEN (or --token-file): {exc}; create one on "
                f"the central side with `gpuadmin node credential create {args.node}`",
                file=sys.stderr,
            )
            return 2
        scan = scan_this_node()
        system = scan.system
        summary = f"{len(scan.gpus)} GPUs, driver {system.driver_version or 'n/a'}"
        print(f"agent {args.node}: {summary}" + (f" ({system.error})" if system.error else ""))
        # The health watcher compares every sample the loop takes; XIDs come from NVML events.
        health = health_agent.start(args.node, node_backend(), send_as_node)
        loop = AgentLoop(args.node, send_as_node, isolation=isolation_report())
        loop.start()
        jobs = executor()  # re-adopts or reports the jobs a previous agent left
        serve_orders_only(app)
        try:
            return _celery(
                [
                    "--quiet",  # no banner per agent: the line above says what it serves
                    "worker",
                    "-Q", node_queue(args.node),
                    "-n", f"agent.{args.node}@%h",
                    "-P", "solo",
                    "-l", "INFO",
                    # Agents never talk to each other: no start-up sync, no gossip.
                    "--without-mingle", "--without-gossip",
                ]
            )  # fmt: skip
        finally:
            loop.stop()
            health.stop()
            if not args.stop_jobs_on_exit:
                jobs.shutdown(kill=False)  # they run on; the next agent re-adopts them
            else:
                if running := jobs.running():
                    AGENT_LOG.info("agent %s: stopping %d running job(s)", args.node, len(running))
                stop_jobs(args.node)  # re-queued within their retries: the node stopped
            flush_reports()  # job events still queued (its sender thread ends with it)
            AGENT_LOG.info("agent %s: stopped", args.node)

    return _with_django(run, database=False)(args)


@_with_django
def cmd_check(args: argparse.Namespace) -> int:
    """Scan the database for violated scheduling invariants; exit 1 when any is found."""
    from scheduling.checks import report

    return 1 if report(sys.stdout) else 0


@_with_django
def cmd_token(args: argparse.Namespace) -> int:
    """Create an API token for a user (on the server: it needs the database). The key goes to
    stdout, once; only its hash is stored."""
    from django.contrib.auth import get_user_model

    from gpuadmin.access.services import create_token

    user = get_user_model().objects.filter(username=args.user).first()
    if user is None:
        print(f"gpuadmin token create: no user {args.user!r}", file=sys.stderr)
        return 1
    _, key = create_token(user, args.name, actor_name=CLI_ACTOR)
    print(key)
    print(
        f"token {args.name!r} for {args.user} created; the key above is shown only this once "
        "(use it as GPUADMIN_TOKEN)",
        file=sys.stderr,
    )
    return 0


@_with_django
def cmd_node_credential(args: argparse.Namespace) -> int:
    """Issue, revoke or list node credentials (on the server: it needs the database)."""
    from gpuadmin.access.models import NodeCredential
    from gpuadmin.access.nodes import create_credential, revoke_credentials

    if args.action == "create":
        _, token = create_credential(args.node, actor_name=CLI_ACTOR)
        print(token)
        print(
            f"credential for node {args.node} created; the token above is shown only this "
            "once (give it to that node's agent as GPUADMIN_NODE_TOKEN or _FILE)",
            file=sys.stderr,
        )
    elif args.action == "revoke":
        revoked = revoke_credentials(args.node, actor_name=CLI_ACTOR)
        print(f"{revoked} credential(s) of node {args.node} revoked")
    else:
        for credential in NodeCredential.objects.order_by("node", "pk"):
            revoked_at = credential.revoked_at
            state = f"revoked {revoked_at:%Y-%m-%d %H:%M}" if revoked_at else "active"
            created = f"{credential.created_at:%Y-%m-%d %H:%M}"
            print(f"#{credential.pk}  {credential.node}  created {created}  {state}")
    return 0


@_with_django
def cmd_slurm_gres_conf(args: argparse.Namespace) -> int:
    """A node's ``gres.conf`` from the catalog, on stdout (Debian's slurmd detects no GPU)."""
    from integrations.slurm.gres import node_gres_conf
    from inventory.models import Node

    node = Node.objects.filter(hostname=args.node).first()
    if node is None:
        print(f"gpuadmin slurm gres-conf: no node {args.node!r} in the catalog", file=sys.stderr)
        return 1
    sys.stdout.write(node_gres_conf(node))
    return 0


def cmd_scan(args: argparse.Namespace) -> int:
    """One node's NVML scan, like a structured ``nvidia-smi``."""
    from inventory.nvml import open_backend
    from inventory.nvml.scanner import scan

    if args.sim:
        backend = open_backend(
            "sim",
            sim_model=args.sim,
            node_name=args.node or f"{Path(args.sim).stem}-01",
            state_dir=args.state_dir,
        )
    else:
        backend = open_backend("real")
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.ERROR,
        format="%(levelname)s %(name)s: %(message)s",
    )
    result = scan(backend)
    if args.json:
        print(json.dumps(result.to_dict(), indent=2))
    elif result.gpus:
        _print_scan_table(result)
    if result.system.error:
        print(f"gpuadmin scan: no usable NVIDIA GPU: {result.system.error}", file=sys.stderr)
        return 1
    return 0


def _print_scan_table(result: NodeScan) -> None:
    system = result.system
    print(
        f"Driver {system.driver_version or 'n/a'}  CUDA {system.cuda_driver_version or 'n/a'}  "
        f"NVML {system.nvml_version or 'n/a'}  GPUs {len(result.gpus)}"
    )
    for gpu in result.gpus:
        facts, metrics = gpu.facts, gpu.metrics
        if facts.error_message:
            print(f"  GPU {facts.index}  {facts.uuid or '?'}  ERROR: {facts.error_message}")
            continue
        util = _or_dash(metrics and metrics.utilization_gpu_pct, "%")
        temp = _or_dash(metrics and metrics.temperature_c, "C")
        power = "-" if not metrics or metrics.power_w is None else f"{metrics.power_w:.0f}W"
        print(
            f"  GPU {facts.index}  {facts.name:<28} {facts.pci_bus_id}  "
            f"{facts.memory_used_mib:>6}/{facts.memory_total_mib} MiB  util {util:>4}  "
            f"{temp:>4}  {power:>7}  NUMA {_or_dash(facts.numa_node)}"
            + ("  MIG" if facts.mig_enabled else "")
        )


def _or_dash(value: object, unit: str = "") -> str:
    return "-" if value is None else f"{value}{unit}"


def cmd_completion(args: argparse.Namespace) -> int:
    """A bash or zsh completion script of the whole command line, written by shtab from the
    argparse parser itself (so it lists every verb and option there is)."""
    import shtab

    sys.stdout.write(shtab.complete(build_parser(), shell=args.shell))
    return 0


def cmd_sim(args: argparse.Namespace) -> int:
    """The simulator's own CLI (``import`` turns a captured machine into a machine model)."""
    from inventory.nvml.sim.cli import main as sim_main

    os.environ.setdefault("GPUADMIN_SIM_STATE_DIR", str(data_dir_from_env() / "sim"))
    return sim_main(args.rest)


def cmd_services(args: argparse.Namespace) -> int:
    services = EmbeddedServices(data_dir_from_env())
    if args.action == "start":
        for name, url in services.start(keep_running=True).items():
            print(f"{name}={url}")
    elif args.action == "stop":
        services.stop(everything=True)
        print("embedded services stopped")
    else:
        for name, running in services.status().items():
            print(f"{name}={running or '(not running)'}")
    return 0


# up: the whole stack for one machine ---------------------------------------------------------


def _ensure_admin() -> None:
    from django.contrib.auth import get_user_model

    user_model = get_user_model()
    if user_model.objects.filter(is_superuser=True).exists():
        print("admin user: exists (credentials were printed when it was created)")
        return
    password = secrets.token_urlsafe(12)
    user_model.objects.create_superuser("admin", "admin@localhost", password)
    print(f"admin user created: username 'admin', password '{password}' (shown only this once)")


def _demo_nodes(fleet_path: str) -> list[tuple[str, str]]:
    """(node name, machine model) for each node of the simulated demo fleet."""
    spec = json.loads(Path(fleet_path).read_text())
    return [(node["name"], node["model"]) for node in spec["nodes"]]


def _demo_token_file(node: str) -> Path:
    """A file holding the demo node's credential (issued on first use), readable only by us."""
    from gpuadmin.access.nodes import node_token

    path = data_dir_from_env() / "agent" / node / "node-token"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.touch(mode=PRIVATE_FILE_MODE)
    path.chmod(PRIVATE_FILE_MODE)
    path.write_text(node_token(node, actor_name="gpuadmin-up"))
    return path


def _isolate_demo_jobs(nodes: list[str]) -> bool:
    """Keep the demo's jobs out of the installation and say as which account they run: as
    root, an unprivileged account of their own (made here) that the jobs of everyone without
    an account of their own run as; otherwise this process's own, like the agents. False when
    that account cannot be made."""
    protect_data_dir(data_dir_from_env(), nodes)
    if not nodes:  # --no-agents: no demo jobs (agents started by hand run theirs as set up)
        return True
    if os.geteuid() != 0:
        from inventory.agent import job_account  # not root: the agents' own account

        print(
            f"demo jobs run as {job_account()}, the account the agents run as: nothing "
            "keeps a job from their credentials and the data folder (start gpuadmin up as "
            "root to give jobs an account of their own)"
        )
        return True
    from django.conf import settings  # validated there (env_unix_user)

    name = settings.GPUADMIN_DEFAULT_UNIX_ACCOUNT or JOB_ACCOUNT
    os.environ["GPUADMIN_DEFAULT_UNIX_ACCOUNT"] = name
    try:
        account = ensure_account(name)
    except AccountError as exc:
        print(f"gpuadmin up: {exc}", file=sys.stderr)
        return False
    os.environ["GPUADMIN_JOBS_AS_OWNER"] = "auto"  # never as the agents' own account (root)
    print(
        f"demo jobs run as the Unix account {name} (uid {account.pw_uid}), unless an admin "
        "gives their owner another; they cannot read the agents' credentials or the data folder"
    )
    return True


def _start_child(argv: list[str], name: str) -> subprocess.Popen[bytes]:
    print(f"starting {name}: gpuadmin {' '.join(argv)}", flush=True)
    # An agent gets what a real node gets, never the central side's database or secret key.
    env = node_environment(os.environ) if argv[0] == "agent" else None
    return subprocess.Popen(
        [sys.executable, "-m", "gpuadmin", *argv], start_new_session=True, env=env
    )


def _stop_stack(supervisor: Supervisor, nodes: list[str]) -> None:
    """Stop placing jobs (a pass under way commits first), then stop the agents (they stop
    their jobs, which are re-queued within their retries), the web and gRPC servers and beat;
    keep the central worker until it has recorded those jobs' ends, then stop it."""
    from django.db import DatabaseError
    from redis.exceptions import RedisError

    from scheduling.loop.passes import resume_placing, stop_placing
    from scheduling.models import HOLDING_STATES, Job, JobState

    try:
        stop_placing()
    except (DatabaseError, RedisError) as exc:
        print(f"cannot stop the placement loop first ({exc}); stopping everything")
    try:
        jobs = Job.objects.filter(
            state=JobState.RUNNING,
            allocations__node__hostname__in=nodes,
            allocations__released_at__isnull=True,
        )
        running = set(jobs.values_list("pk", flat=True))
    except DatabaseError as exc:
        print(f"cannot list the demo nodes' jobs ({exc}); stopping without waiting for them")
        running = set()
    if running:
        print(f"stopping {len(running)} running job(s) on the demo nodes", flush=True)
    supervisor.stop([name for name in supervisor.children if name != "worker"])
    deadline = time.monotonic() + JOB_REPORT_WAIT_S
    with suppress(DatabaseError):
        while running and supervisor.running("worker") and time.monotonic() < deadline:
            time.sleep(0.2)
            holding = Job.objects.filter(pk__in=running, state__in=HOLDING_STATES)
            running = set(holding.values_list("pk", flat=True))
    if running:
        print(
            f"job(s) {', '.join(map(str, sorted(running)))} not recorded as ended yet: "
            "the worker records them when it next starts"
        )
    supervisor.stop(["worker"] if "worker" in supervisor.children else [])
    with suppress(RedisError):
        resume_placing()  # for the next start (which clears it too, should this not)


def cmd_up(args: argparse.Namespace) -> int:
    _stop_on_signals()
    services = _bootstrap_django()
    supervisor = Supervisor(_start_child)
    nodes: list[str] = []
    try:
        from django.conf import settings
        from django.core.management import call_command

        call_command("migrate", interactive=False, verbosity=0)
        print("database: migrated")
        from scheduling.loop.passes import resume_placing

        resume_placing()  # a stack stopped without finishing its stop left the mark
        _ensure_admin()
        demo = [] if args.no_agents else _demo_nodes(settings.GPUADMIN_SIM_FLEET)
        if not _isolate_demo_jobs([node for node, _ in demo]):
            return 1
        supervisor.start("web", ["serve", "--bind", args.bind], stop_grace_s=CHILD_STOP_GRACE_S)
        if args.grpc_bind:
            supervisor.start(
                "grpc", ["grpc", "--bind", args.grpc_bind], stop_grace_s=CHILD_STOP_GRACE_S
            )
        supervisor.start("worker", ["worker"], stop_grace_s=CHILD_STOP_GRACE_S)
        supervisor.start("beat", ["beat"], stop_grace_s=CHILD_STOP_GRACE_S)
        # An agent cancels its jobs on the way out: SIGTERM, then SIGKILL after the jobs' grace.
        agent_grace_s = settings.GPUADMIN_JOB_KILL_GRACE_S + CHILD_STOP_GRACE_S
        for node, model in demo:
            supervisor.start(
                f"agent {node}",
                [
                    "agent", "--node", node, "--sim", model, "--stop-jobs-on-exit",
                    "--token-file", str(_demo_token_file(node)),
                ],
                stop_grace_s=agent_grace_s,
            )  # fmt: skip
            nodes.append(node)
        print(f"\ngpuadmin is up: http://{args.bind}/  (admin: http://{args.bind}/admin/)")
        if args.grpc_bind:
            print(f"gRPC API (gpuadmin.v1): {args.grpc_bind}")
        print("Press Ctrl-C to stop everything.\n", flush=True)
        while True:
            supervisor.poll()
            time.sleep(0.5)
    except KeyboardInterrupt:
        print("\nstopping...", flush=True)
        return 0
    except CrashLoop:
        return 1
    finally:
        _stop_on_signals(stopping=True)
        _stop_stack(supervisor, nodes)
        if services is not None:
            services.release()


# Argument parsing ----------------------------------------------------------------------------


def _add_bind(verb: argparse.ArgumentParser) -> None:
    """``--bind HOST:PORT`` (`up` passes it on to `serve`)."""
    verb.add_argument(
        "--bind", type=bind_argument, default=os.environ.get("GPUADMIN_BIND", DEFAULT_BIND)
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="gpuadmin", description=__doc__.splitlines()[0])
    verbs = parser.add_subparsers(dest="verb", required=True, metavar="VERB")

    up = verbs.add_parser(
        "up", help="the whole stack for one machine (web, gRPC, worker, beat, agents)"
    )
    _add_bind(up)
    grpc_bind = up.add_mutually_exclusive_group()
    grpc_bind.add_argument(
        "--grpc-bind",
        type=bind_argument,
        default=GRPC_BIND,
        metavar="HOST:PORT",
        help=f"where the gRPC API listens (default {GRPC_BIND})",
    )
    grpc_bind.add_argument(
        "--no-grpc",
        dest="grpc_bind",
        action="store_const",
        const="",
        help="do not start the gRPC API server",
    )
    up.add_argument("--no-agents", action="store_true", help="do not start simulated agents")
    up.set_defaults(run=cmd_up)

    serve = verbs.add_parser("serve", help="the web server (granian, WSGI)")
    _add_bind(serve)
    serve.add_argument(
        "--workers", type=positive_int, default=env_int("WEB_CONCURRENCY", 2, minimum=1)
    )
    serve.add_argument("--threads", type=positive_int, default=env_int("WEB_THREADS", 2, minimum=1))
    serve.set_defaults(run=cmd_serve)

    grpc = verbs.add_parser("grpc", help="the gRPC API server (gpuadmin.v1)")
    grpc.add_argument("--bind", type=bind_argument, default=GRPC_BIND)
    grpc.add_argument(
        "--threads",
        type=positive_int,
        default=32,
        help="calls and streams served at once (a stream holds one while it lasts)",
    )
    grpc.add_argument(
        "--tls-cert",
        type=Path,
        metavar="PATH",
        help="serve over TLS with this certificate chain (PEM; with --tls-key)",
    )
    grpc.add_argument("--tls-key", type=Path, metavar="PATH", help="the certificate's key (PEM)")
    grpc.set_defaults(run=cmd_grpc)

    worker = verbs.add_parser("worker", help="the central Celery worker")
    worker.add_argument("--queues", default=None, help="default: GPUADMIN_CENTRAL_QUEUE (default)")
    worker.add_argument("--concurrency", type=positive_int, default=2)
    worker.set_defaults(run=cmd_worker)

    beat = verbs.add_parser("beat", help="the Celery beat scheduler")
    beat.set_defaults(run=cmd_beat)

    agent = verbs.add_parser("agent", help="a node agent: NVML scan + Celery worker on node.NAME")
    agent.add_argument("--node", required=True, help="node name (its hostname)")
    agent.add_argument("--sim", metavar="MODEL", help="simulate this machine model")
    agent.add_argument(
        "--token-file",
        metavar="PATH",
        help="file holding the node's credential (default: GPUADMIN_NODE_TOKEN[_FILE])",
    )
    agent.add_argument(
        "--stop-jobs-on-exit",
        action="store_true",
        help="cancel running jobs when the agent stops (default: leave them running for the "
        "next agent to re-adopt)",
    )
    agent.add_argument(
        "--jobs-as-agent",
        action="store_true",
        help="run every job as this agent's own account, even as root (GPUADMIN_JOBS_AS_OWNER=off)",
    )
    agent.set_defaults(run=cmd_agent)

    check = verbs.add_parser("check", help="check the scheduling invariants in the database")
    check.set_defaults(run=cmd_check)

    scan = verbs.add_parser("scan", help="scan this node's GPUs through NVML")
    scan.add_argument(
        "--sim", metavar="MODEL", help="scan a simulated machine model (a name or a .json file)"
    )
    scan.add_argument("--node", help="simulated node name (default: MODEL-01)")
    scan.add_argument("--state-dir", help="simulator state directory (faults, MIG layout)")
    scan.add_argument("--json", action="store_true", help="print the whole scan as JSON")
    scan.add_argument("-v", "--verbose", action="store_true", help="log what NVML answers")
    scan.set_defaults(run=cmd_scan)

    fleet_cli.add_verbs(verbs)
    completion = verbs.add_parser(
        "completion",
        help="print a bash or zsh completion script (docs/operations/cli.md: installing it)",
    )
    completion.add_argument("shell", choices=("bash", "zsh"))
    completion.set_defaults(run=cmd_completion)
    jobs_cli.add_verbs(verbs)
    ops_cli.add_verbs(verbs)
    ray_cli.add_verbs(verbs)
    ask_cli.add_verbs(verbs)
    token = verbs.add_parser("token", help="API tokens for the CLI and automation")
    token_actions = token.add_subparsers(dest="action", required=True, metavar="ACTION")
    token_create = token_actions.add_parser("create", help="create a token; prints its key once")
    token_create.add_argument("name", help="what the token is for, e.g. laptop or ci")
    token_create.add_argument("--user", required=True, help="username the token acts as")
    token_create.set_defaults(run=cmd_token)

    node = verbs.add_parser("node", help="node credentials (what lets an agent report)")
    node_what = node.add_subparsers(dest="what", required=True, metavar="WHAT")
    credential = node_what.add_parser("credential", help="create, revoke or list credentials")
    credential_actions = credential.add_subparsers(dest="action", required=True, metavar="ACTION")
    for action, text in (
        ("create", "issue a credential for node NAME; prints its token once"),
        ("revoke", "revoke every credential of node NAME: its agent's reports are refused"),
    ):
        parser_ = credential_actions.add_parser(action, help=text)
        parser_.add_argument("node", metavar="NAME", help="the node (its agent's --node)")
        parser_.set_defaults(run=cmd_node_credential)
    listing = credential_actions.add_parser("list", help="every credential and its state")
    listing.set_defaults(run=cmd_node_credential)

    slurm = verbs.add_parser("slurm", help="what a Slurm cluster needs from the catalog")
    slurm_what = slurm.add_subparsers(dest="what", required=True, metavar="WHAT")
    gres_conf = slurm_what.add_parser(
        "gres-conf",
        help="print a node's gres.conf: its GPUs' types, device files, cores and NVLinks",
    )
    gres_conf.add_argument("node", metavar="NODE", help="the node's hostname in the catalog")
    gres_conf.set_defaults(run=cmd_slurm_gres_conf)

    # Listed for --help only: main() hands their arguments to Django's and the simulator's CLIs.
    verbs.add_parser("manage", help="Django's manage.py (gpuadmin manage help)")
    verbs.add_parser("sim", help="NVML simulator: models, inject, proc, reset, reboot, import")

    services = verbs.add_parser("services", help="the embedded PostgreSQL and Redis")
    services.add_argument("action", choices=("start", "stop", "status"))
    services.set_defaults(run=cmd_services)
    return parser


PASS_THROUGH_VERBS = {"manage": cmd_manage, "sim": cmd_sim}


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] in PASS_THROUGH_VERBS:
        # Their arguments (options included) belong to Django's and the simulator's own CLIs.
        return PASS_THROUGH_VERBS[argv[0]](argparse.Namespace(verb=argv[0], rest=argv[1:]))
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.verb == "grpc" and (args.tls_cert is None) != (args.tls_key is None):
        parser.error("grpc: give --tls-cert and --tls-key together")
    if args.verb in ("up", "serve"):
        export_public_url(args.bind)  # before Django reads it, here and in their children
    return args.run(args)


if __name__ == "__main__":
    sys.exit(main())
