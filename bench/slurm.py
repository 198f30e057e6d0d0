"""A private Slurm 22.05 on this machine, for the benches that compare gpuadmin with it and the
tests of gpuadmin's Slurm integration (tests/integrations/slurm/conftest.py).

    with SlurmCluster(tuned=True) as slurm:
        client = slurm.client()  # picklable: for client processes
        client.sbatch(["--hold", "--wrap", "true"])
        client.rest_submit(client.connect(), hold=True)

The cluster it runs (one node, 8 GPUs as GRES, tuned or not) and its slurmrestd:
docs/development/design-notes.md, "A private Slurm: bench/slurm.py".
"""

from __future__ import annotations

import http.client
import json
import os
import shutil
import signal
import socket
import subprocess
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

from common import wait_for, wait_for_port

INSTALL_SCRIPT = Path(__file__).resolve().parent.parent / ".ci" / "install-slurm"
REST_VERSION = "v0.0.38"
GPUS = 8
NODE = "localhost"  # the only node: slurmd finds itself by this name
PARTITION = "batch"  # the only one: every job is in it
ESLURM_JOB_HELD = 2042


def ensure_installed() -> None:
    """Debian's Slurm packages, installed by .ci/install-slurm when they are missing; a
    RuntimeError with the installer's last words when it cannot."""
    install = subprocess.run(["sh", str(INSTALL_SCRIPT)], capture_output=True, text=True)
    if install.returncode != 0:
        raise RuntimeError(
            "Debian's Slurm is not installed and .ci/install-slurm could not install it "
            f"(root or sudo and the Debian archive needed): {install.stderr[-400:]}"
        )


def start_munge(directory: Path) -> Path:
    """A munged of the cluster's own (Slurm's authentication between its daemons and of its
    clients), its socket, key and state in ``directory``: it shares its replay cache of
    credentials with no other cluster (a test session's, an earlier run's) and stops with the
    cluster. The socket's path."""
    directory.mkdir(mode=0o755)
    key = directory / "munge.key"
    key.write_bytes(os.urandom(1024))
    key.chmod(0o400)
    for path in (directory, key):
        shutil.chown(path, "munge", "munge")
    socket_path = directory / "munge.socket"
    options = {
        "socket": socket_path,
        "key-file": key,
        "pid-file": directory / "munged.pid",
        "log-file": directory / "munged.log",
        "seed-file": directory / "munged.seed",
    }
    command = " ".join(["/usr/sbin/munged", "--force", *(f"--{o}={p}" for o, p in options.items())])
    subprocess.run(["su", "-s", "/bin/sh", "munge", "-c", command], check=True)
    wait_for(socket_path.exists, 30, "munged's socket")
    return socket_path


def _exited(pid: int) -> Callable[[], bool]:
    """Whether ``pid`` is gone or a zombie: the daemons detach, and no one here reaps them."""

    def exited() -> bool:
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
        except FileNotFoundError:
            return True
        return stat.rsplit(")", 1)[1].split()[0] == "Z"

    return exited


def free_ports(count: int) -> int:
    """The first of ``count`` consecutive TCP ports that nothing listens on now."""
    for _ in range(100):
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            first = probe.getsockname()[1]
        if first + count > 65535:
            continue
        taken = []
        try:
            for port in range(first, first + count):
                held = socket.socket()
                taken.append(held)
                held.bind(("", port))
        except OSError:
            continue
        finally:
            for held in taken:
                held.close()
        return first
    raise RuntimeError(f"no {count} consecutive free ports found")


class UnixHTTPConnection(http.client.HTTPConnection):
    """HTTP/1.1 over a Unix socket, kept open between requests."""

    def __init__(self, path: str) -> None:
        super().__init__("localhost")
        self.path = path

    def connect(self) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.connect(self.path)


class SlurmCluster:
    """slurmctld on ``port``, slurmd on ``port + 1`` (two free ones when ``port`` is None: other
    clusters, a test session's or another bench's, may run beside it), and slurmrestd on a Unix
    socket (``rest_auth/local``) and, given ``rest_port``, on 127.0.0.1:``rest_port`` too (JWT:
    ``token()``), speaking the ``openapi`` plugins' versions."""

    def __init__(
        self,
        *,
        tuned: bool = True,
        port: int | None = None,
        rest_port: int | None = None,
        openapi: tuple[str, ...] = (REST_VERSION,),
    ) -> None:
        self.tuned = tuned
        self.port = free_ports(2) if port is None else port
        self.rest_port = rest_port
        self.openapi = openapi
        self.dir = Path(tempfile.mkdtemp(prefix="gpuadmin-slurm-"))
        self.conf = self.dir / "slurm.conf"
        self.socket = str(self.dir / "rest.sock")
        self.env = {**os.environ, "SLURM_CONF": str(self.conf)}
        self.restd: list[subprocess.Popen[bytes]] = []

    # ------------------------------------------------------------------ lifecycle

    def __enter__(self) -> SlurmCluster:
        ensure_installed()
        try:
            self.dir.chmod(0o755)  # munged (as munge) reaches its directory in it
            self.munge_socket = start_munge(self.dir / "munge")
            self._write_config()
            self._run("slurmctld", "-c", "-f", str(self.conf))
            self._run("slurmd", "-f", str(self.conf))
            self.dir.chmod(0o777)  # slurmrestd (as nobody) creates its socket here
            self.restd = [self._start_restd("local", f"unix:{self.socket}", self.env)]
            if self.rest_port is not None:
                # slurmrestd passes a client's JWT on to slurmctld only when it authenticates
                # with JWT itself (SLURM_JWT=daemon), which the Unix socket's local mode cannot.
                self.restd.append(
                    self._start_restd(
                        "jwt", f"127.0.0.1:{self.rest_port}", {**self.env, "SLURM_JWT": "daemon"}
                    )
                )
            wait_for(
                lambda: "idle" in self._out("sinfo", "-h", "-o", "%T"), 60, "the node to be idle"
            )
            wait_for(lambda: Path(self.socket).exists(), 60, "slurmrestd's socket")
            if self.rest_port is not None:
                wait_for_port(self.rest_port, 60, "slurmrestd", log=self.dir / "slurmrestd-jwt.log")
        except BaseException:
            self.__exit__(None, None, None)  # no daemon left behind by a start that failed
            raise
        return self

    def _start_restd(self, auth: str, listen: str, env: dict[str, str]) -> subprocess.Popen[bytes]:
        return subprocess.Popen(
            [
                "slurmrestd",
                "-f",
                str(self.conf),
                "-u",
                "nobody",
                "-g",
                "nogroup",
                "-s",
                ",".join(f"openapi/{version}" for version in self.openapi),
                "-a",
                f"rest_auth/{auth}",
                listen,
            ],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=(self.dir / f"slurmrestd-{auth}.log").open("wb"),
        )

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        subprocess.run(
            ["scancel", "--full", f"--partition={PARTITION}"], env=self.env, capture_output=True
        )
        for restd in self.restd:
            restd.terminate()
            restd.wait(timeout=30)
        subprocess.run(["scontrol", "shutdown"], env=self.env, capture_output=True)
        for name in ("slurmd.pid", "slurmctld.pid"):
            pid_file = self.dir / name
            if pid_file.exists():
                wait_for(_exited(int(pid_file.read_text())), 60, f"{name} to stop")
        munged = self.dir / "munge" / "munged.pid"
        if munged.exists():
            pid = int(munged.read_text())
            os.kill(pid, signal.SIGTERM)
            wait_for(_exited(pid), 60, "munged to stop")
        shutil.rmtree(self.dir, ignore_errors=True)

    def _write_config(self) -> None:
        for name in ("state", "spool", "dev"):
            (self.dir / name).mkdir()
        jwt_key = self.dir / "jwt.key"  # slurmctld signs and checks ``scontrol token``'s tokens
        jwt_key.write_bytes(os.urandom(32))
        jwt_key.chmod(0o600)
        for index in range(GPUS):
            (self.dir / "dev" / f"nvidia{index}").touch()
        cpus = 8 if self.tuned else os.cpu_count() or 1
        # Slurm's high-throughput advice: schedule at once; forget ended jobs after 5 s, not 300.
        scheduler = "SchedulerParameters=batch_sched_delay=0,sched_min_interval=0\nMinJobAge=5\n"
        self.conf.write_text(
            f"""ClusterName=gpuadmin-bench
SlurmctldHost=localhost
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket={self.munge_socket}
AuthAltTypes=auth/jwt
AuthAltParameters=jwt_key={jwt_key}
StateSaveLocation={self.dir}/state
SlurmdSpoolDir={self.dir}/spool
SlurmctldPidFile={self.dir}/slurmctld.pid
SlurmdPidFile={self.dir}/slurmd.pid
SlurmctldPort={self.port}
SlurmdPort={self.port + 1}
SlurmctldLogFile={self.dir}/slurmctld.log
SlurmdLogFile={self.dir}/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
{scheduler if self.tuned else ""}GresTypes=gpu
JobCompType=jobcomp/none
AccountingStorageType=accounting_storage/none
# Finished jobs stay in slurmctld's memory for MinJobAge (300 s) and count against MaxJobCount
# (10,000 by default, after which every submission is refused): a submission bench makes
# tens of thousands of jobs within minutes.
MaxJobCount=1000000
# Slurm's default (1001) refuses an --array of more tasks: bench/arrays.py submits 0-1999 and more.
MaxArraySize=100001
MpiDefault=none
ReturnToService=2
SlurmdParameters=config_overrides
NodeName={NODE} CPUs={cpus} Gres=gpu:{GPUS} RealMemory=8000 State=UNKNOWN
PartitionName={PARTITION} Nodes={NODE} Default=YES MaxTime=INFINITE State=UP
"""
        )
        (self.dir / "gres.conf").write_text(f"Name=gpu File={self.dir}/dev/nvidia[0-{GPUS - 1}]\n")

    def _run(self, *argv: str) -> None:
        subprocess.run(argv, env=self.env, check=True)

    def _out(self, *argv: str) -> str:
        return subprocess.run(argv, env=self.env, capture_output=True, text=True).stdout

    # ------------------------------------------------------------------ work

    def client(self) -> SlurmClient:
        return SlurmClient(str(self.conf), self.socket)

    def token(self, user: str = "nobody", lifespan_s: int = 3600) -> str:
        """A JWT for ``user`` (``scontrol token``), for slurmrestd's ``rest_auth/jwt``."""
        line = self._out("scontrol", "token", f"username={user}", f"lifespan={lifespan_s}")
        name, _, token = line.strip().partition("=")
        if name != "SLURM_JWT" or not token:
            raise RuntimeError(f"scontrol token gave no token: {line!r}")
        return token

    def queued(self) -> int:
        """Jobs not finished yet (pending or running)."""
        return len(self._out("squeue", "-h", "-o", "%i").split())

    def cancel_all(self) -> None:
        """Cancel every job: sbatch's (root's) and slurmrestd's (``nobody``'s)."""
        subprocess.run(["scancel", f"--partition={PARTITION}"], env=self.env, check=True)
        wait_for(lambda: self.queued() == 0, 120, "canceled jobs to leave the queue")


@dataclass(frozen=True)
class SlurmClient:
    """What a client process needs to submit to a running ``SlurmCluster``."""

    conf: str
    socket: str

    def sbatch(self, args: list[str]) -> str:
        """``sbatch --parsable ARGS``: the job id."""
        done = subprocess.run(
            ["sbatch", "--parsable", "-o", "/dev/null", *args],
            env={**os.environ, "SLURM_CONF": self.conf},
            capture_output=True,
            text=True,
            check=True,
        )
        return done.stdout.strip()

    def connect(self) -> UnixHTTPConnection:
        return UnixHTTPConnection(self.socket)

    def rest_submit(self, connection: UnixHTTPConnection, *, hold: bool) -> int:
        """POST one one-GPU ``true`` job to slurmrestd over ``connection``; its id."""
        body = json.dumps(
            {
                "script": "#!/bin/sh\ntrue\n",
                "job": {
                    "name": "bench",
                    "current_working_directory": "/tmp",
                    "environment": {"PATH": "/usr/bin:/bin"},
                    "gres": "gpu:1",
                    "standard_output": "/dev/null",
                    "hold": hold,
                },
            }
        )
        connection.request(
            "POST",
            f"/slurm/{REST_VERSION}/job/submit",
            body,
            {"Content-Type": "application/json"},
        )
        reply = json.loads(connection.getresponse().read())
        # A held job is accepted with ESLURM_JOB_HELD ("pending scheduler release") as its error.
        errors = [e for e in reply.get("errors", []) if e.get("error_code") != ESLURM_JOB_HELD]
        if errors or "job_id" not in reply:
            raise RuntimeError(f"slurmrestd refused a job: {errors}")
        return int(reply["job_id"])
