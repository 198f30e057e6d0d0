"""``/api/v1/arrays/``: job arrays (submitted through ``POST /api/v1/jobs/`` with ``array``),
their tasks by state, and cancelling a whole array. Their tasks are jobs:
``/api/v1/jobs/?array=<id>``."""

from __future__ import annotations

from django.db.models import QuerySet
from drf_spectacular.utils import OpenApiResponse, extend_schema
from rest_framework import mixins, viewsets
from rest_framework.decorators import action
from rest_framework.exceptions import PermissionDenied
from rest_framework.request import Request
from rest_framework.response import Response

from gpuadmin.access.permissions import CanSubmit, signed_in
from gpuadmin.access.services import can_act_on, role_of
from gpuadmin.api import ErrorSerializer, Pagination
from scheduling.jobs import control, queries
from scheduling.jobs.api import serializers as s
from scheduling.models import JobArray


class ArrayViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, viewsets.GenericViewSet):
    """Job arrays: users see their own, viewers, operators and admins everyone's."""

    permission_classes = [CanSubmit]
    pagination_class = Pagination
    serializer_class = s.ArraySerializer

    def get_queryset(self) -> QuerySet[JobArray]:
        return queries.with_task_counts(queries.visible_arrays(self.request.user)).order_by("-pk")

    @extend_schema(
        request=None,
        responses={
            200: s.ArrayCanceledSerializer,
            403: OpenApiResponse(ErrorSerializer, "Not allowed to act on this array."),
            404: OpenApiResponse(ErrorSerializer, "No such array (users see only their own)."),
        },
    )
    @action(detail=True, methods=["post"])
    def cancel(self, request: Request, pk: str) -> Response:
        """Cancel every unfinished task: waiting ones at once, running ones through their
        agents (SIGTERM, then SIGKILL after the grace)."""
        array = self.get_object()
        if not can_act_on(request.user, array):
            raise PermissionDenied(f"A {role_of(request.user)} cannot act on array {array.pk}.")
        canceled = control.cancel_array(array, actor=signed_in(request))
        return Response(s.ArrayCanceledSerializer(canceled).data)
