"""``GET /api/v1/audit/``: the audit log, filtered by ``AuditEventFilterSet``, as JSON pages or
(``?format=csv``) one streamed CSV file of every matching row."""

from __future__ import annotations

import csv
import datetime as dt
import json
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

from django.core.serializers.json import DjangoJSONEncoder
from django.db.models import QuerySet
from django.http import StreamingHttpResponse
from django.utils import timezone
from django_filters.rest_framework import DjangoFilterBackend
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema
from rest_framework import serializers, viewsets
from rest_framework.renderers import BaseRenderer, BrowsableAPIRenderer, JSONRenderer
from rest_framework.request import Request
from rest_framework.response import Response

from gpuadmin.api import Pagination
from gpuadmin.audit.access import CanReadAudit
from gpuadmin.audit.filters import AuditEventFilterSet
from gpuadmin.audit.models import AuditEvent
from gpuadmin.spreadsheets import inert

CSV_COLUMNS = (
    "id",
    "time",
    "event_type",
    "actor",
    "actor_id",
    "target_type",
    "target_id",
    "object_repr",
    "before",
    "after",
    "message",
    "request_id",
    "channel",
)
# The model field behind each column (the ``actor`` column is who acted, by name).
CSV_SOURCES = tuple("actor_name" if column == "actor" else column for column in CSV_COLUMNS)
CSV_CHUNK_ROWS = 2000


class AuditEventSerializer(serializers.ModelSerializer):
    actor = serializers.CharField(source="actor_name", help_text="Username or process.")

    class Meta:
        model = AuditEvent
        fields = list(CSV_COLUMNS)


class _Echo:
    """A file whose ``write`` returns what it was given (``csv.writer`` into a stream)."""

    def write(self, value: str) -> str:
        return value


_TIME = serializers.DateTimeField()  # the JSON answer's time format


def _cell(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, dt.datetime):
        value = _TIME.to_representation(value)
    if isinstance(value, dict | list):
        value = json.dumps(value, cls=DjangoJSONEncoder, sort_keys=True)
    return inert(str(value))


def csv_lines(rows: Iterable[Mapping[str, Any]]) -> Iterator[str]:
    """The header (the JSON answer's fields), then one line per row of ``CSV_SOURCES``."""
    writer = csv.writer(_Echo())
    yield writer.writerow(CSV_COLUMNS)
    for row in rows:
        yield writer.writerow([_cell(row[source]) for source in CSV_SOURCES])


class CsvRenderer(BaseRenderer):
    """Selects ``?format=csv``; the rows are streamed by the view, so this renders only what
    is not rows (an error) as ``field,message`` lines."""

    media_type = "text/csv"
    format = "csv"
    charset = "utf-8"

    def render(
        self,
        data: Any,
        accepted_media_type: str | None = None,
        renderer_context: Mapping[str, Any] | None = None,
    ) -> bytes:
        writer = csv.writer(_Echo())
        lines = [writer.writerow(["field", "message"])]
        for field, messages in (data or {}).items():
            for message in messages if isinstance(messages, list) else [messages]:
                lines.append(writer.writerow([field, _cell(message)]))
        return "".join(lines).encode()


class AuditEventViewSet(viewsets.ReadOnlyModelViewSet):
    """The audit log, newest first (operators and admins)."""

    queryset = AuditEvent.objects.all()
    serializer_class = AuditEventSerializer
    permission_classes = [CanReadAudit]
    pagination_class = Pagination
    filter_backends = [DjangoFilterBackend]
    filterset_class = AuditEventFilterSet
    renderer_classes = [JSONRenderer, BrowsableAPIRenderer, CsvRenderer]

    @extend_schema(
        parameters=[
            OpenApiParameter(
                "format",
                OpenApiTypes.STR,
                enum=["json", "csv"],
                description="`csv`: every matching row (no pagination) as one streamed file.",
            )
        ],
        responses={
            200: OpenApiResponse(AuditEventSerializer(many=True), "JSON pages, or text/csv.")
        },
    )
    def list(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        if request.accepted_renderer.format != CsvRenderer.format:
            return super().list(request, *args, **kwargs)
        events: QuerySet[AuditEvent] = self.filter_queryset(self.get_queryset())
        rows = events.values(*CSV_SOURCES)
        response = StreamingHttpResponse(
            csv_lines(rows.iterator(CSV_CHUNK_ROWS)), content_type="text/csv; charset=utf-8"
        )
        stamp = timezone.now().strftime("%Y%m%dT%H%M%SZ")
        response["Content-Disposition"] = f'attachment; filename="audit-{stamp}.csv"'
        return response  # type: ignore[return-value]  # DRF passes any HttpResponse through
