"""``/assistant/``: ask in plain words. Without script the form posts and the page comes back
with the answer; with it (``static/assistant/assistant.js``) the answer streams from
``/assistant/stream/`` as server-sent events: ``text`` pieces, a ``step`` per tool call and
the ``answer`` last (or ``refused``)."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from dataclasses import asdict
from typing import Any

from django.conf import settings
from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse, StreamingHttpResponse
from django.shortcuts import render
from django.utils.html import escape, format_html
from django.utils.safestring import SafeString, mark_safe
from django.views.decorators.http import require_http_methods, require_POST

from assistant import services
from gpuadmin.access.models import Role
from gpuadmin.access.permissions import role_required, signed_in

EXAMPLES = (
    "Why is my job 42 still waiting?",
    "Which GPUs had XID errors this week?",
    "Who holds the H100s and how busy are they?",
    "Is dgx-a100-02 healthy?",
)


# A Markdown link to one of gpuadmin's own pages: ``[job 42](/jobs/42/)`` (not ``//host``).
LINK = re.compile(r"\[([^\]\n]+)\]\((/(?!/)[^)\s]*)\)")


def linked(text: str) -> SafeString:
    """The answer's text, escaped, with its Markdown links to gpuadmin's pages made links
    (``static/assistant/assistant.js`` does the same to a streamed answer)."""
    parts, end = [], 0
    for match in LINK.finditer(text):
        parts.append(escape(text[end : match.start()]))
        parts.append(format_html('<a href="{}">{}</a>', match[2], match[1]))
        end = match.end()
    parts.append(escape(text[end:]))
    return mark_safe("".join(parts))  # noqa: S308 - every part escaped above


def _context(**extra: Any) -> dict[str, Any]:
    return {
        "configured": services.configured(),
        "model": settings.GPUADMIN_ASSISTANT_MODEL,
        "examples": EXAMPLES,
        "max_chars": services.MAX_QUESTION_CHARS,
        **extra,
    }


@role_required(Role.VIEWER)
@require_http_methods(["GET", "POST"])
def page(request: HttpRequest) -> HttpResponse:
    """The question form; a posted question is answered in the page (the stream's fallback)."""
    question = request.POST.get("question", "") if request.method == "POST" else ""
    if not question or not services.configured():
        return render(request, "assistant/page.html", _context(question=question))
    try:
        answer = services.answer(signed_in(request), question)
    except services.QuestionInvalid as exc:
        return render(
            request,
            "assistant/page.html",
            _context(question=question, error=exc.message),
            status=400,
        )
    context = _context(question=question, answer=answer, answer_html=linked(answer.text))
    return render(request, "assistant/page.html", context)


def _event(name: str, data: Any) -> bytes:
    return f"event: {name}\ndata: {json.dumps(data)}\n\n".encode()


def _events(request: HttpRequest, question: str) -> Iterator[bytes]:
    for event in services.ask(signed_in(request), question):
        if isinstance(event, str):
            yield _event("text", {"text": event})
        elif isinstance(event, services.Step):
            yield _event("step", asdict(event))
        else:
            yield _event("answer", event.to_dict())


@login_required  # role_required(Role.VIEWER) lets in the same people; it types page views
@require_POST
def stream(request: HttpRequest) -> HttpResponse | StreamingHttpResponse:
    """The answer to the posted ``question`` as server-sent events."""
    question = request.POST.get("question", "")
    try:
        services.check_question(question)
        if not services.configured():
            raise services.NotConfigured("set GPUADMIN_ASSISTANT_URL")
    except (services.QuestionInvalid, services.NotConfigured) as exc:
        message = exc.message if isinstance(exc, services.QuestionInvalid) else str(exc)
        return HttpResponse(
            _event("refused", {"detail": message}), content_type="text/event-stream", status=400
        )
    response = StreamingHttpResponse(_events(request, question), content_type="text/event-stream")
    response["Cache-Control"] = "no-cache"
    response["X-Accel-Buffering"] = "no"  # nginx: pass each event on as it comes
    return response
