"""Every write endpoint of the API leaves exactly one audit row per state change, with the
person who acted and the request's id. The table is checked against the URLconf: a write
endpoint added without an entry here fails ``test_every_write_endpoint_has_an_entry``."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.urls import URLPattern, URLResolver, get_resolver
from django.utils import timezone
from rest_framework.test import APIClient

from gpuadmin.access.models import ApiToken, Membership, Role
from gpuadmin.access.services import create_token
from gpuadmin.audit.models import AuditEvent
from gpuadmin.celery import app
from health import quarantine
from health.alerts import open_alert
from health.models import BreakerTrip, HealthEvent, Quarantine
from integrations.ray.jobs_api import RayJobsClient
from integrations.ray.models import RayCluster, RayJob, RayJobState
from inventory.models import Gpu
from scheduling.allocations import services as allocation_services
from scheduling.jobs import arrays, submission
from scheduling.models import Job, JobArray, PoolPolicy, Quota, Reservation, SchedulerSettings
from scheduling.policies.api import PoolPolicySerializer
from scheduling.reservations import services as reservations
from scheduling.sharing import relayout
from tests.assistant.chat_server import ChatServer, call, say
from tests.scheduling.conftest import RecordingBroker, add_sim_node

pytestmark = pytest.mark.django_db

WRITE_METHODS = {"post", "put", "patch", "delete"}


def write_endpoints() -> set[tuple[str, str]]:
    """(URL name with its namespace, METHOD) of every API view that accepts a write method."""
    found: set[tuple[str, str]] = set()

    def walk(patterns: list[Any], namespace: str) -> None:
        for pattern in patterns:
            if isinstance(pattern, URLResolver):
                inner = f"{namespace}{pattern.namespace}:" if pattern.namespace else namespace
                walk(pattern.url_patterns, inner)
                continue
            assert isinstance(pattern, URLPattern)
            view = getattr(pattern.callback, "cls", None)  # DRF views; pages and the admin
            if view is None:  # are Django views (their writes: tests of each page)
                continue
            actions = getattr(pattern.callback, "actions", None)
            methods = set(actions) if actions else {m for m in WRITE_METHODS if hasattr(view, m)}
            for method in methods & WRITE_METHODS & set(view.http_method_names):
                found.add((f"{namespace}{pattern.name}", method.upper()))

    walk(get_resolver().url_patterns, "")
    return found


@dataclass
class Call:
    """One write: who sends it, where, and the audit rows it must leave (one per change)."""

    actor: User
    method: str
    url: str
    events: list[str]
    body: dict[str, Any] | None = None


@dataclass
class World:
    alice: User  # a user
    ops: User  # an operator
    root: User  # an admin

    def job(self, **fields: Any) -> Job:
        return submission.submit_job(self.alice, command=["sleep", "60"], **fields)

    def quota(self) -> Quota:
        return Quota.objects.create(project="vision", max_gpus=8)

    def array(self, *, hold: bool = True) -> JobArray:
        """A job array of three tasks, held (or not), two of them made jobs (its cap and one
        more)."""
        array = submission.submit_array(self.alice, "0-2%1", command=["true"], hold=hold).array
        arrays.split_due()
        return array

    def gpu(self, hostname: str = "dgx-01") -> Gpu:
        return Gpu.objects.get(node__hostname=hostname, index=0)

    def quarantine(self, hostname: str = "dgx-02") -> Quarantine:
        """GPU 7 of ``hostname`` fenced by health (an XID 48): its open quarantine."""
        gpu = Gpu.objects.get(node__hostname=hostname, index=7)
        cause = HealthEvent.objects.create(
            node=gpu.node,
            gpu=gpu,
            kind="xid",
            xid=48,
            severity="critical",
            occurred_at=timezone.now(),
            dedupe_key=f"audit:{gpu.uuid}",
        )
        quarantine.fence(gpu, event=cause, policy=None, to_state="degraded")
        return Quarantine.objects.get(gpu=gpu, closed_at__isnull=True)

    def scheduled_job(self) -> Job:
        job = self.job()
        allocation_services.allocate(job, [self.gpu().pk], actor_name="placement-loop")
        return job


def mig_gpu() -> Gpu:
    """GPU 0 of a simulated DGX A100 40GB, in MIG mode."""
    return add_sim_node("dgx-mig", "dgx-a100-40gb").gpus.get(index=0)


def booked(w: World, *, waiting: bool = False, started: bool = False) -> Reservation:
    """A reservation of alice for an hour: from tomorrow, or from a minute ago (``started``);
    approved, or waiting for an admin (``waiting``: the GPUs in no pool approve by hand)."""
    PoolPolicy.objects.update_or_create(
        pool=None, defaults={"reservation_auto_approve": not waiting}
    )
    start = timezone.now() + (timedelta(minutes=-1) if started else timedelta(days=1))
    return reservations.request(w.alice, 1, start, start + timedelta(hours=1))


def reservation_body() -> dict[str, Any]:
    start = timezone.now() + timedelta(days=2)
    return {
        "gpu_count": 2,
        "start": start.isoformat(),
        "end": (start + timedelta(hours=1)).isoformat(),
    }


def submit_body() -> dict[str, Any]:
    return {"command": ["sleep", "60"], "gpu_count": 1}


def ray_job(w: World) -> RayJob:
    """A running Ray job of alice's (Ray's answers to a stop request: ``world``)."""
    cluster = RayCluster.objects.create(name="lab", address="http://127.0.0.1:9")
    return RayJob.objects.create(
        owner=w.alice, cluster=cluster, entrypoint="sleep 60", submission_id="gpuadmin-audit",
        state=RayJobState.RUNNING,
    )  # fmt: skip


def switch(w: World, enable: bool) -> Call:
    """Start or stop the loop from the other state."""
    SchedulerSettings.load()
    SchedulerSettings.objects.update(enabled=not enable)
    verb, event = ("start", "scheduler.started") if enable else ("stop", "scheduler.stopped")
    return Call(w.root, "post", f"/orchestrator/{verb}", [event])


def reset_breaker(w: World) -> Call:
    """Reset the circuit breaker, tripped."""
    BreakerTrip.objects.create(falling=4, fleet=16)
    return Call(w.root, "post", "/api/v1/breaker/reset/", ["health.breaker_reset"], {"reason": "x"})


CASES: dict[tuple[str, str], Callable[[World], Call]] = {
    ("api-v1:node-detail", "PATCH"): lambda w: Call(
        w.root, "patch", "/api/v1/nodes/dgx-01/", ["node.catalog_changed"], {"notes": "rack 4"}
    ),
    ("api-v1:gpu-detail", "PATCH"): lambda w: Call(
        w.root,
        "patch",
        f"/api/v1/gpus/{w.gpu().uuid}/",
        ["gpu.catalog_changed"],
        {"label": "left", "notes": "fan noisy", "mps_shared": True},
    ),
    ("api-v1:node-change-state", "POST"): lambda w: Call(
        w.ops,
        "post",
        "/api/v1/nodes/dgx-02/state/",
        ["node.state_changed"],
        {"state": "offline", "reason": "rack power"},
    ),
    ("api-v1:gpu-change-state", "POST"): lambda w: Call(
        w.ops,
        "post",
        f"/api/v1/gpus/{w.gpu().uuid}/state/",
        ["gpu.state_changed"],
        {"state": "draining", "reason": "firmware"},
    ),
    ("health-quarantine:quarantine-release", "POST"): lambda w: Call(
        w.ops,
        "post",
        f"/api/v1/quarantines/{w.quarantine().pk}/release/",
        ["gpu.state_changed", "gpu.quarantine_changed"],  # back in service, quarantine closed
        {"reason": "reseated"},
    ),
    ("api-breaker-reset", "POST"): reset_breaker,
    ("scheduling-api-v1:job-list", "POST"): lambda w: Call(
        w.alice, "post", "/api/v1/jobs/", ["job.submitted"], submit_body()
    ),
    # Nothing answers at that address: the job is stored and waits to be sent.
    ("ray-api-v1:job-list", "POST"): lambda w: Call(
        w.alice,
        "post",
        "/api/v1/ray/jobs/",
        ["ray_job.submitted"],
        {
            "cluster": RayCluster.objects.create(name="lab", address="http://127.0.0.1:9").name,
            "entrypoint": "true",
        },
    ),  # fmt: skip
    ("ray-api-v1:job-cancel", "POST"): lambda w: Call(
        w.alice, "post", f"/api/v1/ray/jobs/{ray_job(w).pk}/cancel/", ["ray_job.cancel_requested"]
    ),
    ("api-queue-submit", "POST"): lambda w: Call(
        w.alice, "post", "/queue/submit", ["job.submitted"], submit_body()
    ),
    ("scheduling-api-v1:job-cancel", "POST"): lambda w: Call(
        w.alice, "post", f"/api/v1/jobs/{w.job().pk}/cancel/", ["job.canceled"]
    ),
    ("scheduling-api-v1:job-kill", "POST"): lambda w: Call(
        w.ops,
        "post",
        f"/api/v1/jobs/{w.scheduled_job().pk}/kill/",
        ["job.cancel_requested"],  # SIGKILL through its agent, whose report ends it
    ),
    ("api-queue-job", "DELETE"): lambda w: Call(
        w.ops, "delete", f"/queue/{w.job().pk}", ["job.canceled"]
    ),
    ("scheduling-api-v1:job-release", "POST"): lambda w: Call(
        w.alice, "post", f"/api/v1/jobs/{w.job(hold=True).pk}/release/", ["job.queued"]
    ),
    ("scheduling-api-v1:job-hold", "POST"): lambda w: Call(
        w.alice, "post", f"/api/v1/jobs/{w.job().pk}/hold/", ["job.pending"]
    ),
    ("scheduling-api-v1:array-cancel", "POST"): lambda w: Call(
        w.alice,
        "post",
        f"/api/v1/arrays/{w.array().pk}/cancel/",
        # the task not made a job yet, then each of its two jobs
        ["array.canceled", "job.canceled", "job.canceled"],
    ),
    ("scheduling-api-v1:array-release", "POST"): lambda w: Call(
        w.alice,
        "post",
        f"/api/v1/arrays/{w.array().pk}/release/",
        ["array.released", "job.queued", "job.queued"],  # the task to come, then its two jobs
    ),
    ("scheduling-api-v1:array-hold", "POST"): lambda w: Call(
        w.alice,
        "post",
        f"/api/v1/arrays/{w.array(hold=False).pk}/hold/",
        ["array.held", "job.pending", "job.pending"],
    ),
    ("api-queue-priority", "PATCH"): lambda w: Call(
        w.alice,
        "patch",
        f"/queue/{w.job().pk}/priority",
        ["job.priority_changed"],
        {"priority": "high"},
    ),
    ("api-gpu-allocate", "POST"): lambda w: Call(
        w.ops,
        "post",
        "/cluster/gpu-allocate",
        ["allocation.created", "job.scheduled"],  # the GPU's allocation, the job's transition
        {"job_id": w.job().pk, "gpu_uuids": [w.gpu().uuid]},
    ),
    ("api-gpu-release", "POST"): lambda w: Call(
        w.ops,
        "post",
        "/cluster/gpu-release",
        ["job.cancel_requested"],  # the agent's report ends it and frees the GPU later
        {"job_id": w.scheduled_job().pk},
    ),
    ("api-orchestrator-start", "POST"): lambda w: switch(w, enable=True),
    ("api-orchestrator-stop", "POST"): lambda w: switch(w, enable=False),
    ("api-orchestrator-policies", "PUT"): lambda w: Call(
        w.root,
        "put",
        "/orchestrator/policies",
        ["scheduler.policy_changed"],
        {"policy": "priority", "aging_interval_s": 123},
    ),
    ("policies-api-v1:policy-detail", "PATCH"): lambda w: Call(
        w.root, "patch", "/api/v1/policies/~/", ["scheduler.policy_changed"], {"backfill": False}
    ),
    ("policies-api-v1:policy-detail", "PUT"): lambda w: Call(
        w.root,
        "put",
        "/api/v1/policies/~/",
        ["scheduler.policy_changed"],
        {**PoolPolicySerializer(PoolPolicy.default()).data, "policy": "las"},
    ),
    ("policies-api-v1:quota-list", "POST"): lambda w: Call(
        w.root, "post", "/api/v1/quotas/", ["quota.created"], {"user": "alice", "max_gpus": 4}
    ),
    ("policies-api-v1:quota-detail", "PATCH"): lambda w: Call(
        w.root, "patch", f"/api/v1/quotas/{w.quota().pk}/", ["quota.changed"], {"max_gpus": 2}
    ),
    ("policies-api-v1:quota-detail", "PUT"): lambda w: Call(
        w.root,
        "put",
        f"/api/v1/quotas/{w.quota().pk}/",
        ["quota.changed"],
        {"project": "vision", "gpu_hours": 100, "period": "week", "fairshare_weight": 3},
    ),
    ("policies-api-v1:quota-detail", "DELETE"): lambda w: Call(
        w.root, "delete", f"/api/v1/quotas/{w.quota().pk}/", ["quota.deleted"]
    ),
    ("reservation-api-v1:reservation-list", "POST"): lambda w: Call(
        w.alice,
        "post",
        "/api/v1/reservations/",
        ["reservation.requested", "reservation.approved"],  # auto-approved within quota
        reservation_body(),
    ),
    ("reservation-api-v1:reservation-approve", "POST"): lambda w: Call(
        w.root,
        "post",
        f"/api/v1/reservations/{booked(w, waiting=True).pk}/approve/",
        ["reservation.approved"],
    ),
    ("reservation-api-v1:reservation-reject", "POST"): lambda w: Call(
        w.root,
        "post",
        f"/api/v1/reservations/{booked(w, waiting=True).pk}/reject/",
        ["reservation.rejected"],
        {"reason": "not now"},
    ),
    ("reservation-api-v1:reservation-cancel", "POST"): lambda w: Call(
        w.alice, "post", f"/api/v1/reservations/{booked(w).pk}/cancel/", ["reservation.canceled"]
    ),
    ("reservation-api-v1:reservation-release", "POST"): lambda w: Call(
        w.ops,
        "post",
        f"/api/v1/reservations/{booked(w, started=True).pk}/release/",
        ["reservation.released"],
    ),
    ("health-api-v1:alert-ack", "POST"): lambda w: Call(
        w.ops,
        "post",
        f"/api/v1/alerts/{open_alert(fingerprint='a', severity='warning', summary='x').pk}/ack/",
        ["alert.acknowledged"],
        {"comment": "on it"},
    ),
    ("scheduling-api-v1:mig-relayout-list", "POST"): lambda w: Call(
        w.root,
        "post",
        "/api/v1/mig-relayouts/",
        ["gpu.state_changed", "mig_relayout.draining"],  # the GPU drains
        {"gpu": mig_gpu().uuid, "layout_name": "balanced"},
    ),
    ("scheduling-api-v1:mig-relayout-cancel", "POST"): lambda w: Call(
        w.root,
        "post",
        f"/api/v1/mig-relayouts/{relayout.request(mig_gpu(), 'balanced', actor=w.root).pk}/cancel/",
        ["gpu.state_changed", "mig_relayout.canceled"],  # available again
    ),
    # Reads only; each tool call the model makes is audited.
    ("assistant-ask", "POST"): lambda w: Call(
        w.alice,
        "post",
        "/api/v1/assistant/ask/",
        ["assistant.tool_called"],
        {"question": "Which GPU is free?"},
    ),
    ("scheduling-api-v1:token-list", "POST"): lambda w: Call(
        w.alice, "post", "/api/v1/tokens/", ["token.created"], {"name": "laptop"}
    ),
    ("scheduling-api-v1:token-detail", "DELETE"): lambda w: Call(
        w.alice,
        "delete",
        f"/api/v1/tokens/{create_token(w.alice, 'old')[0].pk}/",
        ["token.revoked"],
    ),
}


def test_every_write_endpoint_has_an_entry():
    """A new write endpoint needs a row in ``CASES``: what it changes and what it audits."""
    assert write_endpoints() == set(CASES)


@pytest.fixture
def world(django_user_model, monkeypatch, settings) -> Iterator[World]:
    monkeypatch.setattr(app, "send_task", RecordingBroker().send_task)  # no agent, no loop
    # A Ray cluster that accepts every stop request (tests/integrations/ray/ stops real ones).
    monkeypatch.setattr(RayJobsClient, "stop", lambda client, submission_id: True)
    # The assistant's model: it looks one GPU up, then answers (tests/assistant/ has the rest).
    model = ChatServer([call(("list_gpus", {"limit": 1})), say("GPU 0 of dgx-01.")]).start()
    settings.GPUADMIN_ASSISTANT_URL = model.url
    add_sim_node("dgx-01")
    add_sim_node("dgx-02")
    ops = django_user_model.objects.create_user("ops")
    Membership.objects.create(user=ops, role=Role.OPERATOR)
    yield World(
        alice=django_user_model.objects.create_user("alice"),
        ops=ops,
        root=django_user_model.objects.create_user("root", is_staff=True),
    )
    model.stop()


@pytest.mark.parametrize("endpoint", sorted(CASES), ids=lambda e: f"{e[1]} {e[0]}")
def test_a_write_leaves_one_audit_row_per_change_with_actor_and_request_id(world, endpoint):
    call = CASES[endpoint](world)
    seen = AuditEvent.objects.order_by("-pk").values_list("pk", flat=True).first() or 0
    client = APIClient()
    client.force_authenticate(call.actor)
    sent = uuid.uuid4()
    response = getattr(client, call.method)(
        call.url, call.body, format="json", HTTP_X_REQUEST_ID=str(sent)
    )
    assert 200 <= response.status_code < 300, response.content
    assert response["X-Request-ID"] == str(sent)
    rows = list(AuditEvent.objects.filter(pk__gt=seen).order_by("pk"))
    assert sorted(row.event_type for row in rows) == sorted(call.events)
    assert {(row.actor_id, row.actor_name) for row in rows} == {
        (call.actor.pk, call.actor.get_username())
    }
    assert {row.request_id for row in rows} == {sent}


def test_a_token_request_is_audited_under_the_token_owner(world):
    """Bearer tokens are actors too (the CLI's way in)."""
    _, key = create_token(world.alice, "cli")
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {key}")
    response = client.post("/queue/submit", submit_body(), format="json")
    assert response.status_code == 201
    row = AuditEvent.objects.get(event_type="job.submitted")
    assert (row.actor_name, str(row.request_id)) == ("alice", response["X-Request-ID"])
    assert ApiToken.objects.filter(user=world.alice).count() == 1


def test_an_array_submission_audits_the_array_then_every_task_made_a_job(world):
    """A job array is audited under the request; its tasks, made jobs in bulk by the
    placement loop later, each have their row with the array's owner as actor."""
    client = APIClient()
    client.force_authenticate(world.alice)
    sent = uuid.uuid4()
    body = {**submit_body(), "array": "0-2"}
    response = client.post("/api/v1/jobs/", body, format="json", HTTP_X_REQUEST_ID=str(sent))
    assert response.status_code == 201, response.content
    [row] = AuditEvent.objects.filter(request_id=sent)
    assert (row.event_type, row.target_id) == ("array.submitted", str(response.json()["id"]))
    assert (row.actor_id, row.actor_name) == (world.alice.pk, "alice")
    arrays.split_due()
    tasks = Job.objects.filter(array_id=response.json()["id"]).order_by("array_index")
    rows = AuditEvent.objects.filter(event_type="job.submitted").order_by("pk")
    assert [row.target_id for row in rows] == [str(task.pk) for task in tasks]
    assert {(row.actor_id, row.actor_name) for row in rows} == {(world.alice.pk, "alice")}
