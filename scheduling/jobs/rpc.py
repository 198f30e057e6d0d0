"""The gRPC API's Jobs service (``gpuadmin.v1.Jobs``, protos/gpuadmin/v1/jobs.proto): the REST
API's jobs over gRPC. The same serializers check a submission's fields and say what a caller
may see of a job; the same job services submit and cancel; the same rate limit applies. A
watch follows the job's audited state changes as they commit (``gpuadmin.rpc.events``)."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from datetime import datetime
from types import SimpleNamespace
from typing import Any

import grpc
from django.contrib.auth.models import User
from django.db.models import QuerySet
from django.utils.text import capfirst
from google.protobuf.timestamp_pb2 import Timestamp

from gpuadmin import throttling
from gpuadmin.access.models import Role
from gpuadmin.access.services import can_act_on, role_of
from gpuadmin.rpc import events
from gpuadmin.rpc.calls import Call, Refused, filtered, rpc
from gpuadmin.v1 import jobs_pb2 as pb
from gpuadmin.v1 import jobs_pb2_grpc
from scheduling.allocations.services import AllocationRefused
from scheduling.filters import JobFilterSet
from scheduling.jobs import control, queries, submission, transitions
from scheduling.jobs.api import serializers as s
from scheduling.models import HOLDING_STATES, TERMINAL_STATES, Job

SERVICE = "gpuadmin.v1.Jobs"
JOB_TYPE = Job._meta.label_lower  # the audit rows' target_type of a job
PAGE_SIZE = 50
MAX_PAGE_SIZE = 500

UNSPECIFIED = pb.JOB_STATE_UNSPECIFIED
# What a SubmitJobRequest field is to JobSubmitSerializer: optional scalars only when set, the
# others when they differ from proto3's zero value (so unset fields take the REST defaults).
OPTIONAL_FIELDS = (
    "gpu_count",
    "node_count",
    "estimated_duration_s",
    "max_runtime_s",
    "pool",
    "mps_percent",
    "mps_memory_mib",
    "reservation",
)
PLAIN_FIELDS = (
    "use_shell",
    "name",
    "project",
    "working_dir",
    "container_image",
    "min_gpu_memory_mib",
    "gpu_model",
    "topology",
    "preemptible",
    "max_retries",
    "hold",
    "mig_profile",
    "ray",
    "cpus",
    "host_memory_mib",
    "dependency",
)


def job_state(state: str) -> pb.JobState:
    """A job's state as the enum ``JobState`` (``JOB_STATE_QUEUED``); unspecified for none."""
    try:
        return pb.JobState.Value(f"JOB_STATE_{state.upper()}") if state else UNSPECIFIED
    except ValueError:
        return UNSPECIFIED


def state_name(state: int) -> str:
    """A ``JobState`` as the job's state is stored (``queued``)."""
    return pb.JobState.Name(state).removeprefix("JOB_STATE_").lower()


def timestamp(value: str | datetime | None) -> Timestamp | None:
    if value is None:
        return None
    stamp = Timestamp()
    stamp.FromDatetime(datetime.fromisoformat(value) if isinstance(value, str) else value)
    return stamp


def submitted_fields(request: pb.SubmitJobRequest) -> dict[str, Any]:
    """The request as the REST API's body: the fields it sets."""
    body: dict[str, Any] = {
        name: getattr(request, name) for name in OPTIONAL_FIELDS if request.HasField(name)
    }
    for name in PLAIN_FIELDS:
        value = getattr(request, name)
        if value:
            body[name] = value
    body["command"] = (
        # One string for a shell, as the REST API takes it; else argv.
        request.command[0]
        if request.use_shell and len(request.command) == 1
        else list(request.command)
    )
    if request.env:
        body["env"] = dict(request.env)
    if request.priority:
        body["priority"] = pb.Priority.Name(request.priority).removeprefix("PRIORITY_").lower()
    return body


def job_message(job: Job, user: User) -> pb.Job:
    """``job`` as the REST API shows it to ``user`` (``JobSerializer``: what is private to its
    owner hidden), as a ``gpuadmin.v1.Job``."""
    data: Mapping[str, Any] = s.JobSerializer(
        job, context={"request": SimpleNamespace(user=user)}
    ).data
    message = pb.Job(
        id=data["id"],
        name=data["name"],
        owner=data["owner"],
        project=data["project"],
        state=job_state(data["state"]),
        priority=pb.Priority.Value(f"PRIORITY_{data['priority'].upper()}"),
        command=data["command"] or [],
        command_hidden=data["command"] is None,
        use_shell=data["use_shell"],
        env=data["env"],
        working_dir=data["working_dir"],
        container_image=data["container_image"],
        gpu_count=data["gpu_count"],
        node_count=data["node_count"],
        min_gpu_memory_mib=data["min_gpu_memory_mib"],
        gpu_model=data["gpu_model"],
        topology=data["topology"],
        pool=data["pool"] or "",
        preemptible=data["preemptible"],
        max_retries=data["max_retries"],
        attempt=data["attempt"],
        failures=data["failures"],
        message=data["message"],
        pending_code=data["pending_code"],
        pending_reason=data["pending_reason"],
        mig_profile=data["mig_profile"],
        idempotency_key=job.idempotency_key,
        allocations=[
            pb.Allocation(
                gpu_uuid=held["gpu_uuid"],
                gpu_index=held["gpu_index"],
                node=held["node"],
                attempt=held["attempt"],
            )
            for held in data["allocations"]
        ],
    )
    for name in ("submitted_at", "scheduled_at", "started_at", "finished_at", "estimated_start_at"):
        stamp = timestamp(data[name])
        if stamp is not None:
            getattr(message, name).CopyFrom(stamp)
    for name in (
        "estimated_duration_s",
        "max_runtime_s",
        "exit_code",
        "queue_position",
        "mps_percent",
        "reservation",
    ):
        if data[name] is not None:
            setattr(message, name, data[name])
    return message


def event_message(change: events.StateChange, job_id: int) -> pb.JobEvent:
    event = pb.JobEvent(
        event_id=change.id,
        job_id=job_id,
        event_type=change.event_type,
        state=job_state(change.state),
        previous_state=job_state(change.before),
        actor=change.actor,
        message=change.message,
    )
    event.time.FromDatetime(change.time)
    return event


def visible(user: User, job_id: int, jobs: QuerySet[Job] | None = None) -> Job:
    """A job ``user`` sees (``queries.visible_jobs``), with its details; NOT_FOUND saying why
    otherwise, as the REST API's 404."""
    jobs = queries.with_details(queries.visible_jobs(user)) if jobs is None else jobs
    job = jobs.filter(pk=job_id).first() if 0 < job_id < 2**63 else None
    if job is None:
        said = capfirst(queries.no_job_text(user, job_id)) + "."
        raise Refused(grpc.StatusCode.NOT_FOUND, said, field="id")
    return job


def page_token(text: str) -> int | None:
    if not text:
        return None
    if not text.isdecimal() or not 0 < int(text) < 2**63:
        raise Refused(
            grpc.StatusCode.INVALID_ARGUMENT,
            "page_token: give the next_page_token of the page before",
            field="page_token",
        )
    return int(text)


class JobsServicer(jobs_pb2_grpc.JobsServicer):
    """``gpuadmin.v1.Jobs``: users submit and act on their own jobs; viewers read everyone's;
    operators and admins act on anyone's (``gpuadmin.access``)."""

    @rpc(Role.USER)
    def SubmitJob(self, request: pb.SubmitJobRequest, call: Call) -> pb.SubmitJobResponse:
        wait = throttling.hit("submit", call.user)
        if wait is not None:
            raise Refused(
                grpc.StatusCode.RESOURCE_EXHAUSTED,
                f"Over the submission rate limit: try again in {throttling.retry_after(wait)} s.",
                metadata=[("retry-after", throttling.retry_after(wait))],
            )
        serializer = s.JobSubmitSerializer(data=submitted_fields(request))
        serializer.is_valid(raise_exception=True)
        fields = serializer.validated_data
        job, created = submission.submit_once(call.user, request.idempotency_key, **fields)
        if created:  # as the REST API answers it, without reading it again
            s.with_new_job_details(job, dependencies=bool(fields.get("dependency")))
        else:
            job = visible(call.user, job.pk)
        return pb.SubmitJobResponse(job=job_message(job, call.user), created=created)

    @rpc(Role.VIEWER)
    def GetJob(self, request: pb.GetJobRequest, call: Call) -> pb.Job:
        return job_message(visible(call.user, request.id), call.user)

    @rpc(Role.VIEWER)
    def ListJobs(self, request: pb.ListJobsRequest, call: Call) -> pb.ListJobsResponse:
        size = request.page_size or PAGE_SIZE
        if not 0 < size <= MAX_PAGE_SIZE:
            raise Refused(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"page_size: from 1 to {MAX_PAGE_SIZE}",
                field="page_size",
            )
        jobs = queries.visible_jobs(call.user).order_by("-pk")
        before = page_token(request.page_token)
        if before is not None:
            jobs = jobs.filter(pk__lt=before)
        data = {
            "state": [state_name(state) for state in request.states],
            "owner": request.owner,
            "project": request.project,
            "node": request.node,
        }
        jobs = filtered(JobFilterSet, data, jobs, call.user)
        page = list(queries.with_details(jobs)[: size + 1])
        more = len(page) > size
        page = page[:size]
        return pb.ListJobsResponse(
            jobs=[job_message(job, call.user) for job in page],
            next_page_token=str(page[-1].pk) if more else "",
        )

    @rpc(Role.USER)
    def CancelJob(self, request: pb.CancelJobRequest, call: Call) -> pb.CancelJobResponse:
        job = visible(call.user, request.id)
        if not can_act_on(call.user, job):
            raise Refused(
                grpc.StatusCode.PERMISSION_DENIED,
                f"A {role_of(call.user)} cannot act on job {job.pk}.",
            )
        try:
            control.cancel_job(job, actor=call.user, kill=request.kill)
        except (transitions.IllegalTransition, AllocationRefused) as exc:
            raise Refused(grpc.StatusCode.FAILED_PRECONDITION, str(exc)) from None
        job = visible(call.user, job.pk)
        return pb.CancelJobResponse(
            job=job_message(job, call.user), canceling=job.state in HOLDING_STATES
        )

    @rpc(Role.VIEWER)
    def WatchJob(self, request: pb.WatchJobRequest, call: Call) -> Iterator[pb.JobEvent]:
        """The job's state changes after ``after_event_id`` as they commit, ending after a
        terminal one: what the audit log holds first, then what the listening connection
        hands over (a change both give is sent once: the ids tell)."""
        job = visible(call.user, request.id, queries.visible_jobs(call.user))
        with events.STATE_CHANGES.following(JOB_TYPE, job.pk) as follower:
            call.on_end(follower.stop)
            # Its state before its changes: an ended job's end is then among them.
            state = Job.objects.filter(pk=job.pk).values_list("state", flat=True).get()
            live = state not in TERMINAL_STATES  # else: resumed after its end, nothing more
            for change in follower.changes(request.after_event_id, call.is_active, live=live):
                yield event_message(change, job.pk)
                if change.state in TERMINAL_STATES:
                    return


def add_to(server: grpc.Server) -> list[str]:
    """Add the service to ``server``; the names of what it added (for reflection, health)."""
    jobs_pb2_grpc.add_JobsServicer_to_server(JobsServicer(), server)
    return [SERVICE]
