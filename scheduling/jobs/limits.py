"""Submission limits and checks: the bounds of a job's fields, the environment names a job may
not set, image references and commands. The form, the serializer and the CLI refuse in the words
of these checks.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Mapping
from typing import Any, TypedDict

from django.core.exceptions import ValidationError
from django.core.validators import MaxValueValidator, MinValueValidator

from gpuadmin.refusals import FieldRefusal
from gpuadmin.text import unstorable
from scheduling.jobs import slurm

# Submission limits beyond the fleet's own shape: absurd values are refused up front. The one
# definition: the form and the serializer take their bounds from ``SUBMISSION_LIMITS``, and a
# value out of range is refused in the same words (Django's range validators') whichever way
# the job came in.
MAX_RUNTIME_S = 90 * 24 * 3600
MAX_ENV_VARS = 200
MAX_ARGV = 4096
# Linux takes at most 128 KiB per argument (MAX_ARG_STRLEN) and about 2 MiB of arguments and
# environment together: a job's whole command, and its whole environment, stay below 128 KiB.
MAX_COMMAND_CHARS = 128 * 1024
MAX_ENV_CHARS = 128 * 1024
# Slurm's afterok:12:13,... text: 100 jobs of 18 digits fit; longer is a paste gone wrong.
MAX_DEPENDENCY_CHARS = 2000
SUBMISSION_LIMITS: dict[str, tuple[int, int]] = {
    "gpu_count": (1, 64),  # per node
    "node_count": (1, 1024),
    "min_gpu_memory_mib": (0, 1024 * 1024),  # 1 TiB per GPU: anything above is a typo
    "estimated_duration_s": (1, MAX_RUNTIME_S),
    "max_runtime_s": (1, MAX_RUNTIME_S),
    "max_retries": (0, 20),
    "mps_percent": (1, 100),  # of the GPU's SMs
    "mps_memory_mib": (1, 1024 * 1024),
    # Host resources per node (0: none asked): Linux's CPU ids stop below 65,536
    # (NR_CPUS <= 8192 today); 64 TiB of RAM is beyond the largest single hosts.
    "cpus": (0, 65_536),
    "host_memory_mib": (0, 64 * 1024 * 1024),
    # Job arrays (``--array``): tasks of one array, its indexes, and its %N cap.
    "array_tasks": (1, 10_000),
    "array_index": (0, 9_999_999),
    "array_max_running": (1, 10_000),
    # Jobs one job may depend on (``--dependency``), and the dependencies of all the tasks of
    # one array together (each task depends on each job, and every pass reads the rows).
    "dependencies": (0, 100),
    "array_dependencies": (0, 20_000),
}


class JobRejected(FieldRefusal):
    """A submission that can never run, naming the field and why."""


class Bounds(TypedDict):
    min_value: int
    max_value: int


def limit_bounds(field: str) -> Bounds:
    """``min_value``/``max_value`` for the form's or the serializer's field of that name."""
    low, high = SUBMISSION_LIMITS[field]
    return {"min_value": low, "max_value": high}


# Django's range validators of each limit (their messages are the ones the form shows).
_LIMIT_VALIDATORS = {
    name: (MinValueValidator(low), MaxValueValidator(high))
    for name, (low, high) in SUBMISSION_LIMITS.items()
}


def check_limits(fields: Mapping[str, Any]) -> None:
    """``JobRejected`` naming the first field outside ``SUBMISSION_LIMITS``."""
    for name, validators in _LIMIT_VALIDATORS.items():
        value = fields.get(name)
        if value is None:
            continue
        try:
            for validator in validators:
                validator(value)
        except ValidationError as exc:
            raise JobRejected(name, exc.messages[0]) from None


# Environment variables a job may not set, by exact name or by prefix: they choose which GPUs,
# MIG instances or MPS server a job sees, or configure the container runtime that runs it
# (gpuadmin sets the ones it needs from the allocation). The one list; docs/reference/api.md,
# "What a job may not ask for", quotes it.
RESERVED_ENV_NAMES = frozenset(
    {
        "CUDA_VISIBLE_DEVICES",
        "NVIDIA_VISIBLE_DEVICES",
        "NVIDIA_DRIVER_CAPABILITIES",
        "NVIDIA_DISABLE_REQUIRE",
        "NVIDIA_GDS",
        "NVIDIA_IMEX_CHANNELS",
        "GPU_DEVICE_ORDINAL",
        "HIP_VISIBLE_DEVICES",
        "ROCR_VISIBLE_DEVICES",
    }
)
RESERVED_ENV_PREFIXES = (
    "NVIDIA_REQUIRE_",
    "NVIDIA_MIG_",
    "CUDA_MPS_",
    "GPUADMIN_",
    "APPTAINERENV_",
    "APPTAINER_",
    "SINGULARITYENV_",
    "SINGULARITY_",
    "DOCKER_",
    "CONTAINERS_",
    "CONTAINER_HOST",
    "PODMAN_",
)
# A POSIX variable name (portable character set, no leading digit).
ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")

# The OCI image reference grammar (github.com/distribution/reference, regexp.go):
# [host[:port]/]path[:tag][@digest], at most 255 characters of name.
_PATH_COMPONENT = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
_DOMAIN_COMPONENT = r"(?:[a-zA-Z0-9]|[a-zA-Z0-9][a-zA-Z0-9-]*[a-zA-Z0-9])"
_HOST = rf"(?:{_DOMAIN_COMPONENT}(?:\.{_DOMAIN_COMPONENT})*|\[[a-fA-F0-9:]+\])(?::[0-9]+)?"
IMAGE_REFERENCE = re.compile(
    rf"(?P<name>(?:{_HOST}/)?{_PATH_COMPONENT}(?:/{_PATH_COMPONENT})*)"
    r"(?::[A-Za-z0-9_][A-Za-z0-9_.-]{0,127})?"
    r"(?:@[A-Za-z][A-Za-z0-9]*(?:[-_+.][A-Za-z][A-Za-z0-9]*)*:[0-9a-fA-F]{32,})?\Z"
)
IMAGE_NAME_MAX = 255


def check_text(field: str, value: str) -> None:
    """``JobRejected`` for text PostgreSQL cannot store: NUL characters or lone surrogates."""
    problem = unstorable(value)
    if problem:
        raise JobRejected(field, problem)


def check_image(image: str) -> None:
    """``JobRejected`` unless ``image`` is an OCI image reference (``name[:tag][@digest]``):
    nothing a container runtime could read as one of its options."""
    match = IMAGE_REFERENCE.match(image)
    if match is None:
        raise JobRejected(
            "container_image",
            f"{image!r} is not an image reference: [registry[:port]/]name[:tag][@digest], "
            "name in lowercase letters, digits and separators",
        )
    if len(match["name"]) > IMAGE_NAME_MAX:
        raise JobRejected("container_image", f"a name of at most {IMAGE_NAME_MAX} characters")


def reserved_env_name(name: str) -> bool:
    return name in RESERVED_ENV_NAMES or name.startswith(RESERVED_ENV_PREFIXES)


def check_env(env: Mapping[str, str]) -> None:
    """``JobRejected`` naming ``env`` for a variable that is not a POSIX name, is reserved
    (``RESERVED_ENV_NAMES``/``_PREFIXES``) or holds text PostgreSQL cannot store."""
    if len(env) > MAX_ENV_VARS:
        raise JobRejected("env", f"at most {MAX_ENV_VARS} variables")
    if sum(len(name) + len(value) for name, value in env.items()) > MAX_ENV_CHARS:
        raise JobRejected("env", f"at most {MAX_ENV_CHARS} characters of names and values")
    for name, value in env.items():
        check_text("env", name)
        if not ENV_NAME.match(name):
            raise JobRejected("env", f"not a variable name: {name!r}")
        if reserved_env_name(name):
            raise JobRejected(
                "env", f"{name} is reserved: it would change the job's GPUs or its runtime"
            )
        check_text("env", value)


def split_command(command: str | list[str], use_shell: bool) -> list[str]:
    """A command as argv: a list is kept, a string is split like a POSIX shell would, and with
    ``use_shell`` the string is kept whole for ``/bin/sh -c``. ``JobRejected`` when a string
    cannot be split."""
    if isinstance(command, list):
        return command
    if use_shell:
        return [command]
    if not _SHELL_QUOTING.search(command):  # most commands: as shlex would, without it
        return _SHELL_WORD.findall(command)
    try:
        return shlex.split(command)
    except ValueError as exc:  # e.g. an unclosed quote
        raise JobRejected("command", f"cannot split into arguments: {exc}") from None


# What shlex.split() (POSIX mode, no comments) treats specially besides its whitespace: a
# string without these splits at runs of its whitespace, nothing else.
_SHELL_QUOTING = re.compile(r"[\\'\"]")
_SHELL_WORD = re.compile(r"[^ \t\r\n]+")


def parse_array(spec: str, field: str = "array") -> slurm.ArraySpec:
    """``spec`` (``0-999%50``) within ``SUBMISSION_LIMITS``; ``JobRejected`` naming ``field``
    (``array``; ``tasks`` for the tasks of an array named to control them)."""
    check_text(field, spec)
    try:
        parsed = slurm.parse_array(
            spec,
            max_tasks=SUBMISSION_LIMITS["array_tasks"][1],
            max_index=SUBMISSION_LIMITS["array_index"][1],
        )
    except slurm.SpecError as exc:
        raise JobRejected(field, str(exc)) from None
    cap = SUBMISSION_LIMITS["array_max_running"][1]
    if parsed.max_running is not None and parsed.max_running > cap:
        raise JobRejected(field, f"a %N cap of at most {cap}")
    return parsed
