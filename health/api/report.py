"""``/api/v1/health/``: a GPU's, a node's or the fleet's health (``health.report``), for
``gpuadmin health``. Every signed-in person reads it, as the GPU and node pages show it."""

from __future__ import annotations

from typing import Any

from django.shortcuts import get_object_or_404
from django.urls import path
from drf_spectacular.utils import extend_schema, extend_schema_field
from rest_framework import serializers
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from gpuadmin import api
from health import report
from health.api.quarantine import QuarantineSerializer
from inventory.api.serializers import STATUS_CHOICES, STATUS_HELP
from inventory.models import Gpu, Node


class HealthParamsSerializer(api.Serializer):
    gpu = serializers.CharField(required=False, help_text="This GPU (its UUID) alone.")
    node = serializers.CharField(required=False, help_text="Every GPU of this node (hostname).")
    events = serializers.IntegerField(
        required=False,
        min_value=0,
        max_value=report.MAX_EVENTS,
        default=report.DEFAULT_EVENTS,
        help_text="How many of the latest health events (default 20).",
    )

    def validate(self, data: dict[str, Any]) -> dict[str, Any]:
        if "gpu" in data and "node" in data:
            raise serializers.ValidationError({"node": ["Give either a GPU or a node."]})
        return data


class CounterSerializer(api.Serializer):
    """A group of the live sample's health counters, as the GPU page shows it."""

    label = serializers.CharField()  # type: ignore[assignment]  # shadows Field.label
    values = serializers.DictField(
        child=serializers.IntegerField(allow_null=True),
        help_text="The counters by live-sample field (null: not reported).",
    )
    text = serializers.CharField(help_text="As the GPU page writes them: 0 / 2.")


class GpuHealthSerializer(api.Serializer):
    """A ``report.GpuHealth``: the GPU's state, its open quarantine, its live counters."""

    node = serializers.CharField(source="row.gpu.node.hostname")
    index = serializers.IntegerField(source="row.gpu.index")
    uuid = serializers.CharField(source="row.gpu.uuid")
    model = serializers.CharField(source="row.gpu.name")
    state = serializers.CharField(source="row.gpu.state")
    state_reason = serializers.CharField(source="row.gpu.state_reason")
    state_changed_at = serializers.DateTimeField(
        source="row.gpu.state_changed_at", allow_null=True, help_text="Never changed: null."
    )
    status = serializers.ChoiceField(
        source="row.status", choices=STATUS_CHOICES, help_text=STATUS_HELP
    )
    error = serializers.CharField(source="row.error", help_text="NVML's error (empty: none).")
    quarantine = QuarantineSerializer(allow_null=True, help_text="Its open quarantine.")
    counters = serializers.SerializerMethodField()

    @extend_schema_field(CounterSerializer(many=True))
    def get_counters(self, health: report.GpuHealth) -> list[dict[str, Any]]:
        return [
            {"label": label, "values": values, "text": text}
            for label, values, text in health.row.health_counter_values
        ]


class HealthEventSerializer(api.Serializer):
    """A health event (an ``EventRow``), named by the XID catalog."""

    id = serializers.IntegerField(source="event.pk")
    occurred_at = serializers.DateTimeField(source="event.occurred_at")
    node = serializers.CharField(source="event.node.hostname")
    gpu_uuid = serializers.CharField(source="event.gpu.uuid", default=None, allow_null=True)
    gpu_index = serializers.IntegerField(source="event.gpu.index", default=None, allow_null=True)
    kind = serializers.CharField(source="event.kind")
    xid = serializers.IntegerField(source="event.xid", allow_null=True)
    gpu_instance_id = serializers.IntegerField(
        source="event.gpu_instance_id",
        allow_null=True,
        help_text="The MIG GPU instance the driver attributed the XID to; null: the whole GPU.",
    )
    xid_name = serializers.CharField(
        source="xid_info.name", default=None, allow_null=True, help_text="The XID catalog's."
    )
    what = serializers.CharField(help_text="XID 79 (GPU has fallen off the bus), Retired pages")
    severity = serializers.CharField(source="event.severity")
    message = serializers.CharField(source="event.message")
    policy = serializers.CharField(source="event.policy.name", default=None, allow_null=True)
    outcome = serializers.ListField(
        source="event.outcome", child=serializers.CharField(), help_text="What the policy did."
    )


class HealthReportSerializer(api.Serializer):
    gpus = GpuHealthSerializer(
        many=True,
        help_text="The GPU, the node's GPUs, or the fleet's GPUs that need a look (not "
        "available, missing, or quarantined).",
    )
    events = HealthEventSerializer(many=True, help_text="The latest health events.")


class HealthView(APIView):
    @extend_schema(parameters=[HealthParamsSerializer], responses={200: HealthReportSerializer})
    def get(self, request: Request) -> Response:
        """A GPU's (``?gpu=UUID``), a node's (``?node=HOST``) or the fleet's health: state and
        reason, open quarantine, live health counters, latest events (404: no such GPU or
        node)."""
        params = HealthParamsSerializer(data=request.query_params)
        params.is_valid(raise_exception=True)
        data = params.validated_data
        gpu = get_object_or_404(Gpu, uuid=data["gpu"]) if "gpu" in data else None
        node = get_object_or_404(Node, hostname=data["node"]) if "node" in data else None
        found = report.health_report(gpu=gpu, node=node, events=data["events"])
        return Response(HealthReportSerializer(found).data)


urlpatterns = [path("api/v1/health/", HealthView.as_view(), name="api-health")]
