"""``/api/v1/ray/clusters/`` (registered Ray clusters as their last read found them, for
everyone signed in; admins register them in the admin) and ``/api/v1/ray/jobs/`` (submit,
list, read, logs and cancel of jobs on them, seen as gpuadmin's jobs are: users their own,
viewers, operators and admins all; the entrypoint, environment and logs private as a job's)."""

from __future__ import annotations

from typing import Any

from django.db.models import QuerySet
from django.urls import include, path
from drf_spectacular.utils import extend_schema, inline_serializer
from rest_framework import mixins, serializers, viewsets
from rest_framework.decorators import action
from rest_framework.exceptions import APIException
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.routers import SimpleRouter

from gpuadmin import api
from gpuadmin.access.permissions import (
    CanSubmit,
    IsAdminOrReadOnly,
    check_can_read_private,
    signed_in,
)
from gpuadmin.access.services import can_read_private
from integrations.ray import services
from integrations.ray.jobs_api import RayError
from integrations.ray.models import RayCluster, RayJob


class ClusterUnavailable(APIException):
    """A 503: the Ray cluster did not give the answer asked for (the job itself is stored)."""

    status_code = 503
    default_detail = "The Ray cluster did not answer."
    default_code = "ray_cluster_unavailable"


class RayNodeSerializer(api.Serializer):
    node_id = serializers.CharField()
    address = serializers.CharField()
    name = serializers.CharField()
    is_head = serializers.BooleanField()
    state = serializers.CharField(help_text="Ray's word: ALIVE or DEAD.")
    gpus = serializers.FloatField()
    gpus_in_use = serializers.FloatField()
    cpus = serializers.FloatField()
    cpus_in_use = serializers.FloatField()


class RayClusterSerializer(api.ModelSerializer):
    pool = serializers.CharField(source="pool.name", default=None, read_only=True)
    nodes = RayNodeSerializer(many=True, read_only=True, help_text="As the last read found them.")

    class Meta:
        model = RayCluster
        fields = [
            "id",
            "name",
            "address",
            "pool",
            "state",
            "last_error",
            "ray_version",
            "gpus",
            "gpus_in_use",
            "nodes",
            "last_read_at",
            "last_ok_at",
        ]
        read_only_fields = fields


class RayJobSerializer(api.ModelSerializer):
    """A Ray job. What it keeps private (``entrypoint``, ``runtime_env``) is shown to those
    ``can_read_private`` lets read it, as a gpuadmin job's command and environment: to others
    both are null."""

    owner = serializers.CharField(source="owner.username", read_only=True)
    cluster = serializers.SlugRelatedField(slug_field="name", queryset=RayCluster.objects.all())
    # Both are null in answers to those they are private from, so the schema says nullable;
    # a null entrypoint in a submission is refused by ``services.submit`` as an empty one.
    entrypoint = serializers.CharField(
        allow_null=True,
        help_text="The shell command Ray runs; null when private (GPUADMIN_PRIVATE_DATA).",
    )
    runtime_env = serializers.DictField(
        required=False,
        allow_null=True,
        help_text="Ray's runtime_env (env_vars, pip, working_dir...); null when private, "
        "none when null or left out in a submission.",
    )
    gpus = serializers.FloatField(min_value=0, default=0)
    cpus = serializers.FloatField(min_value=0, default=0)

    class Meta:
        model = RayJob
        fields = [
            "id",
            "owner",
            "cluster",
            "entrypoint",
            "runtime_env",
            "gpus",
            "cpus",
            "submission_id",
            "state",
            "message",
            "created_at",
            "started_at",
            "ended_at",
        ]
        read_only_fields = [
            "id",
            "owner",
            "submission_id",
            "state",
            "message",
            "created_at",
            "started_at",
            "ended_at",
        ]

    def to_representation(self, instance: RayJob) -> dict[str, Any]:
        data: dict[str, Any] = super().to_representation(instance)
        if not can_read_private(self.context["request"].user, instance):
            data["entrypoint"] = data["runtime_env"] = None
        return data


class RayClusterViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, viewsets.GenericViewSet):
    """Registered Ray clusters, their nodes and GPUs (total and in use) as the last read found
    them (``state``: ``new``, ``ok``, ``unreachable``, ``refused``, with ``last_error``)."""

    queryset = RayCluster.objects.select_related("pool")
    serializer_class = RayClusterSerializer
    permission_classes = [IsAdminOrReadOnly]
    pagination_class = api.Pagination


class RayJobViewSet(
    mixins.CreateModelMixin,
    mixins.ListModelMixin,
    mixins.RetrieveModelMixin,
    viewsets.GenericViewSet,
):
    """Jobs submitted to Ray clusters through gpuadmin. ``state`` uses gpuadmin's words:
    ``pending`` (stored, not yet acknowledged by Ray), ``queued`` (Ray's PENDING; ``message``
    says why it waits), ``running``, ``completed``, ``failed``, ``canceled``."""

    queryset = RayJob.objects.all()  # the schema's; a request gets ``get_queryset``'s
    serializer_class = RayJobSerializer
    permission_classes = [CanSubmit]
    pagination_class = api.Pagination

    def get_queryset(self) -> QuerySet[RayJob]:
        return services.visible_jobs(signed_in(self.request))

    def perform_create(self, serializer: serializers.BaseSerializer[Any]) -> None:
        data = serializer.validated_data
        serializer.instance = services.submit(
            owner=signed_in(self.request),
            cluster=data["cluster"],
            entrypoint=data["entrypoint"] or "",
            runtime_env=data.get("runtime_env") or {},
            gpus=data["gpus"],
            cpus=data["cpus"],
        )

    @extend_schema(
        request=None,
        responses=inline_serializer("RayJobLogs", {"logs": serializers.CharField()}),
    )
    @action(detail=True, methods=["get"])
    def logs(self, request: Request, pk: str | None = None) -> Response:
        """The job's output as Ray keeps it (403 to those it is private from, 503 when the
        cluster does not answer)."""
        job = self.get_object()
        check_can_read_private(request, job, f"log of Ray job {job.pk}")
        try:
            return Response({"logs": services.logs(job)})
        except RayError as exc:
            raise ClusterUnavailable(str(exc)) from None

    @extend_schema(request=None, responses=RayJobSerializer)
    @action(detail=True, methods=["post"])
    def cancel(self, request: Request, pk: str | None = None) -> Response:
        """Ask Ray to stop the job (its owner, operators and admins; 409 once it has ended)."""
        job = self.get_object()
        try:
            services.cancel(actor=signed_in(request), job=job)
        except services.RayJobConflict as exc:
            raise api.Conflict(str(exc)) from None
        except RayError as exc:
            raise ClusterUnavailable(str(exc)) from None
        return Response(self.get_serializer(job).data)


router = SimpleRouter()
router.register("clusters", RayClusterViewSet, basename="cluster")
router.register("jobs", RayJobViewSet, basename="job")

urlpatterns = [
    path("api/v1/ray/", include((router.urls, "ray-api-v1"), namespace="ray-api-v1")),
]
