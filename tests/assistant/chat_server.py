"""A real HTTP server that speaks OpenAI's chat-completions protocol, streaming its answers
as server-sent events in small deltas (tool calls' arguments split across chunks), and
answers each request with the next of its scripted replies: the model the assistant's tests
talk to."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclass(frozen=True)
class Scripted:
    """One reply: text, tool calls (name, arguments as text: several are parallel calls), or
    an HTTP error status."""

    content: str = ""
    calls: tuple[tuple[str, str], ...] = ()
    status: int = 200
    streamed: bool = True  # False: one JSON body, as a server that ignores "stream"


def say(text: str) -> Scripted:
    return Scripted(content=text)


def call(*calls: tuple[str, str | dict[str, Any]]) -> Scripted:
    return Scripted(
        calls=tuple(
            (name, args if isinstance(args, str) else json.dumps(args)) for name, args in calls
        )
    )


Script = Scripted | Callable[[dict[str, Any]], Scripted]


def pieces(text: str, size: int) -> list[str]:
    return [text[i : i + size] for i in range(0, len(text), size)] or [""]


def chunks(reply: Scripted, model: str) -> Iterator[dict[str, Any]]:
    """The reply as a server streams it: text 4 characters at a time; each tool call's id and
    name first, then its arguments 5 characters at a time."""

    def chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
        return {
            "id": "chatcmpl-test",
            "object": "chat.completion.chunk",
            "model": model,
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
        }

    yield chunk({"role": "assistant", "content": ""})
    if reply.content:
        for piece in pieces(reply.content, 4):
            yield chunk({"content": piece})
    for index, (name, arguments) in enumerate(reply.calls):
        head = {"index": index, "id": f"call_{index}", "type": "function"}
        yield chunk({"tool_calls": [{**head, "function": {"name": name, "arguments": ""}}]})
        for piece in pieces(arguments, 5):
            yield chunk({"tool_calls": [{"index": index, "function": {"arguments": piece}}]})
    yield chunk({}, "tool_calls" if reply.calls else "stop")


def whole(reply: Scripted, model: str) -> dict[str, Any]:
    """The reply in one body (``"stream": false``)."""
    calls = [
        {"id": f"call_{i}", "type": "function", "function": {"name": name, "arguments": args}}
        for i, (name, args) in enumerate(reply.calls)
    ]
    message: dict[str, Any] = {"role": "assistant", "content": reply.content or None}
    if calls:
        message["tool_calls"] = calls
    finish = "tool_calls" if calls else "stop"
    return {
        "id": "chatcmpl-test",
        "object": "chat.completion",
        "model": model,
        "choices": [{"index": 0, "message": message, "finish_reason": finish}],
    }


@dataclass
class ChatServer:
    """``script``: the replies, in order (a callable decides from the request's body); the
    last one repeats. ``requests``: each request's body and headers, as received."""

    script: list[Script]
    requests: list[dict[str, Any]] = field(default_factory=list)
    headers: list[dict[str, str]] = field(default_factory=list)
    server: ThreadingHTTPServer | None = None

    @property
    def url(self) -> str:
        assert self.server is not None
        port = self.server.server_address[1]
        return f"http://127.0.0.1:{port}/v1"

    def next_reply(self, body: dict[str, Any]) -> Scripted:
        step = self.script[min(len(self.requests) - 1, len(self.script) - 1)]
        return step(body) if callable(step) else step

    def start(self) -> ChatServer:
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                if self.path != "/v1/chat/completions":
                    self.send_error(404)
                    return
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                owner.requests.append(body)
                owner.headers.append(dict(self.headers))
                reply = owner.next_reply(body)
                if reply.status != 200:
                    self.send_response(reply.status)
                    self.send_header("Content-Type", "application/json")
                    self.end_headers()
                    self.wfile.write(b'{"error": {"message": "scripted failure"}}')
                    return
                if not reply.streamed:
                    self.send_response(200)
                    self.send_header("Content-Type", "application/json")
                    self.end_headers()
                    self.wfile.write(json.dumps(whole(reply, body["model"])).encode())
                    return
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.end_headers()
                for chunk in chunks(reply, body["model"]):
                    self.wfile.write(f"data: {json.dumps(chunk)}\n\n".encode())
                    self.wfile.flush()
                self.wfile.write(b"data: [DONE]\n\n")

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return self

    def stop(self) -> None:
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()

    def tool_messages(self, request: int) -> list[dict[str, Any]]:
        """The tool results the assistant sent in request ``request`` (0-based)."""
        return [m for m in self.requests[request]["messages"] if m["role"] == "tool"]
