"""``/api/v1/slurm/clusters/``, ``/api/v1/slurm/nodes/`` and ``/api/v1/slurm/jobs/``: the
Slurm mirror, read-only, for everyone signed in. Clusters are registered in the admin; their
token is never sent back."""

from __future__ import annotations

from django.urls import include, path
from django_filters.rest_framework import DjangoFilterBackend
from rest_framework import mixins, serializers, viewsets
from rest_framework.routers import SimpleRouter

from gpuadmin import api
from gpuadmin.access.permissions import IsAdminOrReadOnly
from integrations.slurm.filters import SlurmClusterFilterSet, SlurmJobFilterSet, SlurmNodeFilterSet
from integrations.slurm.models import SlurmCluster, SlurmJob, SlurmJobGpu, SlurmNode


class SlurmClusterSerializer(api.ModelSerializer):
    address = serializers.CharField(read_only=True, help_text="Its URL, or unix:<socket path>.")

    class Meta:
        model = SlurmCluster
        fields = [
            "id",
            "name",
            "address",
            "auth",
            "user_name",
            "poll_interval_s",
            "drain_fenced",
            "state",
            "last_error",
            "api_version",
            "last_polled_at",
            "last_ok_at",
        ]
        read_only_fields = fields


class SlurmNodeSerializer(api.ModelSerializer):
    cluster = serializers.CharField(source="cluster.name", read_only=True)
    node = serializers.CharField(
        source="node.hostname",
        default=None,
        read_only=True,
        help_text="The catalogued node of that hostname (null: not in the catalog).",
    )

    class Meta:
        model = SlurmNode
        fields = [
            "id",
            "cluster",
            "name",
            "node",
            "states",
            "reason",
            "reason_set_by",
            "reason_changed_at",
            "state_changed_at",
            "partitions",
            "cpus",
            "alloc_cpus",
            "real_memory_mib",
            "alloc_memory_mib",
            "gpus",
            "gpus_used",
            "last_seen_at",
        ]
        read_only_fields = fields


class SlurmJobGpuSerializer(api.ModelSerializer):
    gpu = serializers.CharField(
        source="gpu.uuid",
        default=None,
        read_only=True,
        help_text="The catalogued GPU's UUID (null: no GPU of that minor number on that node).",
    )
    index = serializers.IntegerField(
        source="gpu.index", default=None, read_only=True, help_text="Its NVML index."
    )

    class Meta:
        model = SlurmJobGpu
        fields = ["node_name", "minor_number", "gpu", "index"]
        read_only_fields = fields


class SlurmJobSerializer(api.ModelSerializer):
    cluster = serializers.CharField(source="cluster.name", read_only=True)
    gpus = SlurmJobGpuSerializer(
        many=True, read_only=True, help_text="Slurm's GPU indexes (minor numbers) on the catalog."
    )

    class Meta:
        model = SlurmJob
        fields = [
            "id",
            "cluster",
            "job_id",
            "array_job_id",
            "array_task_id",
            "name",
            "user",
            "account",
            "state",
            "state_flags",
            "reason",
            "partition",
            "nodes",
            "gpus",
            "gpus_requested",
            "cpus",
            "submit_time",
            "start_time",
            "end_time",
            "time_limit_min",
            "last_seen_at",
        ]
        read_only_fields = fields


class ReadOnlyList(mixins.ListModelMixin, viewsets.GenericViewSet):
    # Reads for everyone signed in; nothing here writes (IsAdminOrReadOnly refuses the rest).
    permission_classes = [IsAdminOrReadOnly]
    pagination_class = api.Pagination
    filter_backends = [DjangoFilterBackend]


class SlurmClusterViewSet(ReadOnlyList):
    """Registered Slurm clusters and how their last poll went (``state``: ``new``, ``ok``,
    ``unreachable``, ``refused``, with ``last_error``)."""

    queryset = SlurmCluster.objects.all()
    serializer_class = SlurmClusterSerializer
    filterset_class = SlurmClusterFilterSet


class SlurmNodeViewSet(ReadOnlyList):
    """Slurm's nodes as the last poll read them, each with its catalogued node."""

    queryset = SlurmNode.objects.select_related("cluster", "node")
    serializer_class = SlurmNodeSerializer
    filterset_class = SlurmNodeFilterSet


class SlurmJobViewSet(ReadOnlyList):
    """The jobs in Slurm's queue at the last poll, each with its GPUs on the catalog."""

    queryset = SlurmJob.objects.select_related("cluster").prefetch_related("gpus__gpu")
    serializer_class = SlurmJobSerializer
    filterset_class = SlurmJobFilterSet


router = SimpleRouter()
router.register("clusters", SlurmClusterViewSet, basename="cluster")
router.register("nodes", SlurmNodeViewSet, basename="node")
router.register("jobs", SlurmJobViewSet, basename="job")

urlpatterns = [
    path("api/v1/slurm/", include((router.urls, "slurm-api-v1"), namespace="slurm-api-v1")),
]
