"""MIG re-layouts in the API: what the GPU page's re-layout section shows and asks for
(``scheduling.sharing.relayout`` does the work, one GPU of a node at a time).

- ``GET /api/v1/mig-relayouts/``, ``/api/v1/mig-relayouts/<id>/``: re-layouts, the newest
  first, with their step and its deadline (read as the GPU page is); filters ``gpu`` (UUID),
  ``node`` (hostname), ``state`` (repeatable).
- ``POST /api/v1/mig-relayouts/`` (admins): ``{"gpu", "layout_name", "layout", "preempt"}``
  starts one: the GPU drains (its jobs preempted at once with ``preempt``), the agent applies
  the layout, a re-scan verifies it; a refusal is a 400 naming the field.
- ``POST /api/v1/mig-relayouts/<id>/cancel/`` (admins): one still draining; else a 409.
"""

from __future__ import annotations

from typing import Any

from django.db.models import QuerySet
from django_filters.rest_framework import DjangoFilterBackend
from drf_spectacular.utils import OpenApiResponse, extend_schema
from rest_framework import mixins, serializers, status, viewsets
from rest_framework.decorators import action
from rest_framework.request import Request
from rest_framework.response import Response

from gpuadmin import api
from gpuadmin.access.permissions import IsAdminOrReadOnly, signed_in
from inventory.models import Gpu
from scheduling import filters
from scheduling.jobs.api.views import valid
from scheduling.models import RELAYOUT_FIELDS, MigRelayout
from scheduling.sharing import relayout


class LayoutItemSerializer(api.Serializer):
    profile = serializers.CharField(help_text="A GPU instance profile, e.g. 3g.40gb.")
    start = serializers.IntegerField(help_text="Its placement start (a memory slice).")


class MigRelayoutSerializer(api.ModelSerializer):
    gpu = serializers.CharField(source="gpu.uuid", read_only=True)
    gpu_index = serializers.IntegerField(source="gpu.index", read_only=True)
    node = serializers.CharField(source="node.hostname", read_only=True)
    layout = LayoutItemSerializer(many=True, read_only=True)
    previous_layout = LayoutItemSerializer(
        many=True, read_only=True, help_text="What a failure rolls back to."
    )
    requested_by = serializers.CharField(
        source="requested_by.username", default=None, read_only=True, allow_null=True
    )

    class Meta:
        model = MigRelayout
        fields = ["id", "gpu_index", *RELAYOUT_FIELDS]
        read_only_fields = fields


class MigRelayoutRequestSerializer(api.Serializer):
    gpu = serializers.SlugRelatedField(
        slug_field="uuid", queryset=Gpu.objects.all(), help_text="The GPU's UUID."
    )
    layout_name = serializers.CharField(
        max_length=64,
        help_text="all-<the smallest profile> (e.g. all-1g.10gb), balanced, or custom.",
    )
    layout = serializers.CharField(
        max_length=relayout.LAYOUT_CHARS,
        required=False,
        allow_blank=True,
        default="",
        help_text="With custom: profiles, each @start where it must sit, e.g. "
        "3g.20gb@4, 2g.10gb, 1g.5gb@6.",
    )
    preempt = serializers.BooleanField(
        default=False, help_text="Preempt its jobs now (else wait for them to end)."
    )


class MigRelayoutViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, viewsets.GenericViewSet):
    """MIG re-layouts of single GPUs, the newest first."""

    serializer_class = MigRelayoutSerializer
    permission_classes = [IsAdminOrReadOnly]
    pagination_class = api.Pagination
    filter_backends = [DjangoFilterBackend]
    filterset_class = filters.MigRelayoutFilterSet

    def get_queryset(self) -> QuerySet[MigRelayout]:
        return MigRelayout.objects.select_related("gpu", "node", "requested_by")

    @extend_schema(request=MigRelayoutRequestSerializer, responses={201: MigRelayoutSerializer})
    def create(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        """Give one GPU a new MIG layout (admins; audited step by step)."""
        data = valid(MigRelayoutRequestSerializer, request.data)
        name = data["layout_name"]
        item = relayout.request(
            data["gpu"],
            name,
            actor=signed_in(request),
            layout=relayout.asked_layout(name, data["layout"]),
            preempt=data["preempt"],
        )
        # The new row holds its GPU, node and requester already: no query to answer with it.
        return Response(MigRelayoutSerializer(item).data, status=status.HTTP_201_CREATED)

    @extend_schema(
        request=None,
        responses={
            200: MigRelayoutSerializer,
            409: OpenApiResponse(api.ErrorSerializer, "It no longer drains."),
        },
    )
    @action(detail=True, methods=["post"])
    def cancel(self, request: Request, pk: str) -> Response:
        """Cancel a re-layout still draining (admins): the GPU is available again."""
        item = self.get_object()
        try:
            relayout.cancel(item, actor=signed_in(request))
        except relayout.RelayoutRefused as exc:
            raise api.Conflict(exc.message) from None
        return Response(MigRelayoutSerializer(self.get_queryset().get(pk=item.pk)).data)
