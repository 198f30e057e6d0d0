"""The Ray pages against real Ray (``ray_cluster``): the clusters (an unreachable one as a
state), the submit form with the service's refusals on its fields, a job's page (state, Ray's
reason for a queued job, times), its log and its cancel, under the API's rules."""

from __future__ import annotations

import re

import pytest
from django.test import Client

from gpuadmin.access.models import Role
from integrations.ray import services
from integrations.ray.models import RayCluster, RayJob, RayJobState
from inventory.models import Pool
from scheduling.models import Quota
from tests.integrations.ray.test_external_cluster import events, follow_until, person

pytestmark = [pytest.mark.django_db, pytest.mark.integration]


def browser_of(username: str, role: str = Role.USER) -> Client:
    client = Client()
    client.force_login(person(username, role))
    return client


def job_id_of(response) -> int:  # noqa: ANN001 - a redirect
    assert response.status_code == 302, response.content.decode()[-2000:]
    found = re.fullmatch(r"/ray/jobs/(\d+)/", response["Location"])
    assert found, response["Location"]
    return int(found[1])


def test_the_ray_page_shows_each_cluster_and_an_unreachable_one_as_a_state(
    cluster, free_port, admin
):
    services.save_cluster(
        RayCluster(name="gone", address=f"http://127.0.0.1:{free_port}"), actor=admin
    )
    viewer = browser_of("vic", Role.VIEWER)
    answer = viewer.get("/ray/")
    assert answer.status_code == 200
    page = answer.content.decode()
    assert '<a href="/ray/">Ray</a>' in page  # the navigation reaches it
    assert page.count('data-state="ok"') == 1 and page.count('data-state="unreachable"') == 1
    assert "did not answer" in page
    # Of 4 (what is in use lags Ray's load report: another test's job may just have ended).
    assert re.search(r"GPUs in use: <strong>[\d.]+</strong> of 4<", page), page
    assert page.count("<tr data-ray-node=") == 2
    assert "Submit a Ray job" not in page  # a viewer submits nothing
    assert viewer.get("/ray/jobs/new/").status_code == 403
    # The live region alone for HTMX polls.
    live = viewer.get("/ray/", headers={"HX-Request": "true"}).content.decode()
    assert live.lstrip().startswith('<div id="ray-live"') and "<nav" not in live


def test_a_job_from_the_form_is_shown_logged_and_canceled(
    cluster, django_capture_on_commit_callbacks
):
    alice = browser_of("alice")
    form = alice.get("/ray/jobs/new/?cluster=lab").content.decode()
    assert '<option value="lab" selected>' in form
    with django_capture_on_commit_callbacks(execute=True):  # sent once the row commits
        answer = alice.post(
            "/ray/jobs/new/",
            {
                "cluster": "lab",
                "entrypoint": "echo hello $GREETING; sleep 120",
                "gpus": "1",
                "cpus": "0",
                "env": "GREETING=from the form\n",
                "runtime_env": '{"env_vars": {"OTHER": "1"}}',
            },
        )
    job = RayJob.objects.get(pk=job_id_of(answer))
    assert job.runtime_env == {"env_vars": {"OTHER": "1", "GREETING": "from the form"}}
    assert job.gpus == 1 and events(job)[0] == "ray_job.submitted"
    follow_until(job, lambda job: job.state == RayJobState.RUNNING)
    page = alice.get(f"/ray/jobs/{job.pk}/").content.decode()
    assert 'data-state="running"' in page and "Cancel job" in page
    assert "echo hello $GREETING; sleep 120" in page
    assert f"{job.started_at:%Y-%m-%d %H:%M:%S}" in page
    follow_until(job, lambda job: "hello from the form" in services.logs(job))
    log = alice.get(f"/ray/jobs/{job.pk}/log/").content.decode()
    assert "hello from the form" in log and 'hx-trigger="every 2s"' in log
    # Another user neither sees it nor cancels it; a viewer sees it as a gpuadmin job, not
    # its entrypoint, environment or log, and cannot cancel it.
    bob = browser_of("bob")
    assert bob.get(f"/ray/jobs/{job.pk}/").status_code == 404
    assert bob.post(f"/ray/jobs/{job.pk}/cancel/").status_code == 404
    viewer = browser_of("vic", Role.VIEWER)
    shown = viewer.get(f"/ray/jobs/{job.pk}/").content.decode()
    assert 'data-state="running"' in shown and "Cancel job" not in shown
    assert "sleep 120" not in shown and "GREETING" not in shown and "private to" in shown
    assert "sleep 120" not in viewer.get("/ray/").content.decode()
    assert viewer.get(f"/ray/jobs/{job.pk}/log/").status_code == 403
    assert viewer.post(f"/ray/jobs/{job.pk}/cancel/").status_code == 403
    assert alice.get(f"/ray/jobs/{job.pk}/cancel/").status_code == 405
    answer = alice.post(f"/ray/jobs/{job.pk}/cancel/", follow=True)
    assert "Cancel requested: Ray is stopping job" in answer.content.decode()
    follow_until(job, lambda job: not job.active)
    assert job.state == RayJobState.CANCELED
    assert events(job)[-1] == "ray_job.canceled"
    page = alice.get(f"/ray/jobs/{job.pk}/").content.decode()
    assert 'data-state="canceled"' in page and "Cancel job" not in page
    assert "hx-trigger" not in page.split('id="ray-job-live"')[1].split(">")[0]


def test_a_job_ray_cannot_place_shows_rays_reason(cluster, django_capture_on_commit_callbacks):
    alice = browser_of("alice")
    with django_capture_on_commit_callbacks(execute=True):
        answer = alice.post(
            "/ray/jobs/new/", {"cluster": "lab", "entrypoint": "true", "gpus": "3", "cpus": "0"}
        )
    job = follow_until(
        RayJob.objects.get(pk=job_id_of(answer)), lambda job: job.state == RayJobState.QUEUED
    )
    assert job.message  # Ray's word for why it waits (no node has 3 GPUs)
    page = alice.get(f"/ray/jobs/{job.pk}/").content.decode()
    assert "Why is it waiting?" in page and job.message in page.replace("&#x27;", "'")
    services.cancel(actor=job.owner, job=job)


def test_the_forms_fields_carry_the_refusals(db, admin, free_port):
    pool = Pool.objects.create(name="ray-lab")
    RayCluster.objects.create(name="gone", address=f"http://127.0.0.1:{free_port}", pool=pool)
    frank = browser_of("frank")
    Quota.objects.create(user_id=frank.session["_auth_user_id"], pool=pool, max_gpus=2)
    answer = frank.post(
        "/ray/jobs/new/",
        {
            "cluster": "gone",
            "entrypoint": "true",
            "gpus": "3",
            "cpus": "0",
            "env": "not a pair",
            "runtime_env": "[1]",
        },
    )
    page = answer.content.decode()
    assert answer.status_code == 200 and not RayJob.objects.exists()
    assert re.search(r'id="id_env-error">line 1: expected KEY=VALUE', page), page
    assert 'id="id_runtime_env-error">a JSON object' in page
    answer = frank.post(
        "/ray/jobs/new/", {"cluster": "gone", "entrypoint": "true", "gpus": "3", "cpus": "0"}
    )
    error = re.search(r'id="id_gpus-error">([^<]*)<', answer.content.decode())
    assert error and "2 GPUs" in error[1], answer.content.decode()
    assert not RayJob.objects.exists()
