"""The fleet dashboard names the job and user on each GPU (scheduling registers the source;
inventory knows nothing of jobs), in one query for the whole page."""

from __future__ import annotations

import re

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from inventory.models import Gpu
from inventory.services import set_gpu_state
from tests.inventory.test_pages_fleet import count, live_row
from tests.scheduling.pages.helpers import add_fleet, place, submit

pytestmark = pytest.mark.django_db


def test_gpu_rows_name_the_job_and_its_user(client, alice, agents):
    (node,) = add_fleet(live=True)
    job = submit(alice, gpu_count=2)
    place(job)
    held = list(Gpu.objects.filter(allocations__job=job).order_by("index"))
    idle = Gpu.objects.filter(node=node).exclude(pk__in=[gpu.pk for gpu in held]).first()

    html = client.get("/fleet/").content.decode()

    for gpu in held:
        row, cells = live_row(html, gpu.uuid)
        assert cells["procs"] == f'<a href="/jobs/{job.pk}/">#{job.pk}</a> alice'
        assert row.startswith('<tr class="s-busy">')  # given: not free, even before it starts
    _, cells = live_row(html, idle.uuid)
    assert cells["procs"] == "0"  # no job: the processes the live sample lists
    assert ">Job/procs</th>" in html


def test_the_live_partial_names_them_too(client, alice, agents):
    add_fleet(live=True)
    job = submit(alice)
    place(job)
    partial = client.get("/fleet/", HTTP_HX_REQUEST="true").content.decode()
    assert f'<a href="/jobs/{job.pk}/">#{job.pk}</a> alice</td>' in partial


@pytest.mark.parametrize("htmx", [False, True])
def test_one_query_names_every_gpus_job(client, alice, agents, django_assert_num_queries, htmx):
    headers = {"HTTP_HX_REQUEST": "true"} if htmx else {}
    add_fleet(live=True)
    place(submit(alice))
    with CaptureQueriesContext(connection) as one:
        client.get("/fleet/", **headers)
    add_fleet(3, live=True)
    for _ in range(20):
        submit(alice)
    place()

    with django_assert_num_queries(len(one.captured_queries)) as many:
        response = client.get("/fleet/", **headers)

    assert len(re.findall(r'<a href="/jobs/\d+/">', response.content.decode())) == 21
    sql = [query["sql"] for query in many.captured_queries]
    assert sum("scheduling_allocation" in statement for statement in sql) == 1


def test_a_draining_gpu_that_still_runs_its_job_counts_as_draining(client, alice, agents):
    """Issue 26: the "draining" tile counted 0 (the GPU read "busy") while a draining GPU ran
    its job, and its state badge read "Available" until a reload: the state is a live column."""
    (node,) = add_fleet(live=True)
    job = submit(alice)
    place(job)
    [gpu] = Gpu.objects.filter(allocations__job=job)
    set_gpu_state(gpu, "draining", actor_name="ops", reason="reboot for a new driver")

    page = client.get("/fleet/").content.decode()
    poll = client.get("/fleet/", HTTP_HX_REQUEST="true").content.decode()

    row, cells = live_row(page, gpu.uuid)
    tbody = re.search(rf'<tbody id="live-{node.pk}"[^>]*>.*?</tbody>', poll, re.S)[0]
    assert row in tbody  # the poll's row is the page's
    assert row.startswith('<tr class="s-draining">')
    assert cells["state"] == (
        '<span class="badge badge-amber" title="reboot for a new driver">Draining</span>'
    )
    assert cells["procs"] == f'<a href="/jobs/{job.pk}/">#{job.pk}</a> alice'  # still runs
    for html in (page, poll):
        assert (count(html, "draining"), count(html, "busy")) == (1, 0)
