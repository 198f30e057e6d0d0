"""Fixtures of the integrations' tests: the broker that records what is sent (scheduling's)."""

from tests.scheduling.conftest import broker  # noqa: F401 - a fixture
