"""Scheduling API: the seed-compatible queue, cluster and orchestrator endpoints, and the
/api/v1 jobs, allocations and tokens. Views check who may act and turn the domain's refusals
into 4xx answers; the job services, ``manual``, ``switch`` and ``queries`` do the work."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import replace
from typing import Any

from django.db.models import QuerySet
from django.http import Http404
from django.utils.text import capfirst
from django_filters.rest_framework import DjangoFilterBackend
from drf_spectacular.utils import (
    OpenApiParameter,
    OpenApiResponse,
    PolymorphicProxySerializer,
    extend_schema,
)
from rest_framework import mixins, status, viewsets
from rest_framework.decorators import action
from rest_framework.exceptions import APIException, NotFound, PermissionDenied
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.serializers import Serializer
from rest_framework.throttling import BaseThrottle
from rest_framework.views import APIView

from gpuadmin.access.models import ApiToken
from gpuadmin.access.permissions import (
    CanSubmit,
    IsAdminOrReadOnly,
    IsOperatorOrReadOnly,
    check_can_read_private,
    signed_in,
)
from gpuadmin.access.services import can_act_on, create_token, revoke_token, role_of
from gpuadmin.api import (
    IDEMPOTENCY_KEY,
    MINIMAL_APPLIED,
    Conflict,
    ErrorSerializer,
    Pagination,
    idempotency_key,
    prefers_minimal,
)
from gpuadmin.throttling import SubmitThrottle, TokenThrottle
from scheduling import filters
from scheduling.allocations import manual
from scheduling.allocations import services as allocation_services
from scheduling.jobs import control, queries, submission, transitions
from scheduling.jobs.api import serializers as s
from scheduling.loop import switch
from scheduling.models import HOLDING_STATES, Allocation, Job

# --------------------------------------------------------------------------- plumbing


class Unavailable(APIException):
    status_code = status.HTTP_503_SERVICE_UNAVAILABLE
    default_detail = "The node's agent cannot be asked now."
    default_code = "unavailable"


@contextmanager
def domain_errors() -> Iterator[None]:
    """The domain's refusals as API errors: a 409 for a state that does not allow it, a 404
    for a log that does not exist, a 503 for a silent agent (bad input, a ``FieldRefusal``, is
    the API's 400 naming the field)."""
    try:
        yield
    except (transitions.IllegalTransition, allocation_services.AllocationRefused) as exc:
        raise Conflict(str(exc)) from None
    except queries.NoLog as exc:
        raise NotFound(str(exc)) from None
    except queries.LogUnavailable as exc:
        raise Unavailable(str(exc)) from None


def valid(serializer_class: type[Serializer], data: Any) -> dict[str, Any]:
    serializer = serializer_class(data=data)
    serializer.is_valid(raise_exception=True)
    return serializer.validated_data


def visible_job(request: Request, job_id: int) -> Job:
    """A job the requester sees, with its details; 404 otherwise (users see only theirs)."""
    job = queries.with_details(queries.visible_jobs(signed_in(request))).filter(pk=job_id).first()
    if job is None:
        raise no_job(request, job_id)
    return job


def no_job(request: Request, job_id: int | str) -> NotFound:
    """The 404 of a job the requester does not see (``queries.no_job_text``)."""
    return NotFound(capfirst(queries.no_job_text(request.user, job_id)) + ".")


def check_can_act(request: Request, job: Job) -> None:
    if not can_act_on(request.user, job):
        raise PermissionDenied(f"A {role_of(request.user)} cannot act on job {job.pk}.")


def job_body(request: Request, job: Job) -> dict[str, Any]:
    return s.JobSerializer(job, context={"request": request}).data


def cancel(request: Request, job: Job, *, kill: bool = False) -> Response:
    """Cancel ``job`` (``kill``: SIGKILL at once, no grace): 200 when it ended, 202 while its
    agent stops its processes."""
    check_can_act(request, job)
    with domain_errors():
        control.cancel_job(job, actor=signed_in(request), kill=kill)
    job = visible_job(request, job.pk)
    canceling = job.state in HOLDING_STATES
    body = s.CanceledSerializer(
        {"canceling": canceling, "job": job}, context={"request": request}
    ).data
    return Response(body, status=status.HTTP_202_ACCEPTED if canceling else status.HTTP_200_OK)


JOB_ERRORS = {
    403: OpenApiResponse(ErrorSerializer, "Not allowed to act on this job."),
    404: OpenApiResponse(ErrorSerializer, "No such job (users see only their own)."),
    409: OpenApiResponse(ErrorSerializer, "Its state does not allow it."),
}
THROTTLED = {
    429: OpenApiResponse(ErrorSerializer, "Over the per-user rate limit; see Retry-After."),
}
SUBMITTED = PolymorphicProxySerializer(
    component_name="Submitted",
    serializers=[s.JobSerializer, s.SubmittedArraySerializer, s.SubmittedJobSerializer],
    resource_type_field_name=None,
    many=False,
)
PREFER = OpenApiParameter(
    "Prefer",
    str,
    OpenApiParameter.HEADER,
    description="return=minimal (RFC 7240): a job is answered with its id, state and "
    "submitted_at only (and Preference-Applied: return=minimal).",
)
CANCELED = {
    200: OpenApiResponse(s.CanceledSerializer, "Canceled."),
    202: OpenApiResponse(s.CanceledSerializer, "The agent is stopping its processes."),
}


IDEMPOTENT = OpenApiParameter(
    IDEMPOTENCY_KEY,
    str,
    OpenApiParameter.HEADER,
    description="A key of the client's (a UUID; at most "
    f"{submission.IDEMPOTENCY_KEY_CHARS} characters), sent again with a resend of the same "
    "submission: the first request with a key stores the job (201), a later one with the "
    "same key by the same user answers 200 with that job, whatever its body asks, and stores "
    "nothing (draft-ietf-httpapi-idempotency-key-header). Not with an array.",
)
RESENT = {
    200: OpenApiResponse(
        PolymorphicProxySerializer(
            component_name="Resent",
            serializers=[s.JobSerializer, s.SubmittedJobSerializer],
            resource_type_field_name=None,
            many=False,
        ),
        "A resend: the job its Idempotency-Key stored (its id, state and time only with "
        "Prefer: return=minimal).",
    )
}


def submit(request: Request) -> Response:
    """Submit what the body asks for: 201 with the job (with ``Prefer: return=minimal``, its
    id, state and time only) or the job array; 200 with the job that an ``Idempotency-Key``
    already stored (``submission.submit_once``)."""
    minimal = prefers_minimal(request)
    context = {"request": request, "minimal": minimal, "idempotency_key": idempotency_key(request)}
    serializer = s.JobSubmitSerializer(data=request.data, context=context)
    serializer.is_valid(raise_exception=True)
    job = serializer.save()
    applied = minimal and isinstance(job, Job)  # an array's answer is the same either way
    headers = MINIMAL_APPLIED if applied else None
    answer = status.HTTP_201_CREATED if serializer.created else status.HTTP_200_OK
    return Response(serializer.data, status=answer, headers=headers)


# --------------------------------------------------------------------------- /api/v1


class JobViewSet(
    mixins.ListModelMixin,
    mixins.RetrieveModelMixin,
    mixins.CreateModelMixin,
    viewsets.GenericViewSet,
):
    """Jobs: users see their own, viewers, operators and admins everyone's."""

    permission_classes = [CanSubmit]
    pagination_class = Pagination
    filter_backends = [DjangoFilterBackend]
    filterset_class = filters.JobFilterSet

    def get_queryset(self) -> QuerySet[Job]:
        return queries.with_details(queries.visible_jobs(self.request.user))

    def get_object(self) -> Job:
        """The job of the URL; a 404 that says why when the requester does not see it."""
        try:
            return super().get_object()
        except Http404:
            raise no_job(self.request, self.kwargs["pk"]) from None

    def get_serializer_class(self) -> type[Serializer]:
        if self.action == "create":
            return s.JobSubmitSerializer
        return s.JobDetailSerializer if self.action == "retrieve" else s.JobSerializer

    def get_throttles(self) -> list[BaseThrottle]:
        return [SubmitThrottle()] if self.action == "create" else []

    @extend_schema(parameters=[s.JobListParamsSerializer])
    def list(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        """Jobs, newest first; with ``collapse_arrays`` one row per job array and state."""
        if not valid(s.JobListParamsSerializer, request.query_params)["collapse_arrays"]:
            return super().list(request, *args, **kwargs)
        jobs = self.filter_queryset(self.get_queryset())
        page = self.paginate_queryset(queries.collapsed_arrays(jobs)) or []
        context = {
            **self.get_serializer_context(),
            "array_tasks": queries.array_tasks_of(jobs, page),
        }
        return self.get_paginated_response(s.JobSerializer(page, many=True, context=context).data)

    @extend_schema(
        request=s.JobSubmitSerializer,
        parameters=[PREFER, IDEMPOTENT],
        responses={201: SUBMITTED, **RESENT, **THROTTLED},
    )
    def create(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        """Submit a job, or a job array with ``array`` (same body as ``POST /queue/submit``)."""
        return submit(request)

    @extend_schema(request=None, responses={**CANCELED, **JOB_ERRORS})
    @action(detail=True, methods=["post"])
    def cancel(self, request: Request, pk: str) -> Response:
        return cancel(request, self.get_object())

    @extend_schema(request=None, responses={**CANCELED, **JOB_ERRORS})
    @action(detail=True, methods=["post"])
    def kill(self, request: Request, pk: str) -> Response:
        """Cancel the job with SIGKILL at once, no grace (a cancel under way is cut short):
        the seed's force kill, for a job that ignores SIGTERM."""
        return cancel(request, self.get_object(), kill=True)

    @extend_schema(request=None, responses={200: s.JobSerializer, **JOB_ERRORS})
    @action(detail=True, methods=["post"])
    def release(self, request: Request, pk: str) -> Response:
        """Release a held (pending) job into the queue."""
        return self._move(request, control.release_job)

    @extend_schema(request=None, responses={200: s.JobSerializer, **JOB_ERRORS})
    @action(detail=True, methods=["post"])
    def hold(self, request: Request, pk: str) -> Response:
        """Hold a queued job (pending: never placed until it is released)."""
        return self._move(request, control.hold_job)

    def _move(self, request: Request, move: Callable[..., Job]) -> Response:
        """The URL's job moved by ``move`` (``control.release_job``, ``hold_job``) for the
        requester, who must be allowed to act on it; answered with the job."""
        job = self.get_object()
        check_can_act(request, job)
        with domain_errors():
            move(job, actor=signed_in(request))
        return Response(job_body(request, visible_job(request, job.pk)))

    @extend_schema(
        parameters=[s.LogParamsSerializer],
        responses={
            200: s.JobLogSerializer,
            403: OpenApiResponse(ErrorSerializer, "The log is private to the job's owner."),
            404: OpenApiResponse(ErrorSerializer, "No such job, or it never ran."),
            503: OpenApiResponse(ErrorSerializer, "The node's agent did not answer."),
        },
    )
    @action(detail=True, methods=["get"], filter_backends=[], pagination_class=None)
    def log(self, request: Request, pk: str) -> Response:
        """The last ``tail`` lines of the job's latest attempt, read through its node's agent."""
        job = self.get_object()
        check_can_read_private(request, job, f"log of job {job.pk}")
        params = valid(s.LogParamsSerializer, request.query_params)
        with domain_errors():
            log = queries.job_log(job, lines=params["tail"], hostname=params.get("node"))
        return Response(s.JobLogSerializer(log).data)


class AllocationViewSet(viewsets.ReadOnlyModelViewSet):
    """GPU allocations of the jobs the requester sees."""

    serializer_class = s.AllocationSerializer
    pagination_class = Pagination
    filter_backends = [DjangoFilterBackend]
    filterset_class = filters.AllocationFilterSet

    def get_queryset(self) -> QuerySet[Allocation]:
        return (
            queries.visible_allocations(self.request.user)
            .select_related("gpu", "node")
            .order_by("-pk")
        )


class TokenViewSet(
    mixins.ListModelMixin,
    mixins.CreateModelMixin,
    mixins.DestroyModelMixin,
    viewsets.GenericViewSet,
):
    """The requester's own API tokens; the key is shown once, when it is created."""

    serializer_class = s.TokenSerializer
    pagination_class = Pagination

    def get_queryset(self) -> QuerySet[ApiToken]:
        return queries.own_tokens(self.request.user)

    def get_throttles(self) -> list[BaseThrottle]:
        return [TokenThrottle()] if self.action == "create" else []

    @extend_schema(request=s.TokenSerializer, responses={201: s.NewTokenSerializer, **THROTTLED})
    def create(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        name = valid(s.TokenSerializer, request.data)["name"]
        token, key = create_token(signed_in(request), name)
        data = {**s.TokenSerializer(token).data, "key": key}  # NewTokenSerializer's shape
        return Response(data, status=status.HTTP_201_CREATED)

    @extend_schema(responses={204: None})
    def destroy(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        """Revoke the token (it stays listed, with ``revoked_at``)."""
        revoke_token(self.get_object(), actor=signed_in(request))
        return Response(status=status.HTTP_204_NO_CONTENT)


# --------------------------------------------------------------------------- seed: /queue


class QueueView(APIView):
    """Waiting jobs in queue order (with why each waits), then the jobs holding GPUs."""

    @extend_schema(parameters=[s.QueueParamsSerializer], responses={200: s.QueueSerializer})
    def get(self, request: Request) -> Response:
        limit = valid(s.QueueParamsSerializer, request.query_params)["limit"]
        jobs = queries.visible_jobs(signed_in(request))
        waiting, running = queries.waiting(jobs), queries.holding(jobs)
        body = {
            "waiting": queries.with_details(waiting)[:limit],
            "waiting_count": waiting.count(),
            "running": queries.with_details(running)[:limit],
            "running_count": running.count(),
        }
        return Response(s.QueueSerializer(body, context={"request": request}).data)


class SubmitView(APIView):
    permission_classes = [CanSubmit]
    throttle_classes = [SubmitThrottle]

    @extend_schema(
        request=s.JobSubmitSerializer,
        parameters=[PREFER, IDEMPOTENT],
        responses={
            201: SUBMITTED,
            **RESENT,
            403: OpenApiResponse(ErrorSerializer, "Viewers."),
            **THROTTLED,
        },
    )
    def post(self, request: Request) -> Response:
        """Submit a job (a job array with ``array``): impossible requests are a 400 naming the
        field."""
        return submit(request)


class QueueJobView(APIView):
    permission_classes = [CanSubmit]

    @extend_schema(request=None, responses={**CANCELED, **JOB_ERRORS})
    def delete(self, request: Request, job_id: int) -> Response:
        """Cancel the job."""
        return cancel(request, visible_job(request, job_id))


class PriorityView(APIView):
    permission_classes = [CanSubmit]

    @extend_schema(
        request=s.PrioritySerializer,
        responses={200: s.JobSerializer, **JOB_ERRORS},
    )
    def patch(self, request: Request, job_id: int) -> Response:
        """Change a waiting job's priority."""
        priority = valid(s.PrioritySerializer, request.data)["priority"]
        job = visible_job(request, job_id)
        check_can_act(request, job)
        with domain_errors():
            control.set_priority(job, priority, actor=signed_in(request))
        return Response(job_body(request, job))


class QueueStatisticsView(APIView):
    @extend_schema(responses={200: s.QueueStatisticsSerializer})
    def get(self, request: Request) -> Response:
        return Response(s.QueueStatisticsSerializer(queries.queue_statistics()).data)


# --------------------------------------------------------------------------- seed: /cluster


class GpuStatusView(APIView):
    @extend_schema(
        parameters=[s.GpuStatusParamsSerializer], responses={200: s.GpuStatusListSerializer}
    )
    def get(self, request: Request) -> Response:
        """Every present GPU: schedulable or not, free or allocated (to which job)."""
        hostname = valid(s.GpuStatusParamsSerializer, request.query_params).get("node")
        rows = queries.gpu_status(hostname)
        body = {
            "gpus": rows,
            "count": len(rows),
            "free": sum(row.free for row in rows),
            "allocated": sum(row.in_use for row in rows),
        }
        return Response(s.GpuStatusListSerializer(body).data)


class GpuAllocateView(APIView):
    permission_classes = [IsOperatorOrReadOnly]

    @extend_schema(
        request=s.GpuAllocateSerializer,
        responses={
            201: s.JobSerializer,
            404: OpenApiResponse(ErrorSerializer, "No such job."),
            409: OpenApiResponse(
                ErrorSerializer, "Not queued, or the GPU, MIG device or MPS capacity is taken."
            ),
        },
    )
    def post(self, request: Request) -> Response:
        """Give GPUs, a MIG device or an MPS share to a queued job by hand (operators), as the
        loop would; it is sent to its nodes. What does not fit its request is a 400 naming
        ``gpu_uuids``."""
        data = valid(s.GpuAllocateSerializer, request.data)
        job = visible_job(request, data["job_id"])
        with domain_errors():
            manual.allocate_by_hand(job, data["gpu_uuids"], actor=signed_in(request))
        job = visible_job(request, job.pk)
        return Response(job_body(request, job), status=status.HTTP_201_CREATED)


class GpuReleaseView(APIView):
    permission_classes = [IsOperatorOrReadOnly]

    @extend_schema(
        request=s.GpuReleaseSerializer,
        responses={
            200: OpenApiResponse(s.ReleaseSerializer, "Released."),
            202: OpenApiResponse(s.ReleaseSerializer, "Released once the agent stops the job."),
            404: OpenApiResponse(ErrorSerializer, "No such job."),
            409: OpenApiResponse(ErrorSerializer, "The job holds no GPUs."),
        },
    )
    def post(self, request: Request) -> Response:
        """Take a job's GPUs back (operators): the job is canceled."""
        job = visible_job(request, valid(s.GpuReleaseSerializer, request.data)["job_id"])
        with domain_errors():
            release = manual.release_by_hand(job, actor=signed_in(request))
        release = replace(release, job=visible_job(request, job.pk))
        body = s.ReleaseSerializer(release, context={"request": request}).data
        code = status.HTTP_202_ACCEPTED if release.releasing else status.HTTP_200_OK
        return Response(body, status=code)


# --------------------------------------------------------------------------- seed: /orchestrator


class OrchestratorStatusView(APIView):
    @extend_schema(responses={200: s.OrchestratorStatusSerializer})
    def get(self, request: Request) -> Response:
        return Response(s.OrchestratorStatusSerializer(queries.orchestrator_status()).data)


class OrchestratorSwitchView(APIView):
    """``POST /orchestrator/start`` and ``/stop`` (admins; audited)."""

    permission_classes = [IsAdminOrReadOnly]
    enable = True

    @extend_schema(request=None, responses={200: s.OrchestratorStatusSerializer})
    def post(self, request: Request) -> Response:
        switch.set_scheduler_enabled(self.enable, actor=signed_in(request))
        return Response(s.OrchestratorStatusSerializer(queries.orchestrator_status()).data)
