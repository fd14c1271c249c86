"""A generation server as a real process (issue 25): ``task: auto`` picks generation for the test Llama's
``*ForCausalLM`` config; answers stream as server-sent events over real HTTP; a client that goes away
mid-stream frees its sequence at once (counted, not a server error); SIGTERM lets a running stream
finish, then the process exits 0."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import httpx
from conftest import ServerProcess, wait
from localcluster import genmodel
from localcluster.promtext import sample_sum


def metric(srv: ServerProcess, name: str, **labels: str) -> float:
    return sample_sum(httpx.get(srv.url + "/metrics", timeout=5).text, name, **labels)


def test_streams_disconnects_and_drain_of_a_generation_server(tmp_path: Path) -> None:
    model = genmodel.cached(seed=0, size="test")
    srv = ServerProcess(
        ["--model-uri", f"file://{model}", "--num-threads", "1", "--kv-cache-tokens", "2048",
         "--max-context-tokens", "512", "--max-new-tokens", "400", "--drain-timeout-s", "60"],
        tmp_path / "gen.log", name="tiny",
    )  # fmt: skip
    try:
        srv.wait_ready()
        body = {
            "model": "tiny",
            "prompt": "The licensee may",
            "max_tokens": 24,
            "temperature": 0,
            "stream": True,
        }
        with httpx.Client(base_url=srv.url, timeout=60) as c:
            got = c.post("/v1/completions", json={**body, "stream": False}).json()
            pieces, arrivals = [], []
            with c.stream("POST", "/v1/completions", json=body) as r:
                assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
                for line in r.iter_lines():
                    if line.startswith("data: ") and line != "data: [DONE]":
                        pieces.append(json.loads(line[6:])["choices"][0]["text"])
                        arrivals.append(time.monotonic())
        assert "".join(pieces) == got["choices"][0]["text"]
        assert len(arrivals) > 3  # token by token over the wire, not one buffered body

        # a client that reads two events of a long answer and goes away
        long = {**body, "max_tokens": 400}
        with (
            httpx.Client(base_url=srv.url, timeout=60) as c,
            c.stream("POST", "/v1/completions", json=long) as r,
        ):
            seen = 0
            for line in r.iter_lines():
                seen += line.startswith("data: ")
                if seen == 2:
                    break
        wait(lambda: metric(srv, "modelserver_generation_finished_total", finish_reason="abort") == 1)
        assert metric(srv, "modelserver_generation_requests_running") == 0
        assert metric(srv, "modelserver_requests_total", code="499") == 1
        assert metric(srv, "modelserver_requests_total", code="500") == 0
        # and it generated far fewer than the 400 tokens it asked for: the sequence was cancelled
        assert metric(srv, "modelserver_generation_tokens_total") < 24 + 24 + 200

        # SIGTERM while a stream runs: it finishes, new requests are refused, the process exits 0
        result: dict[str, object] = {}

        def long_stream() -> None:
            longer = {**body, "max_tokens": 300}
            with (
                httpx.Client(base_url=srv.url, timeout=120) as c,
                c.stream("POST", "/v1/completions", json=longer) as r,
            ):
                result["lines"] = [ln for ln in r.iter_lines() if ln.startswith("data: ")]

        t = threading.Thread(target=long_stream)
        t.start()
        wait(lambda: metric(srv, "modelserver_generation_requests_running") == 1)
        srv.terminate()
        wait(lambda: httpx.get(srv.url + "/v2/health/ready", timeout=5).status_code == 503)
        refused = httpx.post(srv.url + "/v1/completions", json={**body, "stream": False}, timeout=10)
        assert refused.status_code == 503 and "retry-after" in refused.headers
        t.join(timeout=120)
        lines = result["lines"]
        assert isinstance(lines, list) and lines[-1] == "data: [DONE]"  # the stream was not cut
        assert srv.proc.wait(timeout=60) == 0
    finally:
        srv.stop()
