"""``/api/v1/arrays/``: job arrays (submitted through ``POST /api/v1/jobs/`` with ``array``),
their tasks by state, cancelling a whole array or some of its tasks, and holding or releasing
a whole array. Their tasks are jobs once made: ``/api/v1/jobs/?array=<id>``."""

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
from scheduling.jobs.api.views import domain_errors, valid
from scheduling.models import JobArray

ARRAY_ERRORS = {
    403: OpenApiResponse(ErrorSerializer, "Not allowed to act on this array."),
    404: OpenApiResponse(ErrorSerializer, "No such array (users see only their own)."),
    409: OpenApiResponse(ErrorSerializer, "Canceled, or no task it applies to."),
}


class ArrayViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, viewsets.GenericViewSet):
    """Job arrays: users see their own, viewers, operators and admins everyone's."""

    permission_classes = [CanSubmit]
    pagination_class = Pagination
    serializer_class = s.ArraySerializer

    def get_queryset(self) -> QuerySet[JobArray]:
        return queries.with_task_counts(queries.visible_arrays(self.request.user)).order_by("-pk")

    def _array_to_act_on(self, request: Request) -> JobArray:
        array = self.get_object()
        if not can_act_on(request.user, array):
            raise PermissionDenied(f"A {role_of(request.user)} cannot act on array {array.pk}.")
        return array

    @extend_schema(
        request=s.ArrayCancelSerializer,
        responses={200: s.ArrayCanceledSerializer, **ARRAY_ERRORS},
    )
    @action(detail=True, methods=["post"])
    def cancel(self, request: Request, pk: str) -> Response:
        """Cancel every unfinished task, or those ``tasks`` names: waiting ones at once,
        running ones through their agents (SIGTERM, then SIGKILL after the grace), those not
        made jobs yet never made."""
        array = self._array_to_act_on(request)
        tasks = valid(s.ArrayCancelSerializer, request.data).get("tasks")
        actor = signed_in(request)
        if tasks is None:
            canceled = control.cancel_array(array, actor=actor)
        else:
            canceled = control.cancel_tasks(array, tasks, actor=actor)
        return Response(s.ArrayCanceledSerializer(canceled).data)

    @extend_schema(request=None, responses={200: s.ArrayHeldSerializer, **ARRAY_ERRORS})
    @action(detail=True, methods=["post"])
    def hold(self, request: Request, pk: str) -> Response:
        """Hold every waiting task: queued ones become pending, those not made jobs yet are
        made pending. Tasks on GPUs are left alone."""
        array = self._array_to_act_on(request)
        with domain_errors():
            held = control.hold_array(array, actor=signed_in(request))
        return Response(s.ArrayHeldSerializer(held).data)

    @extend_schema(request=None, responses={200: s.ArrayHeldSerializer, **ARRAY_ERRORS})
    @action(detail=True, methods=["post"])
    def release(self, request: Request, pk: str) -> Response:
        """Let every held task into the queue: pending ones become queued, those not made
        jobs yet are made queued."""
        array = self._array_to_act_on(request)
        with domain_errors():
            released = control.release_array(array, actor=signed_in(request))
        return Response(s.ArrayHeldSerializer(released).data)
