"""The ``modeldeploy/testapp`` image: a tiny HTTP server used to test the local cluster itself.

Routes: ``/healthz`` (always 200), ``/readyz`` (200 once ``--ready-after`` seconds passed, or 503 while
the file named by ``--unready-file`` exists), ``/metrics`` (Prometheus text), ``/`` (JSON with the pid,
pod name and request count), ``/file?path=P`` (the file's content as the process sees it, 404 if
missing; ``PUT`` tries to write it: 200, or 409 with the errno name). Binds to ``$TESTAPP_HOST`` (the
pod IP given by the node agent).
"""

from __future__ import annotations

import argparse
import errno
import json
import os
import signal
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, urlsplit


def _parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="testapp")
    p.add_argument("--host", default=os.environ.get("TESTAPP_HOST", "127.0.0.1"))
    p.add_argument("--port", type=int, default=int(os.environ.get("TESTAPP_PORT", "8080")))
    p.add_argument("--ready-after", type=float, default=0.0)
    p.add_argument("--unready-file", default="")
    p.add_argument("--exit-after", type=float, default=0.0, help="crash (exit 3) after this many seconds")
    return p.parse_args(argv)


def _handler(args: argparse.Namespace, started: float) -> type[BaseHTTPRequestHandler]:
    """The request handler: its routes answer from ``args`` and the time the server ``started``."""
    counter = {"requests": 0}

    class Handler(BaseHTTPRequestHandler):
        def _send(self, code: int, body: bytes, ctype: str = "application/json") -> None:
            self.send_response(code)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def _file(self) -> Path | None:
            url = urlsplit(self.path)
            if url.path != "/file":
                return None
            return Path((parse_qs(url.query).get("path") or [""])[0])

        def do_PUT(self) -> None:
            path = self._file()
            if path is None:
                self._send(404, b'{"error": "not found"}')
                return
            try:
                path.write_text("written by testapp\n")
            except OSError as exc:
                name = errno.errorcode.get(exc.errno or 0, str(exc.errno))
                self._send(409, json.dumps({"errno": name}).encode())
                return
            self._send(200, b'{"written": true}')

        def do_GET(self) -> None:
            counter["requests"] += 1
            path = self._file()
            if path is not None:
                try:
                    self._send(200, path.read_bytes(), "application/octet-stream")
                except OSError as exc:
                    self._send(404, json.dumps({"error": str(exc)}).encode())
            elif self.path == "/healthz":
                self._send(200, b'{"ok": true}')
            elif self.path == "/readyz":
                ready = time.monotonic() - started >= args.ready_after
                if args.unready_file and Path(args.unready_file).exists():
                    ready = False
                self._send(200 if ready else 503, json.dumps({"ready": ready}).encode())
            elif self.path == "/metrics":
                text = (
                    "# HELP testapp_requests_total Requests served.\n"
                    "# TYPE testapp_requests_total counter\n"
                    f"testapp_requests_total {counter['requests']}\n"
                )
                self._send(200, text.encode(), "text/plain; version=0.0.4")
            else:
                body = {
                    "pid": os.getpid(),
                    "pod": os.environ.get("HOSTNAME", ""),
                    "requests": counter["requests"],
                }
                self._send(200, json.dumps(body).encode())

        def log_message(self, format: str, *a: object) -> None:
            pass

    return Handler


def main(argv: list[str] | None = None) -> int:
    args = _parse_args(argv)
    started = time.monotonic()
    server = ThreadingHTTPServer((args.host, args.port), _handler(args, started))

    def _term(_signum: int, _frame: object) -> None:
        threading.Thread(target=server.shutdown, daemon=True).start()

    signal.signal(signal.SIGTERM, _term)
    if args.exit_after:
        threading.Timer(args.exit_after, lambda: os._exit(3)).start()
    print(f"testapp listening on {args.host}:{args.port} pid {os.getpid()}", flush=True)
    server.serve_forever()
    print("testapp stopped", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
