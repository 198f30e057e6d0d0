"""The Slurm mirror where people and automation see it: the fleet, node, GPU and jobs pages,
``/api/v1/slurm/...``, ``/metrics`` and the admin's registration form."""

from __future__ import annotations

import pytest
from django.db import connection
from django.test import Client, RequestFactory
from django.test.utils import CaptureQueriesContext
from rest_framework.test import APIClient

from gpuadmin.access.models import Membership, Role
from gpuadmin.audit.models import AuditEvent
from integrations.slurm import services
from integrations.slurm.metrics import SlurmCollector
from integrations.slurm.models import PollState, SlurmCluster
from integrations.slurm.sections import fleet_section
from inventory.models import Gpu
from tests.integrations.slurm.mirror import add_reversed_node, answer, job, node, register

pytestmark = pytest.mark.django_db


@pytest.fixture
def mirrored(admin_user) -> SlurmCluster:
    """gpu01 drained, with job 11 on its minor numbers 0 and 1 (NVML's GPUs 7 and 6); job 12
    pending; a node the catalog does not know."""
    add_reversed_node("gpu01")
    cluster = register(admin_user)
    services.sync(
        cluster,
        answer(
            [node("gpu01", "MIXED", "DRAIN", reason="fan", used=(0, 1)), node("login01")],
            [job(11, {"gpu01": (0, 1)}, user="alice"), job(12, user="bob")],
        ),
    )
    return cluster


def signed_in(django_user_model, role: str | None = Role.VIEWER) -> Client:
    user = django_user_model.objects.create_user(f"as-{role}")
    if role:
        Membership.objects.create(user=user, role=role)
    client = Client()
    client.force_login(user)
    return client


def api_as(django_user_model, role: str | None) -> APIClient:
    user = django_user_model.objects.create_user(f"api-{role}")
    if role:
        Membership.objects.create(user=user, role=role)
    client = APIClient()
    client.force_authenticate(user)
    return client


def test_everyone_signed_in_reads_the_mirror_and_nobody_writes_it(django_user_model, mirrored):
    viewer = api_as(django_user_model, Role.VIEWER)
    [cluster] = viewer.get("/api/v1/slurm/clusters/").json()["results"]
    assert (cluster["name"], cluster["state"], cluster["address"]) == (
        "hpc",
        "ok",
        "http://slurm.example:6820",
    )
    assert "token" not in cluster
    nodes = viewer.get("/api/v1/slurm/nodes/?state=drain").json()["results"]
    assert [(row["name"], row["node"], row["states"]) for row in nodes] == [
        ("gpu01", "gpu01", ["MIXED", "DRAIN"])
    ]
    assert viewer.get("/api/v1/slurm/nodes/?node=gpu01").json()["count"] == 1
    jobs = viewer.get("/api/v1/slurm/jobs/?state=running").json()["results"]
    assert [row["job_id"] for row in jobs] == [11]
    seven, six = (Gpu.objects.get(node__hostname="gpu01", index=i).uuid for i in (7, 6))
    assert jobs[0]["gpus"] == [
        {"node_name": "gpu01", "minor_number": 0, "gpu": seven, "index": 7},
        {"node_name": "gpu01", "minor_number": 1, "gpu": six, "index": 6},
    ]
    assert viewer.get("/api/v1/slurm/jobs/?user=bob").json()["results"][0]["reason"] == "Resources"
    assert APIClient().get("/api/v1/slurm/jobs/").status_code == 401
    admin = api_as(django_user_model, Role.ADMIN)
    assert admin.post("/api/v1/slurm/clusters/", {"name": "x"}).status_code == 405
    assert viewer.post("/api/v1/slurm/clusters/", {"name": "x"}).status_code == 403


def test_an_unreachable_cluster_says_so_on_its_pages_and_in_the_api(
    django_user_model, mirrored, monkeypatch
):
    def no_answer(cluster: SlurmCluster) -> None:
        raise services.Unreachable("timed out")

    monkeypatch.setattr(services, "read_cluster", no_answer)
    assert services.poll(mirrored) == PollState.UNREACHABLE
    body = api_as(django_user_model, Role.VIEWER).get("/api/v1/slurm/clusters/").json()
    assert (body["results"][0]["state"], body["results"][0]["last_error"]) == (
        "unreachable",
        "timed out",
    )
    viewer = signed_in(django_user_model)
    for path in ("/fleet/", "/jobs/"):
        page = viewer.get(path)
        assert page.status_code == 200
        assert 'data-state="unreachable"' in page.text and "timed out" in page.text


def test_the_fleet_page_marks_slurm_nodes_and_the_job_holding_each_gpu(django_user_model, mirrored):
    viewer = signed_in(django_user_model)
    text = viewer.get("/fleet/").text
    assert 'data-slurm-node="gpu01"' in text and 'data-slurm-node="login01"' in text
    seven = Gpu.objects.get(node__hostname="gpu01", index=7)
    assert f'href="/gpus/{seven.uuid}/">GPU7</a>: job 11' in text
    assert "mixed+drain" in text and "not in the catalog" in text
    node_page = viewer.get("/nodes/gpu01/").text
    assert "Run by Slurm" in node_page and "GPU6</a>: job 11" in node_page
    gpu_page = viewer.get(f"/gpus/{seven.uuid}/").text
    assert "GPU7</a>: job 11" in gpu_page and "GPU6</a>: job 11" not in gpu_page
    # People not signed in see the fleet, not Slurm's users.
    assert "Slurm clusters" not in Client().get("/fleet/").text


def test_the_jobs_page_lists_slurms_jobs_beside_gpuadmins(django_user_model, mirrored):
    text = signed_in(django_user_model).get("/jobs/").text
    assert "Slurm jobs" in text
    assert 'id="slurm-job-hpc-11" data-state="RUNNING"' in text
    assert 'id="slurm-job-hpc-12" data-state="PENDING"' in text and "Resources" in text
    assert "gpu01 GPU7</a>, " in text
    assert text.index("slurm-job-hpc-12") < text.index("slurm-job-hpc-11")  # pending first
    assert '2 <span class="muted">asked</span>' in text


def test_metrics_count_slurm_nodes_and_jobs_by_state(client, mirrored):
    text = client.get("/metrics").content.decode()
    assert 'gpuadmin_slurm_cluster_up{cluster="hpc"} 1.0' in text
    assert 'gpuadmin_slurm_nodes{cluster="hpc",state="drain"} 1.0' in text
    assert 'gpuadmin_slurm_jobs{cluster="hpc",state="pending"} 1.0' in text
    assert 'gpuadmin_slurm_allocated_gpus{cluster="hpc",user="alice"} 2.0' in text


def test_the_fleet_section_and_the_collector_cost_what_they_say(django_user_model, mirrored):
    """Four queries each, however many nodes and jobs: no query per node or job."""
    request = RequestFactory().get("/")
    request.user = django_user_model.objects.create_user("reader")
    Membership.objects.create(user=request.user, role=Role.VIEWER)
    for grown in (False, True):
        if grown:  # more nodes and jobs, the same queries
            services.sync(
                mirrored,
                answer(
                    [node("gpu01", used=(0, 1, 2)), node("login01"), node("login02")],
                    [job(11, {"gpu01": (0, 1)}), job(13, {"gpu01": (2,)}), job(14)],
                ),
            )
        with CaptureQueriesContext(connection) as captured:
            assert fleet_section("fleet", None, request) is not None
        assert len(captured) == 4
        with CaptureQueriesContext(connection) as captured:
            list(SlurmCollector().collect())
        assert len(captured) == 4


def test_staff_register_a_cluster_in_the_admin_and_its_token_is_never_shown(admin_client):
    form = {
        "name": "lab",
        "url": "https://slurm.lab.example:6820",
        "unix_socket": "",
        "auth": "jwt",
        "user_name": "gpuadmin",
        "token": "eyJ-secret",
        "poll_interval_s": "60",
    }
    assert admin_client.post("/admin/slurm/slurmcluster/add/", form).status_code == 302
    cluster = SlurmCluster.objects.get(name="lab")
    assert cluster.token == "eyJ-secret"
    change = f"/admin/slurm/slurmcluster/{cluster.pk}/change/"
    assert "eyJ-secret" not in admin_client.get(change).text
    # Left empty, the token stays; the change is audited without it.
    admin_client.post(change, {**form, "token": "", "poll_interval_s": "30"})
    cluster.refresh_from_db()
    assert (cluster.token, cluster.poll_interval_s) == ("eyJ-secret", 30)
    changed = AuditEvent.objects.get(event_type="slurm.cluster_changed")
    assert (changed.before, changed.after) == ({"poll_interval_s": 60}, {"poll_interval_s": 30})
    both = {**form, "name": "both", "unix_socket": "/run/slurmrestd.sock"}
    refused = admin_client.post("/admin/slurm/slurmcluster/add/", both)
    assert refused.status_code == 200 and "not both" in refused.text
    assert not SlurmCluster.objects.filter(name="both").exists()
