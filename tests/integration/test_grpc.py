"""The gRPC API through a real `gpuadmin grpc` process and a real grpcio client: jobs submitted
(idempotently), read, listed, followed and canceled; refusals as status codes naming the field;
tokens; TLS, the health service and reflection."""

from __future__ import annotations

import queue
import subprocess
import sys
import threading
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, timedelta
from pathlib import Path

import grpc
import pytest
from django.contrib.auth import get_user_model
from django.db import connection
from django.utils import timezone
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from gpuadmin.access.models import Membership, Role
from gpuadmin.access.services import create_token, revoke_token
from gpuadmin.v1 import (
    fleet_pb2,
    fleet_pb2_grpc,
    jobs_pb2_grpc,
    reservations_pb2,
    reservations_pb2_grpc,
)
from gpuadmin.v1 import jobs_pb2 as pb
from inventory.models import Gpu
from inventory.services import change_state
from scheduling.jobs import control
from scheduling.models import Job, JobState
from tests.conftest import REPO_DIR, child_env, session_database_url, unused_port
from tests.integration.stack import worker_and_agent
from tests.scheduling.conftest import add_sim_node
from tests.unix_accounts import runs_as_this_account
from tests.waiting import wait_for

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]
SUBMIT_RATE = 8  # a minute, for the server under test


@contextmanager
def grpc_server(
    gpuadmin_env: dict[str, str], bind: str, log: Path, *args: str
) -> Iterator[subprocess.Popen[bytes]]:
    """`gpuadmin grpc --bind bind *args` on this session's database, its output in ``log``."""
    env = {
        **gpuadmin_env,
        "DATABASE_URL": session_database_url(),
        "GPUADMIN_SUBMIT_RATE": f"{SUBMIT_RATE}/min",
    }
    command = [sys.executable, "-m", "gpuadmin", "grpc", "--bind", bind, "--threads", "8", *args]
    with log.open("wb") as output:
        process = subprocess.Popen(
            command, env=env, cwd=REPO_DIR, stdout=output, stderr=subprocess.STDOUT
        )
    try:
        yield process
    finally:
        process.terminate()
        process.wait(timeout=30)
        # What the server said: pytest shows it with a failure.
        print(log.read_text())  # noqa: T201


@pytest.fixture(scope="module")
def shared_server(django_db_setup, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """`gpuadmin grpc` serving this session's database for the module's tests (it keeps no
    state of a test's own: each test's users, tokens and jobs are rows, flushed after it);
    its address."""
    folder = tmp_path_factory.mktemp("grpc")
    bind = f"127.0.0.1:{unused_port()}"
    with grpc_server(child_env(folder / "data"), bind, folder / "grpc.log"):
        yield bind


@pytest.fixture
def channel(shared_server: str) -> Iterator[grpc.Channel]:
    """A channel to the module's `gpuadmin grpc` (and a simulated node of 8 GPUs, so that
    submissions fit the fleet)."""
    add_sim_node("grpc-01")
    with grpc.insecure_channel(shared_server) as channel:
        grpc.channel_ready_future(channel).result(timeout=60)
        yield channel


def token_of(username: str, role: str = Role.USER) -> list[tuple[str, str]]:
    """A new user with ``role`` and the call metadata of a token of theirs."""
    user = get_user_model().objects.create_user(username)
    Membership.objects.create(user=user, role=role)
    _, key = create_token(user, "grpc")
    return [("authorization", f"Bearer {key}")]


def refusal(call, request, metadata) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as raised:
        call(request, metadata=metadata, timeout=30)
    return raised.value


def field_of(error: grpc.RpcError) -> str | None:
    return dict(error.trailing_metadata() or ()).get("gpuadmin-field")


def test_jobs_are_submitted_once_read_listed_followed_and_canceled(channel):
    jobs = jobs_pb2_grpc.JobsStub(channel)
    alice = token_of("alice")
    request = pb.SubmitJobRequest(
        idempotency_key="train-1",
        command=["python", "train.py"],
        gpu_count=2,
        env={"SEED": "1"},
        priority=pb.PRIORITY_HIGH,
        hold=True,
    )
    first = jobs.SubmitJob(request, metadata=alice, timeout=30)
    assert first.created
    job = first.job
    assert (job.state, job.gpu_count, job.priority) == (pb.JOB_STATE_PENDING, 2, pb.PRIORITY_HIGH)
    assert (list(job.command), dict(job.env), job.owner) == (
        ["python", "train.py"],
        {"SEED": "1"},
        "alice",
    )
    stored = Job.objects.get(pk=job.id)
    assert (stored.idempotency_key, stored.state) == ("train-1", JobState.PENDING)

    # A resend (the answer was lost) stores nothing more, whatever it asks.
    request.gpu_count = 4
    again = jobs.SubmitJob(request, metadata=alice, timeout=30)
    assert (again.created, again.job.id, again.job.gpu_count) == (False, job.id, 2)
    assert Job.objects.filter(owner__username="alice").count() == 1

    assert jobs.GetJob(pb.GetJobRequest(id=job.id), metadata=alice, timeout=30).id == job.id
    listed = jobs.ListJobs(pb.ListJobsRequest(), metadata=alice, timeout=30)
    assert [listed_job.id for listed_job in listed.jobs] == [job.id]
    assert listed.next_page_token == ""
    # Filtered by the REST API's FilterSet.
    running = pb.ListJobsRequest(states=[pb.JOB_STATE_RUNNING, pb.JOB_STATE_QUEUED])
    assert list(jobs.ListJobs(running, metadata=alice, timeout=30).jobs) == []
    held = pb.ListJobsRequest(owner="me", states=[pb.JOB_STATE_PENDING])
    assert [held.id for held in jobs.ListJobs(held, metadata=alice, timeout=30).jobs] == [job.id]

    # Followed as it changes: released into the queue here, then canceled over gRPC.
    seen: queue.SimpleQueue[pb.JobEvent | None] = queue.SimpleQueue()

    def follow() -> None:
        for event in jobs.WatchJob(pb.WatchJobRequest(id=job.id), metadata=alice, timeout=60):
            seen.put(event)
        seen.put(None)  # the stream ended

    threading.Thread(target=follow, daemon=True).start()
    submitted = seen.get(timeout=30)
    assert (submitted.event_type, submitted.state) == ("job.submitted", pb.JOB_STATE_PENDING)
    control.release_job(stored, actor=stored.owner)
    released = seen.get(timeout=30)
    assert (released.state, released.previous_state) == (pb.JOB_STATE_QUEUED, pb.JOB_STATE_PENDING)

    canceled = jobs.CancelJob(pb.CancelJobRequest(id=job.id), metadata=alice, timeout=30)
    assert (canceled.canceling, canceled.job.state) == (False, pb.JOB_STATE_CANCELED)
    end = seen.get(timeout=30)
    assert (end.state, end.actor, end.message) == (
        pb.JOB_STATE_CANCELED,
        "alice",
        "canceled by alice",
    )
    assert seen.get(timeout=30) is None  # the stream ended with the job
    assert submitted.event_id < released.event_id < end.event_id

    # Resumed after an event: only what came after it, and it ends at the end.
    resumed = jobs.WatchJob(
        pb.WatchJobRequest(id=job.id, after_event_id=submitted.event_id), metadata=alice, timeout=30
    )
    assert [event.event_id for event in resumed] == [released.event_id, end.event_id]
    after_end = pb.WatchJobRequest(id=job.id, after_event_id=end.event_id)
    assert list(jobs.WatchJob(after_end, metadata=alice, timeout=30)) == []

    # The audit rows say it came through gRPC.
    from gpuadmin.audit.models import AuditEvent

    channels = set(
        AuditEvent.objects.filter(target_type="scheduling.job", target_id=str(job.id))
        .exclude(event_type="job.queued")  # released here, not over gRPC
        .values_list("channel", flat=True)
    )
    assert channels == {"grpc"}


def test_a_job_is_followed_to_its_end_on_a_simulated_node(gpuadmin_env, shared_server, tmp_path):
    """Its states as the placement loop (a central worker) and the node's agent change them,
    each as it commits, until the stream ends with the job."""
    hostname = f"grpc-{uuid.uuid4().hex[:6]}"
    agent_args = ("--sim", "dgx-a100-80gb")
    with (
        worker_and_agent(gpuadmin_env, hostname, agent_args, 8, tmp_path),
        grpc.insecure_channel(shared_server) as channel,
    ):
        grpc.channel_ready_future(channel).result(timeout=60)
        erin = token_of("erin")
        runs_as_this_account(get_user_model().objects.get(username="erin"))
        jobs = jobs_pb2_grpc.JobsStub(channel)
        request = pb.SubmitJobRequest(command=["sh", "-c", "sleep 1"], gpu_count=2)
        job = jobs.SubmitJob(request, metadata=erin, timeout=60).job
        watch = jobs.WatchJob(pb.WatchJobRequest(id=job.id), metadata=erin, timeout=120)
        states = [pb.JobState.Name(event.state).removeprefix("JOB_STATE_") for event in watch]
    # (A start reported with the end, on a loaded host, is recorded as the end alone.)
    assert states in (
        ["QUEUED", "SCHEDULED", "RUNNING", "COMPLETED"],
        ["QUEUED", "SCHEDULED", "COMPLETED"],
    )
    assert Job.objects.get(pk=job.id).exit_code == 0


def test_refusals_are_status_codes_naming_the_field(channel):
    jobs = jobs_pb2_grpc.JobsStub(channel)
    bob = token_of("bob")

    # The serializer's bounds, and the job services' own rules.
    error = refusal(jobs.SubmitJob, pb.SubmitJobRequest(command=["x"], gpu_count=0), bob)
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert error.details().startswith("gpu_count: ")
    assert field_of(error) == "gpu_count"
    relative = pb.SubmitJobRequest(command=["x"], working_dir="data")
    error = refusal(jobs.SubmitJob, relative, bob)
    assert (error.code(), field_of(error)) == (grpc.StatusCode.INVALID_ARGUMENT, "working_dir")
    assert error.details() == "working_dir: 'data' is not an absolute path"

    # Another's job is none of a user's; a viewer reads it but cannot submit or cancel.
    carol = token_of("carol")
    job = jobs.SubmitJob(pb.SubmitJobRequest(command=["x"], hold=True), metadata=carol).job
    error = refusal(jobs.GetJob, pb.GetJobRequest(id=job.id), bob)
    assert error.code() == grpc.StatusCode.NOT_FOUND
    assert error.details() == f"No job {job.id} of yours (a user sees only their own jobs)."
    viewer = token_of("vera", Role.VIEWER)
    assert jobs.GetJob(pb.GetJobRequest(id=job.id), metadata=viewer).id == job.id
    error = refusal(jobs.CancelJob, pb.CancelJobRequest(id=job.id), viewer)
    assert error.code() == grpc.StatusCode.PERMISSION_DENIED
    assert error.details() == "This needs the user role; you are a viewer."

    # A state that does not allow it.
    jobs.CancelJob(pb.CancelJobRequest(id=job.id), metadata=carol)
    error = refusal(jobs.CancelJob, pb.CancelJobRequest(id=job.id), carol)
    assert error.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert error.details() == f"job {job.id} is already canceled"

    # Tokens: none, not one, revoked.
    error = refusal(jobs.ListJobs, pb.ListJobsRequest(), [])
    assert error.code() == grpc.StatusCode.UNAUTHENTICATED
    error = refusal(jobs.ListJobs, pb.ListJobsRequest(), [("authorization", "Bearer nope")])
    assert error.code() == grpc.StatusCode.UNAUTHENTICATED
    token = get_user_model().objects.get(username="bob").api_tokens.get()
    revoke_token(token, actor=token.user)
    error = refusal(jobs.ListJobs, pb.ListJobsRequest(), bob)
    assert (error.code(), error.details()) == (
        grpc.StatusCode.UNAUTHENTICATED,
        "Invalid or revoked API token.",
    )

    # The submission rate limit, counted with the REST API's.
    dave = token_of("dave")
    empty = pb.SubmitJobRequest(command=[""])
    codes = [refusal(jobs.SubmitJob, empty, dave) for _ in range(SUBMIT_RATE + 1)]
    assert [error.code() for error in codes[:-1]] == [
        grpc.StatusCode.INVALID_ARGUMENT
    ] * SUBMIT_RATE
    assert codes[-1].code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert int(dict(codes[-1].trailing_metadata())["retry-after"]) >= 1


def test_the_fleet_is_listed_and_gpu_state_changes_followed(channel):
    fleet = fleet_pb2_grpc.FleetStub(channel)
    vera = token_of("vera", Role.VIEWER)
    nodes = fleet.ListNodes(fleet_pb2.ListNodesRequest(), metadata=vera, timeout=30).nodes
    assert [(node.hostname, node.state, node.gpu_count) for node in nodes] == [
        ("grpc-01", "online", 8)
    ]
    listed = fleet.ListGpus(fleet_pb2.ListGpusRequest(node="grpc-01"), metadata=vera, timeout=30)
    assert [gpu.index for gpu in listed.gpus] == list(range(8))
    assert {gpu.state for gpu in listed.gpus} == {"available"}
    assert "A100" in listed.gpus[0].name
    error = refusal(fleet.ListGpus, fleet_pb2.ListGpusRequest(state="melted"), vera)
    assert (error.code(), field_of(error)) == (grpc.StatusCode.INVALID_ARGUMENT, "state")

    # Followed from the list on: an operator drains a GPU, then brings it back.
    watch = fleet.WatchGpus(
        fleet_pb2.WatchGpusRequest(after_event_id=listed.last_event_id), metadata=vera, timeout=60
    )
    gpu = Gpu.objects.get(uuid=listed.gpus[3].uuid)
    operator = get_user_model().objects.create_user("olga", is_staff=True)
    change_state(gpu, "draining", actor=operator, reason="fan noise")
    change_state(gpu, "available", actor=operator, reason="fan replaced")
    first, second = next(watch), next(watch)
    watch.cancel()
    assert (first.gpu_uuid, first.node, first.state, first.previous_state) == (
        gpu.uuid,
        "grpc-01",
        "draining",
        "available",
    )
    assert (first.actor, second.state) == ("olga", "available")
    assert first.event_id < second.event_id

    # Resumed after the first: the second again.
    resumed = fleet.WatchGpus(
        fleet_pb2.WatchGpusRequest(after_event_id=first.event_id, node="grpc-01"),
        metadata=vera,
        timeout=60,
    )
    assert next(resumed).event_id == second.event_id
    resumed.cancel()

    # The server's listening connection lost (the database restarted, say): what changed
    # meanwhile is read from the audit log once it listens again.
    watch = fleet.WatchGpus(
        fleet_pb2.WatchGpusRequest(after_event_id=second.event_id), metadata=vera, timeout=60
    )
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
            "WHERE query = %s AND pid <> pg_backend_pid()",
            ["LISTEN gpuadmin_state_changes"],
        )
        assert cursor.fetchone() == (True,)
    change_state(gpu, "offline", actor=operator, reason="board swap")
    lost = next(watch)
    watch.cancel()
    assert (lost.gpu_uuid, lost.state, lost.message) == (gpu.uuid, "offline", "board swap")

    # Streams never take every thread (8 here): the 7th is refused, other calls still answered.
    streams = [
        fleet.WatchGpus(fleet_pb2.WatchGpusRequest(), metadata=vera, timeout=60) for _ in range(7)
    ]
    wait_for(lambda: any(stream.done() for stream in streams), 30, "a stream refused")
    refused = [stream.code() for stream in streams if stream.done()]
    assert set(refused) == {grpc.StatusCode.RESOURCE_EXHAUSTED}
    assert len(streams) - len(refused) <= 6
    assert fleet.ListNodes(fleet_pb2.ListNodesRequest(), metadata=vera, timeout=10).nodes
    for stream in streams:
        stream.cancel()


def test_reservations_are_requested_read_and_canceled(channel):
    booked = reservations_pb2_grpc.ReservationsStub(channel)
    fay = token_of("fay")
    start = timezone.now().replace(microsecond=0) + timedelta(days=1)
    request = reservations_pb2.RequestReservationRequest(gpu_count=2, note="paper deadline")
    request.start.FromDatetime(start)
    request.end.FromDatetime(start + timedelta(hours=4))
    reservation = booked.RequestReservation(request, metadata=fay, timeout=30)
    # Approved at once: GPUs in no pool, within the default quota.
    assert (reservation.owner, reservation.gpu_count, reservation.state) == ("fay", 2, "approved")
    assert len(reservation.gpus) == 2
    assert reservation.start.ToDatetime(tzinfo=UTC) == start

    got = booked.GetReservation(
        reservations_pb2.GetReservationRequest(id=reservation.id), metadata=fay
    )
    assert got.note == "paper deadline"
    mine = reservations_pb2.ListReservationsRequest(owner="me", states=["approved"])
    listed = booked.ListReservations(mine, metadata=fay, timeout=30).reservations
    assert [found.id for found in listed] == [reservation.id]

    # The services' refusals: a window that ends before it starts, another's reservation.
    request.end.FromDatetime(start - timedelta(hours=1))
    error = refusal(booked.RequestReservation, request, fay)
    assert (error.code(), field_of(error)) == (grpc.StatusCode.INVALID_ARGUMENT, "end")
    cancel = reservations_pb2.CancelReservationRequest(id=reservation.id, reason="done early")
    error = refusal(booked.CancelReservation, cancel, token_of("gil"))
    assert error.code() == grpc.StatusCode.PERMISSION_DENIED

    canceled = booked.CancelReservation(cancel, metadata=fay, timeout=30)
    assert canceled.state == "canceled"
    error = refusal(booked.CancelReservation, cancel, fay)
    assert error.code() == grpc.StatusCode.FAILED_PRECONDITION


def test_tls_health_and_reflection(gpuadmin_env, free_port, tmp_path):
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
         "-subj", "/CN=localhost", "-addext", "subjectAltName=IP:127.0.0.1",
         "-keyout", str(key), "-out", str(cert)],
        check=True,
        capture_output=True,
    )  # fmt: skip
    bind = f"127.0.0.1:{free_port}"
    tls = ("--tls-cert", str(cert), "--tls-key", str(key))
    credentials = grpc.ssl_channel_credentials(root_certificates=cert.read_bytes())
    with (
        grpc_server(gpuadmin_env, bind, tmp_path / "grpc.log", *tls),
        grpc.secure_channel(bind, credentials) as channel,
    ):
        grpc.channel_ready_future(channel).result(timeout=60)
        checks = health_pb2_grpc.HealthStub(channel)
        for service in ("", "gpuadmin.v1.Jobs", "gpuadmin.v1.Fleet", "gpuadmin.v1.Reservations"):
            answer = checks.Check(health_pb2.HealthCheckRequest(service=service), timeout=30)
            assert answer.status == health_pb2.HealthCheckResponse.SERVING

        reflection = reflection_pb2_grpc.ServerReflectionStub(channel)
        asked = [
            reflection_pb2.ServerReflectionRequest(list_services=""),
            reflection_pb2.ServerReflectionRequest(file_containing_symbol="gpuadmin.v1.Jobs"),
        ]
        listed, described = list(reflection.ServerReflectionInfo(iter(asked), timeout=30))
        names = {service.name for service in listed.list_services_response.service}
        assert {"gpuadmin.v1.Jobs", "gpuadmin.v1.Fleet", "grpc.health.v1.Health"} <= names
        assert described.file_descriptor_response.file_descriptor_proto  # for grpcurl

        with grpc.insecure_channel(bind) as plain:
            error = refusal(
                health_pb2_grpc.HealthStub(plain).Check, health_pb2.HealthCheckRequest(), []
            )
            assert error.code() == grpc.StatusCode.UNAVAILABLE
