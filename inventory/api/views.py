"""Inventory API: declarative /api/v1 viewsets and the seed-compatible per-node endpoints."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.db.models import Count, Q, QuerySet
from django_filters.rest_framework import DjangoFilterBackend
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import mixins, permissions, viewsets
from rest_framework.exceptions import NotFound, ValidationError
from rest_framework.pagination import LimitOffsetPagination
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from inventory import live
from inventory.api import serializers as s
from inventory.filters import GpuFilterSet, MigInstanceFilterSet, NodeFilterSet
from inventory.models import Gpu, GpuLink, MigInstance, Node


class IsStaffOrReadOnly(permissions.BasePermission):
    """Any signed-in user reads; only staff write."""

    def has_permission(self, request: Request, view: APIView) -> bool:
        user = request.user
        if not (user and user.is_authenticated):
            return False
        return request.method in permissions.SAFE_METHODS or bool(user.is_staff)


class InventoryPagination(LimitOffsetPagination):
    default_limit = 100
    max_limit = 1000


class CatalogViewSet(
    mixins.ListModelMixin,
    mixins.RetrieveModelMixin,
    mixins.UpdateModelMixin,
    viewsets.GenericViewSet,
):
    """List, retrieve and PATCH (catalog fields only, staff only, audited)."""

    permission_classes = [IsStaffOrReadOnly]
    pagination_class = InventoryPagination
    filter_backends = [DjangoFilterBackend]
    http_method_names = ["get", "patch", "head", "options"]


class NodeViewSet(CatalogViewSet):
    # Meta.ordering does not apply to GROUP BY queries: order explicitly.
    queryset = (
        Node.objects.select_related("pool", "owner")
        .annotate(
            gpu_count=Count("gpus", filter=Q(gpus__missing_since__isnull=True)),
            missing_gpu_count=Count("gpus", filter=Q(gpus__missing_since__isnull=False)),
        )
        .order_by("hostname")
    )
    serializer_class = s.NodeSerializer
    filterset_class = NodeFilterSet
    lookup_field = "hostname"
    lookup_value_regex = r"[^/]+"


class GpuViewSet(CatalogViewSet):
    queryset = (
        Gpu.objects.select_related("node", "pool", "owner")
        .annotate(mig_instance_count=Count("mig_instances"))
        .order_by("node__hostname", "index", "pk")
    )
    serializer_class = s.GpuSerializer
    filterset_class = GpuFilterSet
    lookup_field = "uuid"
    lookup_value_regex = r"[^/]+"


class MigInstanceViewSet(mixins.ListModelMixin, viewsets.GenericViewSet):
    queryset = MigInstance.objects.select_related("gpu__node").order_by(
        "gpu__node__hostname", "gpu__index", "gi_id", "ci_id"
    )
    serializer_class = s.MigInstanceSerializer
    filterset_class = MigInstanceFilterSet
    filter_backends = [DjangoFilterBackend]
    pagination_class = InventoryPagination


# Seed-compatible endpoints: one node, chosen by ?node=<hostname>.

NODE_PARAMETER = OpenApiParameter(
    "node",
    OpenApiTypes.STR,
    description=(
        "Node hostname. Defaults to the only node, else to this host's GPUADMIN_NODE_NAME."
    ),
)
NODE_ERRORS = {400: s.NodeErrorSerializer, 404: s.NodeErrorSerializer}


def resolve_node(request: Request) -> Node:
    """The node named by ``?node=``, or the default one; 404/400 bodies name ``node``."""
    hostname = request.query_params.get("node")
    if hostname is not None:
        node = Node.objects.filter(hostname=hostname).first()
        if node is None:
            raise NotFound({"detail": f"No node with hostname {hostname!r}.", "node": hostname})
        return node
    candidates = list(Node.objects.all()[:2])
    if len(candidates) == 1:
        return candidates[0]
    default = Node.objects.filter(hostname=settings.GPUADMIN_NODE_NAME).first()
    if default is not None:
        return default
    if not candidates:
        raise NotFound(
            {"detail": "No node is registered; pass ?node=<hostname>.", "node": "<hostname>"}
        )
    raise ValidationError(
        {
            "detail": "Several nodes are registered; choose one with ?node=<hostname>.",
            "node": "This parameter is required when several nodes are registered.",
        }
    )


def present_gpus(node: Node) -> QuerySet[Gpu]:
    return node.gpus.present().order_by("index")


def device_row(gpu: Gpu, sample: dict[str, Any] | None, schedulable: bool) -> dict[str, Any]:
    total = gpu.memory_total_mib
    if sample is None:
        return {
            "index": gpu.index,
            "name": gpu.name,
            "total_memory_mb": total,
            "free_memory_mb": None,
            "used_memory_mb": None,
            "utilization_percent": None,
            "temperature_c": None,
            "is_available": False,
            "error_message": gpu.error_message or None,
        }
    used = sample.get("memory_used_mib")
    total = sample.get("memory_total_mib") or total
    return {
        "index": gpu.index,
        "name": gpu.name,
        "total_memory_mb": total,
        "free_memory_mb": None if used is None else max(total - used, 0),
        "used_memory_mb": used,
        "utilization_percent": sample.get("utilization_gpu_pct"),
        "temperature_c": sample.get("temperature_c"),
        "is_available": schedulable and sample.get("processes") == 0,
        "error_message": sample.get("error_message") or gpu.error_message or None,
    }


class DeviceListView(APIView):
    @extend_schema(
        parameters=[NODE_PARAMETER], responses={200: s.DeviceListSerializer, **NODE_ERRORS}
    )
    def get(self, request: Request) -> Response:
        node = resolve_node(request)
        gpus = list(present_gpus(node))
        schedulable = set(Gpu.objects.schedulable().filter(node=node).values_list("pk", flat=True))
        samples = live.latest([node.hostname])[node.hostname]
        devices = [device_row(gpu, samples.get(gpu.uuid), gpu.pk in schedulable) for gpu in gpus]
        return Response({"devices": devices, "count": len(devices)})


class DriverView(APIView):
    @extend_schema(parameters=[NODE_PARAMETER], responses={200: s.DriverSerializer, **NODE_ERRORS})
    def get(self, request: Request) -> Response:
        node = resolve_node(request)
        return Response(
            {
                "driver_version": node.driver_version,
                "cuda_driver_version": node.cuda_driver_version,
                "nvml_version": node.nvml_version,
            }
        )


class MigSummaryView(APIView):
    @extend_schema(
        parameters=[NODE_PARAMETER],
        responses={200: s.MigSummarySerializer(many=True), **NODE_ERRORS},
    )
    def get(self, request: Request) -> Response:
        node = resolve_node(request)
        gpus = (
            present_gpus(node)
            .annotate(
                gi_count=Count("mig_instances__gi_id", distinct=True),
                ci_count=Count("mig_instances"),
            )
            .order_by("index")
        )
        return Response(
            [
                {
                    "index": gpu.index,
                    "uuid": gpu.uuid,
                    "mig_enabled": gpu.mig_enabled,
                    "mig_pending_enabled": gpu.mig_pending_enabled,
                    "gpu_instance_count": gpu.gi_count,
                    "compute_instance_count": gpu.ci_count,
                }
                for gpu in gpus
            ]
        )


class MigInstanceListView(APIView):
    @extend_schema(
        parameters=[NODE_PARAMETER],
        responses={200: s.MigInstanceRowSerializer(many=True), **NODE_ERRORS},
    )
    def get(self, request: Request) -> Response:
        node = resolve_node(request)
        rows = (
            MigInstance.objects.filter(gpu__node=node, gpu__missing_since__isnull=True)
            .select_related("gpu")
            .order_by("gpu__index", "gi_id", "ci_id")
        )
        return Response(
            [
                {
                    "gpu_index": row.gpu.index,
                    "gpu_uuid": row.gpu.uuid,
                    "gi_id": row.gi_id,
                    "ci_id": row.ci_id,
                    "profile_name": row.profile_name,
                    "ci_profile_name": row.ci_profile_name,
                    "placement_start": row.placement_start,
                    "placement_size": row.placement_size,
                    "memory_mib": row.memory_mib,
                    "sm_count": row.sm_count,
                    "uuid": row.uuid,
                }
                for row in rows
            ]
        )


class TopologyView(APIView):
    @extend_schema(
        parameters=[NODE_PARAMETER], responses={200: s.TopologySerializer, **NODE_ERRORS}
    )
    def get(self, request: Request) -> Response:
        node = resolve_node(request)
        gpus = list(present_gpus(node))
        links = {
            frozenset((a, b)): kind
            for a, b, kind in GpuLink.objects.filter(node=node).values_list(
                "gpu_a_id", "gpu_b_id", "link_type"
            )
        }
        matrix = [
            ["X" if a.pk == b.pk else links.get(frozenset((a.pk, b.pk))) for b in gpus]
            for a in gpus
        ]
        return Response(
            {
                "node": node.hostname,
                "gpus": [gpu.index for gpu in gpus],
                "matrix": matrix,
                "numa_nodes": [gpu.numa_node for gpu in gpus],
                "cpu_affinity": [gpu.cpu_affinity for gpu in gpus],
            }
        )
