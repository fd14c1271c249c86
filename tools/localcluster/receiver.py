"""A webhook receiver for tests: a real HTTP server on 127.0.0.1 that records every POST (when, headers,
body) and answers ``status`` -- or holds the connection while ``hang`` is set, as a receiver that is down
in the worst way does. The operator's notifications and gates are tested against it."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


class Receiver(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, status: int = 200, hang: bool = False, path: str = "/hooks/rollouts") -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.status, self.hang, self.path = status, hang, path
        self.got: list[tuple[float, dict[str, str], bytes]] = []  # (monotonic time, headers, body)
        self.release = threading.Event()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}{self.path}"

    def bodies(self) -> list[bytes]:
        return [body for _, _, body in self.got]

    def documents(self) -> list[Any]:
        """The bodies, as JSON."""
        return [json.loads(body) for body in self.bodies()]


class _Handler(BaseHTTPRequestHandler):
    server: Receiver

    def do_POST(self) -> None:
        data = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self.server.got.append((time.monotonic(), {k.lower(): v for k, v in self.headers.items()}, data))
        if self.server.hang:
            self.server.release.wait(60)
            return
        self.send_response(self.server.status)
        if 300 <= self.server.status < 400:
            self.send_header("Location", "/elsewhere")  # a redirect the client must not follow
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


@contextmanager
def receivers() -> Iterator[type[Receiver]]:
    """Start receivers with ``start(status=..., hang=...)``; all are stopped (hung ones released) after."""
    started: list[Receiver] = []

    def start(status: int = 200, hang: bool = False, path: str = "/hooks/rollouts") -> Receiver:
        r = Receiver(status, hang, path)
        threading.Thread(target=r.serve_forever, daemon=True).start()
        started.append(r)
        return r

    try:
        yield start  # type: ignore[misc]
    finally:
        for r in started:
            r.release.set()
            r.shutdown()
            r.server_close()
