"""Debian programs the tests run for real (Prometheus, slurmd, redis-sentinel, PgBouncer):
found on PATH (and the sbin folders), or installed now by the project's ``.ci/install-*``
script, as ``make test`` does."""

from __future__ import annotations

import os
import shutil
import subprocess

from tests.conftest import REPO_DIR, missing

SEARCH = f"{os.environ.get('PATH', '')}:/usr/sbin:/sbin"


def debian_program(program: str, installer: str) -> str:
    """``program``'s path, installed now by ``.ci/<installer>`` if missing; a skip (a failure
    under CI) only when it cannot be installed."""
    found = shutil.which(program, path=SEARCH)
    if found is None:
        install = subprocess.run(
            ["sh", str(REPO_DIR / ".ci" / installer)],
            capture_output=True,
            text=True,
            timeout=900,
            check=False,
        )
        found = shutil.which(program, path=SEARCH)
        if found is None:
            missing(
                f"{program} is not installed and .ci/{installer} could not install it (root or "
                f"sudo and the Debian archive needed): {install.stderr[-400:]}"
            )
    return found
