"""An answer given before the request body arrived never ends the connection with a reset.

A client (httpx, h11) writes the head and the body of a request in two writes. When the server answers
from the head alone (an unknown model: 404; the door full: 503) and closes (``Connection: close``), the
body then reaches a closed socket and the server's kernel answers it with a reset. Behind kube-proxy that
reset leaves the Service connection's conntrack entry in CLOSE, an entry a new connection that reuses the
client port does not reopen: its SYN follows the entry's old translation, to the pod that answered --
after a rollback, a pod whose address is gone (CI: three ENETUNREACH 5.5-6.6 s after a 404 canary was
rolled back, when its pod's address was removed). So the server reads the body it was sent before it
answers, and closes with a FIN: the client reads the answer, then end-of-file, never ECONNRESET.
Played with a raw socket against a real server process (the noop model): the head, a pause long enough
for an early answer to go out, the body, then everything up to the end of the stream."""

from __future__ import annotations

import errno
import socket
import time
from pathlib import Path

import pytest
from conftest import ServerProcess

BODY = b'{"inputs": [{"name": "text", "datatype": "BYTES", "shape": [1], "data": ["hello"]}]}'


def head(path: str, length: int) -> bytes:
    return (
        f"POST {path} HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\nConnection: close\r\n"
        f"Content-Length: {length}\r\n\r\n"
    ).encode()


def exchange(port: int, path: str, pause: float = 0.3) -> tuple[bytes, str]:
    """Send the head, pause, send the body; read to the end. Returns (what was read, how it ended:
    'eof' for a FIN alone, 'reset' when the connection was reset)."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(head(path, len(BODY)))
        time.sleep(pause)
        try:
            s.sendall(BODY)
        except (BrokenPipeError, ConnectionResetError):
            return b"", "reset"
        time.sleep(pause)  # the reset to the body, if any, has come back by now
        got = b""
        while True:
            try:
                chunk = s.recv(65536)
            except ConnectionResetError:
                return got, "reset"
            if not chunk:
                break
            got += chunk
        # after the server's FIN, recv reports end-of-file even when a reset came too: the socket's
        # pending error tells (EPIPE for a reset met after the FIN, ECONNRESET before it)
        err = s.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
        return got, "reset" if err in (
            errno.EPIPE,
            errno.ECONNRESET,
        ) else f"eof (error {err})" if err else "eof"


@pytest.fixture(scope="module")
def noop_server(tmp_path_factory: pytest.TempPathFactory):
    srv = ServerProcess(
        ["--model-uri", "noop://"], tmp_path_factory.mktemp("early") / "server.log", name="echo"
    )
    try:
        srv.wait_ready()
        yield srv
    finally:
        srv.stop()


@pytest.mark.parametrize(
    ("path", "status"),
    [
        ("/v2/models/echo-renamed/infer", b"404"),  # a canary that renamed its model
        ("/v2/models/echo/versions/9/infer", b"404"),
        ("/v2/models/echo/infer", b"200"),  # the control: an answer that needs the body
    ],
)
def test_an_answer_given_before_the_body_came_closes_with_a_fin_not_a_reset(
    noop_server: ServerProcess, path: str, status: bytes
) -> None:
    outcomes = [exchange(noop_server.port, path) for _ in range(5)]
    ends = [end for _, end in outcomes]
    assert ends == ["eof"] * 5, (ends, [got[:120] for got, _ in outcomes], noop_server.logs()[-2000:])
    for got, _ in outcomes:
        assert got.split(b" ", 2)[1] == status, got[:200]
        if status != b"200":
            assert b'"error"' in got, got[-300:]


def test_a_refusal_at_the_full_door_closes_with_a_fin_not_a_reset(tmp_path: Path) -> None:
    """One request in flight allowed; one held inside (its head sent, its body not yet), so the next is
    refused at the door (503, Retry-After) -- after its body came, and with a FIN."""
    srv = ServerProcess(
        ["--model-uri", "noop://", "--max-concurrent-requests", "1"], tmp_path / "server.log", name="echo"
    )
    try:
        srv.wait_ready()
        with socket.create_connection(("127.0.0.1", srv.port), timeout=10) as held:
            held.sendall(head("/v2/models/echo/infer", len(BODY)))  # inside the door, waiting for its body
            time.sleep(0.3)
            got, end = exchange(srv.port, "/v2/models/echo/infer")
            held.sendall(BODY)
            held_answer = held.recv(65536)
    finally:
        srv.stop()
    assert end == "eof", (end, got[:300])
    assert got.split(b" ", 2)[1] == b"503" and b"retry-after" in got.lower() and b'"error"' in got, got[:300]
    assert held_answer.split(b" ", 2)[1] == b"200", held_answer[:200]  # the held one was served
