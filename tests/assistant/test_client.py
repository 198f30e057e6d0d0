"""The chat-completions client on its own, against the scripted server: a streamed reply's
text pieces and parallel tool calls put together from their deltas, a server that answers
in one body, and one that is not there."""

from __future__ import annotations

import socket

import pytest

from assistant.client import ChatClient, ChatUnreachable, Reply, ToolCall
from tests.assistant.chat_server import ChatServer, Scripted

CALLS = (("list_gpus", '{"model": "H100", "limit": 8}'), ("list_alerts", "{}"))


@pytest.fixture
def server():
    started: list[ChatServer] = []

    def start(reply: Scripted) -> ChatServer:
        started.append(ChatServer([reply]).start())
        return started[-1]

    yield start
    for each in started:
        each.stop()


@pytest.mark.parametrize("streamed", [True, False], ids=["streamed", "one body"])
def test_text_and_parallel_tool_calls_come_whole(server, streamed):
    chat = server(Scripted(content="Looking it up.", calls=CALLS, streamed=streamed))
    client = ChatClient(chat.url, "m", api_key="k")

    *pieces, reply = client.stream([{"role": "user", "content": "H100s?"}], [])

    assert all(isinstance(piece, str) for piece in pieces)
    assert "".join(map(str, pieces)) == "Looking it up."
    assert len(pieces) == (4 if streamed else 1)  # 4 characters a delta
    assert reply == Reply(
        "Looking it up.",
        (
            ToolCall("call_0", "list_gpus", '{"model": "H100", "limit": 8}'),
            ToolCall("call_1", "list_alerts", "{}"),
        ),
        "tool_calls",
    )
    assert "tools" not in chat.requests[0]  # none given: none sent


def test_an_endpoint_that_is_not_there_is_unreachable():
    with socket.socket() as probe:  # a port nobody listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    client = ChatClient(f"http://127.0.0.1:{port}/v1", "m", timeout=2)

    with pytest.raises(ChatUnreachable, match=f"http://127.0.0.1:{port}/v1/chat/completions"):
        list(client.stream([], []))
