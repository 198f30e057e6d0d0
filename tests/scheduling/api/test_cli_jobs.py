"""``gpuadmin jobs kill``, ``describe``, the collapsed ``list`` and the attempts of ``show``,
against a live server with a token (issue 26)."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from datetime import timedelta
from pathlib import Path

import pytest
from django.utils import timezone

import gpuadmin as gpuadmin_module
from gpuadmin.audit.models import AuditEvent
from scheduling.allocations import manual
from scheduling.jobs import reports, submission
from scheduling.models import Job, JobArray, JobState
from tests.scheduling.api.conftest import split_all, submit
from tests.scheduling.api.test_cli import gpuadmin  # noqa: F401  (the fixture)

pytestmark = pytest.mark.django_db(transaction=True)


def alice(django_user_model):
    return django_user_model.objects.get(username="alice")


def running_job(owner, fleet, hostname: str = "dgx-01", **fields) -> Job:
    """A job of ``owner`` placed by hand on GPU 0 of ``hostname`` (its agent told to run it)."""
    job = submit(owner, **fields)
    node = next(node for node in fleet if node.hostname == hostname)
    manual.allocate_by_hand(job, [node.gpus.get(index=0).uuid], actor=owner)
    job.refresh_from_db()
    return job


def test_kill_is_sigkill_at_once_even_after_a_cancel(
    gpuadmin,  # noqa: F811
    fleet,
    agent_broker,
    django_user_model,
):
    job = running_job(alice(django_user_model), fleet)
    assert gpuadmin("jobs", "cancel", str(job.pk))[0] == 0  # SIGTERM, the agent's grace
    status, out, err = gpuadmin("jobs", "kill", str(job.pk))
    assert status == 0, err
    assert out == (
        f"job {job.pk}: killing; its processes get SIGKILL now and its GPUs are released once "
        "they are gone\n"
    )
    assert [args for args, _ in agent_broker.named("scheduling.cancel_job")] == [
        (job.pk, 1, "canceled by alice"),
        (job.pk, 1, "killed by alice", "SIGKILL", 0),
    ]
    killed = AuditEvent.objects.filter(event_type="job.cancel_requested").latest("pk")
    assert (killed.after, killed.message, killed.channel) == (
        {"signal": "SIGKILL", "grace_s": 0},
        "killed by alice",
        "cli jobs kill",
    )


def test_kill_of_a_waiting_job_cancels_it(gpuadmin, fleet):  # noqa: F811
    gpuadmin("jobs", "submit", "--hold", "--", "true")
    job = Job.objects.get()
    status, out, _ = gpuadmin("jobs", "kill", str(job.pk))
    assert (status, out) == (0, f"job {job.pk} canceled (it ran nowhere: nothing to kill)\n")
    job.refresh_from_db()
    assert (job.state, job.message) == (JobState.CANCELED, "killed by alice")


def test_describe_is_show(gpuadmin, fleet):  # noqa: F811
    gpuadmin("jobs", "submit", "--name", "train", "--", "true")
    job = Job.objects.get()
    shown = gpuadmin("jobs", "show", str(job.pk))
    assert shown[0] == 0 and f'job {job.pk} "train" (alice)' in shown[1]
    assert gpuadmin("jobs", "describe", str(job.pk)) == shown


def test_list_collapses_an_arrays_tasks_per_state_and_says_held(
    gpuadmin,  # noqa: F811
    fleet,
    agent_broker,
    django_user_model,
):
    owner = alice(django_user_model)
    array = submission.submit_array(owner, "0-9%5", command=["true"]).array
    tasks = list(Job.objects.filter(pk__in=split_all(array)).order_by("array_index"))
    node = fleet[0]
    manual.allocate_by_hand(tasks[0], [node.gpus.get(index=0).uuid], actor=owner)
    held = submit(owner, hold=True, name="later")

    status, out, err = gpuadmin("jobs", "list")
    assert status == 0, err
    rows = [line.split() for line in out.splitlines()]
    assert rows[0] == ["ID", "STATE", "PRIORITY", "GPUS", "OWNER", "NAME", "WHERE", "/", "WHY"]
    assert [row[:2] for row in rows[1:]] == [
        [str(held.pk), "held"],
        [f"{array.pk}_[1-9%5]", "queued"],
        [str(tasks[0].pk), f"({array.pk}_0)"],  # on GPUs: a row of its own
    ]
    assert f"9 tasks: {array.pk}" not in out and "9 tasks: " in out
    assert rows[3][2] == "scheduled" and rows[3][-1] == "dgx-01:0"

    expanded = gpuadmin("jobs", "list", "--expand")[1].splitlines()
    assert len(expanded) == 1 + 1 + 10
    assert gpuadmin("jobs", "list", "--state", "held")[1].splitlines()[1].split()[:2] == [
        str(held.pk),
        "held",
    ]

    status, out, _ = gpuadmin("jobs", "list", "--json")
    page = json.loads(out)
    assert (status, page["count"]) == (0, 3)
    assert page["results"][1]["array_tasks"] == {
        "label": f"{array.pk}_[1-9%5]",
        "indexes": "1-9",
        "count": 9,
    }
    assert page["results"][0]["array_tasks"] is None


def test_list_and_show_print_json(gpuadmin, fleet):  # noqa: F811
    gpuadmin("jobs", "submit", "--array", "0-3", "--", "true")
    array = JobArray.objects.get()
    status, out, _ = gpuadmin("jobs", "array", str(array.pk), "--json")
    assert (status, json.loads(out)["tasks"]) == (0, {"queued": 4})
    job = Job.objects.get(pk=split_all(array)[0])
    status, out, _ = gpuadmin("jobs", "show", str(job.pk), "--json")
    assert (status, json.loads(out)["id"]) == (0, job.pk)


def test_list_into_head_ends_quietly(gpuadmin, fleet, django_user_model):  # noqa: F811
    """``gpuadmin jobs list | head -1`` in a real shell, with more than a pipe holds (1000
    rows of 200 characters and more)."""
    split_all(
        submission.submit_array(
            alice(django_user_model), "0-999", command=["true"], name="x" * 200
        ).array
    )
    script = (
        f"{shlex.quote(sys.executable)} -m gpuadmin jobs list --expand --limit 1000 | head -1;"
        ' echo "status ${PIPESTATUS[0]}" >&2'
    )
    env = {**os.environ, "PYTHONPATH": str(Path(gpuadmin_module.__file__).parent.parent)}
    done = subprocess.run(
        ["bash", "-c", script], capture_output=True, text=True, env=env, timeout=60
    )
    assert done.stdout.split() == [
        "ID",
        "STATE",
        "PRIORITY",
        "GPUS",
        "OWNER",
        "NAME",
        "WHERE",
        "/",
        "WHY",
    ]
    assert done.stderr == "status 141\n"  # no BrokenPipeError traceback


def test_a_requeued_job_shows_its_attempts_apart(
    gpuadmin,  # noqa: F811
    fleet,
    agent_broker,
    django_user_model,
    client,
):
    """Attempt 1 fails with exit code 3 on dgx-01 and is requeued (a retry); the job's
    placement, start and exit code are then no longer shown as its own, and attempt 2 on
    dgx-02 is: in the API, in ``jobs show`` and on the job page."""
    owner = alice(django_user_model)
    job = running_job(owner, fleet, "dgx-01", max_retries=1)
    first_start = (timezone.now() - timedelta(minutes=5)).replace(microsecond=0)
    assert reports.job_started(job.pk, 1, 4242, first_start)
    assert reports.job_finished(job.pk, 1, "failed", 3, "", timezone.now()) == "queued"
    requeued = "requeued: retry 1/1 after attempt 1 failed: exit code 3"

    [attempt] = json.loads(gpuadmin("jobs", "show", str(job.pk), "--json")[1])["attempts"]
    assert {k: attempt[k] for k in ("attempt", "current", "nodes", "ended", "exit_code")} == {
        "attempt": 1,
        "current": False,
        "nodes": {"dgx-01": [0]},
        "ended": "queued",
        "exit_code": 3,
    }
    assert attempt["how_it_ended"] == requeued
    assert attempt["started_at"] == first_start.isoformat().replace("+00:00", "Z")
    status, out, _ = gpuadmin("jobs", "show", str(job.pk))
    facts, _, table = out.partition("previous attempts:\n")
    assert status == 0 and "queued" in facts.splitlines()[0]
    for stale in ("  placement:", "  GPUs:", "  started:", "  exit code:"):
        assert stale not in facts, out
    header, row = table.splitlines()
    assert header.split() == ["ATTEMPT", "WHERE", "STARTED", "ENDED", "EXIT", "HOW", "IT", "ENDED"]
    assert row.split()[:2] == ["1", "dgx-01:0"] and row.split()[4] == "3"
    assert row.endswith(requeued)

    gpu = fleet[1].gpus.get(index=0)
    job.refresh_from_db()
    manual.allocate_by_hand(job, [gpu.uuid], actor=owner)
    assert reports.job_started(job.pk, 2, 4343, timezone.now())
    assert Job.objects.get(pk=job.pk).exit_code == 3  # the job's row still has attempt 1's
    status, out, _ = gpuadmin("jobs", "show", str(job.pk))
    facts, _, table = out.partition("previous attempts:\n")
    assert f"  GPUs:        dgx-02/GPU0 {gpu.uuid} (attempt 2)\n" in facts
    assert "  exit code:" not in facts and "  started:" in facts
    assert "  message:" not in facts  # attempt 1's end, said in its row
    assert len(table.splitlines()) == 2 and table.splitlines()[1].startswith("      1  dgx-01:0")

    client.force_login(owner)
    page = client.get(f"/jobs/{job.pk}/").content.decode()
    status_panel = page[page.index('id="job-live"') : page.index('id="facts-title"')]
    assert "Exit code" not in status_panel and "earlier attempts" in status_panel
    attempts = page[page.index('id="attempts-title"') :]
    attempts = attempts[: attempts.index("</table>")]
    assert 'data-attempt="1"' in attempts and requeued in attempts and "dgx-01: GPU 0" in attempts
    assert 'data-attempt="2" class="active"' in attempts and "dgx-02: GPU 0" in attempts


def test_collapse_arrays_must_be_a_boolean(api_as):
    response = api_as("bob").get("/api/v1/jobs/", {"collapse_arrays": "maybe"})
    assert response.status_code == 400
    assert list(response.json()) == ["collapse_arrays"]
