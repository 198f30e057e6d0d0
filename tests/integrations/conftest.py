"""Fixtures of the integrations' tests: the broker that records what is sent (scheduling's), a
stand-in for the slurmrestd client."""

from tests.integrations.slurm.mirror import slurmrestd  # noqa: F401 - a fixture
from tests.scheduling.conftest import broker  # noqa: F401 - a fixture
