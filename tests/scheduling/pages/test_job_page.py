"""A job's page: facts, the "why is it waiting?" panel, placement on the topology matrix,
allocations, the timeline from the audit log, the log tail through the agent, the live
status panel, and its query count."""

from __future__ import annotations

import re
from datetime import timedelta

import pytest
from django.utils import timezone
from django.utils.html import escape

from inventory.models import Node
from scheduling.agent.wire import FinalState, JobFinished
from scheduling.jobs import control, reports
from scheduling.models import Job, JobState
from tests.scheduling.pages.helpers import LOG_TEXT, add_fleet, place, submit

pytestmark = pytest.mark.django_db


def panel(html: str, name: str) -> str:
    return re.search(rf'<section [^>]*aria-labelledby="{name}-title".*?</section>', html, re.S)[0]


def timeline(html: str) -> list[str]:
    """Each entry's title and state change."""
    entries = re.findall(r"<li><time [^>]*>[^<]*</time> (.*?)</li>", panel(html, "timeline"), re.S)
    return [re.sub(r"\s+", " ", re.sub(r"<[^>]+>", "", entry)).strip() for entry in entries]


def test_a_waiting_job_says_why(client, alice, agents):
    add_fleet()
    place(submit(alice, gpu_count=8))
    job = submit(alice, gpu_count=8, env={"WANDB_API_KEY": "secret", "SEED": "1"})
    place(job)
    Job.objects.filter(pk=job.pk).update(
        estimated_start_at=timezone.now() + timedelta(minutes=42), what_if="with 4 GPUs it could"
    )
    client.force_login(alice)

    html = client.get(f"/jobs/{job.pk}/").content.decode()

    status = panel(html, "status")
    assert 'data-state="queued">queued</span>' in status
    assert "Why is it waiting?" in status
    assert f'<span class="badge badge-grey">{job.pending_code}</span> ' in status
    assert escape(job.pending_reason) in status
    assert "<dd>1 in the queue</dd>" in status
    assert "(in 41\xa0minutes)" in status or "(in 42\xa0minutes)" in status
    assert '<dd class="what-if">with 4 GPUs it could</dd>' in status
    assert f'hx-get="/jobs/{job.pk}/?shown=queued"' in status
    facts = panel(html, "facts")
    assert "<li><code>sleep</code></li><li><code>60</code></li>" in facts
    assert "<code>SEED</code> <code>WANDB_API_KEY</code>" in facts
    assert "secret" not in html  # only the names of the variables
    assert "Not placed yet." in panel(html, "placement")
    assert timeline(html) == ["Submitted by alice"]


def test_a_placed_job_shows_why_there_on_the_topology_matrix(client, alice, agents):
    (node,) = add_fleet()
    job = submit(alice, gpu_count=4, topology="nvlink", name="finetune")
    place(job)
    client.force_login(alice)

    html = client.get(f"/jobs/{job.pk}/").content.decode()

    assert job.state == JobState.SCHEDULED
    placement = panel(html, "placement")
    assert escape(job.placement["explanation"]) in placement
    assert f"<dd>{job.placement['topology_class']} (" in placement
    assert "topology rank 0" in placement
    matrix = re.search(r'<section class="panel job-topology".*?</section>', html, re.S)[0]
    assert f'data-node="{node.hostname}"' in matrix
    indexes = job.placement["nodes"][node.hostname]
    assert f": GPUs {indexes[0]}-{indexes[-1]} " in matrix
    assert re.findall(r'<th scope="col" class="picked">GPU(\d)</th>', matrix) == [
        str(i) for i in indexes
    ]
    assert matrix.count(' picked"') == 16  # the 4 x 4 cells between the job's GPUs
    assert matrix.count('class="link link-') == 64
    allocations = panel(html, "allocations")
    uuids = job.allocations.values_list("gpu__uuid", flat=True)
    assert all(f'href="/gpus/{uuid}/"' in allocations for uuid in uuids)
    assert allocations.count(">held</span>") == 4
    assert timeline(html) == [
        "Submitted by alice",
        "GPUs allocated by placement-loop " + ", ".join(f"{node.hostname}/GPU{i}" for i in indexes),
        "Scheduled queued → scheduled by placement-loop",
    ]
    assert "Why is it waiting?" not in html
    assert f'hx-get="/jobs/{job.pk}/log/" hx-trigger="load"' in html


def test_the_timeline_shows_each_attempt_and_the_end(client, alice, agents):
    add_fleet()
    job = submit(alice, max_retries=1)
    place(job)
    reports.job_started(job.pk, 1, 4242, timezone.now())
    reports.job_finished(job.pk, 1, "failed", 1, "CUDA error", timezone.now())
    place(job)
    control.cancel_job(job, actor=alice)  # its node is reachable: the agent is asked
    client.force_login(alice)

    html = client.get(f"/jobs/{job.pk}/").content.decode()

    entries = timeline(html)
    assert [entry.split(" by ")[0].split(" GPU")[0] for entry in entries] == [
        "Submitted",
        "GPUs allocated",
        "Scheduled queued → scheduled",
        "Running scheduled → running",
        "Queued running → queued",
        "GPUs allocated",
        "Scheduled queued → scheduled",
        "Cancel requested",
    ]
    assert "retry 1/1 after attempt 1 failed: CUDA error" in panel(html, "timeline")
    assert panel(html, "allocations").count("<tr") == 3  # header, attempt 2, attempt 1
    assert len(re.findall(r'<section class="panel job-topology"', html)) == 1  # attempt 2


@pytest.mark.parametrize(
    ("attempt", "preemptions", "max_retries", "said"),
    [
        (0, 0, 0, "none started yet (no retry after a failure)"),
        (2, 0, 1, "2 (up to 1 retry after a failure)"),
        # Preempted attempts count in the attempt, not against the retries.
        (3, 1, 2, "3 (1 preempted; up to 2 retries after failures)"),
    ],
)
def test_the_attempt_says_its_preemptions_apart_from_the_retries(
    client, alice, agents, attempt, preemptions, max_retries, said
):
    add_fleet()
    job = submit(alice, max_retries=max_retries)
    Job.objects.filter(pk=job.pk).update(attempt=attempt, preemptions=preemptions)
    client.force_login(alice)

    status = panel(client.get(f"/jobs/{job.pk}/").content.decode(), "status")

    assert f"<dt>Attempt</dt><dd>{said}</dd>" in status


def test_the_status_panel_polls_and_reloads_the_page_when_the_state_changes(client, alice, agents):
    add_fleet()
    job = submit(alice)
    client.force_login(alice)
    url = f"/jobs/{job.pk}/?shown=queued"

    partial = client.get(url, HTTP_HX_REQUEST="true")
    assert partial.content.decode().lstrip().startswith('<section id="job-live"')
    assert "<html" not in partial.content.decode()
    assert "HX-Request" in partial["Vary"]

    place(job)
    moved = client.get(url, HTTP_HX_REQUEST="true")
    assert (moved.status_code, moved["HX-Refresh"]) == (200, "true")

    control.cancel_job(submit(alice), actor=alice)
    ended = client.get(f"/jobs/{Job.objects.get(state='canceled').pk}/").content.decode()
    assert "hx-trigger" not in panel(ended, "status")  # a finished job's status is final


def test_the_log_tail_comes_from_the_node_agent(client, alice, agents):
    (node,) = add_fleet()
    job = submit(alice)
    client.force_login(alice)
    assert "No log: job" in client.get(f"/jobs/{job.pk}/log/").content.decode()
    place(job)

    html = client.get(f"/jobs/{job.pk}/log/").content.decode()

    assert f"<pre>{LOG_TEXT}</pre>" in html
    assert ("scheduling.tail_log", (job.pk, 1, 200), f"node.{node.hostname}") in agents.sent
    assert 'hx-trigger="every 2s' in html  # it holds its GPUs: the log grows


def test_a_gangs_log_is_read_on_the_node_asked_for(client, alice, agents):
    first, second = add_fleet(2)
    job = submit(alice, gpu_count=8, node_count=2)
    place(job)
    client.force_login(alice)

    html = client.get(f"/jobs/{job.pk}/log/?node={second.hostname}").content.decode()

    assert agents.sent[-1] == ("scheduling.tail_log", (job.pk, 1, 200), f"node.{second.hostname}")
    assert re.findall(r'aria-pressed="(\w+)">([^<]+)</button>', html) == [
        ("false", first.hostname),
        ("true", second.hostname),
    ]
    assert f'hx-get="/jobs/{job.pk}/log/?node={second.hostname}"' in html  # it keeps polling it


def test_a_silent_or_unreachable_agent_is_said_so(client, alice, agents):
    (node,) = add_fleet()
    job = submit(alice)
    place(job)
    client.force_login(alice)
    agents.silent = True

    html = client.get(f"/jobs/{job.pk}/log/").content.decode()
    assert f"node {node.hostname} did not answer within 5 s" in html

    Node.objects.filter(pk=node.pk).update(last_heartbeat_at=None)
    html = client.get(f"/jobs/{job.pk}/log/").content.decode()
    assert f"node {node.hostname} is unreachable" in html


def test_an_unknown_job_is_a_404(client, alice):
    client.force_login(alice)
    assert client.get("/jobs/-1/").status_code == 404


@pytest.mark.parametrize("htmx", [False, True])
def test_query_count_does_not_grow_with_jobs_or_nodes(
    client, alice, agents, django_assert_num_queries, htmx
):
    headers = {"HTTP_HX_REQUEST": "true"} if htmx else {}
    add_fleet(2)
    client.force_login(alice)
    single = submit(alice, gpu_count=2)
    place(single)
    # Session, user, role (may they read it? cancel it?), job, its attempts (audit rows); the
    # full page adds allocations, timeline, GPUs, links and dependencies.
    queries = 5 if htmx else 10
    with django_assert_num_queries(queries):
        client.get(f"/jobs/{single.pk}/?shown=scheduled", **headers)
    add_fleet(1)
    gang = submit(alice, gpu_count=8, node_count=2)
    for _ in range(19):
        submit(alice)
    place(gang)
    assert len(gang.placement["nodes"]) == 2
    with django_assert_num_queries(queries):
        response = client.get(f"/jobs/{gang.pk}/?shown=scheduled", **headers)
    if not htmx:
        assert response.content.decode().count('<section class="panel job-topology"') == 2


def test_a_run_stopped_by_its_memory_limit_says_why_and_what_it_used(client, alice, agents):
    add_fleet()
    job = submit(alice, host_memory_mib=64)
    place(job)
    memory_kill = "stopped: it used more than its 64 MiB of host memory"
    ended = JobFinished(
        f"{job.pk}.1", FinalState.FAILED, -9, timezone.now(), memory_kill, 83.4, 64 * 2**20
    )
    reports.job_events([ended])
    client.force_login(alice)

    status = panel(client.get(f"/jobs/{job.pk}/").content.decode(), "status")

    assert f"<dt>Message</dt><dd>{memory_kill}</dd>" in status
    assert '<dd id="job-usage">CPU time 00:01:23, peak memory 64 MiB <span' in status
