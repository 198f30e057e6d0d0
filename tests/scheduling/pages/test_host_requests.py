"""The submit form's host CPUs and memory (GiB, as the GPU memory), and the job page."""

from __future__ import annotations

import pytest

from inventory.models import Node
from scheduling.jobs import shape
from scheduling.models import Job
from tests.scheduling.pages.helpers import add_fleet
from tests.scheduling.pages.test_submit import VALID, field_errors

pytestmark = pytest.mark.django_db


def test_a_job_asks_for_host_cpus_and_memory_and_its_page_says_so(client, alice, agents):
    add_fleet()
    client.force_login(alice)

    response = client.post(
        "/jobs/new/", VALID | {"cpus": "16", "host_memory_gib": "64"}, follow=True
    )

    job = Job.objects.get()
    assert (job.cpus, job.host_memory_mib) == (16, 64 * 1024)
    assert "<dt>Host</dt><dd>16 CPUs, 64 GiB RAM per node" in response.content.decode()


def test_empty_fields_ask_for_nothing(client, alice, agents):
    add_fleet()
    client.force_login(alice)

    response = client.post("/jobs/new/", VALID | {"cpus": "", "host_memory_gib": ""}, follow=True)

    assert (Job.objects.get().cpus, Job.objects.get().host_memory_mib) == (0, 0)
    assert "<dt>Host</dt><dd>none asked</dd>" in response.content.decode()


def test_more_memory_than_any_node_has_shows_on_the_memory_field(client, alice, agents):
    [node] = add_fleet()
    Node.objects.filter(pk=node.pk).update(cpu_count=128, memory_total_mib=1024 * 1024)
    shape.FleetShape.forget()
    client.force_login(alice)

    response = client.post("/jobs/new/", VALID | {"host_memory_gib": "1024.5"})

    errors = field_errors(response.content.decode())
    assert list(errors) == ["host_memory_gib"], errors
    assert errors["host_memory_gib"].startswith("1024.5 GiB per node, but no node in the fleet")
    assert not Job.objects.exists()
