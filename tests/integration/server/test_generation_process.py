"""A generation server as a real process (issue 25): ``task: auto`` picks generation for the test Llama's
``*ForCausalLM`` config; answers stream as server-sent events over real HTTP; a client that goes away --
mid-stream, or before its whole answer -- frees its sequence at once (counted, not a server error); a body
past the size limit and a prompt past the context are refused at once, over the wire, at no CPU worth
measuring; SIGTERM lets a running stream finish, then the process exits 0 (the module's last test)."""

from __future__ import annotations

import json
import os
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import pytest
from conftest import ServerProcess, wait
from localcluster import genmodel
from localcluster.promtext import sample_sum

BODY = {"model": "tiny", "prompt": "The licensee may", "max_tokens": 24, "temperature": 0, "stream": True}
MiB = 1024 * 1024


def metric(srv: ServerProcess, name: str, **labels: str) -> float:
    return sample_sum(httpx.get(srv.url + "/metrics", timeout=5).text, name, **labels)


def cpu_s(srv: ServerProcess) -> float:
    """The server process's CPU time so far (user + system)."""
    fields = Path(f"/proc/{srv.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@pytest.fixture(scope="module")
def srv(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    model = genmodel.cached(seed=0, size="test")
    server = ServerProcess(
        ["--model-uri", f"file://{model}", "--num-threads", "1", "--kv-cache-tokens", "2048",
         "--max-context-tokens", "512", "--max-new-tokens", "400", "--drain-timeout-s", "60"],
        tmp_path_factory.mktemp("gen") / "gen.log", name="tiny",
    )  # fmt: skip
    try:
        server.wait_ready()
        yield server
    finally:
        server.stop()


def test_a_stream_arrives_token_by_token(srv: ServerProcess) -> None:
    with httpx.Client(base_url=srv.url, timeout=60) as c:
        got = c.post("/v1/completions", json={**BODY, "stream": False}).json()
        pieces, arrivals = [], []
        with c.stream("POST", "/v1/completions", json=BODY) as r:
            assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
            for line in r.iter_lines():
                if line.startswith("data: ") and line != "data: [DONE]":
                    pieces.append(json.loads(line[6:])["choices"][0]["text"])
                    arrivals.append(time.monotonic())
    assert "".join(pieces) == got["choices"][0]["text"]
    assert len(arrivals) > 3  # token by token over the wire, not one buffered body


def counts(srv: ServerProcess) -> tuple[float, float, float]:
    """(sequences aborted, tokens generated, requests counted 499) so far."""
    text = httpx.get(srv.url + "/metrics", timeout=5).text
    return (
        sample_sum(text, "modelserver_generation_finished_total", finish_reason="abort"),
        sample_sum(text, "modelserver_generation_tokens_total"),
        sample_sum(text, "modelserver_requests_total", code="499"),
    )


def test_a_client_gone_mid_stream_frees_its_sequence(srv: ServerProcess) -> None:
    aborted, tokens, gone = counts(srv)
    # a client that reads two events of a long answer and goes away
    with (
        httpx.Client(base_url=srv.url, timeout=60) as c,
        c.stream("POST", "/v1/completions", json={**BODY, "max_tokens": 400}) as r,
    ):
        seen = 0
        for line in r.iter_lines():
            seen += line.startswith("data: ")
            if seen == 2:
                break
    wait(lambda: metric(srv, "modelserver_generation_finished_total", finish_reason="abort") == aborted + 1)
    assert metric(srv, "modelserver_generation_requests_running") == 0
    assert metric(srv, "modelserver_requests_total", code="499") == gone + 1
    assert metric(srv, "modelserver_requests_total", code="500") == 0
    # and it generated far fewer than the 400 tokens it asked for: the sequence was cancelled
    assert metric(srv, "modelserver_generation_tokens_total") - tokens < 200


def test_a_client_gone_before_its_whole_answer_frees_its_sequence(srv: ServerProcess) -> None:
    """Send and close: a non-streamed request whose client leaves holds no place in the engine. The client
    closes its connection once the sequence runs (not after a read timeout: on a quiet core the tiny model
    writes 400 tokens in under 0.5 s), so what is played does not depend on the machine's speed."""
    aborted, tokens, gone = counts(srv)
    body = json.dumps({**BODY, "stream": False, "max_tokens": 400, "ignore_eos": True}).encode()
    url = urlsplit(srv.url)
    head = (
        "POST /v1/completions HTTP/1.1\r\nHost: t\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}"
    )
    with socket.create_connection((url.hostname, url.port), timeout=30) as sock:
        sock.sendall(head.encode() + b"\r\n\r\n" + body)
        deadline = time.monotonic() + 10
        while metric(srv, "modelserver_generation_requests_running") < 1:
            assert time.monotonic() < deadline, "the sequence never ran"
    left = time.monotonic()  # closed: the server must notice while it generates
    wait(lambda: metric(srv, "modelserver_generation_requests_running") == 0, timeout=5)
    wait(lambda: metric(srv, "modelserver_generation_finished_total", finish_reason="abort") == aborted + 1)
    made = metric(srv, "modelserver_generation_tokens_total") - tokens
    assert made < 400, f"all {made} tokens generated for a client that had gone"
    assert time.monotonic() - left < 5
    assert metric(srv, "modelserver_requests_total", code="499") == gone + 1


def test_a_body_past_the_limit_and_a_prompt_past_the_context_are_refused_at_once(srv: ServerProcess) -> None:
    with httpx.Client(base_url=srv.url, timeout=60) as c:
        cpu, t0 = cpu_s(srv), time.monotonic()
        huge = c.post(
            "/v1/completions", content=b"x" * (80 * MiB), headers={"content-type": "application/json"}
        )
        assert huge.status_code == 413 and huge.json()["error"]["type"] == "invalid_request_error"

        def chunks() -> Iterator[bytes]:  # no Content-Length: the server learns the size as it reads
            yield b'{"model": "tiny", "prompt": "'
            for _ in range(80):
                yield b"a" * MiB

        streamed = c.post("/v1/completions", content=chunks(), headers={"content-type": "application/json"})
        assert streamed.status_code == 413
        body_s = time.monotonic() - t0
        prompt = {"model": "tiny", "prompt": "a" * (4 * MiB), "max_tokens": 8}
        cpu, t0 = cpu_s(srv), time.monotonic()
        long = c.post("/v1/completions", json=prompt)
        err = long.json()["error"]
        prompt_s, prompt_cpu = time.monotonic() - t0, cpu_s(srv) - cpu
        ok = c.post("/v1/completions", json={**BODY, "stream": False})
    assert long.status_code == 400 and err["param"] == "prompt" and err["code"] == "context_length_exceeded"
    assert body_s < 10, f"{body_s:.1f} s to refuse two 80 MiB bodies"
    # before the check ahead of tokenizing: 10 s of CPU and +700 MB to refuse it
    assert prompt_s < 3 and prompt_cpu < 1.0, (
        f"{prompt_s:.2f} s, {prompt_cpu:.2f} s of CPU for a 4 MiB prompt"
    )
    assert ok.status_code == 200  # the connection and the server serve on


def test_sigterm_lets_a_running_stream_finish_then_exits_0(srv: ServerProcess) -> None:
    """Last: it ends the module's server."""
    result: dict[str, object] = {}

    def long_stream() -> None:
        with (
            httpx.Client(base_url=srv.url, timeout=120) as c,
            c.stream("POST", "/v1/completions", json={**BODY, "max_tokens": 300}) as r,
        ):
            result["lines"] = [ln for ln in r.iter_lines() if ln.startswith("data: ")]

    t = threading.Thread(target=long_stream)
    t.start()
    wait(lambda: metric(srv, "modelserver_generation_requests_running") == 1)
    srv.terminate()
    wait(lambda: httpx.get(srv.url + "/v2/health/ready", timeout=5).status_code == 503)
    refused = httpx.post(srv.url + "/v1/completions", json={**BODY, "stream": False}, timeout=10)
    assert refused.status_code == 503 and "retry-after" in refused.headers
    assert refused.json()["error"]["type"] == "server_error"
    t.join(timeout=120)
    lines = result["lines"]
    assert isinstance(lines, list) and lines[-1] == "data: [DONE]"  # the stream was not cut
    assert srv.proc.wait(timeout=60) == 0
