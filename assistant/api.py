"""``POST /api/v1/assistant/ask/``: a question answered with the tools' citations."""

from __future__ import annotations

from django.urls import path
from drf_spectacular.utils import OpenApiResponse, extend_schema
from rest_framework import serializers
from rest_framework.exceptions import APIException
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from assistant import services
from gpuadmin import api
from gpuadmin.access.permissions import signed_in


class NotConfigured(APIException):
    status_code = 503
    default_detail = (
        "The assistant has no model: set GPUADMIN_ASSISTANT_URL (and GPUADMIN_ASSISTANT_MODEL) "
        "to an OpenAI-compatible chat-completions endpoint."
    )
    default_code = "not_configured"


class QuestionSerializer(api.Serializer):
    question = serializers.CharField(
        max_length=services.MAX_QUESTION_CHARS, help_text="In plain words."
    )


class CitationSerializer(api.Serializer):
    ref = serializers.CharField(help_text="How the answer names it: job 42, GPU 3 of dgx-01.")
    url = serializers.CharField(help_text="Its page.")


class StepSerializer(api.Serializer):
    name = serializers.CharField(help_text="The tool called.")
    arguments = serializers.CharField(help_text="Its arguments as the model wrote them.")
    ok = serializers.BooleanField()
    error = serializers.CharField(help_text="Why it did not answer; empty when it did.")


class AnswerSerializer(api.Serializer):
    text = serializers.CharField(help_text="The model's answer (Markdown links to citations).")
    citations = CitationSerializer(many=True, help_text="The objects the answer relies on.")
    steps = StepSerializer(many=True, help_text="The tool calls, in order.")
    stopped = serializers.CharField(
        help_text="Why the answer is cut short (the step limit, the endpoint failing); else empty."
    )


class AskView(APIView):
    @extend_schema(
        request=QuestionSerializer,
        responses={
            200: AnswerSerializer,
            503: OpenApiResponse(api.ErrorSerializer, "No model endpoint is configured."),
        },
    )
    def post(self, request: Request) -> Response:
        """Ask the assistant a question about the fleet; it looks things up with read-only
        tools under the requester's permissions (each call audited) and answers."""
        body = QuestionSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        try:
            answer = services.answer(signed_in(request), body.validated_data["question"])
        except services.NotConfigured:
            raise NotConfigured() from None
        return Response(AnswerSerializer(answer).data)


urlpatterns = [path("api/v1/assistant/ask/", AskView.as_view(), name="assistant-ask")]
