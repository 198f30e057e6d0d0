"""Which parser reads which slurmrestd OpenAPI version, and the choice among what a server
offers."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from integrations.slurm.rest import v0_0_38, v0_0_40
from integrations.slurm.rest.model import SlurmJob, SlurmNode, SlurmPartition

_VERSION = re.compile(r"^v(\d+)\.(\d+)\.(\d+)$")


@dataclass(frozen=True)
class Parser:
    """One version's readers of a node, a partition and a job of its answers, and the body of
    its request to drain a node with a reason (None: the version cannot update nodes)."""

    node: Callable[[dict[str, Any]], SlurmNode]
    partition: Callable[[dict[str, Any]], SlurmPartition]
    job: Callable[[dict[str, Any]], SlurmJob]
    drain: Callable[[str], dict[str, Any]] | None = None


V0_0_38 = Parser(v0_0_38.node, v0_0_38.partition, v0_0_38.job)
V0_0_40 = Parser(v0_0_40.node, v0_0_40.partition, v0_0_40.job, v0_0_40.drain)

# v0.0.41 to v0.0.44 (Slurm 24.05 to 25.11) kept the shape of every field gpuadmin reads
# (they regrouped a job's ``job_resources`` and a node's energy fields, which it does not read):
# checked on captures of each, tests/integrations/slurm/captures/.
PARSERS: dict[str, Parser] = {
    "v0.0.38": V0_0_38,
    "v0.0.40": V0_0_40,
    "v0.0.41": V0_0_40,
    "v0.0.42": V0_0_40,
    "v0.0.43": V0_0_40,
    "v0.0.44": V0_0_40,
}


def version_key(version: str) -> tuple[int, ...]:
    """``v0.0.41`` -> (0, 0, 41), for ordering; a name that is no version sorts first."""
    match = _VERSION.match(version)
    return tuple(int(part) for part in match.groups()) if match else ()


def newest_known(offered: Iterable[str]) -> str | None:
    """The newest of the ``offered`` versions that a parser reads; None when none."""
    known = [version for version in offered if version in PARSERS]
    return max(known, key=version_key, default=None)
