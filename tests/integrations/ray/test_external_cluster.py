"""An external Ray cluster through gpuadmin, against real Ray (``ray_cluster``: a head and a
second raylet, 2 declared GPUs each): registered and read, jobs submitted, followed, logged and
canceled through the API, a resubmission under the same id that starts no second job, and a
cluster that does not answer shown as such."""

from __future__ import annotations

import http.server
import json
import re
import threading
import time
import urllib.request
from collections.abc import Callable

import pytest
from django.contrib.auth.models import User
from rest_framework.test import APIClient

from gpuadmin.access.models import Membership, Role
from gpuadmin.audit.models import AuditEvent
from integrations.ray import services, tasks
from integrations.ray.models import ClusterState, RayCluster, RayJob, RayJobState
from inventory.models import Pool
from scheduling.models import Quota

pytestmark = [pytest.mark.django_db, pytest.mark.integration]

FOLLOW_TIMEOUT_S = 30


def person(username: str, role: str = Role.USER) -> User:
    if role == Role.ADMIN:
        return User.objects.create_user(username, is_staff=True)
    user = User.objects.create_user(username)
    if role != Role.USER:
        Membership.objects.create(user=user, role=role)
    return user


def client_of(user: User) -> APIClient:
    client = APIClient()
    client.force_login(user)
    return client


def events(job: RayJob) -> list[str]:
    rows = AuditEvent.objects.filter(target_type="ray.rayjob", target_id=str(job.pk))
    return list(rows.order_by("pk").values_list("event_type", flat=True))


def follow_until(job: RayJob, done: Callable[[RayJob], bool]) -> RayJob:
    deadline = time.monotonic() + FOLLOW_TIMEOUT_S
    while not done(job):
        assert time.monotonic() < deadline, f"{job.state}: {job.message}"
        time.sleep(0.3)
        tasks.poll()
        job.refresh_from_db()
    return job


def ray_jobs_of(address: str, submission_id: str) -> list[dict]:
    with urllib.request.urlopen(f"{address}/api/jobs/", timeout=5) as response:
        listed = json.load(response)
    return [job for job in listed if job["submission_id"] == submission_id]


def test_a_registered_cluster_shows_its_nodes_and_gpus(cluster, admin):
    assert cluster.state == ClusterState.OK, cluster.last_error
    assert cluster.gpus == 4 and cluster.gpus_in_use == 0
    assert [node["gpus"] for node in cluster.nodes] == [2, 2]
    assert [node["is_head"] for node in cluster.nodes] == [True, False]
    assert AuditEvent.objects.filter(event_type="ray.cluster_registered").count() == 1
    viewer = client_of(person("vic", Role.VIEWER))
    [listed] = viewer.get("/api/v1/ray/clusters/").json()["results"]
    assert (listed["name"], listed["state"], listed["gpus"]) == ("lab", "ok", 4)
    assert "token" not in listed
    assert len(listed["nodes"]) == 2
    page = viewer.get("/fleet/").content.decode()
    assert "Ray clusters" in page and 'data-state="ok"' in page


def test_a_job_is_submitted_followed_and_its_logs_read(cluster):
    alice = client_of(person("alice"))
    answer = alice.post(
        "/api/v1/ray/jobs/",
        {
            "cluster": "lab",
            "entrypoint": "echo hello from $GREETING on GPU $CUDA_VISIBLE_DEVICES",
            "runtime_env": {"env_vars": {"GREETING": "ray"}},
            "gpus": 1,
        },
        format="json",
    )
    assert answer.status_code == 201, answer.content
    job = RayJob.objects.get(pk=answer.json()["id"])
    assert job.submission_id.startswith("gpuadmin-")
    follow_until(job, lambda job: not job.active)
    assert job.state == RayJobState.COMPLETED, job.message
    assert job.started_at and job.ended_at
    logs = alice.get(f"/api/v1/ray/jobs/{job.pk}/logs/").json()["logs"]
    # Ray gave the entrypoint the one GPU it asked for (of the node's declared 0 and 1).
    assert re.search(r"hello from ray on GPU [01]\n", logs), logs
    assert events(job)[0] == "ray_job.submitted"
    assert events(job)[-1] == "ray_job.completed"
    page = alice.get("/jobs/").content.decode()
    assert f'<tr id="ray-job-{job.pk}" data-state="completed">' in page
    # Another user neither sees nor reads it.
    bob = client_of(person("bob"))
    assert bob.get(f"/api/v1/ray/jobs/{job.pk}/").status_code == 404
    assert bob.get("/api/v1/ray/jobs/").json()["results"] == []
    assert f'id="ray-job-{job.pk}"' not in bob.get("/jobs/").content.decode()


def test_a_long_job_canceled_ends_canceled(cluster):
    owner = person("carol")
    carol = client_of(owner)
    job_id = carol.post(
        "/api/v1/ray/jobs/", {"cluster": "lab", "entrypoint": "sleep 120"}, format="json"
    ).json()["id"]
    job = follow_until(RayJob.objects.get(pk=job_id), lambda job: job.state == "running")
    answer = carol.post(f"/api/v1/ray/jobs/{job.pk}/cancel/")
    assert answer.status_code == 200, answer.content
    follow_until(job, lambda job: not job.active)
    assert job.state == RayJobState.CANCELED
    assert "ray_job.cancel_requested" in events(job)
    assert events(job)[-1] == "ray_job.canceled"
    assert carol.post(f"/api/v1/ray/jobs/{job.pk}/cancel/").status_code == 409


def test_a_resubmission_under_the_same_id_starts_no_second_job(cluster):
    owner = person("dave")
    job = services.submit(owner=owner, cluster=cluster, entrypoint="echo once")
    follow_until(job, lambda job: not job.active)
    # As if gpuadmin had not seen Ray's answer to the first send: it sends again, same id.
    RayJob.objects.filter(pk=job.pk).update(state=RayJobState.PENDING)
    job.refresh_from_db()
    services.follow(job)
    assert job.state == RayJobState.COMPLETED, job.message
    assert len(ray_jobs_of(cluster.address, job.submission_id)) == 1


def test_a_cluster_that_does_not_answer_is_a_state(
    db, admin, free_port, django_capture_on_commit_callbacks
):
    down = services.save_cluster(
        RayCluster(name="gone", address=f"http://127.0.0.1:{free_port}"), actor=admin
    )
    assert down.state == ClusterState.UNREACHABLE and "did not answer" in down.last_error
    viewer = client_of(person("vic", Role.VIEWER))
    [listed] = viewer.get("/api/v1/ray/clusters/").json()["results"]
    assert listed["state"] == "unreachable"
    page = viewer.get("/fleet/")
    assert page.status_code == 200 and 'data-state="unreachable"' in page.content.decode()
    # A submission is stored and waits to be sent, with the reason.
    erin = client_of(person("erin"))
    with django_capture_on_commit_callbacks(execute=True):  # sent once the row commits
        answer = erin.post("/api/v1/ray/jobs/", {"cluster": "gone", "entrypoint": "true"})
    assert answer.status_code == 201
    job = RayJob.objects.get(pk=answer.json()["id"])
    assert job.state == "pending" and "Not sent yet" in job.message


class Unauthorized(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        self.send_response(401)
        self.end_headers()
        self.wfile.write(b"missing or wrong token")

    def log_message(self, *args: object) -> None:
        pass


def test_a_cluster_that_refuses_is_a_state(db, admin):
    server = http.server.HTTPServer(("127.0.0.1", 0), Unauthorized)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        address = f"http://127.0.0.1:{server.server_port}"
        cluster = services.save_cluster(
            RayCluster(name="locked", address=address, token="wrong"), actor=admin
        )
    finally:
        server.shutdown()
    assert cluster.state == ClusterState.REFUSED
    assert cluster.last_error == "HTTP 401: missing or wrong token"
    [row] = AuditEvent.objects.filter(event_type="ray.cluster_registered")
    assert row.after["token"] == "changed" and "wrong" not in str(row.after)


def test_submissions_follow_roles_and_the_pools_quota(db, admin, free_port):
    pool = Pool.objects.create(name="ray-lab")
    down = RayCluster.objects.create(
        name="gone", address=f"http://127.0.0.1:{free_port}", pool=pool
    )
    viewer = client_of(person("vic", Role.VIEWER))
    refused = viewer.post("/api/v1/ray/jobs/", {"cluster": "gone", "entrypoint": "true"})
    assert refused.status_code == 403
    frank = person("frank")
    Quota.objects.create(user=frank, pool=pool, max_gpus=2)
    services.submit(owner=frank, cluster=down, entrypoint="true", gpus=2)
    over = client_of(frank).post(
        "/api/v1/ray/jobs/", {"cluster": "gone", "entrypoint": "true", "gpus": 1}
    )
    assert over.status_code == 400
    assert "user frank uses 2 of 2 GPUs in pool ray-lab" in over.content.decode()
