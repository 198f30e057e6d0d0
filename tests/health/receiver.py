"""A real HTTP receiver for webhook tests: ``http.server`` on a free port in a thread,
recording every request; it can answer 500 a number of times before 200."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclass
class Received:
    path: str
    content_type: str
    body: Any
    status: int


@dataclass
class Receiver:
    url: str
    failures_left: int = 0
    requests: list[Received] = field(default_factory=list)

    def wait_for(self, count: int, timeout: float = 30) -> list[Received]:
        deadline = time.monotonic() + timeout
        while len(self.requests) < count:
            assert time.monotonic() < deadline, f"{len(self.requests)} of {count} requests came"
            time.sleep(0.05)
        return self.requests


@contextmanager
def receiver(fail_first: int = 0) -> Iterator[Receiver]:
    """A receiver on 127.0.0.1 that answers 500 to its first ``fail_first`` requests."""
    lock = threading.Lock()
    found = Receiver(url="", failures_left=fail_first)

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 (http.server's name)
            raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            with lock:
                failing = found.failures_left > 0
                found.failures_left -= failing
            status = 500 if failing else 200
            found.requests.append(
                Received(self.path, self.headers.get("Content-Type", ""), json.loads(raw), status)
            )
            self.send_response(status)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    found.url = f"http://127.0.0.1:{server.server_address[1]}"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield found
    finally:
        server.shutdown()
        server.server_close()
