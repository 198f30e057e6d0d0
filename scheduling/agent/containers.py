"""Jobs in containers: the runtime's command line for a job (docker, podman or apptainer), the
client's environment, and the calls that kill and remove a container that outlives its client.
See docs/development/executor.md, "Containers".
"""

from __future__ import annotations

import logging
import os
import re
import shlex
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass

from inventory.nvml.parsers.common import format_cpu_list
from scheduling.agent.wire import (
    BASE_ENV_KEYS,
    Account,
    JobSpec,
    base_environment,
)

#: The container runtimes, in the order ``auto`` looks for them on ``PATH``.
CONTAINER_RUNTIMES = ("docker", "podman", "apptainer")
#: What a runtime's client inherits from the agent besides :data:`BASE_ENV_KEYS` (its
#: configuration: daemon socket, context, storage, cache; the rootless runtime directory; the
#: proxies it pulls through), by name prefix. A job variable so named, or one for the dynamic
#: loader, is never put in the client's environment.
_CLIENT_ENV_PREFIXES = {
    "docker": ("DOCKER_",),
    "podman": ("CONTAINER", "REGISTRY_AUTH_FILE"),
    "apptainer": ("APPTAINER_",),
}
_SHARED_CLIENT_ENV_PREFIXES = ("XDG_", "HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY")
#: Runtimes whose containers can outlive their client (docker's daemon or podman's conmon keep
#: them): how to SIGKILL one, and how to remove one at once whether or not it still exists.
_CONTAINER_CALLS = {
    "docker": {"kill": ("kill",), "remove": ("rm", "-f")},
    "podman": {"kill": ("kill",), "remove": ("rm", "-f", "--ignore", "--time", "0")},
}
_RUNTIME_CALL_TIMEOUT_S = 60
# Image sources apptainer takes as they are (paths, SIF files, URIs, archives); anything else
# is a registry reference.
_APPTAINER_SOURCE = re.compile(
    r"[./]|.*\.sif\Z|[a-z]+://|(?:docker-archive|docker-daemon|oci|oci-archive):"
)

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class ContainerLimits:
    """What a docker or podman container gets of its job's confinement (apptainer's container
    is the client's own processes, in the job's cgroup)."""

    cpus: tuple[int, ...] = ()
    memory_mib: int = 0
    pids_max: int = 0
    cgroup_parent: str | None = None  # the job's cgroup, relative to the hierarchy's root

    def options(self) -> list[str]:
        options = []
        if self.cpus:
            options.append(f"--cpuset-cpus={format_cpu_list(self.cpus)}")
        if self.memory_mib:
            options.append(f"--memory={self.memory_mib}m")
        if self.pids_max:
            options.append(f"--pids-limit={self.pids_max}")
        if self.cgroup_parent:
            options.append(f"--cgroup-parent={self.cgroup_parent}")
        return options


def container_process(
    runtime: str,
    spec: JobSpec,
    agent_env: Mapping[str, str],
    *,
    gpu_devices: bool = True,
    account: Account | None = None,
    limits: ContainerLimits | None = None,
) -> tuple[list[str], dict[str, str]]:
    """The argv and environment of the ``runtime`` client that runs ``spec`` in its image as
    ``account`` (default: this process's; see the module docstring and the README's command
    lines). ``gpu_devices=False`` gives the container no GPU devices (simulated GPUs have
    none), while ``CUDA_VISIBLE_DEVICES`` still names the allocated GPUs. ``limits`` are the
    job's CPUs, memory and processes, and the cgroup the container's goes under.

    Nothing the job's owner chose can become an option of the runtime: every option is one
    ``--name=value`` argument of gpuadmin's making before the image (which :class:`JobSpec`
    refuses when it could read as an option); the job's command only follows the image."""
    if not spec.container_image:
        raise ValueError(f"job {spec.job_id} has no container image")
    devices = ",".join(spec.gpu_uuids) if gpu_devices else ""
    variables = {**spec.variables(), "NVIDIA_VISIBLE_DEVICES": devices or "void"}
    env = _client_environment(runtime, agent_env)
    workdir = spec.container_workdir
    if runtime == "apptainer":  # it runs as the account that starts it (the executor's doing)
        image = spec.container_image
        if not _APPTAINER_SOURCE.match(image):
            image = f"docker://{image}"
        env.update({f"APPTAINERENV_{name}": value for name, value in variables.items()})
        argv = ["apptainer", "exec", *(["--nv"] if devices else []), "--cleanenv"]
        return [*argv, *([f"--pwd={workdir}"] if workdir else []), image, *spec.command], env
    account = account or Account.own()
    argv = [runtime, "run", "--rm", "--init", f"--name={spec.container_name}"]
    argv.append(f"--user={account.uid}:{account.gid}")
    argv += (limits or ContainerLimits()).options()
    if devices and runtime == "docker":
        # Quoted: --gpus is read as CSV, where a bare comma would start its next option.
        argv.append(f'--gpus="device={devices}"')
    elif devices:
        argv += [f"--device=nvidia.com/gpu={uuid}" for uuid in spec.gpu_uuids]  # CDI: by UUID
    client_reads = (*_client_env_prefixes(runtime), "LD_")
    for name, value in variables.items():
        if name in BASE_ENV_KEYS or name.upper().startswith(client_reads):
            argv.append(f"--env={name}={value}")  # in the client's environment, it would obey
        else:
            argv.append(f"--env={name}")
            env[name] = value
    workdir_option = [f"--workdir={workdir}"] if workdir else []
    return [*argv, *workdir_option, spec.container_image, *spec.command], env


def _client_env_prefixes(runtime: str) -> tuple[str, ...]:
    return (*_CLIENT_ENV_PREFIXES[runtime], *_SHARED_CLIENT_ENV_PREFIXES)


def _client_environment(runtime: str, agent_env: Mapping[str, str]) -> dict[str, str]:
    """What a container runtime's client inherits from the agent: the base variables and the
    runtime's own configuration, never the rest (the agent's settings and secrets)."""
    prefixes = _client_env_prefixes(runtime)
    own = {name: value for name, value in agent_env.items() if name.upper().startswith(prefixes)}
    return {**base_environment(agent_env), **own}


def container_call(runtime: str | None, spec: JobSpec, action: str) -> None:
    """``<runtime> kill|rm -f <container>`` for a job whose container can outlive its client;
    a failure is logged, not raised: the job's supervision must go on."""
    if runtime not in _CONTAINER_CALLS:
        return
    command = [runtime, *_CONTAINER_CALLS[runtime][action], spec.container_name]
    try:
        result = subprocess.run(
            command,
            env=_client_environment(runtime, os.environ),
            stdin=subprocess.DEVNULL,
            capture_output=True,
            timeout=_RUNTIME_CALL_TIMEOUT_S,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        error = str(exc)
    else:
        if result.returncode == 0:
            return
        error = result.stderr.decode(errors="replace").strip() or f"exit {result.returncode}"
    logger.warning("job %s: %s failed: %s", spec.job_id, shlex.join(command), error)
