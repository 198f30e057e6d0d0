"""The queue page: waiting jobs with their reasons, jobs on GPUs, the latest finished jobs,
filters, the HTMX live region and its query count."""

from __future__ import annotations

import re

import pytest
from django.utils.html import escape

from scheduling.jobs import control
from scheduling.models import JobState
from tests.scheduling.pages.helpers import add_fleet, place, submit

pytestmark = pytest.mark.django_db


def row(html: str, job_id: int) -> str:
    return re.search(rf'<tr id="job-{job_id}".*?</tr>', html, re.S)[0]


def section(html: str, name: str) -> str:
    return re.search(rf'<section [^>]*aria-labelledby="{name}-title">.*?</section>', html, re.S)[0]


def test_the_queue_needs_a_login(client):
    response = client.get("/jobs/")
    assert response.status_code == 302
    assert response["Location"].startswith("/accounts/login/?next=/jobs/")


def test_waiting_jobs_say_why_and_running_jobs_where(client, alice, bob, agents):
    (node,) = add_fleet()
    whole = submit(alice, gpu_count=8, name="pretrain", project="llm")
    place(whole)
    half = submit(bob, gpu_count=4, topology="nvlink", min_gpu_memory_mib=40 * 1024)
    held = submit(bob, hold=True)
    place(half)
    client.force_login(bob)

    html = client.get("/jobs/").content.decode()

    assert half.state == JobState.QUEUED and half.queue_position == 1
    assert half.pending_reason  # the loop's sentence, shown as it is
    waiting = row(section(html, "waiting"), half.pk)
    cells = re.findall(r"<td[^>]*>(.*?)</td>", waiting, re.S)
    assert cells[0] == "1"
    assert f'<a href="/jobs/{half.pk}/">{half.pk}</a>' in cells[1]
    assert cells[3] == "bob"
    assert cells[4] == "4 GPUs · ≥ 40 GiB · One NVLink/NVSwitch domain"
    badge = f'<span class="badge badge-grey">{half.pending_code}</span>'
    assert cells[7].startswith(f"{badge} {escape(half.pending_reason)}")
    assert "Held: not in the queue yet." in row(section(html, "waiting"), held.pk)
    running = row(section(html, "running"), whole.pk)
    assert f"{node.hostname}: " in running
    assert running.count('href="/gpus/GPU-') == 8
    assert escape(whole.placement["explanation"]) in running
    assert 'data-count="waiting">2<' in html
    assert 'href="/jobs/new/"' in html  # users may submit
    # Everyone's jobs are listed; only their own link to a page a user may read.
    assert f"<td>{whole.pk}</td>" in running


def test_finished_jobs_are_listed_latest_first(client, alice, agents):
    add_fleet()
    first, second = submit(alice, name="first"), submit(alice, name="second")
    control.cancel_job(first, actor=alice)
    control.cancel_job(second, actor=alice, reason="wrong data set")
    client.force_login(alice)

    finished = section(client.get("/jobs/").content.decode(), "finished")

    assert finished.index(f'id="job-{second.pk}"') < finished.index(f'id="job-{first.pk}"')
    assert "wrong data set" in row(finished, second.pk)
    assert ">canceled</span>" in row(finished, first.pk)


def test_filters_by_state_owner_and_project(client, alice, bob, agents):
    add_fleet()
    mine = submit(alice, project="vision")
    theirs = submit(bob, project="llm")
    canceled = submit(bob, project="llm")
    control.cancel_job(canceled, actor=bob)
    client.force_login(alice)

    def shown(query: str) -> set[int]:
        html = client.get("/jobs/" + query).content.decode()
        return {int(pk) for pk in re.findall(r'<tr id="job-(\d+)"', html)}

    assert shown("") == {mine.pk, theirs.pk, canceled.pk}  # everyone's, like squeue
    assert shown("?owner=me") == {mine.pk}
    assert shown("?project=llm") == {theirs.pk, canceled.pk}
    assert shown("?state=canceled") == {canceled.pk}
    assert shown("?state=queued&project=llm") == {theirs.pk}
    assert shown("?state=bogus") == {mine.pk, theirs.pk, canceled.pk}  # named by the field


def test_htmx_request_gets_only_the_live_region(client, alice, agents):
    add_fleet()
    submit(alice)
    client.force_login(alice)

    response = client.get("/jobs/?owner=me", HTTP_HX_REQUEST="true")

    partial = response.content.decode()
    assert partial.lstrip().startswith('<div id="queue-live" hx-get="/jobs/?owner=me"')
    assert "<html" not in partial and "<form" not in partial
    assert 'hx-trigger="every 2s"' in partial
    assert "HX-Request" in response["Vary"]
    full = client.get("/jobs/?owner=me").content.decode()
    assert re.sub(r"<time>[^<]*</time>", "", partial.strip()) in re.sub(
        r"<time>[^<]*</time>", "", full
    )


def test_a_viewer_reads_the_queue_but_is_not_offered_the_form(client, alice, viewer, agents):
    add_fleet()
    job = submit(alice)
    client.force_login(viewer)
    html = client.get("/jobs/").content.decode()
    assert f'<a href="/jobs/{job.pk}/">{job.pk}</a>' in row(html, job.pk)  # viewers read all
    assert 'href="/jobs/new/"' not in html


def fill(owner, count: int) -> None:
    """``count`` jobs on GPUs, ``count`` held waiting for the whole fleet (held: a queued
    gang at the head would keep the later jobs off its GPUs), ``count`` finished."""
    for _ in range(count):
        submit(owner)
    place()
    for _ in range(count):
        submit(owner, gpu_count=8, node_count=3, hold=True)
        control.cancel_job(submit(owner), actor=owner)
    place()


# Session, user and role (which jobs may they open? may they submit?); the queue's three
# sections and the GPUs of the running jobs; the full page adds the owners, projects and
# nodes the filter form suggests, the person's quotas ("My usage": none here), the Slurm
# clusters whose jobs it lists and whether a Ray cluster is registered (none here).
@pytest.mark.parametrize(("htmx", "queries"), [(False, 13), (True, 7)])
def test_query_count_does_not_grow_with_the_queue(
    client, alice, agents, django_assert_num_queries, htmx, queries
):
    headers = {"HTTP_HX_REQUEST": "true"} if htmx else {}
    add_fleet(3)
    client.force_login(alice)
    fill(alice, 1)
    with django_assert_num_queries(queries):
        client.get("/jobs/", **headers)
    fill(alice, 19)
    with django_assert_num_queries(queries):
        response = client.get("/jobs/", **headers)
    html = response.content.decode()
    assert [len(re.findall(r'<tr id="job-', section(html, name))) for name in SECTIONS] == [
        20,
        20,
        20,
    ]


SECTIONS = ("waiting", "running", "finished")
