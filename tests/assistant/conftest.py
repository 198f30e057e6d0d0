from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest

from tests.assistant.chat_server import ChatServer, Script
from tests.scheduling.api.conftest import fleet, make_user  # noqa: F401 (fixtures)
from tests.scheduling.conftest import broker  # noqa: F401 (a fixture)


@pytest.fixture
def model(settings) -> Iterator[Callable[..., ChatServer]]:
    """``model(*replies)``: a scripted chat-completions server, started and configured as
    the assistant's endpoint."""
    started: list[ChatServer] = []

    def start(*script: Script) -> ChatServer:
        server = ChatServer(list(script)).start()
        started.append(server)
        settings.GPUADMIN_ASSISTANT_URL = server.url
        settings.GPUADMIN_ASSISTANT_MODEL = "scripted-model"
        settings.GPUADMIN_ASSISTANT_KEY = "sk-test"
        return server

    yield start
    for server in started:
        server.stop()
