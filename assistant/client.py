"""A client of an OpenAI-compatible chat-completions endpoint (vLLM, llama.cpp's server,
Ollama) with tool calling, on the standard library: the answer streamed as server-sent
events, text handed on as it comes and tool calls assembled from their deltas. Plain Python.

Errors are of two kinds: ``ChatUnreachable`` (no answer: refused connection, timeout) and
``ChatRefused`` (an HTTP error status, or a body that is not the protocol).
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any


class ChatError(Exception):
    """A request to the model's endpoint that gave no usable answer."""


class ChatUnreachable(ChatError):
    """The endpoint did not answer."""


class ChatRefused(ChatError):
    """The endpoint answered with an error status or outside the protocol."""


@dataclass(frozen=True)
class ToolCall:
    """One call the model asked for; ``arguments`` is the JSON text as the model wrote it
    (it may not be JSON at all: the caller judges it)."""

    id: str
    name: str
    arguments: str

    def to_dict(self) -> dict[str, Any]:
        """As the assistant message of the conversation repeats it."""
        return {
            "id": self.id,
            "type": "function",
            "function": {"name": self.name, "arguments": self.arguments},
        }


@dataclass(frozen=True)
class Reply:
    """One model turn: its text and the tool calls it asked for (several: parallel calls)."""

    content: str
    tool_calls: tuple[ToolCall, ...] = ()
    finish_reason: str = ""

    def to_message(self) -> dict[str, Any]:
        message: dict[str, Any] = {"role": "assistant", "content": self.content or None}
        if self.tool_calls:
            message["tool_calls"] = [call.to_dict() for call in self.tool_calls]
        return message


@dataclass
class _PartialCall:
    id: str = ""
    name: str = ""
    arguments: list[str] = field(default_factory=list)


@dataclass
class _Assembly:
    """A reply put together from streamed chunks: text pieces, and tool calls by ``index``
    (a server that sends whole calls without an index gets them in the order sent)."""

    text: list[str] = field(default_factory=list)
    calls: dict[int, _PartialCall] = field(default_factory=dict)
    finish_reason: str = ""

    def add(self, delta: dict[str, Any]) -> None:
        for position, piece in enumerate(delta.get("tool_calls") or ()):
            index = piece.get("index")
            if not isinstance(index, int):
                index = len(self.calls) + position
            call = self.calls.setdefault(index, _PartialCall())
            call.id = piece.get("id") or call.id
            function = piece.get("function") or {}
            call.name = function.get("name") or call.name
            arguments = function.get("arguments")
            if isinstance(arguments, dict):  # Ollama's native form: an object, not text
                arguments = json.dumps(arguments)
            if arguments:
                call.arguments.append(arguments)

    def reply(self) -> Reply:
        calls = tuple(
            ToolCall(
                id=call.id or f"call_{index}", name=call.name, arguments="".join(call.arguments)
            )
            for index, call in sorted(self.calls.items())
        )
        return Reply("".join(self.text), calls, self.finish_reason)


class ChatClient:
    """``base_url`` is the API's root, as OpenAI's clients take it (``http://host:8000/v1``);
    requests go to ``{base_url}/chat/completions``."""

    def __init__(
        self, base_url: str, model: str, *, api_key: str = "", timeout: float = 60.0
    ) -> None:
        self.url = base_url.rstrip("/") + "/chat/completions"
        self.model = model
        self.api_key = api_key
        self.timeout = timeout

    def stream(
        self, messages: list[dict[str, Any]], tools: list[dict[str, Any]]
    ) -> Iterator[str | Reply]:
        """The reply's text pieces as they arrive, then the whole ``Reply`` last."""
        body: dict[str, Any] = {"model": self.model, "messages": messages, "stream": True}
        if tools:
            body["tools"] = tools
            body["tool_choice"] = "auto"
        headers = {"Content-Type": "application/json", "Accept": "text/event-stream"}
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        request = urllib.request.Request(
            self.url, data=json.dumps(body).encode(), headers=headers, method="POST"
        )
        try:
            response = urllib.request.urlopen(request, timeout=self.timeout)  # noqa: S310
        except urllib.error.HTTPError as exc:
            detail = exc.read(2000).decode(errors="replace").strip()
            raise ChatRefused(f"HTTP {exc.code} from {self.url}: {detail}") from exc
        except (urllib.error.URLError, OSError) as exc:
            raise ChatUnreachable(f"{self.url} did not answer: {exc}") from exc
        with response:
            assembly = _Assembly()
            try:
                if response.headers.get_content_type() == "application/json":
                    chunks: Iterable[dict[str, Any]] = [_whole(json.load(response))]
                else:
                    chunks = _events(response)
                for chunk in chunks:
                    yield from _take(chunk, assembly)
            except (OSError, ValueError) as exc:
                raise ChatRefused(f"{self.url} broke off its answer: {exc}") from exc
            yield assembly.reply()


def _events(lines: Iterable[bytes]) -> Iterator[dict[str, Any]]:
    """The JSON objects of a server-sent event stream's ``data:`` lines, to ``[DONE]``."""
    for raw in lines:
        line = raw.decode().strip()
        if not line.startswith("data:"):
            continue  # blank separators, comments (": ping"), event names
        data = line[5:].strip()
        if data == "[DONE]":
            return
        chunk = json.loads(data)
        if not isinstance(chunk, dict):
            raise ValueError(f"a chunk that is not an object: {data[:200]}")
        if "error" in chunk:
            raise ValueError(f"the server reported an error: {chunk['error']}")
        yield chunk


def _whole(body: Any) -> dict[str, Any]:
    """A non-streamed answer (a server that ignored ``stream``) as one chunk."""
    if not isinstance(body, dict) or not body.get("choices"):
        raise ValueError("an answer without choices")
    choice = body["choices"][0]
    return {"choices": [{"delta": choice.get("message") or {}, **choice}]}


def _take(chunk: dict[str, Any], assembly: _Assembly) -> Iterator[str]:
    for choice in chunk.get("choices") or ():
        delta = choice.get("delta") or {}
        text = delta.get("content")
        if text:
            assembly.text.append(text)
            yield text
        assembly.add(delta)
        if choice.get("finish_reason"):
            assembly.finish_reason = choice["finish_reason"]
