"""The assistant's loop: a question goes to the model with the tools' schemas; the tool
calls it asks for (several in one turn: parallel calls) run with the asker's permissions in
a read-only transaction, each audited, their results capped in size and sent back; until the
model answers, or ``GPUADMIN_ASSISTANT_MAX_STEPS`` rounds have passed. The answer cites the
objects the tools returned. See docs/users/assistant.md."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from typing import Any

from django.conf import settings
from django.contrib.auth.models import User
from django.core.serializers.json import DjangoJSONEncoder
from django.db import DatabaseError, connection, transaction
from django.utils import timezone

from assistant.client import ChatClient, ChatError, Reply, ToolCall
from assistant.schema import ArgumentsInvalid, bind
from assistant.tools import TOOLS, ToolRefused
from gpuadmin.access.services import role_of
from gpuadmin.audit.services import record
from gpuadmin.refusals import FieldRefusal

# Tool calls run of one turn; the model is told the others were refused.
MAX_CALLS_PER_STEP = 8
MAX_CITATIONS = 20
MAX_QUESTION_CHARS = 2000

SYSTEM_PROMPT = """You are gpuadmin's assistant. gpuadmin runs a fleet of GPU nodes: it keeps \
their inventory and health, queues and places jobs on GPUs, books reservations and accounts \
for usage. Answer the question of {user} (role: {role}) about this fleet, today {today}, \
using only what the tools return: call them to look things up, several at once when they do \
not depend on each other. Never guess: when a tool refuses or finds nothing, say so. Be brief. \
Cite every job, GPU, node or alert you rely on by its "ref" as a Markdown link to its "url", \
for example [job 42](/jobs/42/)."""


class NotConfigured(RuntimeError):
    """No model endpoint is set (``GPUADMIN_ASSISTANT_URL``)."""


class QuestionInvalid(FieldRefusal):
    """An empty or too long question."""


@dataclass(frozen=True)
class Citation:
    ref: str
    url: str


@dataclass(frozen=True)
class Step:
    """One tool call as it ran: its name, the arguments as the model wrote them, and whether
    it answered (``ok``) or what was wrong (``error``)."""

    name: str
    arguments: str
    ok: bool
    error: str = ""


@dataclass
class Answer:
    """What the loop ends with. ``stopped``: why there is no full answer (the step cap, the
    endpoint failing), else empty."""

    text: str = ""
    citations: list[Citation] = field(default_factory=list)
    steps: list[Step] = field(default_factory=list)
    stopped: str = ""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


# What ``ask`` yields: a piece of the answer's text, a step as it ran, or the ``Answer`` last.
Event = str | Step | Answer


def configured() -> bool:
    return bool(settings.GPUADMIN_ASSISTANT_URL)


def default_client() -> ChatClient:
    if not configured():
        raise NotConfigured("the assistant has no model: set GPUADMIN_ASSISTANT_URL")
    return ChatClient(
        settings.GPUADMIN_ASSISTANT_URL,
        settings.GPUADMIN_ASSISTANT_MODEL,
        api_key=settings.GPUADMIN_ASSISTANT_KEY,
        timeout=settings.GPUADMIN_ASSISTANT_TIMEOUT_S,
    )


def check_question(question: str) -> str:
    question = question.strip()
    if not question:
        raise QuestionInvalid("question", "ask a question")
    if len(question) > MAX_QUESTION_CHARS:
        raise QuestionInvalid("question", f"at most {MAX_QUESTION_CHARS} characters")
    return question


def ask(user: User, question: str, client: ChatClient | None = None) -> Iterator[Event]:
    """Answer ``question`` for ``user``: the answer's text as it streams, each tool call once
    it ran, and the ``Answer`` last. ``NotConfigured`` without an endpoint,
    ``QuestionInvalid`` for an empty or too long question."""
    question = check_question(question)
    client = client or default_client()
    system = SYSTEM_PROMPT.format(
        user=user.get_username(), role=role_of(user), today=timezone.localdate().isoformat()
    )
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": system},
        {"role": "user", "content": question},
    ]
    specs = [tool.spec() for tool in TOOLS.values()]
    answer = Answer()
    cited: dict[str, Citation] = {}
    for _ in range(settings.GPUADMIN_ASSISTANT_MAX_STEPS):
        reply: Reply | None = None
        try:
            for piece in client.stream(messages, specs):
                if isinstance(piece, Reply):
                    reply = piece
                else:
                    yield piece
        except ChatError as exc:
            answer.stopped = f"the model's endpoint failed: {exc}"
            break
        assert reply is not None  # stream() always ends with the reply
        messages.append(reply.to_message())
        if not reply.tool_calls:
            answer.text = reply.content
            break
        for position, call in enumerate(reply.tool_calls):
            step, content = _run(user, question, call, refused=position >= MAX_CALLS_PER_STEP)
            answer.steps.append(step)
            if step.ok:
                _collect(json.loads(content), cited)
            messages.append({"role": "tool", "tool_call_id": call.id, "content": content})
            yield step
    else:
        answer.stopped = (
            f"the model was still calling tools after {settings.GPUADMIN_ASSISTANT_MAX_STEPS} "
            "rounds (GPUADMIN_ASSISTANT_MAX_STEPS)"
        )
    answer.citations = _cited(answer.text, list(cited.values()))
    yield answer


def answer(user: User, question: str, client: ChatClient | None = None) -> Answer:
    """``ask``'s ``Answer``, without the stream."""
    *_, last = ask(user, question, client)
    assert isinstance(last, Answer)
    return last


class _Rollback(Exception):
    pass


def read_only(call: Any) -> Any:
    """``call()`` in a read-only transaction (PostgreSQL refuses any write), rolled back."""
    result = None
    try:
        with transaction.atomic():
            with connection.cursor() as cursor:
                cursor.execute("SET TRANSACTION READ ONLY")
            result = call()
            raise _Rollback
    except _Rollback:
        pass
    return result


def _run(user: User, question: str, call: ToolCall, *, refused: bool) -> tuple[Step, str]:
    """Run one tool call: (the step, the content sent back to the model: the result's JSON,
    or an error the model can act on). Audited whatever came of it."""
    kwargs: dict[str, Any] | None = None
    tool = TOOLS.get(call.name)
    try:
        if refused:
            raise ToolRefused(f"at most {MAX_CALLS_PER_STEP} tool calls in one turn")
        if tool is None:
            raise ToolRefused(f"no tool {call.name!r}; the tools are {', '.join(TOOLS)}")
        kwargs = bind(tool.function, call.arguments)
        result = read_only(lambda: tool.function(user, **kwargs))
        content = cap(result, settings.GPUADMIN_ASSISTANT_RESULT_BYTES)
        step = Step(call.name, call.arguments, ok=True)
    except (ToolRefused, ArgumentsInvalid) as exc:
        step = Step(call.name, call.arguments, ok=False, error=str(exc))
    except DatabaseError as exc:
        step = Step(call.name, call.arguments, ok=False, error=f"the query failed: {exc}")
    if not step.ok:
        content = json.dumps({"error": step.error})
    with transaction.atomic():
        record(
            "assistant.tool_called",
            actor=user,
            target_type="assistant.tool",
            target_id=call.name[:64],
            after={
                "arguments": kwargs if kwargs is not None else call.arguments[:1000],
                "ok": step.ok,
                "error": step.error,
                "result_bytes": len(content),
            },
            message=question[:500],
        )
    return step, content


def cap(result: dict[str, Any], limit: int) -> str:
    """``result`` as JSON of at most about ``limit`` bytes: its longest list halved until it
    fits (``truncated`` says how many rows of how many are shown)."""
    text = json.dumps(result, cls=DjangoJSONEncoder)
    while len(text) > limit:
        lists = [(len(value), key) for key, value in result.items() if isinstance(value, list)]
        if not lists or max(lists)[0] <= 1:
            return json.dumps({"truncated": True, "text": text[: limit - 100]})
        length, key = max(lists)
        total = result.get("truncated", {}).get(key, length)
        result = {**result, key: result[key][: length // 2]}
        result["truncated"] = {**result.get("truncated", {}), key: total}
        text = json.dumps(result, cls=DjangoJSONEncoder)
    return text


def _collect(value: Any, cited: dict[str, Citation]) -> None:
    """Every object a result names (a dict with ``ref`` and ``url``), in order, once."""
    if isinstance(value, dict):
        ref, url = value.get("ref"), value.get("url")
        if isinstance(ref, str) and isinstance(url, str):
            cited.setdefault(url, Citation(ref, url))
        for item in value.values():
            _collect(item, cited)
    elif isinstance(value, list):
        for item in value:
            _collect(item, cited)


def _names(text: str, citation: Citation) -> bool:
    if f"({citation.url})" in text:
        return True
    return re.search(rf"\b{re.escape(citation.ref)}\b", text, re.IGNORECASE) is not None


def _cited(text: str, found: list[Citation]) -> list[Citation]:
    """The objects the answer names (by ref or link); all that were found when it names none."""
    named = [citation for citation in found if _names(text, citation)]
    return (named or found)[:MAX_CITATIONS]
