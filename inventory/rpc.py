"""The gRPC API's Fleet service (``gpuadmin.v1.Fleet``, protos/gpuadmin/v1/fleet.proto): the
nodes and GPUs of the REST API's /api/v1/nodes/ and /api/v1/gpus/ (their querysets and
FilterSets), and the GPUs' audited state changes as they commit (``gpuadmin.rpc.events``)."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime
from typing import Any

import grpc
from django.db.models import Max

from gpuadmin.access.models import Role
from gpuadmin.audit.models import AuditEvent
from gpuadmin.rpc import events
from gpuadmin.rpc.calls import Call, filtered, rpc
from gpuadmin.v1 import fleet_pb2 as pb
from gpuadmin.v1 import fleet_pb2_grpc
from inventory.api.views import GpuViewSet, NodeViewSet
from inventory.filters import GpuFilterSet, NodeFilterSet
from inventory.models import Gpu

SERVICE = "gpuadmin.v1.Fleet"
GPU_TYPE = Gpu._meta.label_lower  # the audit rows' target_type of a GPU


def _stamp(message: Any, name: str, value: datetime | None) -> None:
    if value is not None:
        getattr(message, name).FromDatetime(value)


class FleetServicer(fleet_pb2_grpc.FleetServicer):
    """``gpuadmin.v1.Fleet``: the catalog, read by anyone with a token."""

    @rpc(Role.VIEWER)
    def ListNodes(self, request: pb.ListNodesRequest, call: Call) -> pb.ListNodesResponse:
        data = {"state": request.state, "pool": request.pool}
        nodes = filtered(NodeFilterSet, data, NodeViewSet.queryset.all(), call.user)
        answer = pb.ListNodesResponse()
        for node in nodes:
            message = answer.nodes.add(
                hostname=node.hostname,
                state=node.state,
                state_reason=node.state_reason,
                reachable=node.is_reachable(),
                model=node.model,
                pool=node.pool.name if node.pool else "",
                gpu_count=node.gpu_count,
                driver_version=node.driver_version,
            )
            _stamp(message, "state_changed_at", node.state_changed_at)
        return answer

    @rpc(Role.VIEWER)
    def ListGpus(self, request: pb.ListGpusRequest, call: Call) -> pb.ListGpusResponse:
        # Read first: a change committed while the list is read is then after it.
        last = AuditEvent.objects.aggregate(last=Max("pk"))["last"] or 0
        data = {
            "node": request.node,
            "state": request.state,
            "pool": request.pool,
            "model": request.model,
        }
        gpus = filtered(GpuFilterSet, data, GpuViewSet.queryset.all(), call.user)
        answer = pb.ListGpusResponse(last_event_id=last)
        for gpu in gpus:
            message = answer.gpus.add(
                uuid=gpu.uuid,
                node=gpu.node.hostname,
                index=gpu.index,
                name=gpu.name,
                memory_total_mib=gpu.memory_total_mib,
                state=gpu.state,
                state_reason=gpu.state_reason,
                missing=gpu.is_missing,
                pool=gpu.pool.name if gpu.pool else "",
                mig_enabled=gpu.mig_enabled,
            )
            _stamp(message, "state_changed_at", gpu.state_changed_at)
        return answer

    @rpc(Role.VIEWER)
    def WatchGpus(self, request: pb.WatchGpusRequest, call: Call) -> Iterator[pb.GpuEvent]:
        """GPUs' state changes after ``after_event_id`` (from now on without it), as they
        commit, until the client goes away."""
        # A GPU's audit rows name it by UUID; its node, read when first met.
        nodes: dict[str, str] = {}
        with events.STATE_CHANGES.following(GPU_TYPE) as follower:
            call.on_end(follower.stop)
            after = request.after_event_id
            if after <= 0:
                after = AuditEvent.objects.aggregate(last=Max("pk"))["last"] or 0
            history = request.after_event_id > 0
            for change in follower.changes(after, call.is_active, history=history):
                uuid = change.target_id
                if uuid not in nodes:
                    found = Gpu.objects.filter(uuid=uuid).values_list("node__hostname", flat=True)
                    nodes[uuid] = found.first() or ""
                hostname = nodes[uuid]
                if request.node and hostname != request.node:
                    continue
                event = pb.GpuEvent(
                    event_id=change.id,
                    gpu_uuid=uuid,
                    node=hostname,
                    state=change.state,
                    previous_state=change.before,
                    actor=change.actor,
                    message=change.message,
                )
                event.time.FromDatetime(change.time)
                yield event


def add_to(server: grpc.Server) -> list[str]:
    """Add the service to ``server``; the names of what it added (for reflection, health)."""
    fleet_pb2_grpc.add_FleetServicer_to_server(FleetServicer(), server)
    return [SERVICE]
