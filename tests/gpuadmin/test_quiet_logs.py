"""An idle fleet logs nothing at INFO: samples, heartbeats and idle passes are polling, not
state changes (the whole stack's log is checked in tests/integration/test_up.py)."""

from __future__ import annotations

import logging

import pytest

from inventory.agent import SAMPLE_SECTIONS
from inventory.nvml import open_backend
from inventory.nvml.scanner import scan
from scheduling import loop


def test_a_live_sample_logs_nothing_at_info(tmp_path, caplog):
    """The agent's sampling loop scans every 2 s: it was 1,485 lines in 10 idle minutes."""
    backend = open_backend(
        "sim", sim_model="dgx-a100-40gb", node_name="quiet-01", state_dir=str(tmp_path)
    )
    with caplog.at_level(logging.INFO):
        for _ in range(2):
            assert len(scan(backend, include=SAMPLE_SECTIONS).gpus) == 8
    assert [r.getMessage() for r in caplog.records] == []


@pytest.mark.django_db
def test_a_placement_pass_with_nothing_to_do_logs_nothing_at_info(caplog):
    with caplog.at_level(logging.INFO):
        summary = loop.run_pass()
    assert (summary.placed, summary.waiting) == (0, 0)
    assert [r.getMessage() for r in caplog.records] == []


def test_celery_logs_no_line_per_task_but_its_failures(caplog):
    with caplog.at_level(logging.INFO):  # the root level `celery worker -l INFO` sets
        for name in ("celery.app.trace", "celery.worker.strategy", "celery.beat"):
            logger = logging.getLogger(name)
            assert not logger.isEnabledFor(logging.INFO)
            assert logger.isEnabledFor(logging.ERROR)
        assert logging.getLogger("celery.worker.consumer").isEnabledFor(logging.INFO)
