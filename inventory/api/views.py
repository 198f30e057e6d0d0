"""Inventory API: declarative /api/v1 viewsets and the seed-compatible per-node endpoints."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.db.models import Count, Prefetch, Q, QuerySet
from django_filters.rest_framework import DjangoFilterBackend
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema
from rest_framework import generics, mixins, viewsets
from rest_framework.decorators import action
from rest_framework.exceptions import NotFound, ValidationError
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from gpuadmin.access.permissions import (
    IsAdminOrReadOnly,
    IsAdminRole,
    IsOperatorOrReadOnly,
    signed_in,
)
from gpuadmin.api import Conflict, ErrorSerializer, Pagination, ValidationErrorSerializer
from inventory import live, services
from inventory.api import serializers as s
from inventory.filters import GpuFilterSet, MigInstanceFilterSet, NodeFilterSet
from inventory.models import Gpu, MigInstance, Node
from inventory.pages import fleet, topology


class CatalogViewSet(
    mixins.ListModelMixin,
    mixins.RetrieveModelMixin,
    mixins.UpdateModelMixin,
    viewsets.GenericViewSet,
):
    """List, retrieve and PATCH (catalog fields only, admins only, audited)."""

    permission_classes = [IsAdminOrReadOnly]
    pagination_class = Pagination
    filter_backends = [DjangoFilterBackend]
    http_method_names = ["get", "patch", "post", "head", "options"]  # POST: ``state`` only


STATE_ERRORS = {
    409: OpenApiResponse(
        ErrorSerializer, "The state machine refuses the change now (the message names states)."
    )
}


def apply_state_change(
    request: Request, row: Gpu | Node, serializer_class: type[s.StateChangeSerializer]
) -> services.StateChange:
    """Validate ``{state, reason, force}`` (400 naming the field) and apply it as the
    requester, audited; 409 when the state machine refuses, or offline without force while
    jobs run there."""
    change = serializer_class(data=request.data)
    change.is_valid(raise_exception=True)
    data = change.validated_data
    try:
        return services.change_state(
            row, data["state"], actor=signed_in(request), reason=data["reason"], force=data["force"]
        )
    except services.IllegalGpuTransition as exc:
        raise Conflict(str(exc)) from None


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

    @extend_schema(responses={200: s.TopologySerializer})
    @action(detail=True, methods=["get"], filter_backends=[], pagination_class=None)
    def topology(self, request: Request, hostname: str) -> Response:
        """The node's ``nvidia-smi topo -m`` matrix with NUMA and CPU affinity."""
        return Response(s.TopologySerializer(topology.topology_matrix(self.get_object())).data)

    @extend_schema(
        request=s.NodeStateChangeSerializer,
        responses={200: s.NodeStateResultSerializer, **STATE_ERRORS},
    )
    @action(
        detail=True,
        methods=["post"],
        url_path="state",
        permission_classes=[IsOperatorOrReadOnly],
        filter_backends=[],
        pagination_class=None,
    )
    def change_state(self, request: Request, hostname: str) -> Response:
        """Maintenance (operators and admins): drain the node, take it offline (with force,
        the jobs on its GPUs are requeued; without, refused while any runs) or bring it
        online, with a reason (audited)."""
        node = self.get_object()
        change = apply_state_change(request, node, s.NodeStateChangeSerializer)
        context = {"request": request, "change": change}
        return Response(s.NodeStateResultSerializer(node, context=context).data)


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

    @extend_schema(
        request=s.GpuStateChangeSerializer,
        responses={200: s.GpuStateResultSerializer, **STATE_ERRORS},
    )
    @action(
        detail=True,
        methods=["post"],
        url_path="state",
        permission_classes=[IsOperatorOrReadOnly],
        filter_backends=[],
        pagination_class=None,
    )
    def change_state(self, request: Request, uuid: str) -> Response:
        """Maintenance (operators and admins): drain the GPU (running work finishes), take it
        offline (with force, its jobs are requeued; without, refused while any runs) or bring
        it online, with a reason (audited). A change the GPU state machine refuses (e.g. while
        a reset runs) is a 409 naming the states; an admin's change of a quarantined GPU
        releases its quarantine."""
        gpu = self.get_object()
        change = apply_state_change(request, gpu, s.GpuStateChangeSerializer)
        context = {"request": request, "change": change, "live_rows": fleet.gpu_rows([gpu])}
        return Response(s.GpuStateResultSerializer(gpu, context=context).data)

    def _with_live(self, gpus: list[Gpu]) -> dict[str, Any]:
        """The serializer's context with the fleet page's rows of ``gpus`` (their ``live``)."""
        return {**self.get_serializer_context(), "live_rows": fleet.gpu_rows(gpus)}

    def list(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        """GPUs with their catalog facts and ``live``: each as the fleet page shows it now."""
        page = self.paginate_queryset(self.filter_queryset(self.get_queryset()))
        assert page is not None  # always paginated
        serializer = self.get_serializer(page, many=True, context=self._with_live(page))
        return self.get_paginated_response(serializer.data)

    def retrieve(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        gpu = self.get_object()
        return Response(self.get_serializer(gpu, context=self._with_live([gpu])).data)


class FleetStatusView(generics.GenericAPIView):
    queryset = Gpu.objects.all()
    filter_backends = [DjangoFilterBackend]
    filterset_class = GpuFilterSet
    pagination_class = None

    @extend_schema(responses={200: s.FleetStatusSerializer})
    def get(self, request: Request) -> Response:
        """The fleet page's node cards and summary bar: each node's GPUs counted by status
        (free, busy, draining, MIG, MPS, degraded...) and the totals, as the page counts them;
        the GPU list's filters (``?node=``, ``?model=``, ``?pool=``...) apply (only the nodes
        keeping a GPU are listed then)."""
        gpus = self.filter_queryset(self.get_queryset())
        filtered = GpuFilterSet(request.query_params).active
        cards, summary = fleet.fleet_view(gpus, filtered=filtered)
        body = {"statuses": s.STATUS_CHOICES, "nodes": cards, "total": summary}
        return Response(s.FleetStatusSerializer(body).data)


class MigInstanceViewSet(mixins.ListModelMixin, viewsets.GenericViewSet):
    queryset = MigInstance.objects.select_related("gpu__node").order_by(
        "gpu__node__hostname", "gpu__index", "gi_id", "ci_id"
    )
    serializer_class = s.MigInstanceSerializer
    filterset_class = MigInstanceFilterSet
    filter_backends = [DjangoFilterBackend]
    pagination_class = Pagination


# Seed-compatible endpoints: one node, chosen by ?node=<hostname>.

NODE_PARAMETER = OpenApiParameter(
    "node",
    OpenApiTypes.STR,
    description=(
        "Node hostname. Defaults to the only node, else to this host's GPUADMIN_NODE_NAME."
    ),
)
NODE_ERRORS = {404: OpenApiResponse(ValidationErrorSerializer, "No such node, named under `node`.")}


def resolve_node(request: Request) -> Node:
    """The node named by ``?node=``, or the default one; 404/400 bodies name ``node``."""
    hostname = request.query_params.get("node")
    if hostname is not None:
        node = Node.objects.filter(hostname=hostname).first()
        if node is None:
            raise NotFound(
                {"detail": f"No node with hostname {hostname!r}.", "node": ["No such node."]}
            )
        return node
    candidates = list(Node.objects.all()[:2])
    if len(candidates) == 1:
        return candidates[0]
    default = Node.objects.filter(hostname=settings.GPUADMIN_NODE_NAME).first()
    if default is not None:
        return default
    if not candidates:
        raise NotFound(
            {
                "detail": "No node is registered; pass ?node=<hostname>.",
                "node": ["No node is registered."],
            }
        )
    raise ValidationError(
        {
            "detail": "Several nodes are registered; choose one with ?node=<hostname>.",
            "node": ["This parameter is required when several nodes are registered."],
        }
    )


def present_gpus(node: Node) -> QuerySet[Gpu]:
    return node.gpus.present().order_by("index")


class DeviceListView(APIView):
    @extend_schema(
        parameters=[NODE_PARAMETER], responses={200: s.DeviceListSerializer, **NODE_ERRORS}
    )
    def get(self, request: Request) -> Response:
        node = resolve_node(request)
        gpus = Prefetch("gpus", queryset=present_gpus(node))
        # django-stubs refuses a Prefetch on an as_manager() manager (django-stubs PR #3263).
        node = Node.objects.prefetch_related(gpus).get(pk=node.pk)  # type: ignore[arg-type]
        [rows], _ = fleet.fleet_rows([node], live.latest([node.hostname]))
        body = {"devices": rows.gpus, "count": len(rows.gpus)}
        return Response(s.DeviceListSerializer(body).data)


class DriverView(APIView):
    @extend_schema(parameters=[NODE_PARAMETER], responses={200: s.DriverSerializer, **NODE_ERRORS})
    def get(self, request: Request) -> Response:
        return Response(s.DriverSerializer(resolve_node(request)).data)


class MigSummaryView(APIView):
    @extend_schema(
        parameters=[NODE_PARAMETER],
        responses={200: s.MigSummarySerializer(many=True), **NODE_ERRORS},
    )
    def get(self, request: Request) -> Response:
        gpus = present_gpus(resolve_node(request)).annotate(
            gi_count=Count("mig_instances__gi_id", distinct=True),
            ci_count=Count("mig_instances"),
        )
        return Response(s.MigSummarySerializer(gpus, many=True).data)


class MigInstanceListView(APIView):
    @extend_schema(
        parameters=[NODE_PARAMETER],
        responses={200: s.MigInstanceRowSerializer(many=True), **NODE_ERRORS},
    )
    def get(self, request: Request) -> Response:
        rows = (
            MigInstance.objects.filter(
                gpu__node=resolve_node(request), gpu__missing_since__isnull=True
            )
            .select_related("gpu")
            .order_by("gpu__index", "gi_id", "ci_id")
        )
        return Response(s.MigInstanceRowSerializer(rows, many=True).data)


class TopologyView(APIView):
    @extend_schema(
        parameters=[NODE_PARAMETER], responses={200: s.TopologySerializer, **NODE_ERRORS}
    )
    def get(self, request: Request) -> Response:
        return Response(s.TopologySerializer(topology.topology_matrix(resolve_node(request))).data)


class DiscoverView(APIView):
    """Scan the node now through its agent and sync the catalog (admins only)."""

    permission_classes = [IsAdminRole]

    @extend_schema(
        parameters=[NODE_PARAMETER],
        responses={200: s.DiscoverSerializer, 503: s.DiscoverSerializer, **NODE_ERRORS},
    )
    def get(self, request: Request) -> Response:
        node = resolve_node(request)
        try:
            result = services.discover_node(node, actor_name=signed_in(request).get_username())
        except services.DiscoveryFailed as exc:
            body = {"data": [], "meta": {"code": 503, "message": f"GPU discovery failed: {exc}"}}
            return Response(body, status=503)
        data = s.DiscoveredGpuSerializer(
            result.gpus, many=True, context={"driver_version": result.system.driver_version}
        ).data
        meta = {"code": 200, "message": "GPU discovery successful"}
        return Response({"data": data, "meta": meta})
