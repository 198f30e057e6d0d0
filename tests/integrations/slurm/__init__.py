"""Tests of the Slurm integration. bench/ goes on the import path here, before the conftest and
the tests import its private Slurm cluster (``slurm``, bench/slurm.py)."""

import sys

from tests.conftest import REPO_DIR

sys.path.insert(0, str(REPO_DIR / "bench"))
