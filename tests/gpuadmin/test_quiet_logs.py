"""An idle fleet logs nothing at INFO: samples, heartbeats and idle passes are polling, not
state changes (the whole stack's log is checked in tests/integration/test_up.py)."""

from __future__ import annotations

import logging

import pytest

from inventory.agent import SAMPLE_SECTIONS
from inventory.nvml import open_backend
from inventory.nvml.scanner import scan
from scheduling.loop import passes as loop


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


def test_a_lost_gpu_is_logged_when_it_fails_and_when_it_answers_again(tmp_path, caplog):
    """Every sample carries the lost GPU's error: the agent logs the change, not each sample."""
    from inventory.agent import AgentLoop
    from inventory.nvml.sim import faults

    backend = open_backend(
        "sim", sim_model="dgx-a100-40gb", node_name="lossy-01", state_dir=str(tmp_path)
    )
    agent = AgentLoop("lossy-01", lambda *args, **kwargs: None)
    faults.fall_off_bus(backend, None, 3)
    with caplog.at_level(logging.INFO, logger="gpuadmin"):
        for _ in range(3):
            agent.note_gpu_errors(scan(backend, include=SAMPLE_SECTIONS))
        faults.clear(backend, None, 3)
        for _ in range(2):
            agent.note_gpu_errors(scan(backend, include=SAMPLE_SECTIONS))
    lines = [(r.levelname, r.getMessage()) for r in caplog.records]
    assert len(lines) == 2, lines
    assert lines[0][0] == "ERROR" and "GPU 3: " in lines[0][1] and "LOST" in lines[0][1]
    assert lines[1] == ("INFO", "agent lossy-01: GPU 3 answers again")


def test_a_broker_outage_is_logged_once_and_its_end_once(monkeypatch, caplog):
    from kombu.exceptions import OperationalError

    from inventory import agent as agent_module

    outcomes = iter([OperationalError("refused")] * 3)

    def sync():
        if (failure := next(outcomes, None)) is not None:
            raise failure

    agent = agent_module.AgentLoop("flaky-01", lambda *args, **kwargs: None)
    ticks = iter(range(5))
    monkeypatch.setattr(agent, "sync", sync)
    monkeypatch.setattr(agent, "note_gpu_errors", lambda result: None)
    monkeypatch.setattr(agent_module, "publish_sample", lambda hostname: None)
    monkeypatch.setattr(agent.stopped, "wait", lambda _s: next(ticks, None) is None)
    with caplog.at_level(logging.INFO, logger="gpuadmin"):
        agent.run()
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 2, lines
    assert "cannot reach the broker" in lines[0]
    assert lines[1] == "agent flaky-01: the broker answers again"


@pytest.mark.django_db
def test_a_refused_page_is_one_warning_line_without_a_traceback(client, django_user_model, caplog):
    """A probe of 30 pages logged 30 tracebacks: a 403 is one line saying who was refused
    what, and why."""
    from gpuadmin.access.models import Membership, Role

    viewer = django_user_model.objects.create_user("vic")
    Membership.objects.create(user=viewer, role=Role.VIEWER)
    client.force_login(viewer)
    with caplog.at_level(logging.INFO):
        response = client.get("/jobs/new/?x=1")
    assert response.status_code == 403
    [record] = [r for r in caplog.records if r.name == "django.request"]
    assert record.levelname == "WARNING"
    assert record.exc_info is None and not record.exc_text
    assert record.getMessage() == ("Forbidden: GET /jobs/new/ by vic: Viewers cannot submit jobs.")
    assert "Traceback" not in caplog.text
