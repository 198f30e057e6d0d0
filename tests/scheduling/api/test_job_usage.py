"""What a job's last run used (its cgroup's CPU time and peak memory, as sacct's TotalCPU and
MaxRSS) and why a run killed by its memory limit ended: in the API and ``gpuadmin jobs show``."""

from __future__ import annotations

import json

import pytest
from django.utils import timezone

from gpuadmin import cli, jobs_cli
from scheduling.agent.wire import FinalState, JobFinished
from scheduling.jobs import reports, submission
from scheduling.jobs.slurm import cpu_time_text, peak_memory_text
from scheduling.loop import passes as loop
from scheduling.models import Job, JobState

pytestmark = pytest.mark.django_db

MEMORY_KILL = "stopped: it used more than its 64 MiB of host memory"


@pytest.fixture
def alice(api_as, fleet):
    return api_as("alice")


@pytest.fixture
def killed(alice) -> Job:
    """A job its memory limit stopped after 83.4 CPU seconds, at its 64 MiB."""
    job = submission.submit_job(alice.user, command=["python", "leak.py"], host_memory_mib=64)
    loop.run_pass()
    ended = JobFinished(
        f"{job.pk}.1", FinalState.FAILED, -9, timezone.now(), MEMORY_KILL, 83.4, 64 * 2**20
    )
    assert reports.job_events([ended]).reached == {job.pk: JobState.FAILED}
    return job


def test_the_api_gives_the_runs_usage_and_why_it_was_stopped(alice, killed):
    body = alice.get(f"/api/v1/jobs/{killed.pk}/").json()

    assert (body["state"], body["message"]) == ("failed", MEMORY_KILL)
    assert (body["cpu_seconds"], body["max_memory_bytes"]) == (83.4, 64 * 2**20)
    listed = alice.get("/api/v1/jobs/").json()["results"][0]
    assert (listed["cpu_seconds"], listed["max_memory_bytes"]) == (83.4, 64 * 2**20)


def test_cli_show_says_what_the_run_used_as_sacct_does(alice, killed, capsys, monkeypatch):
    body = json.loads(json.dumps(alice.get(f"/api/v1/jobs/{killed.pk}/").json()))
    monkeypatch.setattr(jobs_cli.Api, "call", lambda *args, **kwargs: body)

    assert cli.main(["jobs", "show", str(killed.pk)]) == 0

    out = capsys.readouterr().out
    assert f"  message:     {MEMORY_KILL}\n" in out
    assert "  CPU time:    00:01:23\n" in out
    assert "  peak memory: 64 MiB\n" in out


def test_cli_show_of_a_run_nothing_measured_says_nothing_of_it(alice, capsys, monkeypatch):
    job = submission.submit_job(alice.user, command=["true"])
    body = json.loads(json.dumps(alice.get(f"/api/v1/jobs/{job.pk}/").json()))
    assert (body["cpu_seconds"], body["max_memory_bytes"]) == (None, None)
    monkeypatch.setattr(jobs_cli.Api, "call", lambda *args, **kwargs: body)

    assert cli.main(["jobs", "show", str(job.pk)]) == 0

    out = capsys.readouterr().out
    assert "CPU time" not in out and "peak memory" not in out


@pytest.mark.parametrize(
    ("seconds", "text"),
    [(0.4, "00:00:00"), (83.4, "00:01:23"), (3600 * 26 + 62, "1-02:01:02"), (59.6, "00:01:00")],
)
def test_cpu_time_reads_as_sacct_total_cpu(seconds, text):
    assert cpu_time_text(seconds) == text


@pytest.mark.parametrize(
    ("num_bytes", "text"),
    [(1, "1 MiB"), (64 * 2**20, "64 MiB"), (2**31, "2 GiB"), (2**31 + 1, "2049 MiB")],
)
def test_peak_memory_reads_in_whole_mib_rounded_up(num_bytes, text):
    assert peak_memory_text(num_bytes) == text
