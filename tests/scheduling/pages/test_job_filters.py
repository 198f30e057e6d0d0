"""One FilterSet (``scheduling.filters.JobFilterSet``) serves the queue page and
``/api/v1/jobs/``: the same query string shows the same jobs on both."""

from __future__ import annotations

import re

import pytest

from scheduling.jobs import control
from scheduling.models import Allocation
from tests.scheduling.pages.helpers import add_fleet, place, submit

pytestmark = pytest.mark.django_db


@pytest.fixture
def queue(alice, operator, agents) -> dict[str, str]:
    """Jobs of alice and of otto, an operator (he reads everyone's jobs in the API too): two
    on GPUs of two nodes, one waiting, one held, one canceled."""
    add_fleet(2)
    llm = submit(alice, gpu_count=8, project="llm", priority="high")
    vision = submit(operator, gpu_count=8, project="vision", priority="low")
    place(llm, vision)
    submit(alice, gpu_count=8, project="llm")  # waits: both nodes are taken
    submit(operator, project="vision", hold=True)
    control.cancel_job(submit(operator, project="llm"), actor=operator)
    hosts = Allocation.objects.filter(job=llm).values_list("node__hostname", flat=True)
    return {"llm_node": hosts.first()}


def on_page(client, query: str) -> set[int]:
    html = client.get(f"/jobs/?{query}").content.decode()
    return {int(pk) for pk in re.findall(r'<tr id="job-(\d+)"', html)}


def in_api(client, query: str) -> set[int]:
    response = client.get(f"/api/v1/jobs/?limit=1000&{query}")
    assert response.status_code == 200
    return {job["id"] for job in response.json()["results"]}


@pytest.mark.parametrize(
    ("query", "count"),
    [
        ("", 5),
        ("state=queued&state=pending", 2),  # repeated: any of them
        ("state=scheduled&state=running", 2),
        ("owner=me", 3),  # the requesting user, on both
        ("owner=alice", 2),
        ("project=llm", 3),
        ("priority=high", 1),
        ("node={llm_node}", 1),  # placed there
        ("owner=me&project=llm&state=canceled", 1),
        ("owner=alice&priority=normal", 1),
    ],
)
def test_the_page_and_the_api_show_the_same_jobs(client, operator, queue, query, count):
    client.force_login(operator)
    query = query.format(**queue)
    page, api = on_page(client, query), in_api(client, query)
    assert page == api
    assert len(api) == count


def test_the_page_form_renders_from_the_filterset(client, operator, queue):
    client.force_login(operator)
    query = (
        f"state=queued&state=pending&owner=me&project=llm&priority=high&node={queue['llm_node']}"
    )
    html = client.get(f"/jobs/?{query}").content.decode()
    form = re.search(r'<form method="get" class="filters".*?</form>', html, re.S)[0]
    state = re.search(r'<select name="state"[^>]* multiple>.*?</select>', form, re.S)[0]
    assert re.findall(r'<option value="(\w+)" selected>', state) == ["pending", "queued"]
    assert 'name="owner" value="me"' in form
    assert '<option value="me"><option value="alice"><option value="otto">' in form  # owners
    assert 'name="project" value="llm"' in form
    assert '<option value="llm"><option value="vision">' in form  # the projects of the jobs
    assert re.search(r'<select name="priority"[^>]*>\s*<option value="">all</option>', form)
    assert '<option value="high" selected>High</option>' in form
    assert f'name="node" value="{queue["llm_node"]}"' in form
    assert 'href="/jobs/">Clear</a>' in form
    assert 'href="/jobs/">Clear</a>' not in client.get("/jobs/?owner=").content.decode()


@pytest.mark.parametrize(("field", "value"), [("state", "bogus"), ("priority", "urgent")])
def test_a_bad_value_is_named_on_the_page_and_refused_by_the_api(
    client, operator, queue, field, value
):
    client.force_login(operator)
    html = client.get(f"/jobs/?{field}={value}&project=llm").content.decode()
    error = f"Select a valid choice. {value} is not one of the available choices."
    shown = rf'<select name="{field}".*?</select></label> <span class="bad" id="id_{field}_error">'
    assert re.search(shown + error, html, re.S)  # next to its field
    assert on_page(client, f"{field}={value}&project=llm") == in_api(client, "project=llm")
    response = client.get(f"/api/v1/jobs/?{field}={value}")
    assert response.status_code == 400
    assert list(response.json()) == [field]
