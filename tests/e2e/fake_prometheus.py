"""Prometheus stand-ins that misbehave on a real socket, for the tests that play a broken Prometheus
(tests/e2e/test_verdict.py, tests/chaos/test_operator_stop.py): one that accepts and drips a byte now and
then, one that answers every query with garbage."""

from __future__ import annotations

import http.server
import socket
import threading
from typing import Any


class DrippingPrometheus:
    """Accepts every connection, sends a status line, then one byte every ``every`` seconds, forever."""

    def __init__(self, every: float = 2.0) -> None:
        self.every = every
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(256)
        self.stop = threading.Event()
        self.accepted = 0
        threading.Thread(target=self._accept, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.sock.getsockname()[1]}"

    def _accept(self) -> None:
        self.sock.settimeout(0.5)
        while not self.stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                continue
            self.accepted += 1
            threading.Thread(target=self._drip, args=(conn,), daemon=True).start()

    def _drip(self, conn: socket.socket) -> None:
        try:
            conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n\r\n")
            while not self.stop.wait(self.every):
                conn.sendall(b" ")
        except OSError:
            pass
        finally:
            conn.close()


class GarbagePrometheus:
    """Answers every query 200 with one garbage body after the other: not JSON, cut short, two series
    where one is expected, a matrix, a sample that is not a number."""

    BODIES: tuple[bytes, ...] = (
        b"<html><body>502 Bad Gateway</body></html>",
        b'{"status":"success","data":{"resultType":"vec',
        b'{"status":"success","data":{"resultType":"vector","result":['
        b'{"metric":{"pod":"a"},"value":[1,"0.1"]},{"metric":{"pod":"b"},"value":[1,"0.2"]}]}}',
        b'{"status":"success","data":{"resultType":"matrix","result":[]}}',
        b'{"status":"success","data":{"resultType":"vector","result":[{"metric":{},"value":[1,"abc"]}]}}',
    )

    def __init__(self) -> None:
        self.served = 0
        garbage = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                body = garbage.BODIES[garbage.served % len(garbage.BODIES)]
                garbage.served += 1
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            do_POST = do_GET

            def log_message(self, *args: Any) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"
