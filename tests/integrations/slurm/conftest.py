"""A real Slurm 22.05 for the session (bench/slurm.py's cluster: one node ``localhost`` with 8
GPUs declared as GRES on placeholder files), with slurmrestd on its Unix socket (local
authentication) and on a port of the session's own (JWT), speaking v0.0.37 and v0.0.38."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from slurm import SlurmCluster, ensure_installed, free_ports  # bench/slurm.py (see __init__.py)

from tests.conftest import missing


@pytest.fixture(scope="session")
def slurm_cluster() -> Iterator[SlurmCluster]:
    """The session's Slurm cluster (installed first when missing: a skip, a failure under CI,
    when it cannot be). slurmctld, slurmd and the JWT slurmrestd take 3 consecutive ports."""
    try:
        ensure_installed()
    except RuntimeError as error:
        missing(str(error))
    first = free_ports(3)
    with SlurmCluster(port=first, rest_port=first + 2, openapi=("v0.0.37", "v0.0.38")) as cluster:
        yield cluster
